"""The controller behind `elastic-ring train`: the segment loop and its decisions.

Launching is a backend's job (:mod:`.backends`): ``horovodrun`` per segment for ``--relaunch
prelaunch|overlap|sequential`` (on one host, or the user's ``--hosts``/``--hostfile``), one long-lived
Horovod Elastic job for ``--relaunch inplace``, Ray actors for ``--backend ray``. How a resize is
done is the run's resize strategy (:mod:`.backends.resize`, built with the backend by
:func:`~.backends.make_launch`): new workers (started after the old ones exit, while they exit, or
before they stop), or the same workers re-forming their ring in place. The controller relays the
workers' events into ``RUN_DIR/events.jsonl`` with telemetry added, shows progress, and at each
resize point lets the workers checkpoint and stop, then asks the strategy to go on at the new
size; the workers rescale the LR by Eq. 7 on resume. It measures every resize: stop latency, checkpoint write, relaunch to first step,
total time lost.

When a worker dies (an exception, kill -9, the OOM killer) or its launcher exits non-zero, it
restarts the workers from the last checkpoint (``max_restarts`` failures in a row at most; an
error that repeats at the same step is not retried), at the size the plan says for that step or,
when the backend reports fewer usable slots (hosts that no longer answer), at the largest count
that fits. Each restart is an event with its cause, the rank that failed first, the steps redone
and the time lost. Where the backend keeps the survivors (Ray or ``--relaunch inplace`` with
``--survive``), a failure is a shrink instead: the survivors go on in their processes from the last
step they all hold in memory (:meth:`Controller._survivors`), counted as a restart is; a stall whose
ranks are named ends only those ranks, and the others go on the same way.

It owns the run folder while it runs (a lock, and a heartbeat its workers watch: they exit by
themselves within seconds when it is gone or replaced).

What is not the loop or a decision lives beside it: :mod:`.segment` (a segment's runtime record,
the processes still held), :mod:`.relay` (the workers' events into ``events.jsonl``),
:mod:`.meter` (what each resize and restart cost), :mod:`.diagnose` (why a segment failed, whether
one hangs), :mod:`.display` (what the terminal shows), :mod:`.restart_rule` (when to give up).

Side effects are passed in: ``launcher`` starts processes (or a whole ``backend`` with its
``resize`` strategy), ``clock`` reads time, ``out`` prints. Unit tests drive the loop with fakes; integration tests run real
horovodrun.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from typing import Any, Callable

from elastic_ring import protocol
from elastic_ring.controller import watchdog as wdog
from elastic_ring.controller.api import TERMINAL, Plan, RunSpec, RunState, check_transition
from elastic_ring.controller.backends import Backend, LaunchOptions, ResizeStrategy, make_launch
from elastic_ring.controller.backends.api import Launcher, SegmentLaunch
from elastic_ring.controller.backends.horovodrun import probe_hosts
from elastic_ring.controller.diagnose import Diagnosis
from elastic_ring.controller.display import Display
from elastic_ring.controller.lock import OwnerHeartbeat, RunLock
from elastic_ring.controller.meter import Meter, PendingResize, Restarting
from elastic_ring.controller.relay import Relay
from elastic_ring.controller.requests import take_request
from elastic_ring.controller.restart_rule import FailureHistory, append_traceback, give_up_reason
from elastic_ring.controller.segment import Processes, Segment, segment_log
from elastic_ring.controller.summary import write_summary
from elastic_ring.errors import WorkerFailedError
from elastic_ring.events.api import (CheckpointWritten, ErrorEvent, Evaluation, Event, EventLog, FirstStep, Launch,
                                     Notice, ResizeRequested, Restart, Throughput)
from elastic_ring.protocol import CONTROLLER_FILE, REQUEST_FILE, stop_file
from elastic_ring.worker.lr import RULES

DEFAULT_STARTUP_S = 10.0  # start-up estimate before the first launch has been measured
STALLED_END_S = 15.0  # stalled ranks ended alone: how long the others may take to speak before all are ended
AHEAD_GRACE_S = 0.5  # s a ring written ahead is left for rank 0 at a segment's end (_let_rank0_take_ahead)


class Controller:
    def __init__(self, spec: RunSpec, lr_scaling: str = "linear", launcher: Launcher | None = None,
                 clock: Callable[[], float] = time.time, out: Callable[[str], None] | None = None,
                 network_interface: str | None = None, poll_s: float = 0.1,
                 show_progress: bool | None = None, relaunch: str = "prelaunch",
                 max_restarts: int = 3,
                 host_probe: Callable[[list[tuple[str, int]]], list[tuple[str, int]]] | None = None,
                 plan: Plan | None = None, backend: Backend | None = None, resize: ResizeStrategy | None = None,
                 stall_timeout: float | None = None, lr_decays: tuple[int, ...] = (),
                 constant_batch: tuple[int, int] | None = None) -> None:
        self.lr_decays = tuple(lr_decays)  # steps after which the schedule decays the LR (shown at a resize)
        self.constant_batch = constant_batch  # (global batch, micro-batch): the layout shown at a resize
        # a script's "auto" (its own scaling) is decided by the workers: Eq. 7 is the reference here
        self.spec, self.rule, self.clock, self.poll_s = spec, RULES.get(lr_scaling, RULES["linear"]), clock, poll_s
        self.out = out or (lambda s: print(s, file=sys.stderr, flush=True))
        self.max_restarts = max_restarts
        if backend is None:  # the options were checked at the request (RunRequest.check)
            backend, resize = make_launch(LaunchOptions(relaunch, network_interface=network_interface), spec,
                                          launcher=launcher, host_probe=host_probe)
        assert resize is not None, "a backend comes with its resize strategy (backends.make_launch)"
        self.backend: Backend = backend
        self.resize: ResizeStrategy = resize  # how a resize is done: new workers, or the same ones in place
        self.plan = plan or Plan.from_spec(spec.workers, spec.schedule)
        self.owner = uuid.uuid4().hex
        self.state = RunState.PENDING
        self.events = EventLog(spec.run_dir / "events.jsonl")
        self.watchdog = wdog.Watchdog(timeout_s=stall_timeout)
        say = lambda line: self.out(line)  # noqa: E731 - self.out may be replaced later
        self.diagnosis = Diagnosis(spec, self.backend, self.watchdog, host_probe or probe_hosts, self.events,
                                   say, clock, keeps_processes=resize.keeps_workers)
        self.procs = Processes(self.backend, spec.run_dir, self.owner, clock, self.events)
        self.relay = Relay(spec.run_dir, self.events)
        # a script's LR is reported as its first step after a resize used it (it may set its own)
        self.meter = Meter(self.events, self.rule, lr_by_script=bool(spec.script))
        self.display = Display(say, spec.total_steps,
                               sys.stderr.isatty() if show_progress is None else show_progress)
        self._seg: Segment | None = None  # the segment being watched
        self._next: Segment | None = None  # a pre-launched segment waiting for its go
        self._elastic: Segment | None = None  # in place: the paused segment whose workers go on
        self._interrupts = 0
        self._failures = FailureHistory()  # consecutive failures (reset by saved progress)
        self._seen_requests: set[str] = set()
        self._ahead_written: tuple[int, float] | None = None  # (segment, time.monotonic()) of the last action written ahead
        self._state_info: dict[str, Any] = {}
        # what the workers are doing between a launch and its first step: starting (the run's
        # first launch), resizing, restarting; None once they step (see _phase)
        self._transition: str | None = "starting"
        self._stall_ended = 0.0  # when the stalled ranks alone were ended (the others go on: _end_stalled)
        self._refused: str | None = None  # why the backend's survivors did not go on (the next restart says)
        self._t_failure = 0.0  # when the last failure that a joiner heals was seen (_survivors)
        self._launched = False  # this controller's first launch is the start of a session

    # ------------------------------------------------------------------ state
    def _set_state(self, state: RunState, **extra: Any) -> None:
        """Move to ``state`` (the table in ``controller.api.TRANSITIONS`` is enforced) and write
        ``controller.json``; staying in a state only updates the file."""
        if state is not self.state:
            check_transition(self.state, state)
        self.state = state
        if "pending_world" in extra:  # a live resize asked is decided, or no longer pending
            self._state_info.pop("live_target", None)
        self._state_info.update(extra)
        info = {**self._state_info, "pid": os.getpid(), "owner": self.owner, "state": state.value,
                "phase": self._phase(state), "time": self.clock()}
        protocol.write_json_atomic(self.spec.run_dir / CONTROLLER_FILE, info)

    def _phase(self, state: RunState) -> str:
        """The word a user sees for ``state`` (``controller.status.Phase``): a launch is
        ``starting``, ``resizing`` or ``restarting`` until its workers' first step."""
        if state in TERMINAL:
            return {RunState.SUCCEEDED: "finished", RunState.FAILED: "failed"}.get(state, "stopped")
        if state is RunState.RESTARTING:
            return "restarting"
        if state is RunState.STOPPING:
            return "resizing" if self._state_info.get("pending_world") is not None else "stopping"
        return self._transition or "running"

    def _stepping(self) -> None:
        """The watched segment's workers made their first step: the launch's transition is over."""
        if self._transition is not None:
            self._transition = None
            self._set_state(self.state, pending_world=None, resize_from=None)

    def _save_plan(self) -> None:
        protocol.write_json_atomic(self.spec.run_dir / protocol.PLAN_FILE, self.plan.to_dict())

    def _on_signal(self, signum, frame) -> None:  # only sets a flag
        self._interrupts += 1

    def _checkpoint_step(self) -> int | None:
        """Step of the newest checkpoint that passes its checksum (no torch needed)."""
        from elastic_ring.ckpt.store import newest_valid

        found = newest_valid(self.spec.run_dir / "checkpoints")
        return None if found is None else found[1]

    def _next_stop(self, step: int) -> int:
        return self.plan.next_stop(step, self.spec.total_steps)

    # ------------------------------------------------------------------ main loop
    def run(self, start_step: int, world: int, segment: int) -> dict[str, Any]:
        lock = RunLock(self.spec.run_dir)
        lock.acquire()
        protocol.control_dir(self.spec.run_dir).mkdir(parents=True, exist_ok=True)
        self._save_plan()
        heartbeat = OwnerHeartbeat(self.spec.run_dir, self.owner)
        heartbeat.start()
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        self.diagnosis.start()
        try:
            return self._run(start_step, world, segment)
        finally:
            self.diagnosis.stop()
            for s, h in old.items():
                signal.signal(s, h)
            self.display.stop()
            self.procs.kill_all(self._next, self._seg)
            self.backend.close()
            heartbeat.stop()
            self.relay.close()
            lock.release()

    def _run(self, step: int, world: int, segment: int) -> dict[str, Any]:
        self.display.start(step)
        self._set_state(RunState.LAUNCHING, step=step, world_size=world, segment=segment)
        while True:
            seg = self._begin(step, world, segment)
            rc = self._watch(seg)
            self._relay()
            now = self.clock()
            survived = self._survivors(seg, rc) if rc not in (None, 0) and not self._interrupts else None
            if survived is not None:  # a failure taken as a shrink: the survivors go on in place
                (step, world), segment = survived, seg.index + 1
                continue
            if rc is None:  # checkpoint on disk: relaunch now, the old workers exit meanwhile
                if self.resize.keeps_workers:
                    self._elastic = seg  # paused between two steps, waiting for the new size
                else:
                    self.procs.draining.append(seg)
            else:
                self._elastic = None
                self.procs.exited(seg, rc, now)
            if rc is not None and (rc != 0 or seg.end is None):
                if self._interrupts:
                    return self._interrupted(seg, killed=True)
                step, world = self._recover(seg, rc)
                segment = seg.index + 1
                continue
            step = int(seg.end.step)
            if self._failures.failures:  # a checkpoint newer than the restart's: count again
                self._failures.progress_saved(self._checkpoint_step())
            if self.meter.pending is not None and self.meter.pending.t_first is not None:
                self._drain(wait=True)  # may emit the overhead itself
                self.meter.flush()  # no full window at the new size: no steady step
            if self._interrupts and seg.end.reason != "finished" and not seg.deferred_stop:
                return self._interrupted(seg, killed=False)
            if seg.end.reason == "finished":
                self._cancel_next()
                break
            world, segment = self._decide_resize(seg, step, world, rc, now), segment + 1
        self._drain(wait=True)
        self._set_state(RunState.SUCCEEDED, step=step, world_size=world, segment=segment,
                        pending_world=None)
        return self._finish()

    def _begin(self, step: int, world: int, segment: int) -> Segment:
        """Start segment ``segment`` after ``step``: release the pre-launched workers, or have the
        paused ones go on in place, or launch new ones."""
        if self._next is not None and self._next.index == segment:
            seg, self._next = self._next, None
            seg.stop_at, seg.start_step = self._next_stop(step), step
            self._announce(seg, step, prelaunched_s=self.procs.release(seg))  # the checkpoint is on disk
            return seg
        seg = Segment(segment, world, self._next_stop(step), start_step=step)
        if self._elastic is not None:  # in place: the same processes go on at the new size
            self._resize_inplace(seg, step)
        else:
            self._set_state(RunState.LAUNCHING, step=step, world_size=seg.world, segment=seg.index)
            self._start_processes(seg)
            self._announce(seg, step)
        return seg

    def _decide_resize(self, seg: Segment, step: int, world: int, rc: int | None, now: float) -> int:
        """The workers of ``seg`` stopped at ``step`` for a resize: the size to go on at (a live
        request first, else the plan); the resize is measured from here."""
        source = "live"
        if seg.live_target is not None:
            target, t_req, source = seg.live_target, seg.t_live or now, seg.live_source
            if source == "joiner":  # measured from the survivors' pause, as a scheduled grow: the
                t_req = float(seg.end.stop_decided_at) or t_req  # steps while the stop was agreed are not lost
            self.plan.add(step, target, source)
            self._save_plan()
        else:
            r = self.plan.resize_at(step)
            if r is None and seg.end.reason == "scheduled" and step > seg.stop_at:
                r = self.plan.resize_at(seg.stop_at)  # stopped at the first commit after the step
            if r is None:
                self._fail(seg, rc, f"workers stopped at step {step} with no resize pending")
            target, t_req = r.to, float(seg.end.stop_decided_at)
            source = next((src for s, _, src in self.plan.changes if s == r.step), "schedule")
            self.events.write(ResizeRequested(from_workers=world, to_workers=target,
                                              source="joiner" if source == "joiner" else "schedule", at_step=step,
                                              time=t_req))
        inplace = self._elastic is not None
        self.meter.pending = PendingResize(world, target, step, t_req, float(seg.end.lr),
                                           checkpoint_s=0.0 if inplace else seg.ckpt_s,
                                           t_exit=now if rc is not None or inplace else None,
                                           segment=seg.index, t_failure=self._t_failure if source == "joiner" else None)
        self._transition = "resizing"
        self._set_state(RunState.STOPPING, step=step, world_size=world, pending_world=target,
                        resize_from=world, segment=seg.index)
        if self._next is not None and self._next.world != target:
            self._cancel_next()  # pre-launched for another size than the one decided
        return target

    def _interrupted(self, seg: Segment, killed: bool) -> dict[str, Any]:
        self._cancel_next()
        self._drain(wait=True)
        ck = self._checkpoint_step()
        kept = f"checkpoint at step {ck} kept" if ck else "no checkpoint was written"
        msg = f"interrupted twice: workers killed; {kept}" if killed else f"interrupted: {kept}"
        self._set_state(RunState.INTERRUPTED, step=ck or 0, segment=seg.index)
        cmd = f"elastic-ring train --resume {self.spec.run_dir}"
        self.out(f"{msg}; continue with: {cmd}" if ck else f"{msg}; {cmd} starts over from step 1")
        return self._finish(interrupted=True)

    def _finish(self, interrupted: bool = False) -> dict[str, Any]:
        self.display.stop()
        return write_summary(self.spec.run_dir, self.events, self.clock(), interrupted=interrupted)

    def _fail(self, seg: Segment, rc: int | None, why: str | None = None, rank: int | None = None) -> None:
        """End the run as FAILED: one line naming the cause, the log, and the way back."""
        self._cancel_next()
        self.procs.kill_all(self._next, self._seg)
        if why is None:
            why, rank, _ = self.diagnosis.failure_cause(seg, rc if rc is not None else -1)
        log = seg.log or segment_log(self.spec.run_dir, seg.index, seg.world)
        self.events.write(ErrorEvent(message=why, rank=rank, segment=seg.index))
        self._set_state(RunState.FAILED, segment=seg.index, world_size=seg.world)
        ck = self._checkpoint_step()
        way = (f"checkpoint at step {ck} kept; resume with: elastic-ring train --resume {self.spec.run_dir}"
               if ck else "no checkpoint was written")
        raise WorkerFailedError(f"{why} (log: {log}; {way})", rank=rank, cause=why)

    # ------------------------------------------------------------------ recovery
    def _recover(self, seg: Segment, rc: int) -> tuple[int, int]:
        """A segment failed: restart from the last checkpoint, or give up (raises)."""
        t_detect = self.clock()
        self._cancel_next()
        self.procs.kill_all(self._next, self._seg)
        self._drain(wait=True, timeout=10.0)
        self.meter.pending = None
        records = protocol.read_error_records(self.spec.run_dir, since=seg.t_started)
        why, rank, blamed = self.diagnosis.failure_cause(seg, rc, records)
        rec = blamed.record if blamed is not None else None  # the crash record on disk, if one
        seen = self.backend.failure_detail()
        ck = self._checkpoint_step() or 0
        last, t_last = self.diagnosis.failed_at(seg, records)
        last = max(last, ck)  # the progress file may lag behind the checkpoint's step
        redone = max(0, last - ck)
        failure = {"from_step": ck, "type": blamed.type if blamed else None,
                   "message": blamed.message if blamed else why, "step": blamed.step if blamed else None}
        attempt, repeated = self._failures.record(failure)
        world = self.plan.world_after(ck)
        usable = self.backend.usable_slots(world)  # the backend knows which hosts or nodes answer
        new_world = min(world, usable)
        append_traceback(seg.log, rec)
        reason = give_up_reason(rec, failure, attempt, repeated, self.max_restarts, new_world)
        refused, self._refused = self._refused, None
        self.events.write(Restart(attempt=attempt, cause=why, rank=rank, returncode=rc,
                                  segment=seg.index, world_size=seg.world, from_step=ck,
                                  failed_at_step=last, steps_redone=redone,
                                  new_world_size=0 if reason is not None else new_world, gave_up=reason is not None,
                                  node=(seen.node if seen else None) or self.diagnosis.stalled_hosts(seg),
                                  memory_refused=refused, time=t_detect))
        if reason is not None:
            self._fail(seg, rc, f"{why} ({reason})", rank=rank)
        if new_world < world:
            self.plan.add(ck, new_world, "restart")
            self._save_plan()
            self.out(f"only {usable} slot(s) answer: restarting at {new_world} worker(s) "
                     + (f"(LR unchanged: {self._layout(new_world)})" if self.constant_batch else
                        "(LR by the run's rule)"))
        self._transition = "restarting"
        self._set_state(RunState.RESTARTING, step=ck, world_size=new_world, segment=seg.index + 1,
                        pending_world=None, resize_from=None)
        self.meter.restarting = Restarting(attempt, t_detect, t_last, redone, ck, seg.index + 1)
        self.out(f"{why}: restart {attempt}/{self.max_restarts} from step {ck} with {new_world} "
                 f"worker(s) ({redone} step(s) to redo)" + (f"; not from memory: {refused}" if refused else ""))
        return ck, new_world

    def _survivors(self, seg: Segment, rc: int) -> tuple[int, int] | None:
        """A segment failed (or its stalled ranks were ended: :meth:`_end_stalled`), and the backend
        may keep its survivors (the Ray backend or ``--relaunch inplace`` with ``--survive``): they go
        on in their processes from the last step they all hold in memory, at their number, as after a
        scheduled shrink there (the next segment is an in-place resize).
        The failure counts as a restart's does (``max_restarts``, the same error twice) and is a
        ``restart`` event with ``path`` "memory". Where the backend starts a new worker on a grow
        (``rejoins``), the plan grows back to the size it had after the survivors' next step (a
        ``joiner`` entry). Returns (that step, the survivors' number), or None: restart from the
        checkpoint (:meth:`_recover`)."""
        if not self.resize.keeps_workers or (seg.stall is not None and not self._stall_ended):
            return None
        t_detect = self.clock()
        self._stall_ended = 0.0
        s = self.backend.survivors()
        if s is None:
            self._refused = self.backend.refused  # for the restart that follows
            return None
        self._cancel_next()
        self.meter.pending = None
        f = s.failure
        records = protocol.read_error_records(self.spec.run_dir, since=seg.t_started)
        last, t_last = self.diagnosis.failed_at(seg, records)
        last = max(last, s.step)  # the survivors all hold s.step done: the progress file may lag behind
        redone = max(0, last - s.step)
        stalled = seg.stall is not None
        why = seg.stall.message if stalled else f.message or f"worker rank {f.rank} failed"
        failure = {"from_step": s.step, "type": "Stalled" if stalled else f.type, "message": why,
                   "step": f.step if f.step is not None else last + 1}
        attempt, repeated = self._failures.record(failure)
        rec = f.record or next((r for r in records if r.get("rank") == f.rank and not r.get("peer_loss")), None)
        reason = give_up_reason(rec, failure, attempt, repeated, self.max_restarts, s.world)
        self.events.write(Restart(attempt=attempt, cause=why, rank=f.rank, returncode=rc, segment=seg.index,
                                  world_size=seg.world, from_step=s.step, failed_at_step=last, steps_redone=redone,
                                  new_world_size=0 if reason is not None else s.world, gave_up=reason is not None,
                                  node=f.node, path="memory", time=t_detect))
        if reason is not None:
            self._fail(seg, rc, f"{why} ({reason})", rank=f.rank)
        planned = self.plan.world_after(s.step + 1)  # the size the job was to have after the next step
        self.plan.add(s.step, s.world, "failure")
        joins = (self.backend.rejoins and reason is None and planned > s.world
                 and s.step + 1 < self.spec.total_steps and self.plan.world_after(s.step + 1) == s.world)
        self._t_failure = t_detect  # a joiner's grow back says how long after the failure it came
        if joins:  # a new worker takes the dead one's place after the survivors' next step
            self.plan.add(s.step + 1, planned, "joiner")
        self._save_plan()
        self._elastic = seg  # its survivors wait, paused, for their new ring
        self._transition = "restarting"
        self._set_state(self.state, step=s.step, world_size=s.world, segment=seg.index + 1, pending_world=None,
                        resize_from=None)  # the phase says restarting; the workers never stopped running
        self.meter.restarting = Restarting(attempt, t_detect, t_last, redone, s.step, seg.index + 1, path="memory")
        joined = f" with {s.joiners} warm spare(s) in the failed worker(s)' place" if s.joiners else ""
        if joins:
            joined += (f"; {planned - s.world} new worker(s) join after step {s.step + 1}, the state by broadcast "
                       f"from a survivor")
        self.out(f"{why}: restart {attempt}/{self.max_restarts} in memory: {s.world - s.joiners} survivor(s) go "
                 f"on from step {s.step}{joined} ({redone} step(s) to redo)")
        return s.step, s.world

    # ------------------------------------------------------------------ processes
    def _start_processes(self, seg: Segment) -> None:
        self.procs.start(seg)
        self._set_state(self.state, launchers=list(self.procs.launchers.values()))

    def _drain(self, wait: bool = False, timeout: float = 60.0) -> None:
        """Reap stopped segments' processes; with ``wait``, until all are gone (killed after timeout)."""
        self.procs.reap(lambda seg, t: self.meter.exited(seg.index, t), wait=wait, timeout=timeout,
                        poll_s=self.poll_s)

    def _prelaunch(self, cur: Segment, target: int, stop_at: int) -> None:
        """Start the next segment's workers now; they build everything and wait for their go."""
        nxt = Segment(cur.index + 1, target, stop_at)
        nxt.go_file = protocol.go_file(self.spec.run_dir, nxt.index)
        nxt.go_file.unlink(missing_ok=True)
        self._start_processes(nxt)
        self._next = nxt
        self.out(f"pre-launched {target} worker(s) for segment {nxt.index}; they wait for the checkpoint")

    def _cancel_next(self) -> None:
        if self._next is not None and self._next.handle is not None:
            self.procs.end(self._next)
            self.out(f"cancelled the pre-launched workers of segment {self._next.index}")
        self._next = None

    def _announce(self, seg: Segment, step: int, prelaunched_s: float = 0.0) -> None:
        rel = self.meter.relaunched(seg.index, seg.t_launch)
        self.events.write(Launch(segment=seg.index, world_size=seg.world, start_step=step + 1,
                                 stop_step=seg.stop_at, command=seg.cmd, device=self.spec.device,
                                 prelaunched_s=prelaunched_s, session_start=not self._launched,
                                 time=seg.t_launch))
        self._launched = True
        assert seg.handle is not None
        self.relay.sample(seg.handle.pid, gpus=self.spec.device == "cuda")
        self._set_state(RunState.RUNNING, step=step, world_size=seg.world, segment=seg.index)
        self.display.segment(seg.index, seg.world, step + 1, seg.stop_at,
                             seg.log or segment_log(self.spec.run_dir, seg.index, seg.world))
        if rel is not None:
            self.display.resized(rel.from_workers, rel.to_workers, rel.step, rel.lr_last, rel.lr_new,
                                 self.lr_decays, layout=self._layout(rel.to_workers))

    def _layout(self, world: int) -> str | None:
        """A constant global batch's micro-batch layout at ``world`` workers (None: another rule)."""
        if self.constant_batch is None:
            return None
        from elastic_ring.worker.accumulate import Layout

        g, b = self.constant_batch
        if not b:  # a script's: its micro-batch is its own batch
            return f"global batch {g} shared by {world} worker(s) in the script's micro-batches"
        return Layout(g, b, world).describe()

    def _resize_inplace(self, seg: Segment, step: int) -> None:
        """The workers paused at the end of the last segment go on at the new size: the backend
        tells them (and whatever re-forms their ring). When rank 0 took the action written ahead,
        they went on at the segment's end, not now: the relaunch is timed from there."""
        old = self._elastic
        assert old is not None and old.handle is not None
        self._elastic = None
        seg.handle, seg.log, seg.cmd, seg.t_started = old.handle, old.log, old.cmd, old.t_started
        seg.t_launch = self.clock()
        self._let_rank0_take_ahead(old.index)
        if not self.resize.withdraw_ahead(old.index) and old.end is not None and old.end.time:
            seg.t_launch = min(seg.t_launch, float(old.end.time))
        self.resize.resize(old.index, seg.launch(self.owner), seg.t_launch)
        self._announce(seg, step)

    def _prepare_ahead(self, seg: Segment) -> None:
        """A scheduled resize ahead: the strategy prepares it once the segment's first step is done
        (the ring is formed: earlier, Horovod Elastic's driver could start at or skip to that
        count), so that at the stop the workers in place re-form the ring at once."""
        r = self.plan.resize_at(seg.stop_at)
        if r is not None:
            self.resize.prepare_ahead(SegmentLaunch(r.to, seg.index + 1, self._next_stop(seg.stop_at), self.owner))
            self._ahead_written = (seg.index, time.monotonic())

    def _let_rank0_take_ahead(self, segment: int) -> None:
        """A short segment can end before the controller relays its first step: the ring is then
        written ahead in the same poll that sees the segment's end, and withdrawn at once, although
        rank 0, paused and polling for its action (every 0.05 s), would take it (seen in
        test_ray: 6 steps in 0.21 s, no ``inplace-1.taken.json``). An action written ahead less
        than ``AHEAD_GRACE_S`` ago is left that long for rank 0 to take before it is withdrawn."""
        from elastic_ring.worker.inplace import inplace_action_file

        written, self._ahead_written = self._ahead_written, None
        if written is None or written[0] != segment:
            return
        ahead = inplace_action_file(self.spec.run_dir, segment)
        while ahead.exists() and time.monotonic() < written[1] + AHEAD_GRACE_S:
            time.sleep(0.02)

    # ------------------------------------------------------------------ watching a segment
    def _watch(self, seg: Segment) -> int | None:
        """Watch a segment; returns horovodrun's exit status, or None when the workers have
        checkpointed for a resize and the relaunch may overlap their exit, or have paused in place
        for one. Also None when they exited after a scheduled stop whose next ring rank 0 took
        (written ahead): they ran the next segment (a short last one may end before this sees the
        stop) and the controller follows them there in place; before, it saw a plain exit and
        relaunched that segment on a cold worker, which redid it from its final checkpoint."""
        assert seg.handle is not None
        self._seg = seg
        asked_stop = exit_sent = False
        while True:
            self._relay()
            self._drain()
            self._check_live_request(seg)
            self._check_heal(seg)
            if self._interrupts and not asked_stop and not seg.deferred_stop:
                if not self.resize.withdraw_ahead(seg.index):
                    seg.deferred_stop = True  # the workers took the scheduled resize: stop the next segment
                    continue
                asked_stop = True
                stop_file(self.spec.run_dir, seg.index).touch()
                self._set_state(RunState.STOPPING, world_size=seg.world, segment=seg.index)
                self.out("stopping: workers will checkpoint at the next agreed step (Ctrl-C again to kill)")
            if (self.resize.keeps_workers and self._interrupts and seg.end is not None and not seg.deferred_stop
                    and seg.end.reason != "finished" and not exit_sent):
                exit_sent = True  # paused in place: checkpoint and leave
                self.resize.ask_exit(seg.index, self.clock())
            if self._interrupts > 1:
                seg.handle.kill()
            rc = seg.handle.poll()
            if rc is None and self._interrupts < 2 and seg.stall is None and self.diagnosis.check_stall(seg):
                self._stall_ended = self._end_stalled(seg)
                if not self._stall_ended:
                    seg.handle.kill()
                    while (rc := seg.handle.poll()) is None:
                        time.sleep(0.05)
            elif rc is None and seg.stall is not None and self.clock() - self._stall_ended > STALLED_END_S:
                seg.handle.kill()  # the stalled ranks were ended, yet no survivor spoke: end them all
                self._stall_ended = 0.0
                while (rc := seg.handle.poll()) is None:
                    time.sleep(0.05)
            if rc is not None:
                if (rc == 0 and self.resize.keeps_workers and seg.end is not None and seg.end.reason != "finished"
                        and not self._interrupts and not self.resize.withdraw_ahead(seg.index)):
                    return None  # rank 0 took the ring written ahead and its workers ran on, to their exit
                return rc
            if (self.resize.overlaps_exit and seg.end is not None and seg.end.reason != "finished"
                    and (not self._interrupts or seg.deferred_stop)):
                return None
            if self.resize.prelaunches and self._next is None and not self._interrupts:
                self._maybe_prelaunch(seg)
            time.sleep(self.poll_s)

    def _end_stalled(self, seg: Segment) -> float:
        """A stall whose ranks are named, and a backend that keeps survivors (``--survive``): only
        the stalled ranks are ended; the others lose a peer and go on from memory as after its
        death (:meth:`_survivors`). Returns when (0.0: not done; the caller kills the whole job)."""
        st = seg.stall
        if (st is None or not self.resize.keeps_workers or not st.ranks
                or len(st.ranks) >= seg.world or not self.backend.end_ranks(list(st.ranks))):
            return 0.0
        self.out(f"ended the stalled rank(s) {', '.join(map(str, st.ranks))} only: the others go on from memory")
        return self.clock()

    def _maybe_prelaunch(self, seg: Segment) -> None:
        """Start the next workers early enough that they are ready when the old ones stop."""
        if seg.end is not None:
            return
        if seg.live_target is not None:  # the stop step is not known yet: the go file will say
            self._prelaunch(seg, seg.live_target, seg.stop_at)
            return
        r = self.plan.resize_at(seg.stop_at)
        left = self.meter.seconds_left(seg, self.clock())
        if r is not None and left is not None and left <= self.meter.prelaunch_lead_s(DEFAULT_STARTUP_S):
            self._prelaunch(seg, r.to, self._next_stop(seg.stop_at))

    def _check_live_request(self, seg: Segment) -> None:
        if not (self.spec.run_dir / "control" / REQUEST_FILE).exists():
            return
        if not self.resize.withdraw_ahead(seg.index):
            return  # the workers already took the scheduled resize: the request is read next segment
        req_file = self.spec.run_dir / "control" / REQUEST_FILE
        req = take_request(self.spec.run_dir, self._seen_requests, remove=False)
        if req is None:
            return
        target, t_asked = req
        if seg.live_target is not None or self._next is not None:
            req_file.unlink(missing_ok=True)
            self.out(f"resize request to {target} ignored: a resize is already under way")
            return
        if not 1 <= target <= self.spec.slots or target == seg.world:
            req_file.unlink(missing_ok=True)
            self.events.write(ErrorEvent(message=f"live resize to {target} refused (workers "
                                         f"{seg.world}, slots {self.spec.slots})", segment=seg.index))
            return
        seg.live_target, seg.t_live = target, t_asked if t_asked is not None else self.clock()
        # `resize` sees it pending throughout: live_target is written before the request file goes
        self._set_state(self.state, live_target=target)
        req_file.unlink(missing_ok=True)
        self.events.write(ResizeRequested(from_workers=seg.world, to_workers=target, source="live",
                                          time=seg.t_live))
        stop_file(self.spec.run_dir, seg.index).touch()
        self.out(f"live resize requested: {seg.world} -> {target} workers")

    def _check_heal(self, seg: Segment) -> None:
        """The survivors of a failure went on fewer, and the backend has a warm worker for a failed
        one's place now (Ray with ``--survive``: ``heal_target``): it joins at the next step
        boundary, as a live resize to that size does (a ``resize_requested`` event of source
        ``joiner``)."""
        if seg.live_target is not None or self._next is not None or self._interrupts or seg.end is not None:
            return
        target = self.backend.heal_target()
        if target is None or target == seg.world or not self.resize.withdraw_ahead(seg.index):
            return
        seg.live_target, seg.t_live, seg.live_source = target, self.clock(), "joiner"
        self.events.write(ResizeRequested(from_workers=seg.world, to_workers=target, source="joiner", time=seg.t_live))
        stop_file(self.spec.run_dir, seg.index).touch()
        self.out(f"a warm worker is up for the failed worker's place: {seg.world} -> {target} workers")

    # ------------------------------------------------------------------ the workers' events
    def _relay(self) -> None:
        self.relay.poll(self._on_worker_event, hold=self._ahead)

    def _ahead(self, ev: Event) -> bool:
        """An event of a segment after the one that just ended (workers that took a resize written
        ahead): it waits until that segment is watched."""
        seg, n = self._seg, getattr(ev, "segment", None)
        return seg is not None and seg.end is not None and isinstance(n, int) and n > seg.index

    def _on_worker_event(self, ev: Event) -> None:
        """React to one worker event (already in ``events.jsonl``): the running segment's progress,
        the measurements, the display."""
        seg = self._seg
        mine = seg is not None and getattr(ev, "segment", None) == seg.index
        if mine:
            seg.observe(ev)
        if isinstance(ev, FirstStep) and mine:
            self._stepping()
            self._prepare_ahead(seg)
            rel = self.meter.first_step(seg.index, ev, seg.t_launch, prelaunched=seg.go_file is not None)
            if rel is not None:
                self.display.resized(rel.from_workers, rel.to_workers, rel.step, rel.lr_last, rel.lr_new,
                                     rule=rel.rule, lr_rule=rel.lr_rule, layout=self._layout(rel.to_workers))
        elif isinstance(ev, Throughput):
            if ev.steps:
                self.watchdog.add_step_time(float(ev.seconds) / int(ev.steps))
            self.meter.throughput(ev, running=mine)
            self.display.throughput(ev)
        elif isinstance(ev, CheckpointWritten) and seg is not None:
            seg.ckpt_s = float(ev.seconds)
        elif isinstance(ev, Evaluation):
            self.display.evaluation(ev)
        elif isinstance(ev, Notice):
            self.display.notice(ev.message)
