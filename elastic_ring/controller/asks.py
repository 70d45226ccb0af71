"""The changes asked of a running segment, as the controller's watch polls for them between two
looks at its workers (``Controller._watch``): a live resize (`elastic-ring resize`, the cluster's
policy), a warm worker for a failed one's place or the backend's cluster moving (Ray), host
discovery (:mod:`.host_watch`) and hosts leaving with notice (:mod:`.drains`). Each makes the
segment's workers stop at the next agreed step (:meth:`Asks._ask`: ``Segment.asked``, a
``resize_requested`` event, the stop file); the loop's one decision (``Controller._decide``) takes
it from there.

:class:`Asks` is a base class of :class:`~.controller.Controller`: its methods read and write the
controller's state (``spec``, ``hosts``, ``drains``, ``prelaunch``, ``_interrupts``, ...) as they
did in controller.py, from where they moved unchanged.
"""

from __future__ import annotations

from elastic_ring.controller.backends.api import GroupState, SegmentLaunch
from elastic_ring.controller.membership import Cause, decide
from elastic_ring.controller.requests import take_asked
from elastic_ring.controller.segment import Segment, Stop
from elastic_ring.events.api import ErrorEvent, ResizeRequested
from elastic_ring.protocol import request_file, stop_file


class Asks:
    """The watch's checks for a change asked while a segment runs, and the ask itself (mixed into
    :class:`~.controller.Controller`)."""

    def _check_live_request(self, seg: Segment) -> None:
        req_file = request_file(self.spec.run_dir)
        if not req_file.exists() or not self._redirectable(seg.index):
            return  # (the workers already took the scheduled resize: the request is read next segment)
        req = take_asked(self.spec.run_dir, self._seen_requests, remove=False)
        if req is None:
            return
        target, t_asked, source = req
        if seg.asked is not None or self.prelaunch.next is not None:
            req_file.unlink(missing_ok=True)
            self.out(f"resize request to {target} ignored: a resize is already under way")
            return
        if not 1 <= target <= self.spec.slots or target == seg.world:
            req_file.unlink(missing_ok=True)
            self.events.write(ErrorEvent(message=f"live resize to {target} refused (workers "
                                         f"{seg.world}, slots {self.spec.slots})", segment=seg.index))
            return
        if self.hosts is not None:
            target = self.hosts.within(seg, target)
            if target is None:
                req_file.unlink(missing_ok=True)
                return
        # `resize` sees it pending throughout: live_target is written before the request file goes
        self._set_state(self.state, live_target=target)
        req_file.unlink(missing_ok=True)
        self._ask(seg, Cause(source), target, t_asked if t_asked is not None else self.clock())
        self.out(f"live resize requested: {seg.world} -> {target} workers")

    def _check_heal(self, seg: Segment) -> None:
        """The survivors of a failure went on fewer, and the backend has a warm worker for a failed
        one's place now (Ray with ``--survive``: ``heal_target``): it joins at the next step
        boundary, as a live resize to that size does (a ``resize_requested`` event of source
        ``joiner``). Else the backend's cluster may have moved under the ring (Ray: a node joined,
        or is being drained: :meth:`~.backends.api.Backend.cluster_change`), which it follows the
        same way (source ``hosts`` or ``drained``)."""
        if seg.asked is not None or self.prelaunch.next is not None or self._interrupts or seg.end is not None:
            return
        target = self.backend.heal_target()
        if target is not None and target != seg.world and self._redirectable(seg.index):
            self._ask(seg, Cause.JOINER, target, self.clock())
            self.out(f"a warm worker is up for the failed worker's place: {seg.world} -> {target} workers")
            return
        # the backend's cluster moved (Ray: a node joined, or is draining): it follows at the next step boundary
        change = self.backend.cluster_change(seg.world)
        if change is not None and change[1] != seg.world and self._redirectable(seg.index):
            self._ask(seg, change[0], change[1], self.clock())
            self.out(change[2])

    def _check_hosts(self, seg: Segment) -> None:
        """Host discovery, between two polls of the watch: when the usable slots allow another size
        than ``seg``'s, or no longer hold the hosts it runs on (:meth:`.HostWatch.check`), its
        workers stop at the next agreed step (cause ``hosts``) and the next segment starts on the
        usable hosts (below the minimum: the launch waits for hosts, :meth:`.HostWatch.world`)."""
        if self.hosts is None:
            return
        view = self.hosts.view(seg.index)
        if (seg.asked is not None or self.prelaunch.next is not None or self._interrupts or seg.end is not None
                or seg.stop is not Stop.NONE):
            return
        target = self.hosts.check(seg, view)
        if target is None or not self._redirectable(seg.index):
            return
        self._ask(seg, Cause.HOSTS, target, self.clock())
        self.out(f"host discovery: {seg.world} -> {target} workers at the next agreed step"
                 + ("" if view.target is not None else f" ({view.line()}: the job stops with a checkpoint)"))

    def _check_drains(self, seg: Segment) -> None:
        """Hosts leaving with notice (:mod:`.drains`): a drain asked or a worker's SIGTERM heard since
        the last poll makes ``seg``'s workers stop at the next agreed step (cause ``drained`` or
        ``preempted``), the next segment starting on the other hosts; past a drain's deadline
        the workers are stopped (killed) and it is a failure. In place where the worker cannot
        leave the ring (``Drains.relaunch``) the paused workers are asked to checkpoint and leave,
        and the next segment is launched without it from that checkpoint."""
        self.drains.take(seg)
        if (self.drains.relaunch and seg.paused and seg.stop is Stop.NONE and seg.asked is not None
                and self.resize.keeps_workers):
            seg.stop = Stop.EXIT_SENT  # (not an interrupt: _decide relaunches at the size asked)
            self.resize.ask_exit(seg.index, self.clock())
            return
        if not self.drains.pending or seg.end is not None or (self.hosts is None and self.drains.in_place is None):
            return
        late = self.drains.overdue()
        if late is not None:
            if seg.handle is not None and self.backend.monitor(seg.handle).state is GroupState.RUNNING:
                self.out(f"drain of {late.host}: its deadline ({late.deadline_s:g} s) passed before the shrink "
                         f"landed: the workers are stopped, and it is a failure")
                seg.handle.kill()
            return
        d = self.drains.to_ask()
        if (d is None or seg.asked is not None or self.prelaunch.next is not None or self._interrupts
                or seg.stop is not Stop.NONE or not self._redirectable(seg.index)):
            return
        for other in self.drains.pending.values():
            other.asked = True  # (one stop for every drain heard so far)
        if self.drains.by_slot:  # in place on one host: the notices' workers leave the ring
            target = seg.world - len(self.drains.pending)
            if self.hosts is not None:  # one-host discovery: their slots stay out until a resize asks more
                self.hosts.asked = target
        else:
            target = self.hosts.check(seg, self.hosts.view(seg.index))
        if target is None:  # the segment does not run on it: nothing to stop
            self.drains.idle(seg)
            return
        self._ask(seg, d.cause, target, self.clock())
        self.out(f"{d.cause.value} {d.host}: {seg.world} -> {target} workers at the next agreed step")

    def _ask(self, seg: Segment, cause: Cause, target: int, t: float) -> None:
        """A change asked while ``seg`` runs: its workers stop at the next agreed step (:meth:`_decide`)."""
        seg.asked = decide(cause, seg.last_step, seg.world, target, in_place=self.resize.keeps_workers, time=t)
        self.events.write(ResizeRequested(from_workers=seg.world, to_workers=target, source=cause.value, time=t))
        self._shrink_ahead(seg, cause, target)
        stop_file(self.spec.run_dir, seg.index).touch()

    def _shrink_ahead(self, seg: Segment, cause: Cause, target: int) -> None:
        """In place, a host dropped from discovery or leaving with notice: the shrink's next ring is
        written ahead (``Backend.shrink_ahead``), as a scheduled shrink's is, for rank 0 to take at
        the stop the workers agree on; its hosts are kept on ``seg`` (``_resize`` starts the next
        segment on them when rank 0 took it). Not where a scheduled resize may come first (its
        stop would be the one taken) or the drain relaunches (the workers checkpoint and leave)."""
        if (not self.resize.keeps_workers or target >= seg.world or self.drains.relaunch
                or cause not in (Cause.HOSTS, Cause.DRAINED, Cause.PREEMPTED)
                or self._next_stop(seg.last_step) != self.spec.total_steps):
            return
        hosts = self.hosts.ahead(target).arg() if self.hosts is not None else None
        if self.backend.shrink_ahead(SegmentLaunch(target, seg.index + 1, self.spec.total_steps, self.owner), hosts):
            seg.ahead_hosts = hosts

    def _scheduled_shrink_ahead(self, seg: Segment) -> None:
        """In place over hosts, a scheduled shrink at the end of ``seg`` is written ahead with the
        hosts it will run on, as a dropped host's is (:meth:`_shrink_ahead`), once ``seg`` trains:
        the strategy's own ``prepare_ahead`` places no hosts there. Its hosts are kept on ``seg``
        (``_resize`` starts the next segment on them when rank 0 took it). Not where the size the
        discovered slots allow is another than the schedule's (then decided at the stop)."""
        r = self.plan.resize_at(seg.stop_at)
        if (self.hosts is None or r is None or not self.resize.keeps_workers or r.to >= seg.world
                or seg.asked is not None or self.drains.relaunch or self.hosts.capped(r.to) != r.to):
            return
        hosts = self.hosts.ahead(r.to).arg()
        launch = SegmentLaunch(r.to, seg.index + 1, self._next_stop(seg.stop_at), self.owner)
        if self.backend.shrink_ahead(launch, hosts, at_step=seg.stop_at):
            seg.ahead_hosts = hosts
            self.ahead.wrote(seg.index)
