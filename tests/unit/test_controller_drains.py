"""Leaving with notice in the controller's loop (controller.drains), driven by the fake launcher of
test_controller_fake over a HostManager of fixed hosts: `elastic-ring drain`'s request and a
worker's SIGTERM notice shrink the job off a host as a change of cause drained / preempted (not a
failure); a deadline passed is a failure; a notice of an ended segment is ignored; a failure
withdraws a preempted drain but not an asked one; --grace and Slurm's signal at the controller."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

from elastic_ring import protocol
from elastic_ring.controller.api import RunSpec
from elastic_ring.controller.controller import Controller
from elastic_ring.controller.drains import Drains
from elastic_ring.controller.membership import Cause, decide
from elastic_ring.controller.segment import Segment
from elastic_ring.events import EventLog, read_events
from elastic_ring.events.api import PreemptNotice
from elastic_ring.hosts.api import HostSet, WorkerBounds
from elastic_ring.hosts.discovery import FixedHosts, HostPoller
from elastic_ring.hosts.manager import HostManager
from tests.unit.test_controller_fake import FakeLauncher, FakeWorkers


class StoppingWorkers(FakeWorkers):
    """Fake workers that stop a few steps on when their segment's stop file appears (a live stop)."""

    def poll(self):
        (self.run_dir / "control").mkdir(exist_ok=True)  # rank 0's progress: a step at each poll
        protocol.write_json_atomic(protocol.control_dir(self.run_dir) / protocol.PROGRESS_FILE,
                                   {"step": self.state["step"] + self.polls + 1, "time": time.time()})
        if self.rc is None and self.polls >= 2 and self.stop_at >= self.state["total"] \
                and protocol.stop_file(self.run_dir, self.segment).exists():
            self.stop_at = self.state["step"] + 5
        return super().poll()


class StoppingLauncher(FakeLauncher):
    def start(self, cmd, env, log_path):
        w = StoppingWorkers(self.run_dir, cmd, self.state, None)
        self.started.append(w)
        return w


def _controller(tmp_path: Path, hosts=(("a", 1), ("b", 1)), total=30, grace=None):
    spec = RunSpec(run_dir=tmp_path, workers=2, schedule=(), slots=64, device="cpu", total_steps=total)
    spec.validate()
    manager = HostManager(HostPoller(FixedHosts(HostSet(list(hosts))), interval_s=0.01), WorkerBounds(1, None))
    launcher = StoppingLauncher(tmp_path, total)
    lines: list[str] = []
    ctl = Controller(spec, launcher=launcher, out=lines.append, poll_s=0.0, show_progress=False,
                     relaunch="sequential", hosts=manager, asked_workers=2, grace=grace)
    return ctl, launcher, lines


def _h(w) -> str:
    parts = w.cmd_line.split()
    return parts[parts.index("-H") + 1]


def _ask_drain(run_dir: Path, host: str, deadline: float = 60.0) -> None:
    (run_dir / "control").mkdir(parents=True, exist_ok=True)
    (run_dir / "control" / f"drain-{host}.json").write_text(
        json.dumps({"host": host, "deadline": deadline, "time": time.time()}))


def test_a_drain_request_shrinks_off_the_host_as_a_drained_change_not_a_failure(tmp_path):
    ctl, launcher, lines = _controller(tmp_path)
    _ask_drain(tmp_path, "b")
    summary = ctl.run(0, 2, 0)
    assert summary["state"] == "finished"
    assert [(w.world, _h(w)) for w in launcher.started] == [(2, "a:1,b:1"), (1, "a:1")]
    ev = read_events(tmp_path / "events.jsonl")
    (change,) = [e for e in ev if e["kind"] == "membership_change"]
    assert (change["cause"], change["step"], change["members_before"], change["members_after"]) == ("drained", 5, 2, 1)
    assert not [e for e in ev if e["kind"] == "restart"]
    assert "drained b (elastic-ring drain) at step 5: 2 -> 1 workers, no step redone" in lines, lines
    assert ctl.hosts.manager.drained == ("b",) and not ctl.drains.pending
    assert not list((tmp_path / "control").glob("drain-*.json"))  # taken
    state = json.loads((tmp_path / "controller.json").read_text())  # what `status` and `drain` read
    assert state["hosts"] == "hosts: a:1 (1 slot); drained: b" and state["draining"] == []
    assert state["usable_hosts"] == {"a": 1}


def test_a_workers_sigterm_notice_drains_its_host_as_preempted(tmp_path):
    ctl, launcher, lines = _controller(tmp_path)
    log = EventLog(tmp_path / protocol.WORKER_EVENTS)
    log.write(PreemptNotice(rank=1, segment=7, pid=1, host="b"))  # another segment's: its teardown, ignored
    log.write(PreemptNotice(rank=1, segment=0, pid=2, host="b"))  # rank 1 of segment 0 ran on b (rank order)
    ctl.run(0, 2, 0)
    assert [(w.world, _h(w)) for w in launcher.started] == [(2, "a:1,b:1"), (1, "a:1")]
    changes = read_events(tmp_path / "events.jsonl", kind="membership_change")
    assert [(c["cause"], c["members_after"]) for c in changes] == [("preempted", 1)]
    assert "preempted b: 2 -> 1 workers at the next agreed step" in lines
    assert "drained b (SIGTERM to rank 1) at step 5: 2 -> 1 workers, no step redone" in lines


def test_a_drain_past_its_deadline_is_a_failure_and_the_host_stays_out(tmp_path):
    ctl, launcher, lines = _controller(tmp_path)
    _ask_drain(tmp_path, "b", deadline=1e-6)
    ctl.run(0, 2, 0)
    assert [(w.world, _h(w)) for w in launcher.started] == [(2, "a:1,b:1"), (1, "a:1")]
    ev = read_events(tmp_path / "events.jsonl")
    assert [e["kind"] for e in ev].count("restart") == 1  # today's failure path, counted
    assert [e["cause"] for e in ev if e["kind"] == "membership_change"][0] == "failure"
    assert any(ln.startswith("drain of b: its deadline (1e-06 s) passed before the shrink landed") for ln in lines)
    assert ctl.hosts.manager.drained == ("b",)  # asked by a user: it stays


class _Watch:
    """A HostWatch's part that drains use."""

    def __init__(self, manager):
        self.manager, self.draining = manager, set()

    def host_of(self, seg, rank, run_dir=None):
        return {0: "a", 1: "b"}.get(rank)


def test_a_failure_withdraws_a_preempted_drain_but_not_an_asked_one(tmp_path):
    manager = HostManager(HostPoller(FixedHosts(HostSet([("a", 1), ("b", 1), ("c", 1)])), interval_s=0.01),
                          WorkerBounds(1, None))
    manager.update()
    watch, lines, now = _Watch(manager), [], [100.0]
    drains = Drains(watch, tmp_path, EventLog(tmp_path / "events.jsonl"), lines.append, lambda: now[0])
    seg = Segment(0, 3, 30)
    progress = lambda step: protocol.write_json_atomic(  # noqa: E731
        protocol.control_dir(tmp_path) / protocol.PROGRESS_FILE, {"step": step, "time": 1.0})
    progress(7)
    drains.heard(PreemptNotice(rank=1, segment=0, pid=5, host="b"))
    _ask_drain(tmp_path, "c", deadline=10)
    drains.take(seg)
    drains.take(seg)
    assert set(drains.pending) == {"c"}  # the notice waits for a step: a failing job's teardown does none
    progress(8)
    drains.take(seg)
    assert set(drains.pending) == {"b", "c"} and set(watch.draining) == {"b", "c"}
    assert drains.pending["b"].cause is Cause.PREEMPTED and drains.pending["b"].deadline == 130.0  # 30 s default
    assert drains.pending["c"].cause is Cause.DRAINED and drains.overdue() is None
    now[0] = 110.0
    assert drains.overdue().host == "c"
    assert manager.view().usable.arg() == "a:1"
    drains.failed()
    assert manager.drained == ("c",) and not drains.pending and watch.draining == {}
    assert manager.view().usable.arg() == "a:1,b:1"


def test_drained_and_preempted_are_no_failures_and_shrink_in_place_from_memory():
    for cause in (Cause.DRAINED, Cause.PREEMPTED):
        assert not cause.is_failure
        assert decide(cause, 40, 2, 1, in_place=False).state_source.value == "checkpoint"
        assert decide(cause, 40, 2, 1, in_place=True).state_source.value == "memory"


def test_grace_passed_kills_the_workers_and_slurms_signal_asks_for_a_requeue(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    ctl, launcher, lines = _controller(tmp_path, grace=0.5)
    ctl._on_signal(signal.SIGUSR1, None)  # Slurm's --signal=USR1@90
    ctl._t_interrupt -= 10  # the grace is long gone at the first look
    summary = ctl.run(0, 2, 0)
    assert summary["state"] == "stopped" and summary["requeue"] is True
    assert launcher.started[0].rc == -9  # killed
    assert "the 0.5 s grace passed before the workers checkpointed: killing them" in lines
    assert any(ln.startswith("interrupted: the 0.5 s grace passed: workers killed; no checkpoint was written")
               for ln in lines), lines
    assert "Slurm's signal: exit status 75 (requeue the job; the same --resume goes on)" in lines
    # without Slurm, a SIGTERM is a plain stop (exit status 130)
    monkeypatch.delenv("SLURM_JOB_ID")
    other, _, _ = _controller(tmp_path / "plain")
    other._on_signal(signal.SIGTERM, None)
    assert other._interrupts == 1 and not other._requeue


def test_drain_refuses_in_one_line_a_run_without_discovery_and_a_host_already_draining(tmp_path, capsys):
    from elastic_ring.controller.lock import RunLock
    from tests.conftest import one_line_error, run_inproc

    run = tmp_path / "run"
    run.mkdir()
    info = {"workers": 2, "schedule": [], "slots": 2, "total_steps": 60, "script": None}
    (run / "run.json").write_text(json.dumps(info))
    (run / "controller.json").write_text(json.dumps(
        {"state": "running", "phase": "running", "world_size": 2, "pid": 1, "time": 1.0,
         "usable_hosts": {"a": 1, "b": 1, "c": 1}, "draining": ["c"]}))
    lock = RunLock(run)
    lock.acquire()
    try:
        one_line_error(run_inproc(capsys, "drain", str(run), "b"),
                       f"run {run} does not take its hosts from --host-discovery-script")
        (run / "run.json").write_text(json.dumps({**info, "host_discovery": {"script": "d.sh", "min_workers": 2}}))
        one_line_error(run_inproc(capsys, "drain", str(run), "c"), "host c is already being drained")
        one_line_error(run_inproc(capsys, "drain", str(run), "b"),
                       "draining b leaves 1 slot, below --min-workers 2")
        one_line_error(run_inproc(capsys, "drain", str(run), "b", "--deadline", "-1"), "--deadline must be > 0 s")
        assert not list(run.glob("control/drain-*.json"))  # nothing asked
        (run / "run.json").write_text(json.dumps({**info, "host_discovery": {"script": "d.sh", "min_workers": 1}}))
        r = run_inproc(capsys, "drain", str(run), "b", "--deadline", "5")
        assert r.returncode == 0 and "drain of b requested" in r.stdout, r.stderr
        (req,) = (run / "control").glob("drain-*.json")
        assert json.loads(req.read_text())["host"] == "b" and json.loads(req.read_text())["deadline"] == 5
    finally:
        lock.release()


def test_train_refuses_a_grace_that_is_not_positive(tmp_path, capsys):
    from tests.conftest import one_line_error, run_inproc

    r = run_inproc(capsys, "train", "--grace", "0", "--steps", "2", "--device", "cpu", "--run-dir", str(tmp_path / "r"))
    one_line_error(r, "--grace must be > 0 seconds, got 0")
    assert not (tmp_path / "r").exists()
