"""The controller's state machine driven by a fake launcher: no processes, no Horovod.

The fake "horovodrun" reads the same arguments the real one would pass to the workers
(--segment, --stop-at, --go-file, -np) and writes the events a rank 0 would write.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from elastic_ring.controller.api import Resize, RunSpec, RunState
from elastic_ring.controller.controller import Controller
from elastic_ring.errors import WorkerFailedError
from elastic_ring.events import EventLog, read_events
from elastic_ring.train.worker import WORKER_EVENTS


class FakeWorkers:
    def __init__(self, run_dir: Path, cmd: list[str], state: dict, fail_rank: int | None) -> None:
        arg = lambda name: cmd[cmd.index(name) + 1] if name in cmd else None  # noqa: E731
        self.run_dir, self.state, self.fail_rank = run_dir, state, fail_rank
        self.world = int(arg("-np"))
        self.segment = int(arg("--segment"))
        self.stop_at = int(arg("--stop-at"))
        self.go = Path(arg("--go-file")) if arg("--go-file") else None
        self.pid = 10_000 + self.segment
        self.polls = 0
        self.rc: int | None = None
        self.log = EventLog(run_dir / WORKER_EVENTS)

    def poll(self) -> int | None:
        if self.rc is not None:
            return self.rc
        if self.go is not None and not self.go.exists():
            return None  # pre-launched, waiting for its go
        if self.go is not None:
            self.stop_at = json.loads(self.go.read_text())["stop_at"]
        self.polls += 1
        if self.polls < 2:
            return None
        if self.fail_rank is not None:
            (self.run_dir / "logs").mkdir(exist_ok=True)
            (self.run_dir / "logs" / f"error-rank{self.fail_rank}.json").write_text(json.dumps(
                {"rank": self.fail_rank, "type": "ValueError", "message": "boom", "time": 1e18}))
            self.rc = 1
            return self.rc
        start = self.state["step"] + 1
        lr = 0.1 * self.world
        if self.polls > 2:
            return self._stop(start, lr)
        self.log.write({"kind": "first_step", "segment": self.segment, "world_size": self.world,
                        "step": start, "since_launch_s": 1.0, "lr": lr, "time": time.time()})
        self.log.write({"kind": "throughput", "segment": self.segment, "world_size": self.world,
                        "step": self.stop_at, "steps": self.stop_at - start, "seconds": 1.0,
                        "images_per_s": 100.0 * self.world, "steps_per_s": 10.0, "loss": 1.0,
                        "lr": lr, "epoch": 0, "time": time.time()})
        return None  # training: the controller sees a window before the stop

    def _stop(self, start: int, lr: float) -> int | None:
        if self.polls < 5:
            return None
        self.log.write({"kind": "checkpoint_written", "step": self.stop_at, "path": "x", "seconds": 0.01,
                        "bytes": 1, "world_size": self.world, "lr": lr, "time": time.time()})
        reason = "finished" if self.stop_at >= self.state["total"] else "scheduled"
        self.log.write({"kind": "segment_end", "segment": self.segment, "world_size": self.world,
                        "step": self.stop_at, "reason": reason, "lr": lr,
                        "stop_decided_at": time.time(), "time": time.time()})
        self.state["step"] = self.stop_at
        self.rc = 0
        return None  # checkpoint written; the process exits at the next poll

    def kill(self) -> None:
        self.rc = -9


class FakeLauncher:
    def __init__(self, run_dir: Path, total: int, fail_segment: int | None = None) -> None:
        self.run_dir = run_dir
        self.state = {"step": 0, "total": total}
        self.started: list[FakeWorkers] = []
        self.fail_segment = fail_segment

    def start(self, cmd, env, log_path):
        seg = int(cmd[cmd.index("--segment") + 1])
        w = FakeWorkers(self.run_dir, cmd, self.state, 1 if seg == self.fail_segment else None)
        self.started.append(w)
        return w


def _controller(tmp_path, schedule, relaunch="sequential", fail_segment=None, total=30):
    spec = RunSpec(run_dir=tmp_path, workers=1, schedule=schedule, slots=4, device="cpu",
                   total_steps=total)
    spec.validate()
    launcher = FakeLauncher(tmp_path, total, fail_segment)
    ctl = Controller(spec, launcher=launcher, out=lambda s: None, poll_s=0.0,
                     show_progress=False, relaunch=relaunch)
    return ctl, launcher


@pytest.mark.parametrize("mode", ["sequential", "overlap", "prelaunch"])
def test_schedule_runs_three_segments_with_eq7(tmp_path, mode):
    ctl, launcher = _controller(tmp_path, (Resize(10, 2), Resize(20, 1)), relaunch=mode)
    summary = ctl.run(0, 1, 0)
    assert ctl.state is RunState.SUCCEEDED and summary["state"] == "finished"
    assert [(w.segment, w.world, w.stop_at) for w in launcher.started] == [(0, 1, 10), (1, 2, 20), (2, 1, 30)]
    ev = read_events(tmp_path / "events.jsonl")
    rel = [e for e in ev if e["kind"] == "relaunched"]
    assert [(r["from_workers"], r["to_workers"], r["step"]) for r in rel] == [(1, 2, 10), (2, 1, 20)]
    assert rel[0]["lr_new"] == pytest.approx(2 * rel[0]["lr_last"])
    assert rel[1]["lr_new"] == pytest.approx(0.5 * rel[1]["lr_last"])
    assert len([e for e in ev if e["kind"] == "resize_overhead"]) == 2
    assert len([e for e in ev if e["kind"] == "workers_exited"]) == 3
    assert [e["kind"] for e in ev][-1] == "finished"
    if mode == "prelaunch":
        assert all(w.go is not None for w in launcher.started[1:])
        assert all(e["prelaunched_s"] >= 0 for e in ev if e["kind"] == "launch")


def test_worker_failure_names_rank_and_cause(tmp_path):
    ctl, _ = _controller(tmp_path, (Resize(10, 2),), fail_segment=1)
    with pytest.raises(WorkerFailedError, match="worker rank 1 failed: ValueError: boom") as ei:
        ctl.run(0, 1, 0)
    assert ei.value.rank == 1
    assert ctl.state is RunState.FAILED
    errors = read_events(tmp_path / "events.jsonl", kind="error")
    assert errors and errors[0]["rank"] == 1
    state = json.loads((tmp_path / "controller.json").read_text())
    assert state["state"] == "failed"
