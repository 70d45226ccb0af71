"""The next segment's workers started before the running ones stop (``--relaunch prelaunch``).

A :class:`Prelaunch`, owned by the :class:`~.controller.Controller`, holds that segment
(:attr:`Prelaunch.next`, waiting on its go file until ``Controller._begin`` releases it): the
watch asks it to start one early enough (:meth:`Prelaunch.maybe`), and a change of plan, a failure
or the end cancels it (:meth:`Prelaunch.cancel`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable

from elastic_ring import protocol
from elastic_ring.controller.api import Plan
from elastic_ring.controller.membership import Cause
from elastic_ring.controller.meter import Meter
from elastic_ring.controller.segment import Processes, Segment

if TYPE_CHECKING:
    from elastic_ring.controller.host_watch import HostWatch

DEFAULT_STARTUP_S = 10.0  # start-up estimate before the first launch has been measured


class Prelaunch:
    def __init__(self, run_dir: Path, procs: Processes, start: Callable[[Segment], None], plan: Plan, meter: Meter,
                 hosts: HostWatch | None, next_stop: Callable[[int], int], out: Callable[[str], None],
                 clock: Callable[[], float]) -> None:
        self.run_dir, self.procs, self._start, self.plan, self.meter = run_dir, procs, start, plan, meter
        self.hosts, self._next_stop, self.out, self.clock = hosts, next_stop, out, clock
        self.next: Segment | None = None  # a pre-launched segment waiting for its go

    def start(self, cur: Segment, target: int, stop_at: int) -> None:
        """Start the next segment's workers now; they build everything and wait for their go."""
        nxt = Segment(cur.index + 1, target, stop_at)
        nxt.go_file = protocol.go_file(self.run_dir, nxt.index)
        nxt.go_file.unlink(missing_ok=True)
        self._start(nxt)
        self.next = nxt
        self.out(f"pre-launched {target} worker(s) for segment {nxt.index}; they wait for the checkpoint")

    def cancel(self) -> None:
        if self.next is not None and self.next.handle is not None:
            self.procs.end(self.next)
            self.out(f"cancelled the pre-launched workers of segment {self.next.index}")
        self.next = None

    def maybe(self, seg: Segment) -> None:
        """Start the next workers early enough that they are ready when the old ones stop."""
        if seg.end is not None:
            return
        if seg.asked is not None:  # the stop step is not known yet: the go file will say
            if seg.asked.cause not in (Cause.HOSTS, Cause.DRAINED, Cause.PREEMPTED):  # (the hosts' new
                # workers start once they are known)
                self.start(seg, seg.asked.members_after, seg.stop_at)
            return
        r = self.plan.resize_at(seg.stop_at)
        left = self.meter.seconds_left(seg, self.clock())
        to = None if r is None else r.to if self.hosts is None else self.hosts.capped(r.to)  # (hosts: capped)
        if to is not None and left is not None and left <= self.meter.prelaunch_lead_s(DEFAULT_STARTUP_S):
            self.start(seg, to, self._next_stop(seg.stop_at))
