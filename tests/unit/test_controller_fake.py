"""The controller's state machine driven by a fake launcher: no processes, no Horovod.

The fake "horovodrun" reads the same arguments the real one would pass to the workers
(--segment, --stop-at, --go-file, -np) and writes the events a rank 0 would write.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from elastic_ring.ckpt import CheckpointStore
from elastic_ring.controller.api import (TRANSITIONS, IllegalTransition, Plan, Resize, RunSpec,
                                         RunState, check_transition)
from elastic_ring.controller.controller import Controller
from elastic_ring.errors import WorkerFailedError
from elastic_ring.events import (CheckpointWritten, EventLog, FirstStep, SegmentEnd, Throughput,
                                 read_events)
from elastic_ring.protocol import WORKER_EVENTS


class FakeWorkers:
    def __init__(self, run_dir: Path, cmd: list[str], state: dict, fail_rank: int | None) -> None:
        arg = lambda name: cmd[cmd.index(name) + 1] if name in cmd else None  # noqa: E731
        self.run_dir, self.state, self.fail_rank = run_dir, state, fail_rank
        self.world = int(arg("-np"))
        self.segment = int(arg("--segment"))
        self.stop_at = int(arg("--stop-at"))
        self.go = Path(arg("--go-file")) if arg("--go-file") else None
        self.cmd_line = " ".join(cmd)
        self.pid = 10_000 + self.segment
        self.launched_at_step = state["step"]  # the last checkpointed step when this group started
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
                {"rank": self.fail_rank, "type": "ValueError", "message": "ValueError: boom",
                 "time": time.time(), "step": self.state["step"] + 1}))
            self.rc = 1
            return self.rc
        start = self.state["step"] + 1
        lr = 0.1 * self.world
        if self.polls > 2:
            return self._stop(start, lr)
        self.log.write(FirstStep(segment=self.segment, world_size=self.world, step=start,
                                 since_launch_s=1.0, lr=lr))
        self.log.write(Throughput(segment=self.segment, world_size=self.world, step=self.stop_at,
                                  steps=self.stop_at - start, seconds=1.0, images_per_s=100.0 * self.world,
                                  steps_per_s=10.0, loss=1.0, lr=lr, epoch=0))
        return None  # training: the controller sees a window before the stop

    def _stop(self, start: int, lr: float) -> int | None:
        if self.polls < 5:
            return None
        self.log.write(CheckpointWritten(step=self.stop_at, path="x", seconds=0.01, bytes=1,
                                         world_size=self.world, lr=lr))
        reason = "finished" if self.stop_at >= self.state["total"] else "scheduled"
        self.log.write(SegmentEnd(segment=self.segment, world_size=self.world, step=self.stop_at,
                                  reason=reason, lr=lr, stop_decided_at=time.time()))
        self.state["step"] = self.stop_at
        CheckpointStore(self.run_dir / "checkpoints").save({"step": self.stop_at, "world_size": self.world})
        self.rc = 0
        return None  # checkpoint written; the process exits at the next poll

    def kill(self) -> None:
        self.rc = -9


class FakeLauncher:
    """Starts fake worker groups; the launches numbered in ``fail_launches`` fail (rank 1 raises)."""

    def __init__(self, run_dir: Path, total: int, fail_launches: tuple[int, ...] = ()) -> None:
        self.run_dir = run_dir
        self.state = {"step": 0, "total": total}
        self.started: list[FakeWorkers] = []
        self.fail_launches = fail_launches

    def start(self, cmd, env, log_path):
        fail = len(self.started) in self.fail_launches
        w = FakeWorkers(self.run_dir, cmd, self.state, 1 if fail else None)
        self.started.append(w)
        if fail and w.go is not None:  # a pre-launched worker that crashed while waiting
            (self.run_dir / "logs").mkdir(exist_ok=True)
            (self.run_dir / "logs" / "error-rank1.json").write_text(json.dumps(
                {"rank": 1, "type": "MemoryError", "message": "MemoryError: building the model",
                 "time": time.time(), "step": None}))
            w.fail_rank = None
            w.rc = 1
        return w


def _controller(tmp_path, schedule, relaunch="sequential", fail_launches=(), total=30, max_restarts=3):
    spec = RunSpec(run_dir=tmp_path, workers=1, schedule=schedule, slots=4, device="cpu",
                   total_steps=total)
    spec.validate()
    launcher = FakeLauncher(tmp_path, total, fail_launches)
    ctl = Controller(spec, launcher=launcher, out=lambda s: None, poll_s=0.0,
                     show_progress=False, relaunch=relaunch, max_restarts=max_restarts)
    return ctl, launcher


@pytest.mark.parametrize("mode", ["sequential", "overlap", "prelaunch"])
def test_schedule_runs_three_segments_with_eq7(tmp_path, mode):
    ctl, launcher = _controller(tmp_path, (Resize(10, 2), Resize(20, 1)), relaunch=mode)
    summary = ctl.run(0, 1, 0)
    assert ctl.state is RunState.FINISHED and summary["state"] == "finished"
    assert [(w.segment, w.world, w.stop_at) for w in launcher.started] == [(0, 1, 10), (1, 2, 20), (2, 1, 30)]
    ev = read_events(tmp_path / "events.jsonl")
    rel = [e for e in ev if e["kind"] == "relaunched"]
    assert [(r["from_workers"], r["to_workers"], r["step"]) for r in rel] == [(1, 2, 10), (2, 1, 20)]
    assert rel[0]["lr_new"] == pytest.approx(2 * rel[0]["lr_last"])
    assert rel[1]["lr_new"] == pytest.approx(0.5 * rel[1]["lr_last"])
    assert len([e for e in ev if e["kind"] == "resize_overhead"]) == 2
    assert len([e for e in ev if e["kind"] == "workers_exited"]) == 3
    assert [e["kind"] for e in ev][-1] == "finished"
    # prelaunch starts the next group while the current one still trains (before its checkpoint);
    # the other modes start it after the checkpoint
    launched_at = [w.launched_at_step for w in launcher.started]
    if mode == "prelaunch":
        assert all(w.go is not None for w in launcher.started[1:])
        assert launched_at == [0, 0, 10]
    else:
        assert all(w.go is None for w in launcher.started) and launched_at == [0, 10, 20]


def test_failure_without_restarts_names_rank_cause_and_checkpoint(tmp_path):
    ctl, _ = _controller(tmp_path, (Resize(10, 2),), fail_launches=(1,), max_restarts=0)
    with pytest.raises(WorkerFailedError, match="worker rank 1 failed: ValueError: boom") as ei:
        ctl.run(0, 1, 0)
    assert ei.value.rank == 1
    assert "checkpoint at step 10 kept; resume with: elastic-ring train --resume" in str(ei.value)
    assert ctl.state is RunState.FAILED
    errors = read_events(tmp_path / "events.jsonl", kind="error")
    assert errors and errors[0]["rank"] == 1
    state = json.loads((tmp_path / "controller.json").read_text())
    assert state["state"] == "failed"


def test_failure_before_any_checkpoint_says_none_was_written(tmp_path):
    ctl, _ = _controller(tmp_path, (), fail_launches=(0,), max_restarts=0)
    with pytest.raises(WorkerFailedError, match="no checkpoint was written"):
        ctl.run(0, 1, 0)


def test_failure_after_a_resize_restarts_at_the_new_size_from_the_checkpoint(tmp_path):
    # launches: 0 = segment 0 (1 worker, to step 10), 1 = segment 1 (2 workers) fails
    ctl, launcher = _controller(tmp_path, (Resize(10, 2), Resize(20, 1)), fail_launches=(1,))
    summary = ctl.run(0, 1, 0)
    assert ctl.state is RunState.FINISHED and summary["state"] == "finished"
    # the restart runs segment 2 at 2 workers from the checkpoint of step 10; the resize at 20 holds
    assert [(w.segment, w.world, w.stop_at) for w in launcher.started] == [
        (0, 1, 10), (1, 2, 20), (2, 2, 20), (3, 1, 30)]
    (r,) = read_events(tmp_path / "events.jsonl", kind="restart")
    assert (r["rank"], r["from_step"], r["new_world_size"], r["attempt"]) == (1, 10, 2, 1)
    assert "ValueError: boom" in r["cause"] and not r["gave_up"]
    assert summary["restarts"][0]["from_step"] == 10


def test_the_restart_names_the_node_the_backend_blamed_before_it_looks_for_slots(tmp_path, monkeypatch):
    """The backend's own blame (Ray's group: rank and node) is read when the failure is taken:
    Ray's usable_slots, asked next for the restart's size, drops the group that holds it (the full
    suite's Ray test saw a restart event with no node)."""
    from elastic_ring import protocol

    ctl, launcher = _controller(tmp_path, (Resize(10, 2), Resize(20, 1)), fail_launches=(1,))
    seen = {"failure": None}
    real_usable = ctl.backend.usable_slots

    def usable(want):
        seen["failure"] = None  # as Ray's _drop_all
        return real_usable(want)

    def detail():
        return seen["failure"]

    real_start = ctl.backend.start

    def start(*a, **kw):
        out = real_start(*a, **kw)
        if len(launcher.started) == 2:  # the launch that fails: its group blames a node
            seen["failure"] = protocol.Failure(1, "ValueError", "boom", node="node-b (10.0.0.2)")
        return out

    monkeypatch.setattr(ctl.backend, "usable_slots", usable)
    monkeypatch.setattr(ctl.backend, "failure_detail", detail)
    monkeypatch.setattr(ctl.backend, "start", start)
    ctl.run(0, 1, 0)
    (r,) = read_events(tmp_path / "events.jsonl", kind="restart")
    assert r["node"] == "node-b (10.0.0.2)", r


def test_the_same_error_at_the_same_step_is_not_retried(tmp_path):
    ctl, launcher = _controller(tmp_path, (Resize(10, 2),), fail_launches=(1, 2, 3))
    with pytest.raises(WorkerFailedError, match="the same error at step 11 twice: not retrying"):
        ctl.run(0, 1, 0)
    assert len(launcher.started) == 3  # the first run, one restart, then stop
    rs = read_events(tmp_path / "events.jsonl", kind="restart")
    assert [r["gave_up"] for r in rs] == [False, True]


def test_restarts_exhausted(tmp_path, monkeypatch):
    ctl, launcher = _controller(tmp_path, (Resize(10, 2),), fail_launches=(1, 2), max_restarts=1)
    # make each failure look different, so only the count stops the run
    import elastic_ring.controller.controller as cc
    n = iter(range(100))
    real = cc.protocol.read_error_records
    monkeypatch.setattr(cc.protocol, "read_error_records",
                        lambda *a, **k: [{**r, "message": f"ValueError: boom {next(n)}"} for r in real(*a, **k)])
    with pytest.raises(WorkerFailedError, match=r"\(1 restart\(s\) tried\)"):
        ctl.run(0, 1, 0)
    assert len(launcher.started) == 3


def test_restart_on_fewer_hosts_shrinks_to_what_answers(tmp_path):
    spec = RunSpec(run_dir=tmp_path, workers=2, schedule=(), slots=2, device="cpu", total_steps=30,
                   hosts="localhost:1,gone:1")
    launcher = FakeLauncher(tmp_path, 30, fail_launches=(0,))
    ctl = Controller(spec, launcher=launcher, out=lambda s: None, poll_s=0.0, show_progress=False,
                     relaunch="sequential", host_probe=lambda hosts: [h for h in hosts if h[0] != "gone"])
    ctl.run(0, 2, 0)
    assert [w.world for w in launcher.started] == [2, 1]
    assert "localhost:1" in launcher.started[1].cmd_line and "gone" not in launcher.started[1].cmd_line
    assert Plan.from_dict(json.loads((tmp_path / "plan.json").read_text())).world_after(0) == 1


def test_transition_table_is_enforced():
    check_transition(RunState.RUNNING, RunState.RESTARTING)
    with pytest.raises(IllegalTransition):
        check_transition(RunState.FINISHED, RunState.RUNNING)
    with pytest.raises(IllegalTransition):
        check_transition(RunState.RUNNING, RunState.STARTING)  # only the run's first launch is starting
    with pytest.raises(IllegalTransition):
        check_transition(RunState.STOPPING, RunState.RUNNING)  # a stop asked ends the run
    assert all(not TRANSITIONS[s] for s in (RunState.FINISHED, RunState.FAILED, RunState.STOPPED))
    assert not any(RunState.CRASHED in to for to in TRANSITIONS.values())  # the reader's word alone


def test_plan_world_after_any_history():
    p = Plan.from_spec(2, (Resize(100, 1), Resize(300, 2)))
    assert [p.world_after(s) for s in (0, 99, 100, 299, 300)] == [2, 2, 1, 1, 2]
    assert p.resizes_after(100) == (Resize(300, 2),)
    p.add(150, 2, "live")  # a live resize makes the scheduled 300:2 a no-op, dropped
    assert p.world_after(200) == 2 and p.resizes_after(150) == ()
    p.replace_after(150, (Resize(400, 1),))
    assert p.resizes_after(150) == (Resize(400, 1),)
    assert Plan.from_dict(p.to_dict()) == p


def test_two_signals_kill_the_workers_and_say_what_is_kept(tmp_path):
    """Ctrl-C twice: the workers are killed at once; the message says which checkpoint is kept
    (not that horovodrun failed), and the run ends as interrupted, not failed."""
    out: list[str] = []
    ctl, launcher = _controller(tmp_path, (Resize(10, 2),))
    ctl.out = out.append
    real_start = launcher.start

    def start(cmd, env, log_path):
        w = real_start(cmd, env, log_path)
        if w.segment == 1:
            ctl._interrupts = 2  # two SIGTERMs while segment 1 trains
        return w

    launcher.start = start
    summary = ctl.run(0, 1, 0)
    assert summary["state"] == "stopped" and ctl.state is RunState.STOPPED
    assert launcher.started[1].rc == -9
    assert any("interrupted twice: workers killed; checkpoint at step 10 kept" in line for line in out), out
    assert not read_events(tmp_path / "events.jsonl", kind="restart")


def test_an_interrupt_before_any_checkpoint_says_the_resume_starts_over(tmp_path):
    """Ctrl-C twice before the first checkpoint: not "checkpoint at step None kept; continue with"."""
    out: list[str] = []
    ctl, launcher = _controller(tmp_path, (Resize(10, 2),))
    ctl.out = out.append
    real_start = launcher.start

    def start(cmd, env, log_path):
        ctl._interrupts = 2  # two SIGTERMs as segment 0 starts
        return real_start(cmd, env, log_path)

    launcher.start = start
    assert ctl.run(0, 1, 0)["state"] == "stopped"
    line = next(x for x in out if x.startswith("interrupted"))
    assert line == (f"interrupted twice: workers killed; no checkpoint was written; elastic-ring train --resume "
                    f"{tmp_path} starts over from step 1"), out


def test_a_prelaunched_workers_crash_record_is_not_dropped(tmp_path):
    """Its record is older than the go (which the relaunch is measured from), not than its start."""
    ctl, launcher = _controller(tmp_path, (Resize(10, 2),), relaunch="prelaunch", fail_launches=(1,),
                                max_restarts=0)
    ctl.meter.startup_s = [1000.0]  # pre-launch at once
    with pytest.raises(WorkerFailedError, match="worker rank 1 failed: MemoryError: building the model"):
        ctl.run(0, 1, 0)
    assert launcher.started[1].go is not None


@pytest.mark.parametrize("mode", ["sequential", "overlap", "prelaunch"])
def test_a_rank_that_only_lost_its_peer_is_never_blamed(tmp_path, mode, monkeypatch):
    """Rank 1 dies silently (kill -9) and horovodrun's log names no one: rank 0's "Connection reset
    by peer" is not the cause; the rank with a process record and no error record is."""
    from elastic_ring import protocol

    ctl, launcher = _controller(tmp_path, (Resize(10, 2),), relaunch=mode, fail_launches=(1,))

    def records(run_dir, since=0.0):
        out = []
        for r in real(run_dir, since):
            if r["rank"] == 1:  # what a kill -9 leaves: rank 0's error, rank 1's process record
                (tmp_path / "logs" / "error-rank1.json").unlink()
                for rank in (0, 1):
                    protocol.write_json_atomic(protocol.pid_dir(tmp_path) / f"seg001-rank{rank}.json",
                                               {"rank": rank, "pid": 1, "host": "h", "segment": 1,
                                                "created": time.time()})
                out.append({"rank": 0, "type": "RuntimeError", "time": r["time"], "step": r["step"],
                            "message": "RuntimeError: Gloo: Read error: Connection reset by peer"})
        return out

    real = protocol.read_error_records
    import elastic_ring.controller.controller as cc
    monkeypatch.setattr(cc.protocol, "read_error_records", records)
    ctl.run(0, 1, 0)
    (r,) = read_events(tmp_path / "events.jsonl", kind="restart")
    assert r["rank"] == 1 and "rank 1 died without an error" in r["cause"], r


def test_the_same_error_at_another_step_is_retried(tmp_path, monkeypatch):
    """The restart rule's repeat key includes the step: the same error twice from the same
    checkpoint but at different steps (progress was made in between) is retried."""
    ctl, launcher = _controller(tmp_path, (Resize(10, 2),), fail_launches=(1, 2))
    import elastic_ring.controller.controller as cc
    steps = iter([13, 17, 19, 23])
    real = cc.protocol.read_error_records
    monkeypatch.setattr(cc.protocol, "read_error_records",
                        lambda *a, **k: [{**r, "step": next(steps)} for r in real(*a, **k)])
    summary = ctl.run(0, 1, 0)
    assert summary["state"] == "finished"
    rs = read_events(tmp_path / "events.jsonl", kind="restart")
    assert [(r["gave_up"], r["from_step"]) for r in rs] == [(False, 10), (False, 10)]
    assert len(launcher.started) == 4  # segment 0, the failed 1, the failed retry, the good one


class _FixedStepFailure(FakeLauncher):
    """A deterministic error at step ``fail_at`` whatever the checkpoint; a segment's end writes no
    checkpoint (as an in-place resize: the workers keep their state in memory). Each launch
    restores from the newest checkpoint, as real workers do. More than ``cap`` launches: the
    controller loops (the test fails instead of hanging)."""

    def __init__(self, run_dir, total, fail_at, cap=12):
        super().__init__(run_dir, total)
        self.fail_at, self.cap = fail_at, cap
        self.store = CheckpointStore(run_dir / "checkpoints")

    def start(self, cmd, env, log_path):
        assert len(self.started) < self.cap, f"{self.cap} launches: the restarts never end"
        found = self.store.candidates()
        self.state["step"] = int(found[0].stem.split("-")[1]) if found else 0
        w = FakeWorkers(self.run_dir, cmd, self.state, None)
        if self.state["step"] < self.fail_at <= w.stop_at:
            w.fail_rank = 1
            self.state["step"] = self.fail_at - 1  # the error record names the step it was in
        w._stop = lambda start, lr, w=w: self._end_without_checkpoint(w)
        self.started.append(w)
        return w

    def _end_without_checkpoint(self, w):
        if w.polls < 5:
            return None
        w.log.write(SegmentEnd(segment=w.segment, world_size=w.world, step=w.stop_at, reason="scheduled",
                               lr=0.1, stop_decided_at=time.time()))
        w.rc = 0
        return None


def test_a_deterministic_error_after_an_unsaved_resize_is_not_retried_for_ever(tmp_path):
    """Checkpoint at step 5; resizes at 10 and 20 save nothing; step 25 always fails. A segment
    that ends (10 -> 20) after the restart is no saved progress: the second failure at step 25 from
    the same checkpoint is the same error at the same step, and the run stops (it used to count
    every finished segment as progress and restart for ever)."""
    total = 30
    spec = RunSpec(run_dir=tmp_path, workers=1, schedule=(Resize(10, 2), Resize(20, 1)), slots=4,
                   device="cpu", total_steps=total)
    launcher = _FixedStepFailure(tmp_path, total, fail_at=25)
    launcher.store.save({"step": 5, "world_size": 1})
    ctl = Controller(spec, launcher=launcher, out=lambda s: None, poll_s=0.0, show_progress=False,
                     relaunch="sequential", max_restarts=3)
    with pytest.raises(WorkerFailedError, match="the same error at step 25 twice: not retrying"):
        ctl.run(5, 1, 0)
    rs = read_events(tmp_path / "events.jsonl", kind="restart")
    assert [(r["attempt"], r["from_step"], r["gave_up"]) for r in rs] == [(1, 5, False), (2, 5, True)]


def test_failure_history_resets_only_on_a_newer_checkpoint():
    from elastic_ring.controller.restart_rule import FailureHistory

    h = FailureHistory()
    f = {"type": "ValueError", "message": "boom", "step": 25, "from_step": 10}
    assert h.record(dict(f)) == (1, False)
    assert not h.progress_saved(10) and not h.progress_saved(None)  # steps done, nothing saved
    assert h.record(dict(f)) == (2, True)
    assert h.record({**f, "step": 26}) == (3, False)
    assert h.record({**f, "type": None, "step": 26}) == (4, False)  # no crash record: never "the same"
    assert h.progress_saved(15) and len(h) == 0
    assert h.record(dict(f, from_step=15)) == (1, False)


class _HungOnALostHost(FakeLauncher):
    """Launch 0: two ranks, rank 1 on host ``gone``; both beat step 3, then nothing (the ring waits
    for the vanished host; after ``gloo_s`` it gives up with status 1, as Gloo's timeout would).
    Later launches: the usual fake workers."""

    def __init__(self, run_dir, total, gloo_s=8.0):
        super().__init__(run_dir, total)
        self.gloo_s = gloo_s

    def start(self, cmd, env, log_path):
        import os

        from elastic_ring import protocol
        from elastic_ring.heartbeat import Heartbeat

        w = FakeWorkers(self.run_dir, cmd, self.state, None)
        self.started.append(w)
        if len(self.started) > 1:
            return w
        for rank, host in ((0, "localhost"), (1, "gone")):
            protocol.write_json_atomic(protocol.pid_dir(self.run_dir) / f"seg000-rank{rank}.json",
                                       {"rank": rank, "pid": os.getpid(), "host": host, "segment": 0,
                                        "created": time.time()})
            hb = Heartbeat(self.run_dir, 0, rank)
            hb.beat(3, "step", time.time())
            hb.close()
        t0 = time.time()

        def poll():
            if w.rc is None and time.time() - t0 > self.gloo_s:
                w.rc = 1
            return w.rc

        w.poll = poll
        return w


def test_a_host_that_stops_answering_mid_run_is_found_while_the_job_runs(tmp_path, monkeypatch):
    """--hosts localhost:1,gone:1; host gone stops answering while the job runs (its rank's
    sockets never close: no exit). The host monitor's rounds find it, the watchdog stops the job
    after the grace (not the 60 s timeout, nor Gloo's), blames rank 1 and the host, and the run
    restarts on what still answers and finishes."""
    import elastic_ring.controller.watchdog as wdog

    monkeypatch.setattr(wdog, "STOPPED_GRACE_S", 0.3)
    monkeypatch.setattr(wdog, "HOST_PROBE_EVERY_S", 0.05)
    spec = RunSpec(run_dir=tmp_path, workers=2, schedule=(), slots=2, device="cpu", total_steps=30,
                   hosts="localhost:1,gone:1")
    launcher = _HungOnALostHost(tmp_path, 30)
    ctl = Controller(spec, launcher=launcher, out=lambda s: None, poll_s=0.02, show_progress=False,
                     relaunch="sequential", stall_timeout=60.0,
                     host_probe=lambda hosts: [h for h in hosts if h[0] != "gone"])
    t0 = time.time()
    summary = ctl.run(0, 2, 0)
    assert summary["state"] == "finished"
    (st,) = read_events(tmp_path / "events.jsonl", kind="stalled")
    assert st["ranks"] == [1] and st["why"] == "its host does not answer (gone)", st
    assert st["time"] - t0 < launcher.gloo_s - 2, st  # found by the host monitor, not by the exit
    (r,) = read_events(tmp_path / "events.jsonl", kind="restart")
    assert (r["rank"], r["node"], r["new_world_size"]) == (1, "gone", 1), r
    assert [w.world for w in launcher.started] == [2, 1]
    assert "gone" not in launcher.started[1].cmd_line
