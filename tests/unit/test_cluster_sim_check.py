"""The replay used by the simulator-against-live check (elastic_ring.experiment.live_check): step-counted
jobs on measured speed tables, a start overhead, hand-checked."""

from __future__ import annotations

import pytest

from elastic_ring.errors import ConfigError
from elastic_ring.sim.api import SimConfig
from elastic_ring.experiment.replay import TableSpeed, replay


def test_eight_on_two_slots_runs_jobs_one_after_another_with_the_start_overhead():
    # job 0: 100 steps at 12 steps/s (2 workers) after 3 s of start: ends at 11.33 s; job 1 waits
    r = replay([(0, 100), (0, 100), (5, 50)], "eight", 2, {1: 10.0, 2: 12.0}, 3.0, 5.0)
    assert r.jct_s == pytest.approx((3 + 100 / 12, 2 * (3 + 100 / 12), 3 * 3 + 250 / 12 - 5))
    assert r.resizes == 0


def test_precompute_keeps_one_worker_when_two_are_slower_in_steps():
    # steps/s falls with workers (fixed per-worker batch, step-counted job): never grows
    r = replay([(0, 100), (2, 40)], "precompute", 2, {1: 10.0, 2: 8.0}, 1.0, 5.0)
    assert r.jct_s == pytest.approx((11.0, 5.0)) and r.resizes == 0


def test_precompute_shrinks_on_arrival_and_pays_the_resize_overhead():
    # 2 workers faster: job 0 alone gets 2, job 1's arrival at t=5 shrinks it to 1 (5 s lost)
    r = replay([(0, 100), (5, 10)], "precompute", 2, {1: 10.0, 2: 15.0}, 0.0, 5.0, resize_after_launch=False)
    # t=5: 75 steps done, shrunk to 1 (paused until 10); job 1 runs 10 steps at 10/s, ends at 6;
    # job 0 alone again is grown to 2 at 6 (paused until 11), its last 25 steps take 25/15 s
    assert r.resizes == 2
    assert r.jct_s == pytest.approx((11 + 25 / 15, 1.0))


def test_live_hand_over_a_resize_waits_for_the_launch_in_flight():
    # as above, but the grow at t=6 (job 1 done) waits for the shrink's relaunch (paused until 10):
    # paused until 15, then 25 steps at 15/s
    r = replay([(0, 100), (5, 10)], "precompute", 2, {1: 10.0, 2: 15.0}, 0.0, 5.0)
    assert r.resizes == 2 and r.jct_s == pytest.approx((15 + 25 / 15, 1.0))


def test_live_hand_over_slots_of_a_launching_job_are_free_only_after_its_launch():
    # job 0 starts on both slots at t=0 with a 10 s launch; job 1 arrives at 1: job 0 is shrunk,
    # but only once launched (t=10, then 5 s of relaunch at 1 worker), and job 1 starts on the
    # slot given back at t=10 (10 s launch): 10 steps at 10/s, done at 21
    r = replay([(0, 100), (1, 10)], "precompute", 2, {1: 10.0, 2: 15.0}, 10.0, 5.0)
    assert r.jct_s[1] == pytest.approx(21 - 1)
    # job 0: paused until 15, 100 steps at 1 worker until job 1 ends at 21 (60 done), then
    # grown to 2 at 21 (5 s), the last 40 at 15/s
    assert r.jct_s[0] == pytest.approx(26 + 40 / 15) and r.resizes == 2
    # the paper's instant hand-over: job 1 starts at t=1
    r = replay([(0, 100), (1, 10)], "precompute", 2, {1: 10.0, 2: 15.0}, 10.0, 5.0, resize_after_launch=False)
    assert r.jct_s[1] == pytest.approx(11.0)


def test_overhead_per_worker_and_exploratory_on_a_small_node():
    # eight on 4 slots: every start at 4 workers costs 2 + 3 x 1 s
    r = replay([(0, 40), (0, 40)], "eight", 4, {1: 10.0, 2: 20.0, 4: 40.0}, 2.0, 1.0, overhead_per_worker_s=1.0)
    assert r.jct_s == pytest.approx((6.0, 12.0))
    # exploratory on 4 slots: measured at 1, 2, 4 (hold 4), Eq. 5 fitted from 3 counts, finishes
    r = replay([(0, 400), (5, 100)], "exploratory", 4, {1: 10.0, 2: 20.0, 4: 40.0}, 2.0, 1.0)
    assert r.completed == 2 and r.resizes >= 2


def test_launches_side_by_side_share_the_per_worker_cost():
    # two 1-worker jobs start together on 2 slots: the second launch counts the first one's worker
    # (2 + 1 s), the first saw none (2 s); 10 steps at 10/s each (2 workers no faster: no grow)
    speeds = {1: 10.0, 2: 10.0}
    r = replay([(0, 10), (0, 10)], "optimus", 2, speeds, 2.0, 1.0, overhead_per_worker_s=1.0)
    assert sorted(r.jct_s) == pytest.approx([3.0, 4.0])
    r = replay([(0, 10), (0, 10)], "optimus", 2, speeds, 2.0, 1.0, overhead_per_worker_s=1.0,
               launches_share_node=False)
    assert r.jct_s == pytest.approx((3.0, 3.0))


def test_table_speed_and_bad_input():
    t = TableSpeed({1: 10.0, 2: 12.0})
    assert t.samples_per_s(1) == 10.0 and t.samples_per_s(4) == 12.0
    with pytest.raises(ConfigError):
        TableSpeed({1: 0.0})
    with pytest.raises(ConfigError):
        SimConfig(start_overhead_s=-1)


def test_replay_keeps_the_seconds_each_resize_cost():
    # the shrink at t=5 (to 1 worker) and the grow at t=6 (to 2): 5 s each, + 1 s per worker
    # beyond the first; the first start (start overhead) is not a resize
    lost = []
    r = replay([(0, 100), (5, 10)], "precompute", 2, {1: 10.0, 2: 15.0}, 3.0, 5.0, resize_after_launch=False,
               overhead_per_worker_s=1.0, launches_share_node=False, lost=lost)
    assert r.resizes == 2 and lost == pytest.approx([5.0, 6.0])


class _Scripted:
    """A policy answering each decision from a script: (call number, active job ids) -> allocation;
    it records the resize costs it was given (the -rc gate's ``costs``)."""

    name = "scripted"
    explores = False
    resize_cost_s = 3.5

    def __init__(self, script):
        self.script, self.calls, self.costs, self.seen = script, 0, {}, []

    def allocate(self, jobs, total_gpus, current):
        self.calls += 1
        self.seen.append(dict(self.costs))
        return self.script(self.calls, sorted(j.id for j in jobs))


def _replay_scripted(jobs, script, gpus, start_s, resize_s, lost=None):
    from elastic_ring.sim.api import JobSpec
    from elastic_ring.experiment.replay import live_simulator

    cfg = SimConfig(gpus=gpus, jobs=len(jobs), start_overhead_s=start_s, resize_overhead_s=resize_s,
                    resize_after_launch=True, launches_share_node=False, remaining="oracle")
    models = {"t": TableSpeed({1: 10.0, 2: 20.0, 4: 40.0})}
    pol = _Scripted(script)
    specs = [JobSpec(id=i, arrival=float(a), work=float(w), workload="t") for i, (a, w) in enumerate(jobs)]
    return live_simulator(cfg, pol, models, lost=lost).run(specs), pol


def test_a_start_waiting_for_slots_takes_the_latest_target_at_no_cost():
    # t=0: job 0 on 2 slots (10 s launch). t=1: job 0 set to 1 (its slot free once launched, t=10)
    # and job 1 to 1, which waits for that slot. t=2: job 1 set to 0, job 2 to 1: live, job 1 never
    # started (no resize); job 2 starts at 10 (10 s launch), 10 steps at 10/s: done at 21. Then job 1
    # starts on job 2's slot at 21: done at 32. One resize in all (job 0's 2 -> 1).
    plans = {1: {0: 2}, 2: {0: 1, 1: 1}, 3: {0: 1, 1: 0, 2: 1}}
    r, _ = _replay_scripted([(0, 1000), (1, 10), (2, 10)],
                            lambda n, ids: plans.get(n, {i: 1 for i in ids[:2]}), 2, 10.0, 5.0)
    assert r.resizes == 1
    assert r.jct_s[2] == pytest.approx(21 - 2) and r.jct_s[1] == pytest.approx(32 - 1)


def test_changes_asked_while_a_change_is_in_flight_collapse_into_the_latest():
    # job 0 launches on 4 slots until t=10; set to 1 at t=1 (asked at once: begins at 10, 5 s of
    # relaunch), to 2 at t=2 and back to 1 at t=3: live, the last two are targets of a job with a
    # resize in flight and never asked. One resize; job 0 trains from 15: 100 steps, done at 25.
    def script(n, ids):
        return {1: {0: 4}, 2: {0: 1}, 3: {0: 2}}.get(n, {0: 1})
    r, _ = _replay_scripted([(0, 100), (1, 10), (2, 10), (3, 10)], lambda n, ids: {
        **{i: (1 if n >= 4 else 0) for i in ids}, **script(n, ids)}, 4, 10.0, 5.0)
    assert r.resizes == 1 and r.jct_s[0] == pytest.approx(25.0)


def test_a_grow_waiting_for_slots_trains_on_at_its_size():
    # job 0 starts on 1 slot (10 s launch, 10 steps/s from t=10); job 1 starts on the other at 12
    # (launch until 22); t=13: job 1 stopped, job 0 set to 2: the slot is free only once job 1's
    # launch is done (22). Live, job 0 trains at 1 worker until 22 (120 steps), then 5 s of resize,
    # then 180 steps at 20/s: done at 36 (committed at t=13 it paused from 13: done at 40.5).
    plans = {1: {0: 1}, 2: {0: 1, 1: 1}, 3: {0: 2, 1: 0, 2: 0}}
    r, _ = _replay_scripted([(0, 300), (12, 10), (13, 10)],
                            lambda n, ids: plans.get(n, {i: 1 for i in ids if i != 0}), 2, 10.0, 5.0)
    assert r.jct_s[0] == pytest.approx(36.0)


def test_the_resize_cost_gate_weighs_what_the_live_scheduler_had_measured():
    # job 0 (2 slots, launched at 10) shrunk to 1 at t=12 when job 1 arrives: 5 s lost (12 -> 17),
    # read live one throughput window (20 steps at 10/s) later, t=19. The decision at t=18 still
    # has the default (3.5 s) for every job; the one at t=20 job 0's 5 s, and the other jobs the
    # median of every job's measured costs (the live ResizeCosts).
    lost = []
    plans = {1: {0: 2}, 2: {0: 1, 1: 1}, 3: {0: 1, 1: 1}, 4: {0: 1, 1: 1}}
    _, pol = _replay_scripted([(0, 1000), (12, 10), (18, 10), (20, 10)],
                              lambda n, ids: plans.get(n, {0: 1, ids[-1]: 1}), 2, 10.0, 5.0, lost)
    assert lost[0] == pytest.approx(5.0)
    assert pol.seen[2] == {0: 3.5, 1: 3.5, 2: 3.5}
    assert pol.seen[3] == {0: 5.0, 1: 5.0, 2: 5.0, 3: 5.0}


def test_the_check_keeps_each_jobs_scheduler_events_by_name(tmp_path):
    # the live check: the live run's starts, resize requests, stops and vetoed grows per job,
    # timed from the first submission (what the replay's changes are compared with)
    import sqlite3

    from elastic_ring.cluster.api import JobRequest
    from elastic_ring.cluster.store import Store

    from elastic_ring.experiment import live_records as mod

    now = [100.0]
    store = Store(tmp_path, create=True, clock=lambda: now[0])
    a = store.submit(JobRequest(name="j0", kind="script", path="x.py", steps=10))
    b = store.submit(JobRequest(name="j1", kind="script", path="x.py", steps=10))
    for t, jid, kind, data in [(103.0, a, "started", {"workers": 2, "slots": [0, 1], "pid": 7}),
                               (104.5, a, "resize_requested", {"frm": 2, "to": 1}),
                               (106.0, b, "grow_vetoed", {"held": 1, "asked": 2}),
                               (107.0, b, "throughput", {})]:  # the last: not a scheduler event
        now[0] = t
        store.event(jid, kind, **data)
    store.close()
    db = sqlite3.connect(str(tmp_path / "cluster.db"))
    ev = mod.sched_events(db, 100.0)
    db.close()
    assert ev == {"j0": [[3.0, "started", {"workers": 2, "slots": [0, 1]}], [4.5, "resize_requested", {"frm": 2, "to": 1}]],
                  "j1": [[6.0, "grow_vetoed", {"held": 1, "asked": 2}]]}


# ---- launches sharing the node's cores, and the calibration's repeated starts (issue 22, point 6)

INF = float("inf")


def test_shared_launch_ends_slow_launches_only_past_the_cores():
    from elastic_ring.experiment.replay import shared_launch_ends

    # two 1-worker launches of 4 s on 2 cores: 2 processes, no slowdown; three: 3 on 2, each 2/3
    assert shared_launch_ends([(0, 4, 1, -1, INF)] * 2, 2) == pytest.approx([4, 4])
    assert shared_launch_ends([(0, 4, 1, -1, INF)] * 3, 2) == pytest.approx([6, 6, 6])
    # a 2-worker launch joins at 2 s: 3 processes, both at 2/3; the first's last 2 s take 3 (ends
    # at 5), the second has 2 of 4 s done then and ends alone at 7: the earlier launch slows too
    assert shared_launch_ends([(0, 4, 1, -1, INF), (2, 4, 2, -1, INF)], 2) == pytest.approx([5, 7])
    # a 4-worker launch alone is at its calibrated speed (its own processes are in its time alone)
    assert shared_launch_ends([(0, 9, 4, -1, INF)], 2) == pytest.approx([9])


def test_shared_launch_ends_follow_and_kill():
    from elastic_ring.experiment.replay import shared_launch_ends

    # launch 1 follows launch 0 (a resize asked while it launches); launch 2 (2 workers) from 1 s:
    # 0 ends at 5.5, then 1 and 2 run side by side (4 processes, half speed each)
    ends = shared_launch_ends([(0, 4, 1, -1, INF), (0, 3, 2, 0, INF), (1, 4, 2, -1, INF)], 2)
    assert ends == pytest.approx([5.5, 9.5, 7.5])
    # a 4-worker launch stopped at 2 s: the 1-worker launch beside it (from 1 s, 4 s alone) runs at
    # 2/5 for 1 s, then alone: ends at 2 + 3.6
    assert shared_launch_ends([(0, 4, 4, -1, 2.0), (1, 4, 1, -1, INF)], 2) == pytest.approx([2.0, 5.6])


def test_replay_with_cores_slows_every_launch_in_flight():
    # one core: two 1-worker starts (2 s alone each) side by side take 4 s each (then 1 s of steps);
    # the engine's per-worker model charged only the second (3 s, 4 s); on 2 cores, no slowdown
    speeds = {1: 10.0, 2: 10.0}
    kw = dict(overhead_per_worker_s=1.0)
    assert replay([(0, 10), (0, 10)], "optimus", 2, speeds, 2.0, 1.0, cores=1, **kw).jct_s == pytest.approx((5, 5))
    assert replay([(0, 10), (0, 10)], "optimus", 2, speeds, 2.0, 1.0, cores=2, **kw).jct_s == pytest.approx((3, 3))
    # a start joining at 1 s moves the first job's launch end (and so its completion) too:
    # 0-1 s alone (1 s of 2 done), 1-3 s both at 1/2, job 0 ends its launch at 3, job 1 at 4
    r = replay([(0, 10), (1, 10)], "optimus", 2, speeds, 2.0, 1.0, cores=1, **kw)
    assert r.jct_s == pytest.approx((4.0, 4.0))
    with pytest.raises(ConfigError):
        replay([(0, 10)], "optimus", 2, speeds, 2.0, 1.0, cores=0)


def test_replay_with_cores_explores_to_the_end():
    # exploration phases whose launches are stretched by a later launch: their ends move, the
    # earlier phase-end events are dropped, every job finishes, and on many cores nothing moves
    jobs = [(0, 300), (2, 200), (3, 100)]
    t = {1: 10.0, 2: 20.0, 4: 40.0}
    r1 = replay(jobs, "exploratory", 4, t, 3.0, 2.0, overhead_per_worker_s=1.0, cores=1)
    r64 = replay(jobs, "exploratory", 4, t, 3.0, 2.0, overhead_per_worker_s=1.0, cores=64)
    base = replay(jobs, "exploratory", 4, t, 3.0, 2.0, overhead_per_worker_s=1.0, launches_share_node=False)
    assert r1.completed == r64.completed == 3
    assert r64.jct_s == pytest.approx(base.jct_s)
    assert r1.avg_jct_s > r64.avg_jct_s


def _script_module():
    from elastic_ring.experiment import live_check

    return live_check


def test_calibration_takes_the_median_start_of_each_size(tmp_path, monkeypatch):
    # 3 starts per size: at 1 worker 9, 4, 5 s (median 5: the 9 s one is outvoted); at 4 workers
    # 10, 30, 11 (median 11). Every resize loses 2 + 1.5 (W - 1) s: a = 2, b = 1.5, and the start
    # line s = mean(5 - 0, 11 - 3 b) = 5.75
    mod = _script_module()
    starts = {1: [9.0, 4.0, 5.0], 4: [10.0, 30.0, 11.0]}
    calls = []

    def fake_train(rd, args, steps, start, slots, schedule, cores=None):
        calls.append((rd.name, steps, start, schedule))
        ev, w = [], start
        for part in filter(None, schedule.split(",")):
            to = int(part.split(":")[1])
            ev.append({"kind": "resize_overhead", "from_workers": w, "to_workers": to, "total_lost_s": 2 + 1.5 * (to - 1)})
            w = to
        return ev, starts[start].pop(0)

    monkeypatch.setattr(mod, "_train", fake_train)
    # 1-worker starts side by side: 6.0-8.0 s each (median 7.5 against 5 alone: r = 1.5); on 2
    # cores two launches of 1 + h processes run at 1 / (1 + h): h = 0.5
    pairs = [[6.0, 7.5], [8.0, 7.5], [7.5, 7.0]]
    monkeypatch.setattr(mod, "_train_pair", lambda work, tag, args, steps, slots: pairs.pop(0))
    monkeypatch.setattr(mod.os, "sched_getaffinity", lambda pid: {0, 1})
    cal = mod.calibrate(tmp_path, 4, [], repeats=3)
    assert cal["pair_start_samples_s"] == [6.0, 7.5, 8.0, 7.5, 7.5, 7.0] and cal["cores"] == 2
    assert cal["launch_extra_processes"] == pytest.approx(0.5)
    assert cal["measured_start_s"] == {"1": 5.0, "4": 11.0}
    assert cal["measured_start_samples_s"] == {"1": [9.0, 4.0, 5.0], "4": [10.0, 30.0, 11.0]}
    assert len(cal["measured_resizes"]) == 12  # two resize runs of 3 resizes, twice
    assert cal["resize_overhead_s"] == pytest.approx(2.0) and cal["overhead_per_worker_s"] == pytest.approx(1.5)
    assert cal["start_overhead_s"] == pytest.approx(5.75)
    # the second pair's segments are REPEAT_SEGMENT steps; the last starts are START_STEPS steps, no resize
    assert [c[1] for c in calls[4:]] == [mod.START_STEPS] * 2 and calls[2][3].startswith(f"{mod.REPEAT_SEGMENT}:")


def test_launch_extra_inverts_the_shared_cores_model():
    # two 1-worker launches of 1 + h processes, each 4 s alone, side by side on 2 cores: the model's
    # pair time gives back h; no slowdown gives 0; slower than the model can be: at most cores - 1
    from elastic_ring.experiment.live_launches import launch_extra
    from elastic_ring.experiment.replay import shared_launch_ends

    for h in (0.0, 0.3, 0.8):
        pair = shared_launch_ends([(0, 4.0, 1 + h, -1, INF)] * 2, 2)[0]
        assert launch_extra(pair, 4.0, 2) == pytest.approx(h)
    assert launch_extra(3.5, 4.0, 2) == 0.0 and launch_extra(40.0, 4.0, 2) == 1.0


def test_the_calibrations_pair_picks_the_shared_cores_model():
    # a calibration with launch_extra_processes replays with launches sharing its cores (primary),
    # the engine's per-worker cost beside; one without keeps the per-worker cost, sharing beside
    from elastic_ring.experiment.live_results import simulate_run

    jobs = [{"name": f"j{i}", "arrival_s": a, "steps": n, "start_overhead_s": 5.0, "resize_relaunch_s": []}
            for i, (a, n) in enumerate([(0, 40), (0, 40), (1, 40)])]
    run = {"jobs": jobs, "avg_jct_s": 20.0, "makespan_s": 25.0}
    cal = {"rates_steps_per_s": {"1": 3.3, "2": 6.6, "3": 9.9, "4": 13.2}, "start_overhead_s": 4.0,
           "resize_overhead_s": 3.0, "overhead_per_worker_s": 2.0}
    old = simulate_run(run, "precompute", 4, cal, cores=2)
    new = simulate_run(run, "precompute", 4, {**cal, "launch_extra_processes": 0.5, "cores": 2})
    assert old["launch_model"] == "per_worker" and old["shared_cores"]["launch_extra"] == 0.0
    assert new["launch_model"] == "shared_cores" and new["shared_cores"]["launch_extra"] == 0.5
    assert new["per_worker"]["avg_jct_s"] == pytest.approx(old["avg_jct_s"])
    assert new["avg_jct_s"] == pytest.approx(new["shared_cores"]["avg_jct_s"])
    assert new["avg_jct_s"] > old["shared_cores"]["avg_jct_s"]  # 1.5 processes a launch: more sharing


def test_launch_table_counts_what_overlapped_each_launch_and_on_which_core():
    # j0 starts on slots 0, 1 at 0 s (10 s); j1 starts on slot 2 (core 0 of 2) at 5 s (5 s), so half
    # of j0's start overlaps one worker on its core 0; j1's whole start overlaps j0's 2 workers, one
    # on its core (slot 0) and one on the other (slot 1); j1's resize to slots 2, 3 at 20 s: alone
    from elastic_ring.experiment.live_launches import launch_table

    res = {"live": {"jobs": [
        {"name": "j0", "start_overhead_s": 10.0, "resize_relaunch_s": [],
         "events": [[0.0, "started", {"workers": 2, "slots": [0, 1]}]]},
        {"name": "j1", "start_overhead_s": 5.0, "resize_relaunch_s": [4.0],
         "events": [[5.0, "started", {"workers": 1, "slots": [2]}], [20.0, "resized", {"workers": 2, "slots": [2, 3]}]]},
    ]}}
    t = {(x["job"], x["kind"]): x for x in launch_table(res, cores=2)}
    assert t["j0", "start"]["other_workers"] == pytest.approx(0.5)
    assert t["j0", "start"]["same_core_workers"] == pytest.approx(0.5)
    assert t["j1", "start"]["other_workers"] == pytest.approx(2.0)
    assert t["j1", "start"]["same_core_workers"] == pytest.approx(1.0)
    assert t["j1", "resize"]["s"] == 4.0 and t["j1", "resize"]["other_workers"] == 0.0
