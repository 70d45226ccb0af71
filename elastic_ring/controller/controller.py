"""The controller behind `elastic-ring train`: the segment loop and its decisions.

Launching is a backend's job (:mod:`.backends`): ``horovodrun`` per segment for ``--relaunch
prelaunch|overlap|sequential`` (on one host, or the user's ``--hosts``/``--hostfile``), one long-lived
Horovod Elastic job for ``--relaunch inplace``. The controller relays the workers' events into
``RUN_DIR/events.jsonl`` with telemetry added, shows progress, and at each resize point lets the
workers checkpoint and exit, then has the backend start them at the new size (or, for a backend
that keeps its workers, tells the paused workers the new size); the workers rescale the LR by
Eq. 7 on resume. It measures every resize: stop latency, checkpoint write, relaunch to first step,
total time lost.

When a worker dies (an exception, kill -9, the OOM killer) or its launcher exits non-zero, it
restarts the workers from the last checkpoint (``max_restarts`` failures in a row at most; an
error that repeats at the same step is not retried), at the size the plan says for that step or,
when the backend reports fewer usable slots (hosts that no longer answer), at the largest count
that fits. Each restart is an event with its cause, the rank that failed first, the steps redone
and the time lost.

It owns the run folder while it runs (a lock, and a heartbeat its workers watch: they exit by
themselves within seconds when it is gone or replaced).

Side effects are passed in: ``launcher`` starts processes (or a whole ``backend``), ``clock``
reads time, ``out`` prints. Unit tests drive the loop with fakes; integration tests run real
horovodrun.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from elastic_ring import protocol
from elastic_ring.controller.api import Plan, Resize, RunSpec, RunState, check_transition
from elastic_ring.controller.lock import RunLock
from elastic_ring.controller.restart_rule import FailureHistory, append_traceback, not_retried
from elastic_ring.controller.summary import summarize
from elastic_ring.controller import watchdog as wdog
from elastic_ring.errors import UserError, WorkerFailedError
from elastic_ring.events.api import (ErrorEvent, EventLog, Finished, FirstStepAfterResize, Launch,
                                     Recovered, Stalled, Relaunched, ResizeOverhead, ResizeRequested, Restart,
                                     WorkersExited, read_events)
from elastic_ring.protocol import CONTROLLER_FILE, REQUEST_FILE, WORKER_EVENTS, stop_file
from elastic_ring.telemetry import Telemetry
from elastic_ring.telemetry.tensorboard import sink_for_run as tensorboard_sink
from elastic_ring.worker.lr import RULES

# the launch side lives in .backends; re-exported here for the callers that import it from here
from elastic_ring.controller.backends import Backend, make_backend  # noqa: E402
from elastic_ring.controller.backends.api import (BUILTIN_TARGET, ROOT, Handle, Launcher,  # noqa: E402,F401
                                                  SegmentLaunch, worker_entry)
from elastic_ring.controller.backends.elastic import (discovery_files, elastic_horovodrun_command,  # noqa: E402,F401
                                                      write_hosts)
from elastic_ring.controller.backends.horovodrun import (SubprocessLauncher, horovodrun_command,  # noqa: E402,F401
                                                         probe_hosts)


RELAUNCH_MODES = ("prelaunch", "overlap", "sequential", "inplace")
INPLACE_LIMITS = ("one host only (--hosts/--hostfile are refused); the worker whose slot is removed "
                  "is ended by Horovod inside hvd.init() (it aborts, by design); after a worker "
                  "failure the restart is a fresh elastic launch from the last checkpoint")
DEFAULT_STARTUP_S = 10.0  # start-up estimate before the first launch has been measured


@dataclass
class PendingResize:
    from_workers: int
    to_workers: int
    step: int
    t_request: float
    lr_last: float
    checkpoint_s: float = 0.0
    t_exit: float | None = None
    t_launch: float | None = None
    t_first: float | None = None
    steady_step_s: float | None = None
    segment: int = -1  # the segment whose workers are being stopped


@dataclass
class _Seg:
    index: int
    world: int
    stop_at: int
    handle: Handle | None = None
    t_launch: float = 0.0  # relaunch -> first step is measured from here (the go, if pre-launched)
    t_started: float = 0.0  # when its processes really started (crash records are newer)
    end: dict[str, Any] | None = None
    ckpt_s: float = 0.0
    live_target: int | None = None
    t_live: float | None = None
    start_step: int = 0  # the last step done before this segment
    deferred_stop: bool = False  # an interrupt came after the workers took a resize written ahead
    go_file: Path | None = None  # set when pre-launched: the workers wait for this file
    cmd: list[str] = field(default_factory=list)
    last_step: int = 0
    last_step_t: float = 0.0
    steps_per_s: float = 0.0
    log: Path | None = None
    stall: wdog.Stall | None = None  # set when the watchdog killed it
    pids: list[dict[str, Any]] = field(default_factory=list)  # process records at its exit


@dataclass
class _Restarting:
    """A restart in progress, measured up to the first step after it."""

    attempt: int
    t_detect: float
    t_last_progress: float
    steps_redone: int
    from_step: int
    segment: int = -1


class Controller:
    def __init__(self, spec: RunSpec, lr_scaling: str = "linear", launcher: Launcher | None = None,
                 clock: Callable[[], float] = time.time, out: Callable[[str], None] | None = None,
                 network_interface: str | None = None, poll_s: float = 0.1,
                 show_progress: bool | None = None, relaunch: str = "prelaunch",
                 max_restarts: int = 3,
                 host_probe: Callable[[list[tuple[str, int]]], list[tuple[str, int]]] | None = None,
                 plan: Plan | None = None, backend: Backend | None = None,
                 stall_timeout: float | None = None) -> None:
        self.spec = spec
        self.rule = RULES[lr_scaling]
        self.clock = clock
        self.out = out or (lambda s: print(s, file=sys.stderr, flush=True))
        self.network_interface = network_interface
        self.poll_s = poll_s
        if relaunch not in RELAUNCH_MODES:
            raise UserError(f"relaunch mode must be one of {', '.join(RELAUNCH_MODES)}")
        if relaunch == "inplace" and (spec.hosts or spec.hostfile):
            raise UserError("--relaunch inplace runs on one host: drop --hosts/--hostfile, or use "
                            "another relaunch mode")
        if max_restarts < 0:
            raise UserError(f"--max-restarts must be >= 0, got {max_restarts}")
        if stall_timeout is not None and stall_timeout < 0:
            raise UserError(f"--stall-timeout must be >= 0 seconds (0: off), got {stall_timeout}")
        self.watchdog = wdog.Watchdog(timeout_s=stall_timeout)
        self._t_beats = 0.0
        self._host_probe = host_probe or probe_hosts  # the watchdog asks which hosts still answer
        self._hosts: wdog.HostMonitor | None = None  # asks them while the job runs (run())
        self.relaunch = relaunch
        self.max_restarts = max_restarts
        self.backend: Backend = backend or make_backend(relaunch, spec, launcher=launcher,
                                                        network_interface=network_interface,
                                                        host_probe=host_probe)
        self.in_place = self.backend.keeps_workers  # a resize re-forms the ring in the same workers
        self.plan = plan or Plan.from_spec(spec.workers, spec.schedule)
        self.owner = uuid.uuid4().hex
        self._next: _Seg | None = None  # a pre-launched segment waiting for its go
        self._startup_s: list[float] = []  # measured launch -> first step, for the pre-launch lead
        self._last_speed = 0.0  # steps/s of the latest throughput window of any segment
        self._draining: list[_Seg] = []  # stopped segments whose processes are still exiting
        self.show_progress = sys.stderr.isatty() if show_progress is None else show_progress
        self.state = RunState.PENDING
        self.events = EventLog(spec.run_dir / "events.jsonl")
        self.worker_events = spec.run_dir / WORKER_EVENTS
        self._wpos = self.worker_events.stat().st_size if self.worker_events.exists() else 0
        self._interrupts = 0
        self._pending: PendingResize | None = None
        self._restarting: _Restarting | None = None
        self._failures = FailureHistory()  # consecutive failures (reset by saved progress)
        self._telemetry: Telemetry | None = None
        self._progress = None
        self._task = None
        self._seen_requests: set[str] = set()
        self._state_info: dict[str, Any] = {}
        self._hb_stop = threading.Event()
        self._launchers: dict[int, list[float]] = {}  # segment -> [horovodrun pid, create time]
        self._elastic: _Seg | None = None  # in place: the paused segment whose workers go on
        self._tb = tensorboard_sink(spec.run_dir)  # TensorBoard curves, fed from events.jsonl

    # ------------------------------------------------------------------ state
    def _set_state(self, state: RunState, **extra: Any) -> None:
        """Move to ``state`` (the table in ``controller.api.TRANSITIONS`` is enforced) and write
        ``controller.json``; staying in a state only updates the file."""
        if state is not self.state:
            check_transition(self.state, state)
        self.state = state
        self._state_info.update(extra)
        info = {**self._state_info, "pid": os.getpid(), "owner": self.owner, "state": state.value,
                "time": self.clock()}
        protocol.write_json_atomic(self.spec.run_dir / CONTROLLER_FILE, info)

    def _save_plan(self) -> None:
        protocol.write_json_atomic(self.spec.run_dir / protocol.PLAN_FILE, self.plan.to_dict())

    def _on_signal(self, signum, frame) -> None:  # only sets a flag
        self._interrupts += 1

    def _heartbeat(self) -> None:
        path = protocol.control_dir(self.spec.run_dir) / protocol.HEARTBEAT_FILE
        seq = 0
        while True:
            seq += 1
            try:
                protocol.write_json_atomic(path, {"owner": self.owner, "seq": seq, "pid": os.getpid(),
                                                  "time": time.time()})
            except OSError:
                pass
            if self._hb_stop.wait(protocol.HEARTBEAT_EVERY_S):
                return

    # ------------------------------------------------------------------ main loop
    def run(self, start_step: int, world: int, segment: int) -> dict[str, Any]:
        lock = RunLock(self.spec.run_dir)
        lock.acquire()
        protocol.control_dir(self.spec.run_dir).mkdir(parents=True, exist_ok=True)
        self._save_plan()
        hb = threading.Thread(target=self._heartbeat, daemon=True, name="elastic-ring-heartbeat")
        self._hb_stop.clear()
        hb.start()
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        if self._run_hosts() and self.watchdog.timeout_s != 0:
            self._hosts = wdog.HostMonitor(self._run_hosts(), self._host_probe, wdog.HOST_PROBE_EVERY_S)
            self._hosts.start()
        try:
            return self._run(start_step, world, segment)
        finally:
            if self._hosts is not None:
                self._hosts.stop()
            for s, h in old.items():
                signal.signal(s, h)
            if self._progress is not None:
                self._progress.stop()
            self._kill_all()
            self.backend.close()
            self._hb_stop.set()
            hb.join(timeout=5)
            if self._tb is not None:
                self._tb.close()
            lock.release()

    def _kill_all(self) -> None:
        """Leave no process behind, whatever ended the run (an exception included)."""
        for seg in [*self._draining, self._next, getattr(self, "_seg", None)]:
            if seg is not None and seg.handle is not None and seg.handle.poll() is None:
                seg.handle.kill()

    def _next_stop(self, step: int) -> int:
        for r in self.plan.resizes_after(step):
            return r.step
        return self.spec.total_steps

    def _scheduled_target(self, step: int) -> Resize | None:
        for r in self.plan.resizes_after(step - 1):
            return r if r.step == step else None
        return None

    def _run(self, step: int, world: int, segment: int) -> dict[str, Any]:
        self._start_progress(step)
        self._set_state(RunState.LAUNCHING, step=step, world_size=world, segment=segment)
        while True:
            if self._next is not None and self._next.index == segment:
                seg, self._next = self._next, None
                seg.stop_at, seg.start_step = self._next_stop(step), step
                self._go(seg, step)
            elif self._elastic is not None:  # in place: the same processes go on at the new size
                seg = _Seg(segment, world, self._next_stop(step), start_step=step)
                self._resize_inplace(seg, step)
            else:
                seg = _Seg(segment, world, self._next_stop(step), start_step=step)
                self._launch(seg, step)
            rc = self._watch(seg)
            self._relay()
            now = self.clock()
            if rc is None:  # checkpoint on disk: relaunch now, the old workers exit meanwhile
                if self.in_place:
                    self._elastic = seg  # paused between two steps, waiting for the new size
                else:
                    self._draining.append(seg)
            else:
                self._elastic = None
                self.events.write(WorkersExited(segment=seg.index, world_size=seg.world,
                                                returncode=rc, time=now))
                self._forget_pids(seg)
            if rc is not None and (rc != 0 or seg.end is None):
                if self._interrupts:
                    return self._interrupted(seg, killed=True)
                step, world = self._recover(seg, rc)
                segment = seg.index + 1
                continue
            step = int(seg.end["step"])
            if self._failures.failures:  # a checkpoint newer than the restart's: count again
                self._failures.progress_saved(self._checkpoint_step())
            if self._pending is not None and self._pending.t_first is not None:
                self._drain(wait=True)  # may emit the overhead itself
                if self._pending is not None:  # no full window at the new size: no steady step
                    self._emit_overhead(steady_step_s=self._pending.steady_step_s or 0.0)
            if self._interrupts and seg.end["reason"] != "finished" and not seg.deferred_stop:
                return self._interrupted(seg, killed=False)
            if seg.end["reason"] == "finished":
                self._cancel_next()
                break
            # a resize: live request first, else the plan
            if seg.live_target is not None:
                target, t_req, source = seg.live_target, seg.t_live or now, "live"
                self.plan.add(step, target, "live")
                self._save_plan()
            else:
                r = self._scheduled_target(step)
                if r is None:
                    self._fail(seg, rc, f"workers stopped at step {step} with no resize pending")
                target, t_req, source = r.to, float(seg.end["stop_decided_at"]), "schedule"
                self.events.write(ResizeRequested(from_workers=world, to_workers=target,
                                                  source=source, at_step=step, time=t_req))
            inplace = self._elastic is not None
            self._pending = PendingResize(world, target, step, t_req, float(seg.end["lr"]),
                                          checkpoint_s=0.0 if inplace else seg.ckpt_s,
                                          t_exit=now if rc is not None or inplace else None,
                                          segment=seg.index)
            self._set_state(RunState.STOPPING, step=step, world_size=world, pending_world=target,
                            segment=segment)
            if self._next is not None and self._next.world != target:
                self._cancel_next()  # pre-launched for another size than the one decided
            world, segment = target, segment + 1
        self._drain(wait=True)
        self._set_state(RunState.SUCCEEDED, step=step, world_size=world, segment=segment,
                        pending_world=None)
        return self._finish()

    def _interrupted(self, seg: _Seg, killed: bool) -> dict[str, Any]:
        self._cancel_next()
        self._drain(wait=True)
        ck = self._checkpoint_step()
        if killed:
            kept = f"checkpoint at step {ck} kept" if ck else "no checkpoint was written"
            msg = f"interrupted twice: workers killed; {kept}"
        else:
            msg = f"interrupted: checkpoint at step {ck} kept"
        self._set_state(RunState.INTERRUPTED, step=ck or 0, segment=seg.index)
        self.out(f"{msg}; continue with: elastic-ring train --resume {self.spec.run_dir}")
        return self._finish(interrupted=True)

    def _checkpoint_step(self) -> int | None:
        """Step of the newest checkpoint that passes its checksum (no torch needed)."""
        from elastic_ring.ckpt.store import newest_valid

        found = newest_valid(self.spec.run_dir / "checkpoints")
        return None if found is None else found[1]

    # ------------------------------------------------------------------ recovery
    def _recover(self, seg: _Seg, rc: int) -> tuple[int, int]:
        """A segment failed: restart from the last checkpoint, or give up (raises)."""
        t_detect = self.clock()
        self._cancel_next()
        self._kill_all()
        self._drain(wait=True, timeout=10.0)
        self._pending = None
        records = protocol.read_error_records(self.spec.run_dir, since=seg.t_started)
        why, rank, rec = self._failure_cause(seg, rc, records)
        detail = self.backend.failure_detail() or {}
        ck = self._checkpoint_step() or 0
        prog = protocol.read_json(protocol.control_dir(self.spec.run_dir) / protocol.PROGRESS_FILE) or {}
        last = max(int(prog.get("step", 0)), seg.last_step, seg.start_step)
        t_last = float(prog.get("time", 0.0)) or seg.last_step_t or seg.t_launch
        # the ranks that died of their peer's loss name the step they were in: the one before it
        # was done (progress.json is written at most twice a second, so it may lag behind)
        for r in records:
            if isinstance(r.get("step"), int) and r["step"] - 1 > last:
                last, t_last = r["step"] - 1, float(r.get("time", t_last))
        if seg.stall is not None and seg.stall.last_step > last:  # the heartbeats are newer still
            last, t_last = seg.stall.last_step, self.watchdog.t_progress
        redone = max(0, last - ck)
        failure = {"from_step": ck, "type": rec.get("type") if rec else None,
                   "message": rec.get("message") if rec else why, "step": rec.get("step") if rec else None}
        attempt, repeated = self._failures.record(failure)
        world = self.plan.world_after(ck)
        usable = self._usable_slots(world)
        new_world = min(world, usable)
        append_traceback(seg.log, rec)
        deterministic = not_retried(rec)
        give_up = bool(deterministic) or repeated or attempt > self.max_restarts or new_world < 1
        self.events.write(Restart(attempt=attempt, cause=why, rank=rank, returncode=rc,
                                  segment=seg.index, world_size=seg.world, from_step=ck,
                                  failed_at_step=last, steps_redone=redone,
                                  new_world_size=0 if give_up else new_world, gave_up=give_up,
                                  node=detail.get("node") or self._stalled_hosts(seg), time=t_detect))
        if give_up:
            if deterministic:
                reason = deterministic
            elif repeated:
                where = (f"at step {failure['step']}" if failure["step"] is not None
                         else f"before the first step after step {ck}")
                reason = f"the same error {where} twice: not retrying"
            elif new_world < 1:
                reason = "no slot answers"
            else:
                reason = f"{self.max_restarts} restart(s) tried"
            self._fail(seg, rc, f"{why} ({reason})", rank=rank)
        if new_world < world:
            self.plan.add(ck, new_world, "restart")
            self._save_plan()
            self.out(f"only {usable} slot(s) answer: restarting at {new_world} worker(s) (LR by Eq. 7)")
        self._set_state(RunState.RESTARTING, step=ck, world_size=new_world, segment=seg.index + 1)
        self._restarting = _Restarting(attempt, t_detect, t_last, redone, ck, seg.index + 1)
        self.out(f"{why}: restart {attempt}/{self.max_restarts} from step {ck} with {new_world} "
                 f"worker(s) ({redone} step(s) to redo)")
        return ck, new_world

    @staticmethod
    def _stalled_hosts(seg: _Seg) -> str | None:
        """The hosts that did not answer, when the watchdog stopped ``seg`` for that."""
        return ", ".join(seg.stall.hosts) if seg.stall is not None and seg.stall.hosts else None

    def _usable_slots(self, want: int) -> int:
        """Slots usable now (the backend knows which hosts or nodes still answer)."""
        return self.backend.usable_slots(want)

    def _failure_cause(self, seg: _Seg, rc: int, records: list[dict[str, Any]] | None = None
                       ) -> tuple[str, int | None, dict[str, Any] | None]:
        """(one-line cause, first failed rank, its crash record) of a failed segment."""
        if records is None:
            records = protocol.read_error_records(self.spec.run_dir, since=seg.t_started)
        hr_first = self.backend.first_failed_rank(seg.log)
        with_record = {r.get("rank") for r in records}
        dead = [hr_first] if hr_first is not None and hr_first not in with_record else []
        if not dead:  # e.g. Horovod Elastic's driver names no rank: the ones that left no record
            pids = seg.pids or protocol.read_pid_records(self.spec.run_dir)
            inplace = self.relaunch == "inplace"  # (its processes outlive their first segment)
            dead = sorted({int(p["rank"]) for p in pids if p.get("segment") == seg.index or (
                inplace and float(p.get("created") or 0) >= seg.t_started - 1.0)} - with_record)
        first = protocol.first_failure(records, dead)
        if seg.stall is not None:  # killed by the watchdog: the others only lost their peer
            first = {"rank": seg.stall.rank, "type": "Stalled", "message": seg.stall.message,
                     "step": seg.stall.last_step + 1, "ranks": list(seg.stall.ranks)}
        detail = self.backend.failure_detail()
        if detail and seg.stall is None and (first is None or first.get("type") in (None, "Killed", "PeerLost")):
            return detail["message"], detail.get("rank"), None  # the backend saw who went first
        if first is None and hr_first is not None:
            first = {"rank": hr_first, "type": None, "message": None}
        if first is None:
            return f"horovodrun exited with status {rc} before the workers checkpointed", None, None
        rank = first.get("rank")
        if first.get("type") == "Stalled":
            return first["message"], rank, first
        if first.get("type") == "Killed":
            return first["message"], rank, None
        if first.get("type") == "PeerLost":
            return first["message"], None, first
        if first.get("type") is None:
            return f"worker rank {rank} exited first (horovodrun status {rc})", rank, None
        return f"worker rank {rank} failed: {first.get('message')}", rank, first

    def _forget_pids(self, seg: _Seg) -> None:
        """Remove the segment's process records (kept in ``seg.pids`` for the failure's cause)."""
        seg.pids = protocol.read_pid_records(self.spec.run_dir)
        for f in protocol.pid_dir(self.spec.run_dir).glob(f"seg{seg.index:03d}-rank*.json"):
            f.unlink(missing_ok=True)

    # ------------------------------------------------------------------ processes
    def _start_processes(self, seg: _Seg) -> Path:
        log = self.spec.run_dir / "logs" / f"segment-{seg.index:03d}-w{seg.world}.log"
        seg.log = log
        seg.t_launch = seg.t_started = self.clock()
        started = self.backend.start(SegmentLaunch(seg.world, seg.index, seg.stop_at, self.owner,
                                                   seg.go_file), log)
        seg.handle, seg.cmd = started.handle, started.cmd
        self._launchers[seg.index] = [seg.handle.pid, _create_time(seg.handle.pid)]
        self._set_state(self.state, launchers=list(self._launchers.values()))
        return log

    def _prelaunch(self, cur: _Seg, target: int, stop_at: int) -> None:
        """Start the next segment's workers now; they build everything and wait for their go."""
        nxt = _Seg(cur.index + 1, target, stop_at)
        nxt.go_file = protocol.go_file(self.spec.run_dir, nxt.index)
        nxt.go_file.unlink(missing_ok=True)
        self._start_processes(nxt)
        self._next = nxt
        self.out(f"pre-launched {target} worker(s) for segment {nxt.index}; they wait for the checkpoint")

    def _cancel_next(self) -> None:
        if self._next is not None and self._next.handle is not None:
            self._next.handle.kill()
            while self._next.handle.poll() is None:
                time.sleep(0.05)
            self.out(f"cancelled the pre-launched workers of segment {self._next.index}")
        self._next = None

    def _go(self, seg: _Seg, step: int) -> None:
        """Release a pre-launched segment: the checkpoint of ``step`` is on disk."""
        assert seg.go_file is not None and seg.handle is not None
        t_go = self.clock()
        tmp = seg.go_file.with_name(f".{seg.go_file.name}.tmp")
        tmp.write_text(json.dumps({"stop_at": seg.stop_at, "time": t_go}))
        os.replace(tmp, seg.go_file)
        prelaunched_s = t_go - seg.t_launch
        seg.t_launch = t_go  # relaunch -> first step is measured from the go
        self._announce(seg, step, prelaunched_s)

    def _announce(self, seg: _Seg, step: int, prelaunched_s: float = 0.0) -> None:
        if self._pending is not None:
            p = self._pending
            p.t_launch = seg.t_launch
            self.events.write(Relaunched(segment=seg.index, from_workers=p.from_workers,
                                         to_workers=p.to_workers, step=p.step, lr_last=p.lr_last,
                                         lr_new=self.rule.scale(p.lr_last, p.from_workers, p.to_workers),
                                         time=seg.t_launch))
        self.events.write(Launch(segment=seg.index, world_size=seg.world, start_step=step + 1,
                                 stop_step=seg.stop_at, command=seg.cmd, device=self.spec.device,
                                 prelaunched_s=prelaunched_s, time=seg.t_launch))
        assert seg.handle is not None
        self._telemetry = Telemetry(seg.handle.pid, gpus=self.spec.device == "cuda")
        self._set_state(RunState.RUNNING, step=step, world_size=seg.world, segment=seg.index)
        if self._progress is not None:
            self._progress.update(self._task, world=seg.world)
        else:
            log = self.spec.run_dir / "logs" / f"segment-{seg.index:03d}-w{seg.world}.log"
            self.out(f"segment {seg.index}: {seg.world} worker(s) from step {step + 1} to {seg.stop_at} "
                     f"(log: {log})")

    def _resize_inplace(self, seg: _Seg, step: int) -> None:
        """The workers paused at the end of the last segment go on at the new size: the backend
        tells them (and whatever re-forms their ring)."""
        old = self._elastic
        assert old is not None and old.handle is not None
        self._elastic = None
        seg.handle, seg.log, seg.cmd, seg.t_started = old.handle, old.log, old.cmd, old.t_started
        seg.t_launch = self.clock()
        self.backend.resize_in_place(old.index, SegmentLaunch(seg.world, seg.index, seg.stop_at, self.owner),
                                     seg.t_launch)
        self._announce(seg, step)

    def _inplace_lead(self, seg: _Seg) -> None:
        """A scheduled resize ahead: report its slot count once the segment's first step is done
        (the ring is formed: earlier, the driver could start at or skip to that count). Horovod's
        driver notices it while the workers train (it starts or ends no process before they
        reset), so at the stop the workers re-form the ring at once instead of waiting up to a
        second for the discovery."""
        r = self._scheduled_target(seg.stop_at)
        if r is not None:
            self.backend.report_ahead(r.to, SegmentLaunch(r.to, seg.index + 1, self._next_stop(seg.stop_at),
                                                          self.owner))

    def _launch(self, seg: _Seg, step: int) -> None:
        self._set_state(RunState.LAUNCHING, step=step, world_size=seg.world, segment=seg.index)
        self._start_processes(seg)
        self._announce(seg, step)

    def _drain(self, wait: bool = False, timeout: float = 60.0) -> None:
        """Reap stopped segments' processes; with ``wait``, until all are gone (killed after timeout)."""
        t0 = time.time()
        while self._draining:
            for seg in list(self._draining):
                assert seg.handle is not None
                rc = seg.handle.poll()
                if rc is None and wait and time.time() - t0 > timeout:
                    seg.handle.kill()
                    continue
                if rc is None:
                    continue
                self._draining.remove(seg)
                now = self.clock()
                self.events.write(WorkersExited(segment=seg.index, world_size=seg.world,
                                                returncode=rc, time=now))
                if rc != 0:  # after a complete checkpoint: report, but the run goes on
                    self.events.write(ErrorEvent(message=f"workers of segment {seg.index} exited "
                                                 f"with status {rc} after their checkpoint",
                                                 segment=seg.index))
                p = self._pending
                if p is not None and p.segment == seg.index:
                    p.t_exit = now
                    if p.t_first is not None and p.steady_step_s is not None:
                        self._emit_overhead(p.steady_step_s)
            if not wait or not self._draining:
                return
            time.sleep(self.poll_s)

    def _watch(self, seg: _Seg) -> int | None:
        """Watch a segment; returns horovodrun's exit status, or None when the workers have
        checkpointed for a resize and the relaunch may overlap their exit."""
        assert seg.handle is not None
        self._seg = seg
        asked_stop = exit_sent = False
        while True:
            self._relay()
            self._drain()
            self._check_live_request(seg)
            if self._interrupts and not asked_stop and not seg.deferred_stop:
                if self.in_place and not self.backend.retract_ahead(seg.index):
                    seg.deferred_stop = True  # the workers took the scheduled resize: stop the next segment
                    continue
                asked_stop = True
                stop_file(self.spec.run_dir, seg.index).touch()
                self._set_state(RunState.STOPPING, world_size=seg.world, segment=seg.index)
                self.out("stopping: workers will checkpoint at the next agreed step (Ctrl-C again to kill)")
            if (self.in_place and self._interrupts and seg.end is not None and not seg.deferred_stop
                    and seg.end["reason"] != "finished" and not exit_sent):
                exit_sent = True  # paused in place: checkpoint and leave
                self.backend.ask_exit(seg.index, self.clock())
            if self._interrupts > 1:
                seg.handle.kill()
            rc = seg.handle.poll()
            if rc is None and self._interrupts < 2 and self._check_stall(seg):
                seg.handle.kill()
                while (rc := seg.handle.poll()) is None:
                    time.sleep(0.05)
            if rc is not None:
                return rc
            if (self.relaunch != "sequential" and seg.end is not None and seg.end["reason"] != "finished"
                    and (not self._interrupts or seg.deferred_stop)):
                return None
            if self.relaunch == "prelaunch" and self._next is None and not self._interrupts:
                self._maybe_prelaunch(seg)
            time.sleep(self.poll_s)

    def _check_stall(self, seg: _Seg) -> bool:
        """Read the heartbeats (twice a second); True when the watchdog found a stall (then
        ``seg.stall`` says where and whom; see :mod:`.watchdog`)."""
        now = self.clock()
        if now - self._t_beats < 0.5:
            return False
        self._t_beats = now
        wd, rd = self.watchdog, self.spec.run_dir
        if wd.segment != seg.index:
            wd.reset(seg.index, seg.world, seg.t_launch)
        wd.observe(wdog.read_beats(rd, seg.index), now)
        local = {socket.gethostname(), socket.getfqdn(), "localhost", "127.0.0.1", "::1"}

        def log_text() -> str:
            try:
                return seg.log.read_text(errors="replace")[-200_000:] if seg.log else ""
            except OSError:
                return ""

        seg.stall = wd.check(
            now, stopped=lambda: wdog.stopped_ranks(protocol.read_pid_records(rd), seg.index, local),
            dead_hosts=lambda: self._dead_host_ranks(seg),
            missing=lambda: wdog.missing_ranks(log_text()),
            lost=lambda: self._dead_host_ranks(seg, silent=self._hosts_seen_silent()))
        if seg.stall is not None:
            st = seg.stall
            self.events.write(Stalled(segment=st.segment, last_step=st.last_step, idle_s=st.idle_s,
                                      allowed_s=st.allowed_s, ranks=list(st.ranks), why=st.why,
                                      time=now))
            self.out(f"{seg.stall.message}; no step for {seg.stall.idle_s:.1f} s "
                     f"(allowed {seg.stall.allowed_s:.1f} s): killing the workers")
        return seg.stall is not None

    def _run_hosts(self) -> list[tuple[str, int]]:
        """The hosts of --hosts/--hostfile ([] on one host)."""
        spec = self.spec
        if not (spec.hosts or spec.hostfile):
            return []
        from elastic_ring.controller.api import parse_hostfile, parse_hosts

        return parse_hosts(spec.hosts) if spec.hosts else parse_hostfile(spec.hostfile)

    def _hosts_seen_silent(self) -> frozenset[str]:
        """The hosts the last round of the host monitor found silent (asks no one now)."""
        return self._hosts.silent() if self._hosts is not None else frozenset()

    def _dead_host_ranks(self, seg: _Seg, silent: frozenset[str] | None = None) -> dict[int, str]:
        """rank -> host, for ranks of ``seg`` on hosts of --hosts/--hostfile that no longer answer
        (``silent``: those hosts as already found; None: ask every host now)."""
        hosts = self._run_hosts()
        if not hosts or silent == frozenset():
            return {}
        names = {h for h, _ in hosts}
        alive = names - silent if silent is not None else {h for h, _ in self._host_probe(hosts)}
        return wdog.ranks_on_dead_hosts(protocol.read_pid_records(self.spec.run_dir), seg.index, alive, names)

    def _maybe_prelaunch(self, seg: _Seg) -> None:
        """Start the next workers early enough that they are ready when the old ones stop."""
        if seg.end is not None:
            return
        if seg.live_target is not None:  # the stop step is not known yet: the go file will say
            self._prelaunch(seg, seg.live_target, seg.stop_at)
            return
        r = self._scheduled_target(seg.stop_at)
        # speed: this segment's last window, else the last one seen at all (an earlier segment)
        speed = seg.steps_per_s or self._last_speed
        if r is None or speed <= 0:
            return
        startup = statistics.median(self._startup_s) if self._startup_s else DEFAULT_STARTUP_S
        lead_s = 2.0 * startup + 1.0  # start-ups run slower beside training: be early
        if seg.last_step_t <= 0:  # not yet stepping: pre-launch now if the whole segment is short
            if (seg.stop_at - seg.start_step) / speed <= lead_s:
                self._prelaunch(seg, r.to, self._next_stop(seg.stop_at))
            return
        est_step = seg.last_step + (self.clock() - seg.last_step_t) * speed
        if (seg.stop_at - est_step) / speed <= lead_s:
            self._prelaunch(seg, r.to, self._next_stop(seg.stop_at))

    # ------------------------------------------------------------------ live resize
    def _check_live_request(self, seg: _Seg) -> None:
        path = self.spec.run_dir / "control" / REQUEST_FILE
        if not path.exists():
            return
        if self.in_place and not self.backend.retract_ahead(seg.index):
            return  # the workers already took the scheduled resize: the request is read next segment
        try:
            req = json.loads(path.read_text())
            rid = str(req["id"])
            target = int(req["to"])
        except (OSError, ValueError, KeyError, json.JSONDecodeError):
            return  # being written; read next time
        if rid in self._seen_requests:
            return
        self._seen_requests.add(rid)
        path.unlink(missing_ok=True)
        if seg.live_target is not None or self._next is not None:
            self.out(f"resize request to {target} ignored: a resize is already under way")
            return
        if not 1 <= target <= self.spec.slots or target == seg.world:
            self.events.write(ErrorEvent(message=f"live resize to {target} refused (workers "
                                         f"{seg.world}, slots {self.spec.slots})", segment=seg.index))
            return
        seg.live_target, seg.t_live = target, float(req.get("time", self.clock()))
        self.events.write(ResizeRequested(from_workers=seg.world, to_workers=target, source="live",
                                          time=seg.t_live))
        stop_file(self.spec.run_dir, seg.index).touch()
        self.out(f"live resize requested: {seg.world} -> {target} workers")

    # ------------------------------------------------------------------ events
    def _relay(self) -> None:
        if self._tb is not None:
            self._tb.sync()
        if not self.worker_events.exists():
            return
        with self.worker_events.open("rb") as f:
            f.seek(self._wpos)
            data = f.read()
        end = data.rfind(b"\n")
        if end < 0:
            return
        seg = getattr(self, "_seg", None)
        for line in data[:end + 1].splitlines(keepends=True):
            try:
                ev = json.loads(line)
            except json.JSONDecodeError:
                self._wpos += len(line)
                continue
            if (seg is not None and seg.end is not None and isinstance(ev.get("segment"), int)
                    and ev["segment"] > seg.index):
                return  # workers that took a resize written ahead are past the segment: wait for it
            self._wpos += len(line)
            self._on_worker_event(ev)

    def _on_worker_event(self, ev: dict[str, Any]) -> None:
        seg = getattr(self, "_seg", None)
        kind = ev.get("kind")
        p = self._pending
        if kind == "throughput" and self._telemetry is not None:
            ev["telemetry"] = self._telemetry.sample()
        self.events.write(ev)
        if kind == "first_step" and seg is not None and ev["segment"] == seg.index:
            seg.last_step, seg.last_step_t = int(ev["step"]), float(ev["time"])
            startup = float(ev["time"]) - seg.t_launch
            if seg.go_file is None and 0 < startup < 3600:  # ignore clock skew between hosts
                self._startup_s.append(startup)
            if self.in_place:
                self._inplace_lead(seg)
        if kind == "throughput" and ev.get("steps"):
            self.watchdog.add_step_time(float(ev["seconds"]) / int(ev["steps"]))
        if kind == "throughput" and seg is not None and ev["segment"] == seg.index:
            seg.last_step, seg.last_step_t = int(ev["step"]), float(ev["time"])
            seg.steps_per_s = self._last_speed = float(ev["steps_per_s"])
        rs = self._restarting
        if kind == "first_step" and rs is not None and seg is not None and ev["segment"] == seg.index:
            t_first = float(ev["time"])
            step_s = 1.0 / self._last_speed if self._last_speed > 0 else 0.0
            self.events.write(Recovered(attempt=rs.attempt, segment=seg.index, world_size=ev["world_size"],
                                        step=ev["step"], from_step=rs.from_step,
                                        steps_redone=rs.steps_redone,
                                        detect_to_first_step_s=t_first - rs.t_detect,
                                        time_lost_s=max(0.0, t_first - rs.t_last_progress)
                                        + rs.steps_redone * step_s, time=t_first))
            self._restarting = None
        if kind == "first_step" and p is not None and seg is not None and ev["segment"] == seg.index:
            p.t_first = float(ev["time"])
            self.events.write(FirstStepAfterResize(segment=seg.index, world_size=ev["world_size"],
                                                   step=ev["step"], lr=ev["lr"],
                                                   since_launch_s=p.t_first - (p.t_launch or p.t_first),
                                                   time=p.t_first))
        elif kind == "throughput":
            if p is not None and p.t_first is not None and p.steady_step_s is None:
                p.steady_step_s = ev["seconds"] / max(1, ev["steps"])
                if p.t_exit is not None:
                    self._emit_overhead(p.steady_step_s)
            self._show(ev)
        elif kind == "checkpoint_written" and seg is not None:
            seg.ckpt_s = float(ev["seconds"])
        elif kind == "segment_end" and seg is not None and ev["segment"] == seg.index:
            seg.end = ev
        elif kind == "evaluation":
            self.out(f"test accuracy {100 * ev['test_accuracy']:.2f}% (loss {ev['test_loss']:.4f}) "
                     f"at step {ev['step']}")

    def _emit_overhead(self, steady_step_s: float) -> None:
        p = self._pending
        assert p is not None and p.t_first is not None
        self.events.write(ResizeOverhead(
            from_workers=p.from_workers, to_workers=p.to_workers, step=p.step,
            stop_latency_s=(p.t_exit or p.t_request) - p.t_request, checkpoint_s=p.checkpoint_s,
            relaunch_to_first_step_s=p.t_first - (p.t_launch or p.t_first),
            total_lost_s=max(0.0, p.t_first - p.t_request - steady_step_s),
            steady_step_s=steady_step_s))
        self._pending = None

    # ------------------------------------------------------------------ output
    def _start_progress(self, step: int) -> None:
        if not self.show_progress:
            return
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        self._progress = Progress(
            TextColumn("[bold]train"), BarColumn(), TextColumn("step {task.completed}/{task.total}"),
            TextColumn("w={task.fields[world]}"), TextColumn("{task.fields[ips]} img/s"),
            TextColumn("loss {task.fields[loss]}"), TimeRemainingColumn(), transient=False)
        self._task = self._progress.add_task("train", total=self.spec.total_steps, completed=step,
                                             world="-", ips="-", loss="-")
        self._progress.start()

    def _show(self, ev: dict[str, Any]) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=ev["step"], world=ev["world_size"],
                                  ips=f"{ev['images_per_s']:.0f}", loss=f"{ev['loss']:.3f}")
        else:
            self.out(f"step {ev['step']}/{self.spec.total_steps}  workers {ev['world_size']}  "
                     f"{ev['images_per_s']:.1f} img/s  {ev['steps_per_s']:.2f} steps/s  "
                     f"loss {ev['loss']:.4f}  lr {ev['lr']:.4g}")

    def _fail(self, seg: _Seg, rc: int | None, why: str | None = None, rank: int | None = None) -> None:
        """End the run as FAILED: one line naming the cause, the log, and the way back."""
        self._cancel_next()
        self._kill_all()
        if why is None:
            why, rank, _ = self._failure_cause(seg, rc if rc is not None else -1)
        log = seg.log or self.spec.run_dir / "logs" / f"segment-{seg.index:03d}-w{seg.world}.log"
        self.events.write(ErrorEvent(message=why, rank=rank, segment=seg.index))
        self._set_state(RunState.FAILED, segment=seg.index, world_size=seg.world)
        ck = self._checkpoint_step()
        way = (f"checkpoint at step {ck} kept; resume with: elastic-ring train --resume {self.spec.run_dir}"
               if ck else "no checkpoint was written")
        raise WorkerFailedError(f"{why} (log: {log}; {way})", rank=rank, cause=why)

    def _finish(self, interrupted: bool = False) -> dict[str, Any]:
        evs = read_events(self.spec.run_dir / "events.jsonl")
        launches = [e for e in evs if e["kind"] == "launch"] or [{"time": self.clock()}]
        if not interrupted:
            s0 = summarize(evs)
            self.events.write(Finished(step=s0["step"], wall_s=self.clock() - launches[0]["time"],
                                       train_loss=s0["train_loss"], test_accuracy=s0["test_accuracy"],
                                       test_loss=s0["test_loss"]))
            evs = read_events(self.spec.run_dir / "events.jsonl")
        summary = summarize(evs)
        if interrupted:
            summary["state"] = "interrupted"
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        tmp = self.spec.run_dir / ".summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=2))
        os.replace(tmp, self.spec.run_dir / "summary.json")
        return summary



def _create_time(pid: int) -> float:
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:  # noqa: BLE001 - a fake launcher's pid
        return 0.0
