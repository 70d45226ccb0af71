"""Hosts leaving with notice, as the controller's loop sees them: `elastic-ring drain RUN_DIR HOST`
and a worker's SIGTERM (a preemption: Kubernetes, a spot reclaim, a scheduler).

Either makes the host leave the job at the next step boundary the workers agree on: the host is
left out of the usable hosts at once (:meth:`~elastic_ring.hosts.manager.HostManager.drain`), the
controller asks the running segment to stop (cause ``drained`` or ``preempted``, not a failure:
``--max-restarts`` untouched) and the next segment starts on the other hosts, nothing redone.
Only when the shrink has not landed by the notice's deadline are the workers stopped, and that is
a failure as any other (:meth:`Drains.overdue`). A worker's notice counts once rank 0 has made a step after it was
heard (``control/progress.json``): a failing horovodrun SIGTERMs the other workers itself, and a
job that lost a worker makes no step again.

A :class:`Drains`, owned by the :class:`~.controller.Controller`, holds the drains under way; the
controller calls :meth:`Drains.heard` for each worker event the relay hands it,
:meth:`Drains.take` from its watch, and :meth:`Drains.landed` or :meth:`Drains.failed` from
``_act``. Asking the stop stays the controller's (``Controller._ask``). A drain request needs host
discovery (``--host-discovery-script``): without it, it is refused (an ``error`` event).

In place on one host (``--relaunch inplace``, with or without discovery: ``in_place``) a worker's notice
names its slot host (``worker.notice``): the backend drops that slot at the next in-place resize
(:meth:`~.backends.api.Backend.leave`), so the ring shrinks in the same processes with that worker
leaving, whatever its rank; nothing is read back. Where the backend cannot (a launcher without a
host per slot: ``localhost:K`` on GPUs or with ``--no-survive``) the job stops with a checkpoint at
the agreed step instead (the paused workers are asked to leave, as an interrupt's are) and goes on
from it at one worker fewer, relaunched without that worker (``Draining.relaunch``): still cause
``preempted``, nothing redone, ``--max-restarts`` untouched. The last worker has no one to go on:
the job stops with that checkpoint (``Controller._preempted_stop``), and ``--resume`` goes on.

In place over discovered hosts (``--relaunch inplace`` with a script that lists several hosts:
the backend's ``over_hosts``) a drain and a notice are a discovered host's, as above: the host is
left out of the usable hosts and the controller's next ring is placed without it, which the
backend re-forms in place (the workers on it leave, the others go on in their processes).
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from elastic_ring import protocol
from elastic_ring.controller.membership import Cause, MembershipChange
from elastic_ring.controller.requests import take_drains
from elastic_ring.controller.segment import Segment
from elastic_ring.events.api import ErrorEvent, Event, EventLog, Notice, PreemptNotice

if TYPE_CHECKING:
    from elastic_ring.controller.backends.api import Backend
    from elastic_ring.controller.host_watch import HostWatch

NOTICE_DEADLINE_S = 30.0  # a worker's SIGTERM without --grace: Kubernetes' default grace period


@dataclass
class Draining:
    """A host leaving: why (``cause``: drained or preempted; ``why`` a few words), by when the
    shrink must land (the controller's clock), and whether the segment's stop was asked for it."""

    host: str
    cause: Cause
    why: str
    deadline_s: float
    deadline: float
    asked: bool = False
    relaunch: bool = False  # in place, where the worker cannot leave the ring: stop with a checkpoint, relaunch


class Drains:
    def __init__(self, hosts: HostWatch | None, run_dir: Path, events: EventLog, out: Callable[[str], None],
                 clock: Callable[[], float], notice_deadline_s: float | None = None,
                 backend: Backend | None = None) -> None:
        self.hosts, self.run_dir, self.events, self.out, self.clock = hosts, run_dir, events, out, clock
        # in place (with or without discovery): the backend whose ring a notice's worker leaves
        self.in_place = backend
        self.notice_deadline_s = notice_deadline_s or NOTICE_DEADLINE_S
        self.pending: dict[str, Draining] = {}
        self._notices: list[PreemptNotice] = []
        self._heard: list[tuple[PreemptNotice, int]] = []  # notices waiting for a step (rank 0's progress then)

    @property
    def by_slot(self) -> bool:
        """In place on one host: a notice's worker leaves by its slot host (:meth:`_leave`), and
        there is no host to drain. False over discovered hosts (the backend's ``over_hosts``): a
        drain or a notice leaves the host, in place as well."""
        return self.in_place is not None and not self.in_place.over_hosts

    @property
    def relaunch(self) -> bool:
        """A drain under way stops the job with a checkpoint and relaunches it (:meth:`_leave`)."""
        return any(d.relaunch for d in self.pending.values())

    def heard(self, ev: Event) -> None:
        """A worker event (the relay's): a SIGTERM's notice is taken at the next :meth:`take`."""
        if isinstance(ev, PreemptNotice):
            self._notices.append(ev)

    def take(self, seg: Segment) -> None:
        """Start the drains asked since: `elastic-ring drain`'s requests, and the notices of ``seg``'s
        workers (a notice of an earlier segment is that segment's teardown: ignored)."""
        for host, deadline_s, _ in take_drains(self.run_dir):
            if self.hosts is None or self.by_slot:
                why = "runs in place on one host" if self.by_slot else "has no host discovery"
                self.events.write(ErrorEvent(message=f"drain of {host} refused: the run {why}", segment=seg.index))
                continue
            self._start(seg, host, Cause.DRAINED, "elastic-ring drain", deadline_s)
        notices, self._notices = self._notices, []
        step = self._progress()
        # (in place a worker outlives its segments: its notice names the slot host it still holds)
        self._heard += [(ev, step) for ev in notices
                        if (ev.segment == seg.index and self.hosts is not None) or self.in_place is not None]
        if not self._heard or step <= min(at for _, at in self._heard):
            return
        # a step done since the notice was heard: the job is alive, not a failing horovodrun's
        # teardown (it SIGTERMs the other workers once one failed; then no step is done again)
        waiting = []
        for ev, at in self._heard:
            if step <= at:
                waiting.append((ev, at))
                continue
            if self.by_slot:
                self._leave(seg, ev)
                continue
            # (in place over hosts a worker's rank may have changed since it started: its host is its name)
            named = self.in_place is not None and ev.host in (self.hosts.hosts_of.get(seg.index) or {})
            host = ((ev.host if named else None)
                    or (self.hosts.host_of(seg, ev.rank, self.run_dir) if ev.rank is not None else None) or ev.host)
            if host:
                self._start(seg, host, Cause.PREEMPTED, f"SIGTERM to rank {ev.rank}", self.notice_deadline_s)
        self._heard = waiting

    def _progress(self) -> int:
        """Rank 0's last step done (``control/progress.json``, written at most twice a second)."""
        prog = protocol.read_json(protocol.control_dir(self.run_dir) / protocol.PROGRESS_FILE)
        return int(prog.get("step", 0)) if isinstance(prog, dict) else 0

    def _leave(self, seg: Segment, ev: PreemptNotice) -> None:
        """In place: the notice's worker leaves the ring at the next resize; where the backend
        cannot take it out, the job stops with a checkpoint there and is relaunched without it;
        for the last worker the job stops there (``--resume`` goes on). A notice naming no host
        ends at a second SIGTERM (a failure as before)."""
        if self.in_place is None or ev.host in self.pending:
            return
        if self.in_place.leave(ev.host):
            self._start(seg, ev.host, Cause.PREEMPTED, f"SIGTERM to pid {ev.pid}", self.notice_deadline_s,
                        slot=True)
            return
        if ev.host:  # (the last worker: the job stops there, ``Controller._preempted_stop``)
            self._start(seg, ev.host, Cause.PREEMPTED, f"SIGTERM to pid {ev.pid}", self.notice_deadline_s,
                        slot=True, relaunch=True)
            return
        note = (f"SIGTERM to pid {ev.pid} (its host not known): it cannot leave the ring in place: it ends, "
                f"a failure as before")
        self.out(note)
        self.events.write(Notice(message=note, segment=seg.index))
        try:
            os.kill(ev.pid, signal.SIGTERM)  # its notice restored SIGTERM's default action
        except (ProcessLookupError, PermissionError):
            pass

    def _start(self, seg: Segment, host: str, cause: Cause, why: str, deadline_s: float, slot: bool = False,
               relaunch: bool = False) -> None:
        """``host`` leaves: a discovered host drained, or (``slot``) a worker's slot host in place
        (``relaunch``: the job stops with a checkpoint and is relaunched without its worker)."""
        if host in self.pending:
            return
        if self.hosts is not None and not slot:
            self.hosts.manager.drain(host)
        self.pending[host] = Draining(host, cause, why, deadline_s, self.clock() + deadline_s, relaunch=relaunch)
        if self.hosts is not None and not slot:
            self.hosts.draining = {h: d.deadline for h, d in self.pending.items()}
        alone = relaunch and seg.world - len(self.pending) < 1
        where = ("the job stops with a checkpoint (the last worker)" if alone else
                 "the job stops with a checkpoint and goes on without it" if relaunch else
                 "the ring shrinks in place without it" if slot else "the job shrinks off it")
        note = (f"draining {host} ({why}): {where} at the next agreed step "
                f"(deadline {deadline_s:g} s)")
        self.out(note)
        self.events.write(Notice(message=note, segment=seg.index))

    def to_ask(self) -> Draining | None:
        """A drain whose stop is not asked yet (the segment's stop is asked for it, once)."""
        return next((d for d in self.pending.values() if not d.asked), None)

    def overdue(self) -> Draining | None:
        """A drain whose deadline passed before its shrink landed (the workers are to be stopped)."""
        now = self.clock()
        return next((d for d in self.pending.values() if now >= d.deadline), None)

    def landed(self, seg: Segment, change: MembershipChange) -> None:
        """``seg`` ended for a change that is not a failure: the next segment runs off every
        drained host (the hosts it starts on are the usable ones). Each says so once."""
        for d in self.pending.values():
            note = (f"drained {d.host} ({d.why}) at step {change.step}: {change.members_before} -> "
                    f"{change.members_after} workers, no step redone")
            self.out(note)
            self.events.write(Notice(message=note, segment=seg.index))
        self._clear()

    def idle(self, seg: Segment) -> None:
        """The drained hosts carry none of ``seg``'s workers: they are out, nothing to stop."""
        for d in self.pending.values():
            note = f"drained {d.host} ({d.why}): no worker ran on it"
            self.out(note)
            self.events.write(Notice(message=note, segment=seg.index))
        self._clear()

    def failed(self) -> None:
        """The segment failed before the shrink landed (a second SIGTERM, the deadline, another
        worker's failure): the failure's path rules. A preempted host's drain is withdrawn (its
        notice may be the failing job's own teardown: horovodrun SIGTERMs the other workers); a
        drain asked with `elastic-ring drain` stays."""
        for d in self.pending.values():
            if d.cause is Cause.PREEMPTED and self.hosts is not None and not self.by_slot:
                self.hosts.manager.undrain(d.host)
        if self.in_place is not None:
            self.in_place.unleave()
        self._clear()

    def _clear(self) -> None:
        self.pending.clear()
        self._heard.clear()
        if self.hosts is not None:
            self.hosts.draining = {}
