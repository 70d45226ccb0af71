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

The throughput window's mean loss rides in the same allreduce (:data:`VOTE_SLOTS`) where the loop
form decides the stop at the step itself (``job.steps()``, an epoch loop's optimizer): a closed
window waits for the next vote where K is fewer than the window's steps (one collective every K
steps), else its close starts a vote (one every window). The step boundary starts at most one
small collective at any step, and no window has a collective of its own (a vote starts at most K
steps after the last one: a live stop still lands within K + 1 steps).
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
# the vote's vector: these slots, the last two only where the job has them (a sharded job's
# checkpoint due; a window's loss, where the loop form closes its windows at vote steps), so one
# job's votes are all of one length (Horovod's response cache keeps a collective of one name and
# shape negotiated once; a window's slot is 0.0 at a vote that carries none): summed over the ranks
VOTE_SLOTS = ("asked", "finish", "every", "checkpoint", "window")


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


@dataclass(frozen=True)
class Ballot:
    """One vote's figures, a rank's before the allreduce, their sums over the ranks after it:
    rank 0's stop flag (the controller asked), ``job.finish()`` on some rank, rank 0's proposed
    period, rank 0's time-based checkpoint due (a sharded job's), and the mean loss of a closed
    throughput window on this rank (``window``: None, none rides; every rank the same)."""

    asked: bool = False
    finish: bool = False
    every: int = 0
    checkpoint: bool = False
    window: float | None = None

    def pack(self, checkpoint_slot: bool = False, window_slot: bool = False) -> list[float]:
        """The vector the ranks sum (:data:`VOTE_SLOTS`, the slots the job has)."""
        v = [float(self.asked), float(self.finish), float(self.every)]
        if checkpoint_slot:
            v.append(float(self.checkpoint))
        if window_slot:
            v.append(0.0 if self.window is None else float(self.window))
        elif self.window is not None:
            raise ValueError("a window's loss in a vote without its slot")
        return v

    @classmethod
    def unpack(cls, values, checkpoint_slot: bool = False, window_slot: bool = False,
               window: bool = False) -> "Ballot":
        """The summed vector read back (the same slots as packed); ``window``: a window rode in it
        (every rank knows: they all close their windows at the same steps), then ``window`` is the
        sum of the ranks' losses."""
        v = [float(x) for x in values]
        n = 3 + checkpoint_slot + window_slot
        if len(v) != n:
            raise ValueError(f"a stop vote of {len(v)} values, not {n}")
        return cls(asked=v[0] > 0, finish=v[1] > 0, every=int(round(v[2])),
                   checkpoint=checkpoint_slot and v[3] > 0,
                   window=v[-1] if window_slot and window else None)


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
        self.ride: float | None = None  # this rank's loss of a closed window, for the next vote to carry
        self.rode: float | None = None  # the last vote read: the ranks' sum of the window it carried
        self._riding = False  # the vote in flight carries a window
        self.windows = False  # the votes have a window's slot (the step boundary's form: set at its begin)
        self.begin()

    def begin(self) -> None:
        """A segment's steps start (a new world size: a new step time): the next vote at its next
        step, then every ``floor`` steps until rank 0 has timed some."""
        self.every = self.floor  # the period agreed last (status: a live stop lands within it)
        self.next_at = 0  # the step after which the next vote starts (every rank the same)
        self._started_at = 0
        self._timed: tuple[int, float] | None = None  # rank 0: (step, perf_counter) at the last vote
        self._vote_s = 0.0  # rank 0: the training thread's time in the last vote's start and read
        self.ride = self.rode = None
        self._riding = False

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
        rank's ``job.finish()``, rank 0's next period and the closed throughput window's loss set
        in :attr:`ride` (taken: the next read gives the ranks' sum in :attr:`rode`); ``step``: the
        step just done.

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
        # (checkpoint_due: every rank of a sharded job the same)
        checkpoint = self.checkpoint_due is not None and self.ring.rank == 0 and bool(self.checkpoint_due())
        ride, self.ride = self.ride, None
        self._riding = ride is not None
        flags = torch.tensor(Ballot(asked, self.finish_requested, every, checkpoint, ride).pack(
            self.checkpoint_due is not None, self.windows))
        handle = self.ring.coll.allreduce_async(flags, name="stop_flag")
        self._vote_s = time.perf_counter() - t0
        return handle

    def result(self, handle) -> tuple[bool, bool]:
        """(the controller asked for a stop, some rank called job.finish()); the next vote is due
        the agreed period after this one started; a window it carried in :attr:`rode`."""
        t0 = time.perf_counter()
        b = Ballot.unpack(self.ring.coll.wait(handle).tolist(), self.checkpoint_due is not None,
                          self.windows, self._riding)
        self._riding = False
        self.every = max(b.every, 1) if b.every else self.floor
        self.next_at = self._started_at + self.every
        if b.checkpoint:
            self.checkpoint_asked = True
        self.rode = b.window
        self._vote_s += time.perf_counter() - t0
        return b.asked, b.finish
