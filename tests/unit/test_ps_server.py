"""The server loop (:class:`elastic_ring.ps.server.Server`) without MPI: the in-process transport
on the virtual clock, and a round-robin transport for the wall-clock path. Tiny MLP runs (a
fraction of a second each); the real mpirun jobs are in tests/integration/test_ps_mpirun.py."""

from __future__ import annotations

import pytest

from elastic_ring.events.api import read_events
from elastic_ring.ps.api import PSConfig
from elastic_ring.ps.inprocess import run_inprocess
from elastic_ring.ps.server import Server

TINY = dict(workers=2, slowdown=(1.0, 2.0), base_step_s=0.08, noise=0.1, model="mlp", width=16, batch_size=16,
            lr=0.002, clock="virtual", eval_every_s=0.25, time_budget_s=2.0)
TIMING = {"time", "real_s", "eval_s", "compute_s", "max_compute_s", "wall_s", "blocked_s"}  # the machine's


def run(tmp_path, name: str, **kw) -> list[dict]:
    d = tmp_path / name
    d.mkdir()
    run_inprocess(PSConfig(**{**TINY, **kw}), d)
    return read_events(d / "events.jsonl")


def without_timing(ev: list[dict]) -> list[dict]:
    return [{k: v for k, v in e.items() if k not in TIMING} for e in ev]


def test_events_are_a_function_of_config_and_seed_and_in_order(tmp_path):
    kw = dict(sync="dssp-exact", staleness="1:3", workers=3, slowdown=(1.0, 1.5, 3.0))
    ev = run(tmp_path, "a", **kw)
    assert without_timing(ev) == without_timing(run(tmp_path, "b", **kw))
    kinds = [e["kind"] for e in ev]
    assert kinds[0] == "ps_launch" and kinds[-1] == "ps_finished"
    assert kinds[-4:-1] == ["ps_worker_summary"] * 3
    assert {"ps_push", "ps_controller", "ps_hold", "ps_release", "ps_accuracy"} <= set(kinds)
    fin = ev[-1]
    pushes = [e for e in ev if e["kind"] == "ps_push"]
    assert fin["reason"] == "time_budget" and fin["wall_s"] == TINY["time_budget_s"]
    assert fin["version"] == len(pushes) and fin["max_release_gap"] <= 3 == fin["release_bound"]
    assert [e["version_applied"] for e in pushes] == list(range(len(pushes)))
    assert all(e["target_s"] > 0 and e["t"] <= TINY["time_budget_s"] for e in pushes)
    held: set[int] = set()  # a held worker does not push until a release
    for e in ev:
        if e["kind"] == "ps_push":
            assert e["worker"] not in held
        elif e["kind"] == "ps_hold":
            held.add(e["worker"])
        elif e["kind"] == "ps_release":
            held.remove(e["worker"])


def test_deferred_evaluation_sees_the_weights_of_the_same_points(tmp_path):
    now = run(tmp_path, "now", sync="ssp", staleness="1")
    later = run(tmp_path, "later", sync="ssp", staleness="1", eval_deferred=True)

    def acc(ev):
        return [(e["t"], e["version"], e["test_accuracy"], e["pushes"]) for e in ev if e["kind"] == "ps_accuracy"]

    def trace(ev):
        return [e for e in without_timing(ev) if e["kind"] in ("ps_push", "ps_hold", "ps_release")]

    assert len(acc(now)) == 9 and acc(now) == acc(later)  # t = 0, 0.25, ..., 2.0
    assert trace(now) == trace(later)
    assert [e["kind"] for e in later].index("ps_accuracy") > [e["kind"] for e in later].index("ps_push")


@pytest.mark.parametrize("stop,reason", [
    (dict(max_pushes=25, time_budget_s=0.0, eval_every_s=0.0, eval_every_updates=10), "max_pushes"),
    (dict(stop_accuracy=0.4), "stop_accuracy"),
    (dict(time_budget_s=1.0), "time_budget"),
])
def test_stop_conditions(tmp_path, stop, reason):
    ev = run(tmp_path, reason, sync="dssp", staleness="1:4", **stop)
    fin = ev[-1]
    acc = [e for e in ev if e["kind"] == "ps_accuracy"]
    assert fin["reason"] == reason
    if reason == "max_pushes":
        assert fin["version"] == 25 and [a["version"] for a in acc] == [0, 10, 20, 25]
    if reason == "stop_accuracy":  # the first evaluation on the grid that reaches it ends the run
        assert acc[-1]["test_accuracy"] >= 0.4 and fin["wall_s"] == acc[-1]["t"] < 2.0
        assert all(a["test_accuracy"] < 0.4 for a in acc[:-1])
    if reason == "time_budget":
        assert fin["wall_s"] == 1.0 and acc[-1]["t"] == 1.0


class RoundRobin:
    """Wall-clock transport: the workers that hold an OK push in turn (lowest rank first after the
    last pusher), with real gradients."""

    def __init__(self, cfg: PSConfig) -> None:
        from elastic_ring.ps.worker import WorkerCompute

        self.work = {w: WorkerCompute(cfg, w) for w in range(1, cfg.workers + 1)}
        self.pulled: dict[int, tuple] = {}
        self.last = 0

    def barrier(self) -> None:
        pass

    def send_ok(self, w: int, payload: tuple) -> None:
        self.pulled[w] = payload

    def recv_push(self, due: int | None = None) -> tuple[int, dict]:
        assert due is None  # the wall clock takes whichever push comes
        ready = sorted(self.pulled)
        w = next((q for q in ready if q > self.last), ready[0])
        self.last = w
        version, weights, buffers = self.pulled.pop(w)
        grad, bufs, loss, compute = self.work[w].gradient(weights, buffers)
        return w, dict(grad=grad, buffers=bufs, version=version, loss=loss, compute_s=compute, sleep_s=0.0,
                       target_s=0.5)

    def stop(self, workers: list[int]) -> dict[int, dict]:
        return {w: dict(compute_s=0.0, sleep_s=0.0, blocked_s=0.0, wall_s=0.0) for w in workers}


def test_wall_clock_loop_with_a_fake_transport(tmp_path):
    cfg = PSConfig(**{**TINY, "clock": "wall", "sync": "bsp", "max_pushes": 12, "time_budget_s": 0.0,
                      "eval_every_s": 0.0, "eval_every_updates": 5})
    Server(cfg, tmp_path, RoundRobin(cfg)).serve()
    ev = read_events(tmp_path / "events.jsonl")
    fin = ev[-1]
    pushes = [e for e in ev if e["kind"] == "ps_push"]
    assert fin["reason"] == "max_pushes" and fin["version"] == 12 and fin["clock"] == "wall"
    assert [e["worker"] for e in pushes] == [1, 2] * 6
    assert all(e["target_s"] == 0.5 for e in pushes)  # the worker's own target on the wall clock
    assert fin["max_release_gap"] == 0 and fin["pushes"] == {"1": 6, "2": 6}
    assert [a["version"] for a in ev if a["kind"] == "ps_accuracy"] == [0, 5, 10, 12]
    assert len([e for e in ev if e["kind"] == "ps_hold"]) == 6  # BSP: worker 1 waits for 2 every round
