"""The live scheduler's loop driven with a fake runner (no processes): slots never shared, at most
one resize in flight, shrinks free slots only after the old workers exit, decisions at arrivals
and completions, cancel, drain, and recovery after a crash (nothing lost, nothing run twice)."""

from __future__ import annotations

import pytest

from elastic_ring.cluster.api import ClusterConfig, JobRequest, JobState, Observation
from elastic_ring.cluster.scheduler import Scheduler
from elastic_ring.cluster.store import Store
from elastic_ring.sched import make_policy


class FakeJob:
    def __init__(self, total: int, workers: int):
        self.total, self.world, self.step = total, workers, 0
        self.alive, self.outcome = True, None
        self.launches, self.exits = 1, 0
        self.pending: tuple[int, int] | None = None  # (new size, ticks left)
        self.stopping = 0
        self.error: str | None = None  # why its controller ended, as the runner reads it


class FakeRunner:
    """Each tick (observe) a job advances one step per worker; a resize takes ``lag`` observations."""

    def __init__(self, lag: int = 2, speed=None):
        self.jobs: dict[int, FakeJob] = {}
        self.starts: list[tuple[int, int, bool]] = []
        self.lag = lag
        self.refuse_resize = False
        # speed: workers -> steps/s; when given, every training observation reports one throughput
        # window (launches, world, steps, seconds), the first after each launch 10x too slow (warm-up)
        self.speed = speed
        self.windows: dict[tuple[int, int], int] = {}  # (job, launch) -> windows reported
        # lost: job id -> seconds each of its resizes "loses": the resize_overhead events reported
        # at the end of a resize (what the -rc policies weigh)
        self.lost: dict[int, float] = {}
        self.pending_lost: dict[int, list[float]] = {}

    def start(self, job, slots, workers, resume):
        self.starts.append((job["id"], workers, resume))
        old = self.jobs.get(job["id"])
        fj = FakeJob(job["request"].steps, workers)
        if resume and old is not None:
            fj.step = old.step
            fj.launches = old.launches + 1  # the run folder's events accumulate across controllers
        self.jobs[job["id"]] = fj
        return 1000 + job["id"]

    def request_resize(self, job, to):
        fj = self.jobs[job["id"]]
        if self.refuse_resize or fj.pending or fj.world == to:
            return False
        fj.pending = (to, self.lag)
        return True

    def stop(self, job):
        self.jobs[job["id"]].stopping = self.lag

    def observe(self, job):
        fj = self.jobs.get(job["id"])
        if fj is None:
            return Observation(alive=False, outcome=None)
        if fj.alive:
            if fj.stopping:
                fj.stopping -= 1
                if not fj.stopping:
                    fj.alive, fj.outcome = False, "interrupted"
            elif fj.pending:
                to, left = fj.pending
                if left <= 1:
                    fj.world, fj.pending = to, None
                    fj.launches += 1
                    fj.exits += 1
                    if job["id"] in self.lost:
                        self.pending_lost.setdefault(job["id"], []).append(self.lost[job["id"]])
                else:
                    fj.pending = (to, left - 1)
            else:
                fj.step = min(fj.total, fj.step + fj.world)
                if fj.step >= fj.total:
                    fj.alive, fj.outcome = False, "succeeded"
                if self.speed is not None:
                    n = self.windows[(job["id"], fj.launches)] = self.windows.get((job["id"], fj.launches), 0) + 1
                    sps = self.speed(fj.world) / (10.0 if n == 1 else 1.0)
                    thr = [(fj.launches, fj.world, 20, 20 / sps)]
                    return Observation(alive=fj.alive, state="running", world_size=fj.world, step=fj.step,
                                       total=fj.total, launches=fj.launches, exits=fj.exits, outcome=fj.outcome,
                                       throughput=thr)
        return Observation(alive=fj.alive, state="running", world_size=fj.world, step=fj.step, total=fj.total,
                           launches=fj.launches, exits=fj.exits, outcome=fj.outcome,
                           resize_lost_s=self.pending_lost.pop(job["id"], []), error=fj.error)


def _setup(tmp_path, slots=4, policy="precompute", lag=2):
    store = Store(tmp_path, create=True, clock=lambda: 0.0)
    cfg = ClusterConfig(hosts=(("localhost", slots),), policy=policy)
    runner = FakeRunner(lag)
    clock = iter(range(10 ** 6))
    sched = Scheduler(store, cfg, make_policy(policy), runner, rate_for=lambda j: (lambda w: float(w) ** 0.9),
                      clock=lambda: float(next(clock)))
    return store, cfg, runner, sched


def _submit(store, name, steps, **kw):
    return store.submit(JobRequest(name=name, kind="script", path="x.py", steps=steps, **kw))


def _check_invariants(store, slots):
    held = [s for j in store.jobs() for s in j["slots"]]
    assert len(held) == len(set(held)), f"a slot held twice: {held}"
    assert all(0 <= s < slots for s in held)
    for j in store.jobs():
        if j["state"].terminal:
            assert j["slots"] == []


def _run(store, sched, runner, slots, ticks=400, each=None):
    for _ in range(ticks):
        sched.tick()
        _check_invariants(store, slots)
        # the slots a job holds cover the workers it really runs (old ones included while resizing)
        for j in store.jobs(active_only=True):
            fj = runner.jobs.get(j["id"])
            if j["state"] == JobState.RUNNING and fj is not None and fj.alive:
                assert len(j["slots"]) >= fj.world
        if each:
            each()
        if all(j["state"].terminal for j in store.jobs()):
            return
    raise AssertionError("jobs did not finish")


def test_third_arrival_shrinks_a_running_job_and_waits_for_the_exit(tmp_path):
    store, cfg, runner, sched = _setup(tmp_path)
    a, b = _submit(store, "a", 400), _submit(store, "b", 400)
    sched.recover()
    for _ in range(3):
        sched.tick()
    assert sum(len(j["slots"]) for j in store.jobs()) == 4  # two jobs share the 4 slots
    c = _submit(store, "c", 40)
    waited, started_while_shrinking = [], []

    def watch():
        # a shrink is in flight while the fake runner still runs the old, larger worker group
        shrinking = [j for j, fj in runner.jobs.items() if j != c and fj.alive and fj.pending
                     and fj.pending[0] < fj.world]
        started = any(s[0] == c for s in runner.starts)
        if not started and shrinking:
            waited.append(shrinking)
        if started and not started_while_shrinking:
            started_while_shrinking.append(bool(shrinking))

    _run(store, sched, runner, 4, each=watch)
    assert waited, "no shrink was ever in flight while c waited: the test exercised nothing"
    assert started_while_shrinking == [False]  # c started only after the old workers exited
    ev = store.events()
    assert any(e["kind"] == "resize_requested" and e["data"]["to"] < e["data"]["frm"] for e in ev)
    assert [j["state"] for j in store.jobs()] == [JobState.FINISHED] * 3
    causes = [d["cause"] for d in store.decisions()]
    assert causes.count("arrival") == 3 and causes.count("completion") == 3
    assert sorted(s[0] for s in runner.starts if not s[2]) == [a, b, c]  # each started once


def test_at_most_one_resize_in_flight_per_job(tmp_path):
    store, cfg, runner, sched = _setup(tmp_path, lag=6)
    _submit(store, "a", 600)
    sched.recover()
    requests = []
    orig = runner.request_resize

    def counting(job, to):
        fj = runner.jobs[job["id"]]
        assert fj.pending is None, "second resize while one is in flight"
        requests.append(to)
        return orig(job, to)

    runner.request_resize = counting
    sched.tick()
    _submit(store, "b", 100)
    _submit(store, "c", 100)
    _run(store, sched, runner, 4)
    assert requests  # resizes happened, each one alone


def test_cancel_queued_and_running_and_drain(tmp_path):
    store, cfg, runner, sched = _setup(tmp_path, slots=2, policy="eight")
    a, b = _submit(store, "a", 10 ** 6), _submit(store, "b", 10 ** 6)
    sched.recover()
    sched.tick()
    assert store.job(a)["state"] == JobState.RUNNING and store.job(b)["state"] == JobState.QUEUED
    store.update(b, cancel=1)
    sched.tick()
    assert store.job(b)["state"] == JobState.CANCELLED
    store.update(a, cancel=1)
    for _ in range(5):
        sched.tick()
    assert store.job(a)["state"] == JobState.CANCELLED and store.job(a)["slots"] == []
    c = _submit(store, "c", 10 ** 6)
    sched.tick()
    assert store.job(c)["state"] == JobState.RUNNING
    store.set_meta("down", True)
    for _ in range(10):
        if not sched.tick():
            break
    else:
        raise AssertionError("did not drain")
    assert store.job(c)["state"] == JobState.PAUSED  # checkpointed; `cluster up` resumes it


def test_cancel_right_after_the_start_ends_cancelled_not_failed(tmp_path):
    """The cancel lands after the decision that started the job and before its controller wrote
    anything (seen live under load): the controller ends with no summary and no launch."""
    store, cfg, runner, sched = _setup(tmp_path, slots=2, policy="eight")
    a = _submit(store, "a", 10 ** 6)
    sched.recover()
    sched.tick()
    assert store.job(a)["state"] == JobState.RUNNING
    store.update(a, cancel=1)
    runner.jobs[a].launches = 0
    sched.tick()  # stop requested
    runner.jobs[a].stopping = 0
    runner.jobs[a].alive, runner.jobs[a].outcome = False, None  # killed before any summary
    sched.tick()
    job = store.job(a)
    assert job["state"] == JobState.CANCELLED and job["slots"] == []
    assert [e["kind"] for e in store.events(a)][-1] == "cancelled"


def test_preempted_before_its_first_launch_goes_back_to_the_queue_not_failed(tmp_path):
    """srtf preempted a job 3 s after its start, before its controller launched workers (seen
    live): the controller ends with no summary and no launch; the job is queued again and later
    runs to the end."""
    store, cfg, runner, sched = _setup(tmp_path, slots=2, policy="eight")
    a = _submit(store, "a", 40)
    sched.recover()
    sched.tick()
    runner.jobs[a].launches = 0
    sched._stop(store.job(a), "preempt")
    runner.jobs[a].stopping = 0
    runner.jobs[a].alive, runner.jobs[a].outcome = False, None  # killed before any summary
    sched.tick()
    assert store.job(a)["state"] in (JobState.QUEUED, JobState.RUNNING)
    assert "failed" not in [e["kind"] for e in store.events(a)]
    _run(store, sched, runner, 2)
    assert store.job(a)["state"] == JobState.FINISHED


def test_a_failed_job_keeps_its_controllers_reason_and_its_run_folder(tmp_path):
    """A controller that ends on an error before any launch (a bad config key): the job is failed
    with the error's line as its message, not "controller ended with no summary"; the store knows
    its run folder from the start."""
    store, cfg, runner, sched = _setup(tmp_path, slots=2, policy="eight")
    a = _submit(store, "a", 40)
    sched.recover()
    sched.tick()
    assert store.job(a)["run_dir"] == str((tmp_path / "jobs" / str(a)).resolve())
    fj = runner.jobs[a]
    fj.launches, fj.alive, fj.outcome = 0, False, None
    fj.error = "unknown key 'bogus' (known: batch_size, depth, ...)"
    sched.tick()
    job = store.job(a)
    assert job["state"] == JobState.FAILED and job["message"] == fj.error
    fj.error = None  # and with nothing to say, the old words
    b = _submit(store, "b", 40)
    sched.tick()
    fb = runner.jobs[b]
    fb.launches, fb.alive, fb.outcome = 0, False, None
    sched.tick()
    assert store.job(b)["message"] == "controller ended with no summary"


def test_cancel_landing_after_the_decision_never_starts_the_job(tmp_path):
    """The cancel is written while the scheduler is in the tick that took the arrival (after its
    decision gave the job slots, before it starts jobs): the job is not started, then cancelled."""
    store, cfg, runner, sched = _setup(tmp_path, slots=2, policy="eight")
    sched.recover()
    a = _submit(store, "a", 10 ** 6)
    orig = sched.decide

    def decide_then_cancel(cause, jid):
        out = orig(cause, jid)
        if cause == "arrival":
            assert out[a] > 0  # the decision gave it slots
            store.update(a, cancel=1)
        return out

    sched.decide = decide_then_cancel
    sched.tick()
    assert runner.starts == [] and store.job(a)["slots"] == []
    sched.tick()
    assert store.job(a)["state"] == JobState.CANCELLED and runner.starts == []
    assert "started" not in [e["kind"] for e in store.events(a)]


def test_recovery_adopts_live_controllers_and_resumes_stopped_ones(tmp_path):
    store, cfg, runner, sched = _setup(tmp_path)
    a, b = _submit(store, "a", 300), _submit(store, "b", 300)
    sched.recover()
    for _ in range(5):
        sched.tick()
    # the scheduler is killed; job b's controller died with it (interrupted at a checkpoint)
    runner.jobs[b].alive, runner.jobs[b].outcome = False, "interrupted"
    step_b = runner.jobs[b].step
    before = len(runner.starts)
    resumed_at = []
    real_start = runner.start

    def start(job, slots, workers, resume):
        pid = real_start(job, slots, workers, resume)
        resumed_at.append((job["id"], runner.jobs[job["id"]].step))
        return pid

    runner.start = start
    sched2 = Scheduler(store, cfg, make_policy("precompute"), runner, rate_for=lambda j: (lambda w: float(w)))
    sched2.recover()
    assert any(e["kind"] == "adopted" and e["job_id"] == a for e in store.events())
    _run(store, sched2, runner, 4)
    assert [j["state"] for j in store.jobs()] == [JobState.FINISHED] * 2
    fresh = [s for s in runner.starts if not s[2]]
    assert sorted(s[0] for s in fresh) == [a, b]  # never started from scratch twice
    # after the crash: a (alive) adopted, not started again; b resumed once, from its step
    assert [(s[0], s[2]) for s in runner.starts[before:]] == [(b, True)]
    assert resumed_at == [(b, step_b)] and step_b > 0
    assert runner.jobs[b].step == 300


class _Killed(BaseException):
    """The scheduler's process ends here, as under a kill -9 at a fault point."""


def _killed_at(point):
    def fault(at):
        if at == point:
            raise _Killed(point)
    return fault


@pytest.mark.parametrize("point", ["after_store_running", "after_start"])
def test_a_kill_inside_a_start_loses_nothing_and_starts_the_job_once(tmp_path, point):
    """A start stores the job as running with its slots, starts its controller, then stores the
    pid. Killed after the first step (no controller), the restarted scheduler puts the job back in
    the queue, not in failed; after the second (a controller, no pid), it adopts the controller.
    Either way the job runs to its end, started from scratch once."""
    store, cfg, runner, sched = _setup(tmp_path, slots=2, policy="eight")
    sched.fault = _killed_at(point)
    a = _submit(store, "a", 40)
    sched.recover()
    with pytest.raises(_Killed):
        sched.tick()
    row = store.job(a)
    assert row["state"] == JobState.RUNNING and row["slots"] and row["pid"] is None  # inside the window
    assert (a in runner.jobs) == (point == "after_start")  # the controller exists only after the start
    sched2 = Scheduler(store, cfg, make_policy("eight"), runner, rate_for=lambda j: (lambda w: float(w)),
                       fault=lambda at: None)
    sched2.recover()
    kinds = [e["kind"] for e in store.events(a)]
    assert "failed" not in kinds
    if point == "after_store_running":
        assert store.job(a)["state"] == JobState.QUEUED and store.job(a)["slots"] == [] and "queued" in kinds
    else:
        assert store.job(a)["state"] == JobState.RUNNING and "adopted" in kinds
    _run(store, sched2, runner, 2)
    assert store.job(a)["state"] == JobState.FINISHED and runner.jobs[a].step == 40
    assert [(s[0], s[2]) for s in runner.starts] == [(a, False)]


def test_the_fault_point_comes_from_the_environment(monkeypatch):
    import os
    import signal

    from elastic_ring.cluster import scheduler as sm
    from elastic_ring.cluster.api import ClusterError

    kills = []
    monkeypatch.setattr(sm.os, "kill", lambda pid, sig: kills.append((pid, sig)))
    fault = sm.injected_fault({sm.FAULT_ENV: "after_start:2"})
    fault("after_store_running")
    fault("after_start")
    assert kills == []
    fault("after_start")  # the second pass
    assert kills == [(os.getpid(), signal.SIGKILL)]
    sm.injected_fault({})("after_start")
    assert len(kills) == 1
    for bad in ("nowhere", "after_start:0", "after_start:x"):
        with pytest.raises(ClusterError, match=sm.FAULT_ENV):
            sm.injected_fault({sm.FAULT_ENV: bad})


def test_bad_requests_are_user_errors(tmp_path):
    from elastic_ring.cluster.api import ClusterError

    with pytest.raises(ClusterError):
        JobRequest(name="x", kind="script", path="x.py", steps=None)
    with pytest.raises(ClusterError):
        JobRequest(name="x", kind="script", path="x.py", steps=5, min_workers=3, max_workers=2)
    with pytest.raises(ClusterError):
        ClusterConfig(hosts=(("localhost", 2),), policy="nope")
    with pytest.raises(ClusterError):
        Store(tmp_path / "none")


# ---------------------------------------------------------------- resize costs (issue 22, point 3)
def test_resize_costs_own_median_then_cluster_median_then_default():
    from elastic_ring.sched.resize_cost import ResizeCosts, default_resize_cost

    c = ResizeCosts(3.5)
    assert c.cost(1) == (3.5, "default")
    assert c.add(1, 2.0) and c.add(1, 9.0) and c.add(1, 4.0)
    assert not c.add(1, float("nan")) and not c.add(1, -1.0) and not c.add(1, "x")
    assert c.cost(1) == (4.0, "job")  # the median: one slow resize does not dominate
    assert c.cost(2) == (4.0, "cluster")  # no measurement of its own yet: every job's median
    c.add(2, 1.0)
    assert c.cost(2) == (1.0, "job") and c.table([1, 2, 3]) == {1: 4.0, 2: 1.0, 3: 3.0}
    assert default_resize_cost("cuda") == 10.0 and default_resize_cost("cpu") == 3.5


def _grow_after_completion(tmp_path, lost_s: float | None):
    """a (500 steps) runs alone on 4 slots, b (20 steps) arrives: a shrinks to 2 (a resize that
    reports ``lost_s`` seconds lost), b ends: precompute-rc decides whether a grows back to 4."""
    store, cfg, runner, sched = _setup(tmp_path, policy="precompute-rc")
    a = _submit(store, "a", 500)
    if lost_s is not None:
        runner.lost[a] = lost_s
    sched.recover()
    sched.tick()
    _submit(store, "b", 20)
    _run(store, sched, runner, 4)
    grows = [e for e in store.events(a) if e["kind"] == "resize_requested" and e["data"]["to"] > e["data"]["frm"]]
    return store, sched, a, grows


def test_rc_policy_uses_each_jobs_measured_resize_cost(tmp_path):
    # a costly measured resize (1000 s): growing a for the rest of its run does not pay -> vetoed
    store, sched, a, grows = _grow_after_completion(tmp_path / "slow", 1000.0)
    assert sched.resize_costs.cost(a) == (1000.0, "job")
    assert not grows
    veto = [e for e in store.events(a) if e["kind"] == "grow_vetoed"]
    assert veto and veto[0]["data"]["cost_source"] == "job" and veto[0]["data"]["resize_cost_s"] == 1000.0
    assert veto[0]["data"]["held"] == 2 and veto[0]["data"]["asked"] == 4
    # a cheap one (1 ms): the same grow pays and happens
    store, sched, a, grows = _grow_after_completion(tmp_path / "fast", 0.001)
    assert sched.resize_costs.cost(a) == (0.001, "job")
    assert grows and not [e for e in store.events(a) if e["kind"] == "grow_vetoed"]


def test_rc_policy_falls_back_to_the_default_cost_before_a_measurement(tmp_path):
    # no resize_overhead event ever: the default (3.5 s on CPU) decides; a 500-step job at ~2-4
    # steps/s has ~100 s left, so growing 2 -> 4 pays against 3.5 s
    store, sched, a, grows = _grow_after_completion(tmp_path, None)
    assert sched.resize_costs.cost(a) == (3.5, "default")
    assert grows


def test_cluster_up_offers_the_rc_policies():
    from elastic_ring.cluster.scheduler import live_policy

    p = live_policy("srtf-rc", 4, "cuda")
    assert p.name == "srtf-rc" and p.resize_cost_s == 10.0
    assert ClusterConfig(hosts=(("localhost", 2),), policy="optimus-rc").policy == "optimus-rc"


def test_a_shrink_pins_the_job_to_the_slots_it_keeps_before_its_new_workers_launch(tmp_path):
    """The new workers of a shrink take their threads from the affinity they launch with: the job
    must be on the cores it keeps when the resize is asked for, not only after the old ones exit."""
    store, cfg, runner, sched = _setup(tmp_path)
    pins = []  # (job, slots, the fake controller's resize pending at that moment)
    runner.pin = lambda job, slots: pins.append((job["id"], list(slots), runner.jobs[job["id"]].pending)) or True
    a = _submit(store, "a", 400)
    sched.recover()
    for _ in range(3):
        sched.tick()
    assert len(store.job(a)["slots"]) == 4
    _submit(store, "b", 400)
    for _ in range(3):
        sched.tick()
    asked = [e for e in store.events(a) if e["kind"] == "resize_requested"]
    assert asked and asked[0]["data"]["to"] < 4
    to = asked[0]["data"]["to"]
    first = next(p for p in pins if p[0] == a)
    assert first[1] == [0, 1, 2, 3][:to] and first[2] is None  # pinned before the request
    # a refused request puts it back on all its slots
    pins.clear()
    runner.refuse_resize = True
    _submit(store, "c", 400)
    for _ in range(6):
        sched.tick()
    mine = [p[1] for p in pins if p[0] == a]
    assert len(mine) >= 2 and len(mine[0]) < len(store.job(a)["slots"])  # asked, refused
    assert mine[-1] == store.job(a)["slots"]  # back on every slot it still holds
