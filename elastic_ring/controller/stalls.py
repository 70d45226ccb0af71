"""What the controller does when a segment hangs: end the stalled ranks alone, or the whole job.

:class:`~.diagnose.Diagnosis` says whether a segment hangs (and which ranks); a :class:`Stalls`,
owned by the :class:`~.controller.Controller` and called from its watch, acts on it. Under a
backend that keeps survivors (``--survive``) only the stalled ranks are ended and the others go on
from memory as after a death (``Controller._failed``); else, or when no survivor speaks within
``STALLED_END_S``, the whole job is ended and the segment fails.
"""

from __future__ import annotations

import time
from typing import Callable

from elastic_ring.controller.backends import Backend, ResizeStrategy
from elastic_ring.controller.backends.api import GroupState, GroupStatus
from elastic_ring.controller.diagnose import Diagnosis
from elastic_ring.controller.segment import Segment

STALLED_END_S = 15.0  # stalled ranks ended alone: how long the others may take to speak before all are ended


class Stalls:
    def __init__(self, diagnosis: Diagnosis, backend: Backend, resize: ResizeStrategy,
                 out: Callable[[str], None], clock: Callable[[], float], interrupts: Callable[[], int]) -> None:
        self.diagnosis, self.backend, self.resize, self.out, self.clock = diagnosis, backend, resize, out, clock
        self._interrupts = interrupts  # the controller's count of signals (a second one kills)
        self.ended = 0.0  # when the stalled ranks alone were ended (the others go on: end_alone)

    def check(self, seg: Segment) -> GroupStatus | None:
        """A hang ends the stalled ranks alone (:meth:`end_alone`) or the whole job, as do ranks
        ended alone with no survivor speaking within ``STALLED_END_S``; returns the group's state
        then (the backend's ``monitor`` once its launcher exited), else None."""
        assert seg.handle is not None
        if seg.stall is None:
            if self._interrupts() > 1 or not self.diagnosis.check_stall(seg):
                return None
            self.ended = self.end_alone(seg)
            if self.ended:
                return None
        elif self.clock() - self.ended <= STALLED_END_S:
            return None
        else:
            self.ended = 0.0  # the stalled ranks were ended, yet no survivor spoke: end them all
        seg.handle.kill()
        while (status := self.backend.monitor(seg.handle)).state is GroupState.RUNNING:
            time.sleep(0.05)
        return status

    def end_alone(self, seg: Segment) -> float:
        """A stall whose ranks are named, and a backend that keeps survivors (``--survive``): only
        the stalled ranks are ended; the others lose a peer and go on from memory as after its
        death (``Controller._failed``). Returns when (0.0: not done; the caller kills the whole job)."""
        st = seg.stall
        if (st is None or not self.resize.keeps_workers or not st.ranks
                or len(st.ranks) >= seg.world or not self.backend.end_ranks(list(st.ranks))):
            return 0.0
        self.out(f"ended the stalled rank(s) {', '.join(map(str, st.ranks))} only: the others go on from memory")
        return self.clock()
