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
step they all hold in memory (:meth:`Controller._failed`), counted as a restart is; a stall whose
ranks are named ends only those ranks, and the others go on the same way.

With host discovery (``--host-discovery-script``: a :class:`~elastic_ring.hosts.manager.HostManager`
passed in), the watch polls discovery every interval: when the usable slots change, the job stops
at an agreed step with a checkpoint and is relaunched at the size they allow (``--min-workers`` ..
``--max-workers``, or the size asked) on the first of those slots (cause ``hosts``); below the
minimum it waits, and a schedule's or a live resize's size is capped by what is discovered.

Every cause of a change of members (schedule, live request, hosts, joiner, failure, stall, lost host) goes
through one path: the watch of a segment ends with its group's state (:meth:`Controller._watch`: a
:class:`~.backends.api.GroupStatus`, from the backend's ``monitor``), :meth:`Controller._decide`
turns it into one :class:`~.membership.MembershipChange` (its cause and state source),
:meth:`Controller._act` carries it out and writes it as a ``membership_change`` event, and the next
segment begins from that state source (:meth:`Controller._begin`: a new group from the checkpoint,
or the paused one re-formed in place from memory or a peer).

It owns the run folder while it runs (a lock, and a heartbeat its workers watch: they exit by
themselves within seconds when it is gone or replaced).

What is not the loop or a decision lives beside it: :mod:`.membership` (the record of a change, and
the one rule of its state source), :mod:`.segment` (a segment's runtime record,
the processes still held), :mod:`.relay` (the workers' events into ``events.jsonl``),
:mod:`.meter` (what each resize and restart cost), :mod:`.diagnose` (why a segment failed, whether
one hangs), :mod:`.display` (what the terminal shows), :mod:`.restart_rule` (when to give up),
:mod:`.host_watch` (host discovery: the size to launch at, the hosts, when they change),
:mod:`.stalls` (a hang: the stalled ranks ended alone, or the whole job), :mod:`.prelaunch` (the
next segment's workers started before the stop), :mod:`.ahead` (the next ring written ahead, in place),
:mod:`.worker_events` (what each worker event changes: progress, measurements, the display);
two base classes of :class:`Controller` hold the methods moved out of this file: :mod:`.asks` (the
watch's checks for a change asked while a segment runs, and the ask) and :mod:`.recovery` (a
failure's survivors asked, and the restart).

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
from typing import TYPE_CHECKING, Any, Callable

from elastic_ring import protocol
from elastic_ring.controller import watchdog as wdog
from elastic_ring.controller.ahead import RingAhead
from elastic_ring.controller.api import LAUNCHING, Plan, RunSpec, RunState, check_transition
from elastic_ring.controller.asks import Asks
from elastic_ring.controller.backends import Backend, LaunchOptions, ResizeStrategy, make_launch
from elastic_ring.controller.backends.api import GroupState, GroupStatus, Launcher
from elastic_ring.controller.backends.horovodrun import probe_hosts
from elastic_ring.controller.diagnose import Diagnosis
from elastic_ring.controller.display import Display, layout_words
from elastic_ring.controller.drains import Drains
from elastic_ring.controller.host_watch import HostWatch
from elastic_ring.controller.lock import OwnerHeartbeat, RunLock
from elastic_ring.controller.membership import Cause, MembershipChange, StateSource, decide
from elastic_ring.controller.meter import Meter, PendingResize
from elastic_ring.controller.prelaunch import Prelaunch
from elastic_ring.controller.recovery import Recovery
from elastic_ring.controller.relay import Relay
from elastic_ring.controller.restart_rule import FailureHistory
from elastic_ring.controller.segment import Processes, Segment, Stop, segment_log
from elastic_ring.controller.stalls import Stalls
from elastic_ring.controller.summary import write_summary
from elastic_ring.controller.survive_choice import SurviveWatch
from elastic_ring.controller.worker_events import WorkerEvents
from elastic_ring.errors import EXIT_REQUEUE, WorkerFailedError
from elastic_ring.events.api import ErrorEvent, EventLog, Launch, Notice, ResizeRequested
from elastic_ring.hosts import slurm
from elastic_ring.protocol import CONTROLLER_FILE, stop_file
from elastic_ring.worker.lr import RULES

if TYPE_CHECKING:
    from elastic_ring.hosts.manager import HostManager

NAP_S = 0.01  # how often the loop's sleep looks for a new live request


class Controller(Asks, Recovery):
    def __init__(self, spec: RunSpec, lr_scaling: str = "linear", launcher: Launcher | None = None,
                 clock: Callable[[], float] = time.time, out: Callable[[str], None] | None = None,
                 network_interface: str | None = None, poll_s: float = 0.1,
                 show_progress: bool | None = None, relaunch: str = "prelaunch",
                 max_restarts: int = 3,
                 host_probe: Callable[[list[tuple[str, int]]], list[tuple[str, int]]] | None = None,
                 plan: Plan | None = None, backend: Backend | None = None, resize: ResizeStrategy | None = None,
                 stall_timeout: float | None = None, lr_decays: tuple[int, ...] = (),
                 constant_batch: tuple[int, int] | None = None, hosts: HostManager | None = None,
                 asked_workers: int | None = None, grace: float | None = None, survive: Any = None) -> None:
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
        self.state = RunState.STARTING  # (controller.json is written from the first launch on)
        self.events = EventLog(spec.run_dir / "events.jsonl")
        self.watchdog = wdog.Watchdog(timeout_s=stall_timeout)
        say = lambda line: self.out(line)  # noqa: E731 - self.out may be replaced later
        self.diagnosis = Diagnosis(spec, self.backend, self.watchdog, host_probe or probe_hosts, self.events,
                                   say, clock, keeps_processes=resize.keeps_workers)
        self.stalls = Stalls(self.diagnosis, self.backend, resize, say, clock, lambda: self._interrupts)
        self.procs = Processes(self.backend, spec.run_dir, self.owner, clock, self.events)
        self.relay = Relay(spec.run_dir, self.events)
        # a script's LR is reported as its first step after a resize used it (it may set its own)
        self.meter = Meter(self.events, self.rule, lr_by_script=bool(spec.script))
        self.display = Display(say, spec.total_steps,
                               sys.stderr.isatty() if show_progress is None else show_progress)
        self._seg: Segment | None = None  # the segment being watched
        self._elastic: Segment | None = None  # in place: the paused segment whose workers go on
        self._interrupts = 0
        # --grace: seconds from the first interrupt for the workers to checkpoint (None: no limit);
        # Slurm's notice (SIGUSR1, or SIGTERM, inside an allocation) ends with EXIT_REQUEUE
        self.grace, self._t_interrupt, self._grace_passed, self._requeue = grace, None, False, False
        self._failures = FailureHistory()  # consecutive failures (reset by saved progress)
        self._seen_requests: set[str] = set()
        self._state_info: dict[str, Any] = {}
        self._state_written = False  # controller.json holds this controller's state
        self._refused: str | None = None  # why the backend's survivors did not go on (the next restart says)
        self._t_failure = 0.0  # when the last failure that a joiner heals was seen (_failed)
        self._launched = False  # this controller's first launch is the start of a session
        # host discovery (hosts.manager.HostManager, or None), watched by a HostWatch
        self.hosts = None if hosts is None else HostWatch(
            hosts, asked_workers, plan=self.plan, save_plan=self._save_plan, meter=self.meter, events=self.events,
            out=say, clock=clock, poll_s=poll_s, show_line=self._show_hosts, interrupted=lambda: self._interrupts,
            show_state=lambda st: self._set_state(self.state, host_state=st))
        if hosts is not None:  # a host the watchdog's monitor finds silent is not grown onto (HostManager.silent)
            hosts.silent = self.diagnosis.silent_hosts
        # hosts leaving with notice (`elastic-ring drain`, a worker's SIGTERM): .drains
        self.drains = Drains(self.hosts, spec.run_dir, self.events, say, clock, notice_deadline_s=grace,
                             backend=self.backend if resize.keeps_workers else None)
        self.prelaunch = Prelaunch(spec.run_dir, self.procs, self._start_processes, self.plan, self.meter, self.hosts,
                                   self._next_stop, say, clock)
        self.ahead = RingAhead(self.plan, resize, spec.run_dir, self.owner, self._next_stop)  # (in place)
        self.worker_events = WorkerEvents(self.meter, self.display, self.watchdog, constant_batch, self._stepping)
        # whether a failure's survivors go on (controller.survive_choice.Choice; None: the backend's own say)
        self.survival = None if survive is None else SurviveWatch(survive, spec.run_dir, self.events, say,
                                                                  self._show_survive)

    def _show_survive(self, line: str) -> None:
        """The survive choice in ``controller.json`` (`status`), written now once the run is under way."""
        self._state_info["survive"] = line
        if self._state_written:
            self._set_state(self.state)

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
                "time": self.clock()}
        protocol.write_json_atomic(self.spec.run_dir / CONTROLLER_FILE, info)
        self._state_written = True

    def _stepping(self, seg: Segment) -> None:
        """The watched segment's workers made their first step: the launch (starting, resizing,
        restarting) is over; a scheduled resize ahead is prepared (:meth:`.RingAhead.prepare`)."""
        if self.state in LAUNCHING:
            self._set_state(RunState.RUNNING, pending_world=None, resize_from=None)
        self.ahead.prepare(seg)
        self._scheduled_shrink_ahead(seg)  # (over hosts in place: with its hosts)

    def _show_hosts(self, line: str, view: Any) -> None:
        """`status`'s hosts line, the usable hosts and those draining (`elastic-ring drain` checks them)."""
        self._set_state(self.state, hosts=line, usable_hosts=dict(view.usable.items()),
                        draining=sorted(self.drains.pending))

    def _save_plan(self) -> None:
        protocol.write_json_atomic(self.spec.run_dir / protocol.PLAN_FILE, self.plan.to_dict())

    def _on_signal(self, signum, frame) -> None:  # only sets flags
        self._interrupts += 1
        if self._t_interrupt is None:
            self._t_interrupt = self.clock()
        if signum in (signal.SIGTERM, signal.SIGUSR1) and slurm.in_allocation():
            self._requeue = True  # Slurm's preemption or time limit: the batch script requeues

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
        if self.survival is not None:
            self.survival.start()
        heartbeat = OwnerHeartbeat(self.spec.run_dir, self.owner)
        heartbeat.start()
        sigs = (signal.SIGINT, signal.SIGTERM) + ((signal.SIGUSR1,) if slurm.in_allocation() else ())
        old = {s: signal.signal(s, self._on_signal) for s in sigs}
        self.diagnosis.start()
        try:
            return self._run(start_step, world, segment)
        finally:
            self.diagnosis.stop()
            for s, h in old.items():
                signal.signal(s, h)
            self.display.stop()
            self.procs.kill_all(self.prelaunch.next, self._seg)
            self.backend.close()
            heartbeat.stop()
            self.relay.close()
            lock.release()

    def _run(self, step: int, world: int, segment: int) -> dict[str, Any]:
        self.display.start(step)
        self._set_state(RunState.STARTING, step=step, world_size=world, segment=segment)
        source = StateSource.CHECKPOINT  # (or from the start: no checkpoint yet)
        while True:
            if self.hosts is not None and (self.prelaunch.next is None or self.prelaunch.next.index != segment):
                got = self.hosts.world(step, world, segment)
                if isinstance(got, str):  # gave up waiting for hosts, or interrupted while waiting
                    return self._stopped_waiting(step, segment, got)
                world = got
            seg = self._begin(step, world, segment, source)
            watched = self._watch(seg)
            self._relay()  # (the workers' last events: the segment's end)
            status = watched.settled(ended=seg.end is not None, hung=seg.stall is not None)
            now = self.clock()
            change = self._decide(seg, status, now)
            if change is None:  # the schedule's end
                break
            if change.cause is Cause.INTERRUPT:
                return self._interrupted(seg, killed=status.failed)
            if change.cause is Cause.PREEMPTED and change.members_after < 1:
                return self._preempted_stop(seg, change)
            self._act(seg, change, status.exit_code, now)
            step, world, segment, source = change.step, change.members_after, seg.index + 1, change.state_source
        self._drain(wait=True)
        self._set_state(RunState.FINISHED, step=int(seg.end.step), world_size=seg.world, segment=seg.index,
                        pending_world=None)
        return self._finish()

    def _begin(self, step: int, world: int, segment: int, source: StateSource) -> Segment:
        """Start segment ``segment`` after ``step`` from ``source`` (the last change's state source):
        release the pre-launched workers, or launch new ones (from the checkpoint), or have the
        paused ones go on in place (from memory or a peer: the backend's re-form)."""
        if self.prelaunch.next is not None and self.prelaunch.next.index == segment:
            seg, self.prelaunch.next = self.prelaunch.next, None
            seg.stop_at, seg.start_step = self._next_stop(step), step
            self._announce(seg, step, prelaunched_s=self.procs.release(seg))  # the checkpoint is on disk
            return seg
        seg = Segment(segment, world, self._next_stop(step), start_step=step)
        if source is not StateSource.CHECKPOINT:  # in place: the same processes go on at the new size
            if self.hosts is not None:  # the hosts it runs on (over several: the driver is told; one host: `status`)
                self.backend.use_hosts(self.hosts.place(seg).arg())
            self._resize_inplace(seg, step, source)
        else:  # (in the launch's state: starting, resizing, restarting)
            self._set_state(self.state, step=step, world_size=seg.world, segment=seg.index)
            self._start_processes(seg)
            self._announce(seg, step)
        return seg

    # ------------------------------------------------------------------ one membership change
    def _decide(self, seg: Segment, status: GroupStatus, now: float) -> MembershipChange | None:
        """The watch of ``seg`` ended with ``status`` (:meth:`_watch`, then ``GroupStatus.settled``):
        how the job's members change, the one place that asks (:func:`.membership.decide`) from the
        cause and what the backend offers (survivors it keeps, a ring re-formed in place, the slots
        that answer); None: the schedule's end."""
        failed, rc = status.failed, status.exit_code
        # an interrupt ends the run, unless the workers took the resize written ahead (the next segment stops)
        stop = bool(self._interrupts) and (failed or (seg.paused and seg.stop is not Stop.DEFERRED))
        cause = Cause.STALL if status.state is GroupState.STALLED else Cause.FAILURE
        if failed and rc != 0 and not stop and (s := self._ask_survivors(seg)) is not None:
            return decide(cause, s.step, seg.world, s.world, in_place=True, survivors=s, time=now)
        if status.state is GroupState.WAITING:  # checkpoint on disk: relaunch now, the old workers exit meanwhile
            if self.resize.keeps_workers:
                self._elastic = seg  # paused between two steps, waiting for the new size
            else:
                self.procs.draining.append(seg)
        else:
            self._elastic = None
            self.procs.exited(seg, rc, now)
        if failed and stop:
            return decide(Cause.INTERRUPT, seg.last_step, seg.world, 0, in_place=False, time=now)
        if failed:
            t_detect = self.clock()
            self.prelaunch.cancel()
            self.procs.kill_all(self.prelaunch.next, self._seg)
            self._drain(wait=True, timeout=10.0)
            self.meter.pending = None
            seg.failure_seen = self.backend.failure_detail()  # before usable_slots (Ray drops its group)
            ck = self._checkpoint_step() or 0
            world = self.plan.world_after(ck)
            return decide(cause, ck, seg.world, world, in_place=False, usable=self.backend.usable_slots(world),
                          time=t_detect)
        step = int(seg.end.step)
        if self._failures.failures:  # a checkpoint newer than the restart's: count again
            self._failures.progress_saved(self._checkpoint_step())
        if self.meter.pending is not None and self.meter.pending.t_first is not None:
            self._drain(wait=True)  # may emit the overhead itself
            self.meter.flush()  # no full window at the new size: no steady step
        if stop:
            return decide(Cause.INTERRUPT, step, seg.world, 0, in_place=False, time=now)
        if seg.end.reason == "finished":
            self.prelaunch.cancel()
            return None
        if seg.asked is not None:  # a live request, or a warm worker for a failed one's place
            cause, target, t_req = seg.asked.cause, seg.asked.members_after, seg.asked.time or now
            if cause is Cause.JOINER:  # measured from the survivors' pause, as a scheduled grow: the
                t_req = float(seg.end.stop_decided_at) or t_req  # steps while the stop was agreed are not lost
        else:
            r = self.plan.resize_at(step)
            if r is None and seg.end.reason == "scheduled" and step > seg.stop_at:
                r = self.plan.resize_at(seg.stop_at)  # stopped at the first commit after the step
            if r is None:
                self._fail(seg, rc, f"workers stopped at step {step} with no resize pending")
            source = next((src for s, _, src in self.plan.changes if s == r.step), "schedule")
            cause, target, t_req = (Cause.JOINER if source == "joiner" else Cause.SCHEDULE, r.to,
                                     float(seg.end.stop_decided_at))
            if self.hosts is not None and cause is Cause.SCHEDULE:  # bounded by the slots discovered
                self.hosts.asked = target
                target = self.hosts.capped(target) or target  # (below the minimum: it waits at the launch)
        return decide(cause, step, seg.world, target, in_place=self._elastic is not None, time=t_req)

    def _act(self, seg: Segment, change: MembershipChange, rc: int | None, now: float) -> None:
        """Go on as ``change`` says (the one place that acts on a decision): a failure restarted from
        the checkpoint or taken in memory, or a resize; then say so (a ``membership_change`` event).
        Hosts draining leave with either (:mod:`.drains`)."""
        if change.cause.is_failure:
            self.drains.failed()
            self._failed(seg, change, rc)
        else:
            if self.drains.pending:
                self.drains.landed(seg, change)
            self._resize(seg, change, rc, now)
        self.events.write(change.event(seg.index))

    def _resize(self, seg: Segment, change: MembershipChange, rc: int | None, now: float) -> None:
        """The workers of ``seg`` stopped at ``change.step`` for a resize: measured from ``change.time``."""
        step, world, target = change.step, change.members_before, change.members_after
        inplace = self._elastic is not None
        if seg.ahead_hosts is not None and self.hosts is not None and not self._redirectable(seg.index):
            self.hosts.keep(seg.ahead_hosts)  # rank 0 took the shrink written ahead: the ring is on its hosts
        if seg.asked is not None:
            self.plan.add(step, target, change.cause.value)
            self._save_plan()
        else:
            self.events.write(ResizeRequested(from_workers=world, to_workers=target, source=change.cause.value,
                                              at_step=step, time=change.time))
        joiner = change.cause is Cause.JOINER
        self.meter.pending = PendingResize(world, target, step, change.time, float(seg.end.lr),
                                           checkpoint_s=0.0 if inplace else seg.ckpt_s,
                                           t_exit=now if rc is not None or inplace else None,
                                           segment=seg.index, t_failure=self._t_failure if joiner else None)
        self._set_state(RunState.RESIZING, step=step, world_size=world, pending_world=target,
                        resize_from=world, segment=seg.index)
        if self.prelaunch.next is not None and self.prelaunch.next.world != target:
            self.prelaunch.cancel()  # pre-launched for another size than the one decided

    def _interrupted(self, seg: Segment, killed: bool) -> dict[str, Any]:
        self.prelaunch.cancel()
        self._drain(wait=True)
        ck = self._checkpoint_step()
        kept = f"checkpoint at step {ck} kept" if ck else "no checkpoint was written"
        if self._grace_passed:
            msg = f"interrupted: the {self.grace:g} s grace passed: workers killed; {'the last ' if ck else ''}{kept}"
        elif killed:
            msg = f"interrupted twice: workers killed; {kept}"
        else:
            within = (f" (in {self.clock() - self._t_interrupt:.1f} s of the {self.grace:g} s grace)"
                      if self.grace is not None and self._t_interrupt is not None else "")
            msg = f"interrupted: {kept}{within}"
        self._set_state(RunState.STOPPED, step=ck or 0, segment=seg.index)
        cmd = f"elastic-ring train --resume {self.spec.run_dir}"
        self.out(f"{msg}; continue with: {cmd}" if ck else f"{msg}; {cmd} starts over from step 1")
        return self._finish(interrupted=True)

    def _preempted_stop(self, seg: Segment, change: MembershipChange) -> dict[str, Any]:
        """The last worker's notice (:mod:`.drains`): it checkpointed at the agreed step and left,
        no one goes on; the run stops as an interrupted one (``--resume`` goes on), not a failure."""
        self.prelaunch.cancel()
        self._drain(wait=True)
        whys = ", ".join(f"{d.host} ({d.why})" for d in self.drains.pending.values())
        self.drains.landed(seg, change)
        ck = self._checkpoint_step()
        why = f"preempted: the last worker left with notice: {whys}"
        self._set_state(RunState.STOPPED, step=ck or 0, segment=seg.index, stopped=why)
        self.events.write(Notice(message=f"{why}; checkpoint at step {ck} (step {change.step} agreed)",
                                 segment=seg.index))
        self.out(f"{why}; checkpoint at step {ck} kept; continue with: elastic-ring train --resume "
                 f"{self.spec.run_dir}")
        return self._finish(interrupted=True)

    def _finish(self, interrupted: bool = False) -> dict[str, Any]:
        self.display.stop()
        summary = write_summary(self.spec.run_dir, self.events, self.clock(), interrupted=interrupted)
        if interrupted and self._requeue:  # Slurm's notice: the batch script requeues on this status
            self.out(f"Slurm's signal: exit status {EXIT_REQUEUE} (requeue the job; the same --resume goes on)")
            summary["requeue"] = True
        return summary

    def _fail(self, seg: Segment, rc: int | None, why: str | None = None, rank: int | None = None) -> None:
        """End the run as FAILED: one line naming the cause, the log, and the way back."""
        self.prelaunch.cancel()
        self.procs.kill_all(self.prelaunch.next, self._seg)
        if why is None:
            why, rank, _ = self.diagnosis.failure_cause(seg, rc if rc is not None else -1)
        log = seg.log or segment_log(self.spec.run_dir, seg.index, seg.world)
        self.events.write(ErrorEvent(message=why, rank=rank, segment=seg.index))
        self._set_state(RunState.FAILED, segment=seg.index, world_size=seg.world)
        ck = self._checkpoint_step()
        way = (f"checkpoint at step {ck} kept; resume with: elastic-ring train --resume {self.spec.run_dir}"
               if ck else "no checkpoint was written")
        raise WorkerFailedError(f"{why} (log: {log}; {way})", rank=rank, cause=why)

    # ------------------------------------------------------------------ processes
    def _start_processes(self, seg: Segment) -> None:
        if self.hosts is not None:  # the first seg.world usable slots, in rank order
            self.backend.use_hosts(self.hosts.place(seg).arg())
        if self.survival is not None:
            self.survival.launching(self.backend)  # after the default's "off": no survivors kept
        self.procs.start(seg)
        self._set_state(self.state, launchers=list(self.procs.launchers.values()))

    def _drain(self, wait: bool = False, timeout: float = 60.0) -> None:
        """Reap stopped segments' processes; with ``wait``, until all are gone (killed after timeout)."""
        self.procs.reap(lambda seg, t: self.meter.exited(seg.index, t), wait=wait, timeout=timeout,
                        poll_s=self.poll_s)

    def _announce(self, seg: Segment, step: int, prelaunched_s: float = 0.0) -> None:
        rel = self.meter.relaunched(seg.index, seg.t_launch)
        self.events.write(Launch(segment=seg.index, world_size=seg.world, start_step=step + 1,
                                 stop_step=seg.stop_at, command=seg.cmd, device=self.spec.device,
                                 prelaunched_s=prelaunched_s, session_start=not self._launched,
                                 time=seg.t_launch))
        self._launched = True
        assert seg.handle is not None
        self.relay.sample(seg.handle.pid, gpus=self.spec.device == "cuda")
        self._set_state(self.state, step=step, world_size=seg.world, segment=seg.index)  # (running at its first step)
        self.display.segment(seg.index, seg.world, step + 1, seg.stop_at,
                             seg.log or segment_log(self.spec.run_dir, seg.index, seg.world))
        if rel is not None:
            self.display.resized(rel.from_workers, rel.to_workers, rel.step, rel.lr_last, rel.lr_new,
                                 self.lr_decays, layout=layout_words(self.constant_batch, rel.to_workers))

    def _resize_inplace(self, seg: Segment, step: int, source: StateSource) -> None:
        """The workers paused at the end of the last segment go on at the new size from ``source``:
        the backend tells them (and whatever re-forms their ring). When rank 0 took the action
        written ahead, they went on at the segment's end, not now: the relaunch is timed from there."""
        old = self._elastic
        assert old is not None and old.handle is not None
        self._elastic = None
        seg.handle, seg.log, seg.cmd, seg.t_started = old.handle, old.log, old.cmd, old.t_started
        seg.t_launch = self.clock()
        self.ahead.let_rank0_take(old.index)
        if not self._redirectable(old.index) and old.end is not None and old.end.time:
            seg.t_launch = min(seg.t_launch, float(old.end.time))
        self.resize.reform(old.index, seg.launch(self.owner), seg.t_launch, source)
        self._announce(seg, step)

    # ------------------------------------------------------------------ watching a segment
    def _watch(self, seg: Segment) -> GroupStatus:
        """Watch a segment until its group is no longer running (the backend's ``monitor``);
        returns its state: exited (``SUCCEEDED``, ``FAILED`` with the launcher's exit status; a hang
        ended by :class:`.Stalls` too), or ``WAITING`` when the workers have checkpointed for a
        resize and the relaunch may overlap their exit, or have paused in place for one. Also
        ``WAITING`` when they exited after a scheduled stop whose next ring rank 0 took (written
        ahead): they ran the next segment (a short last one may end before this sees the stop) and
        the controller follows them there in place; before, it saw a plain exit and relaunched that
        segment on a cold worker, which redid it from its final checkpoint."""
        assert seg.handle is not None
        self._seg = seg
        while True:
            self._relay()
            self._drain()
            self._check_live_request(seg)
            self._check_drains(seg)
            self._check_hosts(seg)
            self._check_heal(seg)
            if self.survival is not None and self.survival.measuring:
                self.survival.check(seg.world)
            if self._interrupts:
                self._on_interrupt(seg)
            status = self.backend.monitor(seg.handle)
            if status.state is GroupState.RUNNING:
                status = self.stalls.check(seg) or status
            if status.state is not GroupState.RUNNING:  # rank 0 took the ring written ahead and its workers ran on:
                ran_on = (status.state is GroupState.SUCCEEDED and seg.paused and self.resize.keeps_workers
                          and seg.stop is Stop.NONE)
                return GroupStatus(GroupState.WAITING) if ran_on and not self._redirectable(seg.index) else status
            if seg.paused and self.resize.overlaps_exit and seg.stop.goes_on:
                return GroupStatus(GroupState.WAITING)
            if self.resize.prelaunches and self.prelaunch.next is None and seg.stop is Stop.NONE:
                self.prelaunch.maybe(seg)
            self._nap(self.poll_s)

    def _nap(self, seconds: float) -> None:
        """Sleep up to ``seconds`` between two rounds of the loop, waking early when a live resize
        request is written (the request file appears or changes; a stat every :data:`NAP_S`): a
        request waits no poll period (measured before: 78-95 ms from the request to the stop file
        at a 0.1 s poll). A request file left unread (its segment's ring was taken already) wakes
        no one: only a change does."""
        req = protocol.request_file(self.spec.run_dir)

        def mark() -> tuple[int, int] | None:
            try:
                st = os.stat(req)
            except OSError:
                return None
            return st.st_ino, st.st_mtime_ns

        before, end = mark(), time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(NAP_S, left))
            if mark() != before:
                return

    def _on_interrupt(self, seg: Segment) -> None:
        """Ctrl-C / SIGTERM: the workers checkpoint at the next agreed step and exit (paused in
        place: they are asked to leave); a second one kills them. When they already took the resize
        written ahead, ``seg`` goes on and the next segment is stopped (``Stop.DEFERRED``)."""
        if seg.stop is Stop.NONE:
            if not self._redirectable(seg.index):
                seg.stop = Stop.DEFERRED  # the workers took the scheduled resize: stop the next segment
                return
            seg.stop = Stop.ASKED
            stop_file(self.spec.run_dir, seg.index).touch()
            self._set_state(RunState.STOPPING, world_size=seg.world, segment=seg.index)
            self.out("stopping: workers will checkpoint at the next agreed step (Ctrl-C again to kill)")
        if seg.stop is Stop.ASKED and self.resize.keeps_workers and seg.paused:
            seg.stop = Stop.EXIT_SENT  # paused in place: checkpoint and leave
            self.resize.ask_exit(seg.index, self.clock())
        if self._interrupts > 1:
            assert seg.handle is not None
            seg.handle.kill()
        elif (self.grace is not None and not self._grace_passed and self._t_interrupt is not None
              and self.clock() - self._t_interrupt >= self.grace and seg.handle is not None):
            self._grace_passed = True  # --grace: the workers had their time to checkpoint
            self.out(f"the {self.grace:g} s grace passed before the workers checkpointed: killing them")
            seg.handle.kill()

    def _redirectable(self, segment: int) -> bool:
        """Whether the end of ``segment`` may still change (what was written ahead for it withdrawn);
        False: its workers took it, and a request or an interrupt waits for the next segment."""
        return self.resize.withdraw_ahead(segment)

    # ------------------------------------------------------------------ host discovery
    def _stopped_waiting(self, step: int, segment: int, why: str) -> dict[str, Any]:
        """The run stops while it waits for hosts: its checkpoint is kept, ``--resume`` goes on."""
        self._drain(wait=True)
        if self.plan.world_after(step) < 1:  # a resume starts at the minimum, not at no worker
            self.plan.add(step, self.hosts.manager.bounds.min, Cause.HOSTS.value)
            self._save_plan()
        ck = self._checkpoint_step()
        self._set_state(RunState.STOPPED, step=ck or 0, segment=max(segment - 1, 0))
        cmd = f"elastic-ring train --resume {self.spec.run_dir}"  # (the discovery options are kept)
        self.out(f"{why}; checkpoint at step {ck} kept; continue with: {cmd}" if ck else
                 f"{why}; no checkpoint was written")
        return self._finish(interrupted=True)

    # ------------------------------------------------------------------ the workers' events
    def _relay(self) -> None:
        """The workers' new events into ``events.jsonl``, each reacted to (:meth:`.WorkerEvents.react`)."""
        self.relay.poll(lambda ev: (self.drains.heard(ev), self.worker_events.react(ev, self._seg)),
                        hold=lambda ev: self.worker_events.hold(ev, self._seg))
