"""Where a job stands (:class:`Segment`), why a segment stopped (:class:`StopReason`), and the
agreement on where a segment stops (:class:`StopVote`).

After a vote step all ranks start one allreduce of rank 0's stop flag (the controller's stop file),
of any rank's ``job.finish()`` and of the period rank 0 proposes; it travels with the next step's
gradients and is read after that step, so all ranks stop after the same step without a blocking
collective between steps. The next vote step is the agreed period K after this one: every rank
reads the same K from the same vote. Rank 0 chooses K (:func:`choose_every`) from the step time
it measured since the last vote, so that a vote costs at most 1% of the steps it covers, but a
live stop waits at most ``stop_latency_ms`` (default 100 ms) for the next vote, and K is never
below ``control_every``; so a live stop lands within K + 1 steps. A scheduled stop needs no vote:
its step is known in advance.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from elastic_ring import protocol

VOTE_SHARE = 0.01  # a vote costs at most this share of the steps between two votes
VOTE_COST_FLOOR_S = 0.5e-3  # a vote's cost counted at least this (its collective's threads included)
MAX_EVERY = 10_000  # steps between two votes at most


class StopReason(StrEnum):
    """Why a segment's steps stopped, agreed by all ranks. The values are what the ``segment_end``
    event and the controller's readers hold (a :class:`StrEnum`: each compares equal to its value)."""

    SCHEDULED = "scheduled"  # the segment's stop step, known in advance (a resize's)
    REQUESTED = "requested"  # the controller's stop, agreed by a vote (a live or policy resize)
    FINISHED = "finished"  # the run's end: its length reached, or some rank's job.finish()


@dataclass
class Segment:
    """The job's counters: the segment (one world size) and its stop step, the run's length, the
    last step done, and how the segment ended. One object, shared by the job's parts."""

    number: int
    stop_at: int
    total_steps: int
    step: int = 0  # the last step done
    current: int | None = None  # the step under way (a crash record names it)
    stop_reason: StopReason | None = None  # once agreed
    finished: bool = False  # the run is done
    decided: float = 0.0  # when all ranks agreed to stop

    def stopped(self, reason: StopReason, decided: float) -> None:
        reason = StopReason(reason)
        self.stop_reason, self.finished, self.decided = reason, reason is StopReason.FINISHED, decided


def choose_every(step_s: float, vote_s: float, floor: int, latency_s: float) -> int:
    """The vote period K (steps from one vote to the next) rank 0 proposes: the fewest steps over
    which a vote costs at most :data:`VOTE_SHARE` of the steps' time (a vote counted at least
    :data:`VOTE_COST_FLOOR_S`: the collective's own work on its threads is not seen from the
    training thread), but never so many that a live stop waits more than ``latency_s`` (K steps
    of ``step_s``), and never fewer than ``floor`` (``control_every``). ``latency_s`` 0, or no
    step time measured yet: ``floor``."""
    if latency_s <= 0 or step_s <= 0:
        return floor
    need = math.ceil(max(vote_s, VOTE_COST_FLOOR_S) / (VOTE_SHARE * step_s))
    cap = int(latency_s / step_s)
    return max(floor, min(need, cap, MAX_EVERY))


class StopVote:
    """Rank 0's stop flag and any rank's ``job.finish()``, agreed by all ranks without blocking,
    every :attr:`every` steps (see the module docstring).

    ``floor``: ``control_every``, the fewest steps between two votes; ``latency_s``: the longest a
    live stop may wait for the next vote (0: vote every ``floor`` steps, no adaptation)."""

    def __init__(self, run_dir: Path, ring: Any, seg: Segment, floor: int = 1, latency_s: float = 0.0) -> None:
        self.run_dir, self.ring, self.seg = run_dir, ring, seg
        self.floor, self.latency_s = max(1, int(floor)), float(latency_s)
        self.finish_requested = False  # job.finish() on this rank
        # a sharded job (worker.sharded): rank 0's time-based checkpoint due, carried by the vote
        self.checkpoint_due: Any = None  # rank 0's test, or None: not carried
        self.checkpoint_asked = False  # the last vote read carried it (every rank the same)
        self.begin()

    def begin(self) -> None:
        """A segment's steps start (a new world size: a new step time): the next vote at its next
        step, then every ``floor`` steps until rank 0 has timed some."""
        self.every = self.floor  # the period agreed last (status: a live stop lands within it)
        self.next_at = 0  # the step after which the next vote starts (every rank the same)
        self._started_at = 0
        self._timed: tuple[int, float] | None = None  # rank 0: (step, perf_counter) at the last vote
        self._vote_s = 0.0  # rank 0: the training thread's time in the last vote's start and read

    def due(self, step: int) -> bool:
        """A vote starts after ``step`` (the same answer on every rank)."""
        return step >= self.next_at

    def propose(self, step: int, now: float) -> int:
        """Rank 0: the next period, from the time per step since the last vote (:func:`choose_every`)."""
        last, self._timed = self._timed, (step, now)
        if last is None or step <= last[0]:
            return self.floor
        return choose_every((now - last[1]) / (step - last[0]), self._vote_s, self.floor, self.latency_s)

    def start(self, step: int | None = None):
        """Start, without waiting, the allreduce of rank 0's stop flag (the stop file exists), any
        rank's ``job.finish()`` and rank 0's next period; ``step``: the step just done.

        It is completed at the next check (:meth:`result`), one step later: meanwhile it is
        negotiated and reduced by the collective's background thread together with the next step's
        gradients, so the agreement costs no collective of its own on the training thread (a
        blocking allreduce between steps did: a full negotiation round, ~5-8% of a step on a
        loaded CPU). Every rank starts and completes the same votes at the same steps (the period
        travels in the vote itself), so all ranks still stop after the same step.
        """
        import torch

        step = self.seg.step if step is None else step
        t0 = time.perf_counter()
        every = 0
        asked = False
        if self.ring.rank == 0:
            asked = protocol.stop_file(self.run_dir, self.seg.number).exists()
            every = self.propose(step, t0)
        self._started_at = step
        flags = [1.0 if asked else 0.0, 1.0 if self.finish_requested else 0.0, float(every)]
        if self.checkpoint_due is not None:  # (every rank of a sharded job the same)
            flags.append(1.0 if self.ring.rank == 0 and self.checkpoint_due() else 0.0)
        flags = torch.tensor(flags)
        handle = self.ring.coll.allreduce_async(flags, name="stop_flag")
        self._vote_s = time.perf_counter() - t0
        return handle

    def result(self, handle) -> tuple[bool, bool]:
        """(the controller asked for a stop, some rank called job.finish()); the next vote is due
        the agreed period after this one started."""
        t0 = time.perf_counter()
        v = self.ring.coll.wait(handle)
        every = int(round(v[2].item())) if v.numel() > 2 else 0
        self.every = max(every, 1) if every else self.floor
        self.next_at = self._started_at + self.every
        if v.numel() > 3 and v[3].item() > 0:
            self.checkpoint_asked = True
        self._vote_s += time.perf_counter() - t0
        return bool(v[0].item() > 0), bool(v[1].item() > 0)
