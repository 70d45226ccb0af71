"""`exploratory` live, with the fake runner: a new job holds min(8, S) slots (a power of two), is
resized through 1, 2, 4, 8 on them, measured from its own throughput windows (the first after
each launch skipped), and planned with the Eq. 5 fit; the invariants hold throughout."""

from __future__ import annotations

import json

import pytest

from elastic_ring.cluster.api import ClusterConfig, ClusterError, JobRequest, JobRow, JobState
from elastic_ring.cluster.runner import ProcessRunner, run_dir
from elastic_ring.cluster.scheduler import EXPLORE_WINDOWS, Scheduler, explore_hold, explore_sizes, live_policy
from elastic_ring.cluster.store import Store
from elastic_ring.perfmodel.speed import SpeedModel, fit_speed_few
from elastic_ring.sched.policies import Exploratory, doubling_allocate

from .test_cluster_scheduler import FakeRunner, _run, _submit


def _row(jid: int) -> JobRow:
    """A job row as the store gives it (queued, never started)."""
    return JobRow(id=jid, name="j", request=JobRequest(name="j", kind="script", path="x.py", steps=10),
                  state=JobState.QUEUED, submitted=0.0)

TRUE = SpeedModel(t0=0.0, t1=0.004, t2=0.03, t3=0.02, m=1.0, n=1.0)  # steps/s falls from 50 at 1 worker


def _setup(tmp_path, slots=8, device="cpu", lag=2):
    store = Store(tmp_path, create=True, clock=lambda: 0.0)
    cfg = ClusterConfig(hosts=(("localhost", slots),), policy="exploratory", device=device)
    runner = FakeRunner(lag, speed=lambda w: float(TRUE.predict(w)))
    clock = iter(range(10 ** 6))
    sched = Scheduler(store, cfg, live_policy("exploratory", slots), runner,
                      rate_for=lambda j: (lambda w: float(w)), clock=lambda: float(next(clock)))
    return store, cfg, runner, sched


def _kinds(store, jid, *kinds):
    return [e for e in store.events(jid) if e["kind"] in kinds]


def _tick_until(sched, done, ticks: int = 200) -> None:
    """Scheduler passes until ``done()`` holds (at most ``ticks``)."""
    for _ in range(ticks):
        sched.tick()
        if done():
            return


def test_hold_and_sizes():
    assert [explore_hold(s) for s in (1, 2, 3, 4, 6, 8, 16)] == [1, 2, 2, 4, 4, 8, 8]
    assert explore_sizes(8, 1) == [1, 2, 4, 8] and explore_sizes(8, 3) == [4, 8] and explore_sizes(4, 5) == []
    assert live_policy("exploratory", 6).explore_gpus == 4


def test_exploration_sequence_fit_and_doubling(tmp_path):
    store, cfg, runner, sched = _setup(tmp_path)
    a = _submit(store, "a", 10 ** 6)
    sched.recover()
    slots_while_exploring = []
    for _ in range(200):
        sched.tick()
        if not _kinds(store, a, "explore_fit"):
            slots_while_exploring.append(len(store.job(a)["slots"]))
        else:
            break
    else:
        raise AssertionError("exploration did not finish")
    assert set(slots_while_exploring) == {8}  # it holds 8 slots while it measures
    assert [e["data"]["to"] for e in _kinds(store, a, "explore_step")] == [1, 2, 4, 8]
    assert runner.starts == [(a, 1, False)]  # one start, then live resizes
    measured = {e["data"]["workers"]: e["data"]["steps_per_s"] for e in _kinds(store, a, "explore_measured")}
    assert sorted(measured) == [1, 2, 4, 8]
    for w, f in measured.items():  # the 10x-slow warm-up windows are not in the measurement
        assert f == pytest.approx(TRUE.predict(w), rel=1e-9)
    assert all(e["data"]["windows"] == EXPLORE_WINDOWS for e in _kinds(store, a, "explore_measured"))
    fit = _kinds(store, a, "explore_fit")[0]["data"]
    assert fit["method"] == "eq5"
    model = SpeedModel.from_dict(fit["model"])
    for w in (1, 3, 8, 16):
        assert model.predict(w) == pytest.approx(TRUE.predict(w), rel=1e-6)
    assert store.decisions()[-1]["cause"] == "explored"
    # a second job arrives: it explores on 8 slots first, the measured job shares nothing (0 left)
    b = _submit(store, "b", 10 ** 6)
    for _ in range(3):
        sched.tick()
    last = store.decisions()[-1]
    assert last["cause"] == "arrival" and last["allocation"] == {a: 0, b: 8}


def test_fitted_rate_drives_the_doubling(tmp_path):
    store, cfg, runner, sched = _setup(tmp_path, slots=16)
    a = _submit(store, "a", 10 ** 6)
    sched.recover()
    _tick_until(sched, lambda: _kinds(store, a, "explore_fit"))
    model = SpeedModel.from_dict(_kinds(store, a, "explore_fit")[0]["data"]["model"])
    alloc = store.decisions()[-1]["allocation"]
    q = max(10 ** 6 - store.job(a)["step"], 1)
    expect = doubling_allocate([(a, float(q), lambda w: float(model.predict(w)))], 16)
    assert alloc == expect
    # with the slower-at-width model, doubling never pays: a single job drops to 1 slot
    assert alloc == {a: 1}


@pytest.mark.parametrize("slots,sizes,method", [(4, [1, 2, 4], "eq5-3-terms"), (2, [1, 2], "eq5-2-terms"),
                                                (1, [1], "eq5-1-terms")])
def test_small_node_explores_up_to_its_slots(tmp_path, slots, sizes, method):
    store, cfg, runner, sched = _setup(tmp_path, slots=slots)
    a = _submit(store, "a", 10 ** 6)
    sched.recover()
    _tick_until(sched, lambda: _kinds(store, a, "explore_fit"))
    assert [e["data"]["to"] for e in _kinds(store, a, "explore_step")] == sizes
    fit = _kinds(store, a, "explore_fit")[0]["data"]
    assert fit["method"] == method
    model = SpeedModel.from_dict(fit["model"])
    for w in sizes:  # the reduced fit reproduces what it measured
        assert model.predict(w) == pytest.approx(TRUE.predict(w), rel=1e-6)


def test_gpu_node_explores_by_stop_and_resume_on_held_slots(tmp_path):
    store, cfg, runner, sched = _setup(tmp_path, slots=4, device="cuda")
    a = _submit(store, "a", 10 ** 6)
    sched.recover()
    for _ in range(200):
        sched.tick()
        held = store.job(a)["slots"]
        assert len(held) in (0, 4)  # all 4 while it runs; none only between a stop and the resume
        if _kinds(store, a, "explore_fit"):
            break
    assert runner.starts == [(a, 1, False), (a, 2, True), (a, 4, True)]
    assert _kinds(store, a, "explore_fit")[0]["data"]["method"] == "eq5-3-terms"


def test_invariants_with_explorers_arriving(tmp_path):
    store, cfg, runner, sched = _setup(tmp_path, slots=8, lag=3)
    orig = runner.request_resize
    asked = []

    def one_at_a_time(job, to):
        assert runner.jobs[job["id"]].pending is None, "second resize while one is in flight"
        asked.append((job["id"], to))
        return orig(job, to)

    runner.request_resize = one_at_a_time
    ids = [_submit(store, "a", 300)]
    sched.recover()
    for _ in range(4):
        sched.tick()
    ids += [_submit(store, "b", 120), _submit(store, "c", 60)]
    _run(store, sched, runner, 8, ticks=1000)  # checks: no slot held twice, slots cover the workers
    assert [j["state"] for j in store.jobs()] == [JobState.FINISHED] * 3
    assert asked
    for jid in ids:
        steps = [e["data"]["to"] for e in _kinds(store, jid, "explore_step")]
        assert steps[0] == 1 and steps == sorted(steps)
    assert any(d["cause"] == "explored" for d in store.decisions())


def test_restart_continues_an_exploration(tmp_path):
    store, cfg, runner, sched = _setup(tmp_path)
    a = _submit(store, "a", 10 ** 6)
    sched.recover()
    _tick_until(sched, lambda: len(_kinds(store, a, "explore_measured")) == 2)
    sched2 = Scheduler(store, cfg, live_policy("exploratory", 8), runner, rate_for=lambda j: (lambda w: float(w)))
    sched2.recover()
    _tick_until(sched2, lambda: _kinds(store, a, "explore_fit"))
    assert sorted(e["data"]["workers"] for e in _kinds(store, a, "explore_measured")) == [1, 2, 4, 8]
    assert [e["data"]["to"] for e in _kinds(store, a, "explore_step")] == [1, 2, 4, 8]


def test_runner_reads_throughput_windows_with_launch_counts(tmp_path):
    cfg = ClusterConfig(hosts=(("localhost", 4),), policy="exploratory")
    runner = ProcessRunner(tmp_path, cfg)
    rd = run_dir(tmp_path, 7)
    rd.mkdir(parents=True)
    ev = [{"kind": "launch", "world_size": 1},
          {"kind": "throughput", "world_size": 1, "steps": 20, "seconds": 4.0, "steps_per_s": 5.0, "step": 20},
          {"kind": "throughput", "world_size": 1, "steps": 20, "seconds": 1.0, "steps_per_s": 20.0, "step": 40},
          {"kind": "launch", "world_size": 2},
          {"kind": "throughput", "world_size": 2, "steps": 10, "seconds": 1.0, "steps_per_s": 10.0, "step": 50}]
    (rd / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in ev))
    job = _row(7)
    obs = runner.observe(job)
    assert obs.throughput == [(1, 1, 20, 4.0), (1, 1, 20, 1.0), (2, 2, 10, 1.0)]
    assert runner.observe(job).throughput == []  # only new windows


def test_few_point_fit_and_bad_input():
    from elastic_ring.perfmodel.speed import FitError

    fit, method = fit_speed_few([1, 2, 4], [TRUE.predict(w) for w in (1, 2, 4)], 1.0, 1.0)
    assert method == "eq5-3-terms" and fit.model.predict(8) == pytest.approx(TRUE.predict(8), rel=1e-6)
    with pytest.raises(FitError):
        fit_speed_few([], [], 1.0, 1.0)
    with pytest.raises(FitError):
        fit_speed_few([1, 2], [1.0, -1.0], 1.0, 1.0)


def test_exploratory_needs_its_hold(tmp_path):
    store = Store(tmp_path, create=True)
    cfg = ClusterConfig(hosts=(("localhost", 4),), policy="exploratory")
    with pytest.raises(ClusterError):
        Scheduler(store, cfg, Exploratory(8), FakeRunner(), rate_for=lambda j: (lambda w: float(w)))


def test_a_job_whose_steps_get_faster_with_workers_is_planned_wider(tmp_path):
    """A fixed global batch (examples/paced.py): steps/s rises with w, which Eq. 5 on steps/s
    cannot follow (it fitted a constant, and doubling never grew such a job live). The fit on
    steps/s per worker, rate w·f(w) (the simulator's exploration), reproduces it: the lone job
    gets all 4 slots; a restarted scheduler plans it the same way from the stored fit."""
    from elastic_ring.cluster.scheduler import fit_explored

    speed = lambda w: 3.3 * w * 0.9 ** (w - 1)  # noqa: E731
    store, cfg, runner, sched = _setup(tmp_path, slots=4)
    runner.speed = speed
    a = _submit(store, "a", 10 ** 6)
    sched.recover()
    _tick_until(sched, lambda: _kinds(store, a, "explore_fit"))
    fit = _kinds(store, a, "explore_fit")[0]["data"]
    assert fit["per_worker"] is True
    assert store.decisions()[-1]["cause"] == "explored" and store.decisions()[-1]["allocation"] == {a: 4}
    for w in (1, 2, 4):
        assert sched._rate(store.job(a))(w) == pytest.approx(speed(w), rel=0.02)
    again = Scheduler(store, cfg, live_policy("exploratory", 4), runner, rate_for=lambda j: (lambda w: 1.0))
    assert again._rate(store.job(a))(4) == pytest.approx(speed(4), rel=0.02)
    # a fixed per-worker batch (steps/s falls): Eq. 5 on steps/s, as before
    model, method, per_worker, rmse = fit_explored([1, 2, 4], [float(TRUE.predict(w)) for w in (1, 2, 4)])
    assert not per_worker and method == "eq5-3-terms" and rmse < 1e-9
