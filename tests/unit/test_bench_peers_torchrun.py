"""scripts/bench_peers.py's torchrun resize harnesses, without launching anything: the relaunch
plan, the time lost read from step records (work redone after a stop), the per-resize phases, and
the commands (the elastic agents opt out of the shared rendezvous store, without which a joining
agent times out)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from tests.conftest import ROOT, load_module


@pytest.fixture(scope="module")
def bp():
    return load_module(ROOT / "scripts" / "bench_peers.py")


def _args() -> argparse.Namespace:
    return argparse.Namespace(depth=20, width=8, batch_size=32, device="cpu", resize_steps=15)


def _step(world: int, step: int, t: float) -> dict:
    return {"kind": "step", "world": world, "step": step, "time": t}


def test_relaunch_plan(bp):
    assert bp.relaunch_plan(15, True) == [(1, 15), (2, 30), (1, None)]
    assert bp.relaunch_plan(15, False) == [(1, None)]


def test_losses_of_a_stop_and_relaunch(bp):
    # x1: steps 1-17 one a second (16 and 17 done after the checkpoint at 15, before the stop);
    # x2 resumes at 16 at t=30, 0.5 s a step
    recs = [_step(1, i, float(i)) for i in range(1, 18)]
    recs.append({"kind": "ckpt", "world": 1, "step": 15, "time": 15.1})
    recs.append({"kind": "start", "world": 2, "step": 15, "time": 29.0})
    recs += [_step(2, 16 + k, 30.0 + 0.5 * k) for k in range(6)]
    (z,) = bp._losses(recs)
    assert (z["from"], z["to"], z["redone_steps"]) == (1, 2, 2)
    assert z["lost_s"] == pytest.approx(30.0 - 15.0 - 0.5)


def test_relaunch_phases(bp):
    marks = [{"ckpt": 10.0, "seen": 10.2, "stopped": 12.0, "launched": 12.1}]
    recs = [_step(1, 15, 9.9), {"kind": "start", "world": 2, "step": 15, "time": 20.0}, _step(2, 16, 21.5)]
    (ph,) = bp.relaunch_phases(marks, recs)
    assert ph["seen_s"] == pytest.approx(0.2) and ph["stop_s"] == pytest.approx(1.8)
    assert ph["relaunch_s"] == pytest.approx(0.1) and ph["start_record_s"] == pytest.approx(7.9)
    assert ph["first_step_s"] == pytest.approx(1.5)
    assert bp.relaunch_phases([{"ckpt": 1.0, "seen": 1.0, "stopped": 2.0}], recs) == []  # never relaunched


def test_commands(bp, tmp_path: Path):
    a = _args()
    cmd = bp._torchrun_standalone(a, tmp_path / "o", tmp_path, 2, 45, [15, 30])
    assert "--standalone" in cmd and cmd[cmd.index("--nproc-per-node") + 1] == "2"
    assert cmd[cmd.index("--ckpt-at") + 1] == "15,30" and cmd[cmd.index("--steps") + 1] == "45"
    el = bp._torchrun(a, tmp_path / "o", tmp_path, 29555, 145)
    assert el[el.index("--nnodes") + 1] == "1:2" and el[el.index("--rdzv-backend") + 1] == "c10d"


def test_run_driven(bp, tmp_path: Path):
    """The harness runner: hands back what ``drive`` found; a failure raises with the log's tail;
    a process still running when ``drive`` gives up is killed with its group."""
    import sys

    py = sys.executable
    t0, wall, got = bp._run_driven([py, "-c", "print('ok')"], {}, tmp_path / "a.log", "ok", lambda p: p.pid)
    assert wall >= 0 and isinstance(got, int) and (tmp_path / "a.log").read_text() == "ok\n"
    with pytest.raises(bp.BenchError, match=r"(?s)bad failed \(status 3\):\n.*the tail"):
        bp._run_driven([py, "-c", "print('the tail'); raise SystemExit(3)"], {}, tmp_path / "b.log", "bad")
    seen = []

    def give_up(proc):
        seen.append(proc)
        raise bp.BenchError("gave up")

    with pytest.raises(bp.BenchError, match="gave up"):
        bp._run_driven([py, "-c", "import time; time.sleep(60)"], {}, tmp_path / "c.log", "slow", give_up)
    assert seen[0].returncode is not None  # killed and reaped, not left running
