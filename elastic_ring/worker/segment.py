"""Where a job stands (:class:`Segment`) and the agreement on where a segment stops (:class:`StopVote`).

Every ``control_every`` steps all ranks start one allreduce of rank 0's stop flag (the controller's
stop file) and of any rank's ``job.finish()``; it travels with the next step's gradients and is read
one check later, so all ranks stop after the same step without a blocking collective between steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elastic_ring import protocol


@dataclass
class Segment:
    """The job's counters: the segment (one world size) and its stop step, the run's length, the
    last step done, and how the segment ended. One object, shared by the job's parts."""

    number: int
    stop_at: int
    total_steps: int
    step: int = 0  # the last step done
    current: int | None = None  # the step under way (a crash record names it)
    stop_reason: str | None = None  # "scheduled", "requested" or "finished", once agreed
    finished: bool = False  # the run is done
    decided: float = 0.0  # when all ranks agreed to stop

    def stopped(self, reason: str, decided: float) -> None:
        self.stop_reason, self.finished, self.decided = reason, reason == "finished", decided


class StopVote:
    """Rank 0's stop flag and any rank's ``job.finish()``, agreed by all ranks without blocking."""

    def __init__(self, run_dir: Path, ring: Any, seg: Segment) -> None:
        self.run_dir, self.ring, self.seg = run_dir, ring, seg
        self.finish_requested = False  # job.finish() on this rank

    def start(self):
        """Start, without waiting, the allreduce of rank 0's stop flag (the stop file exists).

        It is completed at the next check (:meth:`result`), one check later: meanwhile it is
        negotiated and reduced by the collective's background thread together with the next step's
        gradients, so the agreement costs no collective of its own on the training thread (a
        blocking allreduce between steps did: a full negotiation round, ~5-8% of a step on a
        loaded CPU). Every rank starts and completes the same votes at the same steps, so all
        ranks still stop after the same step; a stop lands ``control_every`` steps later.
        """
        import torch

        asked = self.ring.rank == 0 and protocol.stop_file(self.run_dir, self.seg.number).exists()
        flags = torch.tensor([1.0 if asked else 0.0, 1.0 if self.finish_requested else 0.0])
        return self.ring.coll.allreduce_async(flags, name="stop_flag")

    def result(self, handle) -> tuple[bool, bool]:
        """(the controller asked for a stop, some rank called job.finish())."""
        v = self.ring.coll.wait(handle)
        return bool(v[0].item() > 0), bool(v[1].item() > 0)
