"""The next ring written ahead, in place: a scheduled resize prepared before the workers stop.

Under a strategy that keeps its workers (``--relaunch inplace``, Ray, ``--collective torch
--relaunch inplace``) the next ring is written ahead once a segment's first step is done, so that
at the stop rank 0 takes it (``seam.take_ahead_action``) and the workers re-form at once. A
:class:`RingAhead`, owned by the :class:`~.controller.Controller`, writes it
(:meth:`RingAhead.prepare`, from the first step's event) and, at the next segment's start, leaves
rank 0 a moment to take it (:meth:`RingAhead.let_rank0_take`) before the strategy withdraws or
replaces it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

from elastic_ring.controller.api import Plan
from elastic_ring.controller.backends import ResizeStrategy
from elastic_ring.controller.backends.api import SegmentLaunch
from elastic_ring.controller.segment import Segment

AHEAD_GRACE_S = 0.5  # s a ring written ahead is left for rank 0 at a segment's end (let_rank0_take)


class RingAhead:
    def __init__(self, plan: Plan, resize: ResizeStrategy, run_dir: Path, owner: str,
                 next_stop: Callable[[int], int]) -> None:
        self.plan, self.resize, self.run_dir, self.owner, self._next_stop = plan, resize, run_dir, owner, next_stop
        self.written: tuple[int, float] | None = None  # (segment, time.monotonic()) of the last action written ahead

    def prepare(self, seg: Segment) -> None:
        """A scheduled resize ahead: the strategy prepares it once the segment's first step is done
        (the ring is formed: earlier, Horovod Elastic's driver could start at or skip to that
        count), so that at the stop the workers in place re-form the ring at once."""
        r = self.plan.resize_at(seg.stop_at)
        if r is not None:
            self.resize.prepare_ahead(SegmentLaunch(r.to, seg.index + 1, self._next_stop(seg.stop_at), self.owner))
            self.wrote(seg.index)

    def wrote(self, segment: int) -> None:
        """An action was written ahead for the end of ``segment`` now (here, or by the controller
        over hosts: ``Asks._scheduled_shrink_ahead``)."""
        self.written = (segment, time.monotonic())

    def let_rank0_take(self, segment: int) -> None:
        """A short segment can end before the controller relays its first step: the ring is then
        written ahead in the same poll that sees the segment's end, and withdrawn at once, although
        rank 0, paused and polling for its action (every 0.05 s), would take it (seen in
        test_ray: 6 steps in 0.21 s, no ``inplace-1.taken.json``). An action written ahead less
        than ``AHEAD_GRACE_S`` ago is left that long for rank 0 to take before it is withdrawn."""
        from elastic_ring.seam import action_file

        written, self.written = self.written, None
        if written is None or written[0] != segment:
            return
        ahead = action_file(self.run_dir, segment)
        while ahead.exists() and time.monotonic() < written[1] + AHEAD_GRACE_S:
            time.sleep(0.02)
