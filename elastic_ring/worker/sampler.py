"""The data position of a job: this rank's share of one endless, seeded stream of epoch
permutations, saved in every checkpoint (see :class:`Sampler`)."""

from __future__ import annotations

from typing import Any

from elastic_ring.worker.errors import ContractError


class Sampler:
    """This rank's share of one endless, seeded stream of epoch permutations.

    A step with ``w`` workers consumes the next ``w * batch_size`` positions; rank r takes the r-th
    contiguous share. The cursor is saved in every checkpoint, so whatever the world sizes before
    and after a resize, every sample of every epoch is used exactly once.
    """

    def __init__(self, job: Any, size: int, batch_size: int, seed: int) -> None:
        from elastic_ring.data.stream import SampleStream

        self.job, self.batch_size = job, batch_size
        self.stream = SampleStream(size, seed)
        self.cursor = 0
        self._batch_start: int | None = None  # where the batch next_batch() took last starts
        self._loader = False  # iterated as a DataLoader's batch_sampler: the steps move the cursor

    def next_batch(self):
        """This rank's indices (a LongTensor) for the current step; advances the cursor."""
        if self._loader:
            raise ContractError("the sampler feeds a DataLoader (batch_sampler=): do not also call "
                                "next_batch() on it")
        start = self.cursor + self.job.rank * self.batch_size
        idx = self.stream.take(start, self.batch_size)
        self.last_start = start
        cursor = self.cursor
        self.cursor = cursor + self.batch_size * self.job.size
        self._batch_start = cursor
        return idx

    @property
    def cursor(self) -> int:
        """Positions of the stream used by completed steps (taken ones, with ``next_batch()``)."""
        return self._cursor

    @cursor.setter
    def cursor(self, value: int) -> None:
        self._cursor = value
        self._batch_start = None  # restored, or moved past a DataLoader's batch

    def __iter__(self):
        """Use the sampler as a ``DataLoader``'s ``batch_sampler`` (any ``num_workers``, prefetch):
        yields this rank's index list for this step, the next step, ... without moving the cursor;
        :meth:`Job.steps` moves it by ``world * batch_size`` after each completed step. So the batches
        a loader prefetched but the job did not train on are not lost at a stop: the next segment's
        loader starts from the checkpointed cursor. One batch per step; create the loader's
        iterator after :meth:`Job.restore`."""
        if not self.job.restored:
            raise ContractError("iterate the DataLoader (or the sampler) after job.restore(): the "
                                "data position is restored there")
        if self.job.inplace:  # the shares of batches prefetched before an in-place resize are stale
            raise ContractError("a DataLoader over job.sampler() is not supported under --relaunch "
                                "inplace: use data.next_batch()")
        self._loader = True
        cursor, world, rank, b = self.cursor, self.job.size, self.job.rank, self.batch_size
        k = 0
        while True:
            yield self.stream.take(cursor + k * world * b + rank * b, b).tolist()
            k += 1

    @property
    def epoch(self) -> int:
        """The epoch (0-based) of the batch being trained: the one ``next_batch()`` took last, or
        the DataLoader's batch of this step (the cursor moves after the step); before the first
        batch of a segment, the next one's. Where a batch straddles two epochs, the epoch of its
        first sample. For a scheduler stepped per epoch, after taking the step's batch:
        ``while sched.last_epoch < data.epoch: sched.step()``, exact across resizes (the
        scheduler's own count is restored with it)."""
        start = self._batch_start if self._batch_start is not None and not self._loader else self.cursor
        return start // self.stream.size
