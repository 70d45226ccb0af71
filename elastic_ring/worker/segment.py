"""Where a job stands (:class:`Segment`), why a segment stopped (:class:`StopReason`), and the
agreement on where a segment stops (:class:`StopVote`).

After a vote step all ranks start one allreduce of rank 0's stop flag (the controller's stop file),
of any rank's ``job.finish()`` and of the period and the read lag rank 0 proposes; it travels in
the background with the next steps' gradients and is read L steps later (the read lag agreed in
the vote before), so all ranks stop after the same step without a collective on the training
thread's critical path: by the time it is read it is done, the read costs no wait. The next vote
step is the agreed period K after this one: every rank reads the same K and L from the same vote.
Rank 0 chooses them (:func:`choose_lag`, :func:`choose_every`) from the step time it measured
since the last vote: L the fewest steps that cover :data:`READ_LAG_S` (the collective's own time
in the background, a negotiation round of Horovod's included), K the fewest steps over which a
vote costs at most 0.5% of the steps it covers, but so that a live stop waits at most
``stop_latency_ms`` (default 100 ms) plus one step: a stop asked just after a vote started is
carried by the next one, K steps later, and read L steps after that, so K + L steps are at most
``stop_latency_ms`` and one step of them; K is never below ``control_every``. A live stop lands
within K + L steps. A scheduled stop needs no vote: its step is known in advance. With
``stop_latency_ms`` 0, K is ``control_every`` and L 1 (read after the next step).

The throughput window's mean loss rides in the same allreduce (:data:`VOTE_SLOTS`) where the loop
form decides the stop at the step itself (``job.steps()``, an epoch loop's optimizer): a closed
window waits for the next vote where K is fewer than the window's steps (one collective every K
steps), else its close starts a vote (one every window), or, with a vote still in flight, the
read of that one does. The step boundary starts at most one small collective at any step, one
vote is in flight at a time, and no window has a collective of its own.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from elastic_ring import protocol

VOTE_SHARE = 0.005  # a vote costs at most this share of the steps between two votes (half of issue
# 50's 1% for the library's whole cost per step: the rest is the common step's)
VOTE_COST_FLOOR_S = 0.5e-3  # a vote's cost counted at least this (its collective's threads included)
MAX_EVERY = 10_000  # steps between two votes at most
READ_LAG_S = 0.02  # a vote is read at least this long after it started, where the latency allows
# (its allreduce done in the background by then: Horovod negotiates every 5 ms cycle on CPUs)
# the vote's vector: these slots (``lag``: the next vote's read lag), the last two only where the
# job has them (a sharded job's checkpoint due; a window's loss, where the loop form closes its
# windows at vote steps), so one
# job's votes are all of one length (Horovod's response cache keeps a collective of one name and
# shape negotiated once; a window's slot is 0.0 at a vote that carries none): summed over the ranks
VOTE_SLOTS = ("asked", "finish", "every", "lag", "checkpoint", "window")


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


def _steps_allowed(step_s: float, latency_s: float) -> int:
    """The steps a live stop may take (from a vote's start to the read of the next one): those of
    ``latency_s`` and one more."""
    return int(latency_s / step_s) + 1


def choose_lag(step_s: float, latency_s: float) -> int:
    """The read lag L (steps from a vote's start to its read) rank 0 proposes for the next vote:
    the fewest steps that cover :data:`READ_LAG_S`, so that the allreduce is done when read, but
    at most half the steps a live stop may take (:func:`choose_every` gets the rest). ``latency_s``
    0, or no step time measured yet: 1 (read after the next step)."""
    if latency_s <= 0 or step_s <= 0:
        return 1
    return max(1, min(math.ceil(READ_LAG_S / step_s), _steps_allowed(step_s, latency_s) // 2, MAX_EVERY))


def choose_every(step_s: float, vote_s: float, floor: int, latency_s: float, lag: int = 1) -> int:
    """The vote period K (steps from one vote to the next) rank 0 proposes: the fewest steps over
    which a vote costs at most :data:`VOTE_SHARE` of the steps' time (a vote counted at least
    :data:`VOTE_COST_FLOOR_S`: the collective's own work on its threads is not seen from the
    training thread), but never so many that a live stop waits more than ``latency_s`` and one
    step (K steps of ``step_s`` to the next vote, then its read ``lag`` steps later), and never
    fewer than ``floor`` (``control_every``). ``latency_s`` 0, or no step time measured yet:
    ``floor``."""
    if latency_s <= 0 or step_s <= 0:
        return floor
    need = math.ceil(max(vote_s, VOTE_COST_FLOOR_S) / (VOTE_SHARE * step_s))
    cap = _steps_allowed(step_s, latency_s) - max(1, lag)
    return max(floor, min(need, cap, MAX_EVERY))


@dataclass(slots=True)  # (not frozen: a frozen dataclass sets each field through object.__setattr__)
class Ballot:
    """One vote's figures, a rank's before the allreduce, their sums over the ranks after it:
    rank 0's stop flag (the controller asked), ``job.finish()`` on some rank, rank 0's proposed
    period and the next vote's read lag, rank 0's time-based checkpoint due (a sharded job's), and
    the mean loss of a closed throughput window on this rank (``window``: None, none rides; every
    rank the same)."""

    asked: bool = False
    finish: bool = False
    every: int = 0
    lag: int = 0
    checkpoint: bool = False
    window: float | None = None

    def pack(self, checkpoint_slot: bool = False, window_slot: bool = False) -> list[float]:
        """The vector the ranks sum (:data:`VOTE_SLOTS`, the slots the job has)."""
        v = [float(self.asked), float(self.finish), float(self.every), float(self.lag)]
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
        v = tuple(map(float, values))
        n = 4 + checkpoint_slot + window_slot
        if len(v) != n:
            raise ValueError(f"a stop vote of {len(v)} values, not {n}")
        return cls(asked=v[0] > 0, finish=v[1] > 0, every=int(round(v[2])), lag=int(round(v[3])),
                   checkpoint=checkpoint_slot and v[4] > 0,
                   window=v[-1] if window_slot and window else None)


class StopVote:
    """Rank 0's stop flag and any rank's ``job.finish()``, agreed by all ranks without blocking,
    every :attr:`every` steps, each vote read :attr:`lag` steps after it started (see the module
    docstring).

    ``floor``: ``control_every``, the fewest steps between two votes; ``latency_s``: the longest a
    live stop may wait, one step aside (0: vote every ``floor`` steps, read after the next, no
    adaptation)."""

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
        self._stop_path: tuple[int | None, str] = (None, "")  # (segment, its stop file)
        self.windows = False  # the votes have a window's slot (the step boundary's form: set at its begin)
        self.begin()

    def begin(self) -> None:
        """A segment's steps start (a new world size: a new step time): the next vote at its next
        step, read after the step after it, then every ``floor`` steps until rank 0 has timed some."""
        self.every = self.floor  # the period agreed last (status: a live stop lands within it + lag)
        self.lag = 1  # the read lag agreed last: the next vote started is read this many steps later
        self.next_at = 0  # the step after which the next vote starts (every rank the same)
        self.read_at = 0  # the step after which the vote in flight is read (every rank the same)
        self._started_at = 0
        self._timed: tuple[int, float] | None = None  # rank 0: (step, perf_counter) at the last vote
        self._vote_s = 0.0  # rank 0: the training thread's time in the last vote's start and read
        self.ride = self.rode = None
        self._riding = False

    def due(self, step: int) -> bool:
        """A vote starts after ``step`` (the same answer on every rank; none is in flight)."""
        return step >= self.next_at

    def readable(self, step: int) -> bool:
        """The vote in flight is read after ``step`` (the same answer on every rank)."""
        return step >= self.read_at

    def propose(self, step: int, now: float) -> tuple[int, int]:
        """Rank 0: the next period and the next vote's read lag, from the time per step since the
        last vote (:func:`choose_lag`, :func:`choose_every`)."""
        last, self._timed = self._timed, (step, now)
        if last is None or step <= last[0]:
            return self.floor, 1
        step_s = (now - last[1]) / (step - last[0])
        lag = choose_lag(step_s, self.latency_s)
        every = choose_every(step_s, self._vote_s, self.floor, self.latency_s, lag)
        return every, min(lag, every)

    def start(self, step: int | None = None):
        """Start, without waiting, the allreduce of rank 0's stop flag (the stop file exists), any
        rank's ``job.finish()``, rank 0's next period and read lag and the closed throughput
        window's loss set in :attr:`ride` (taken: the next read gives the ranks' sum in
        :attr:`rode`); ``step``: the step just done. The training thread only hands the values to
        the collective's vote thread, which makes their tensor and launches the allreduce
        (:class:`~elastic_ring.worker.collective.VoteThread`).

        It is completed (:meth:`result`) :attr:`lag` steps later (agreed by the vote before):
        meanwhile it is negotiated and reduced by the collective's background thread together with
        the next steps' gradients, so the agreement costs no collective of its own on the training
        thread (a blocking allreduce between steps did: a full negotiation round, ~5-8% of a step
        on a loaded CPU; one read after the next step waited for Horovod's next round, ~1.4 ms).
        Every rank starts and completes the same votes at the same steps (the period and the lag
        travel in the votes themselves), so all ranks still stop after the same step.
        """
        step = self.seg.step if step is None else step
        t0 = time.perf_counter()
        every = lag = 0
        asked = False
        if self.ring.rank == 0:  # (os.access makes no exception for a missing file, as exists() does:
            asked = os.access(self._stop_file(), os.F_OK)  # 1.2 against 4 us warm; exists() took 31 after a step)
            every, lag = self.propose(step, t0)
        self._started_at = step
        self.read_at = step + self.lag
        # (checkpoint_due: every rank of a sharded job the same)
        checkpoint = self.checkpoint_due is not None and self.ring.rank == 0 and bool(self.checkpoint_due())
        ride, self.ride = self.ride, None
        self._riding = ride is not None
        values = Ballot(asked, self.finish_requested, every, lag, checkpoint, ride).pack(
            self.checkpoint_due is not None, self.windows)
        coll = self.ring.coll
        launch = getattr(coll, "vote_async", None)
        if launch is not None:  # (its vote thread makes the tensor and launches it)
            handle = launch(values, name="stop_flag")
        else:
            import torch

            handle = coll.allreduce_async(torch.tensor(values), name="stop_flag")
        self._vote_s = time.perf_counter() - t0
        return handle

    def close(self) -> None:
        """No vote follows in this segment (its stop agreed; the last read): the collective's
        vote thread ends (:class:`~elastic_ring.worker.collective.VoteThread`; the next
        segment's first vote starts another)."""
        coll = getattr(self.ring, "_coll", None)
        close = getattr(coll, "close", None)
        if close is not None:
            close()

    def _stop_file(self) -> str:
        """The controller's stop file of this segment (its path made once per segment)."""
        number = self.seg.number
        if self._stop_path[0] != number:
            self._stop_path = (number, str(protocol.stop_file(self.run_dir, number)))
        return self._stop_path[1]

    def result(self, handle) -> tuple[bool, bool]:
        """(the controller asked for a stop, some rank called job.finish()); the next vote is due
        the agreed period after this one started, and read the agreed lag after its start; a
        window it carried in :attr:`rode`."""
        t0 = time.perf_counter()
        coll = self.ring.coll
        wait_values = getattr(coll, "wait_values", None)
        values = wait_values(handle) if wait_values is not None else coll.wait(handle).tolist()
        b = Ballot.unpack(values, self.checkpoint_due is not None, self.windows, self._riding)
        self._riding = False
        self.every = max(b.every, 1) if b.every else self.floor
        self.lag = max(b.lag, 1)
        self.next_at = self._started_at + self.every
        if b.checkpoint:
            self.checkpoint_asked = True
        self.rode = b.window
        self._vote_s += time.perf_counter() - t0
        return b.asked, b.finish
