"""The data position of a job: this rank's share of one endless, seeded stream of epoch
permutations, saved in every checkpoint (see :class:`Sampler`)."""

from __future__ import annotations

from typing import Any

from elastic_ring.worker.errors import ContractError

AHEAD = 64  # steps whose batches next_batch() prepares at once (see Sampler._prepare)
CHUNK = 1 << 16  # at most this many stream positions at once (fewer steps of a large global batch)


class Sampler:
    """This rank's share of one endless, seeded stream of epoch permutations.

    A step with ``w`` workers consumes the next ``w * batch_size`` positions; rank r takes the r-th
    contiguous share. The cursor is saved in every checkpoint, so whatever the world sizes before
    and after a resize, every sample of every epoch is used exactly once.

    ``global_batch`` (the run's ``constant-batch`` rule): a step consumes the next ``global_batch``
    positions at any world size, in micro-batches of ``batch_size`` that the ranks share
    (:meth:`next_micro_batches`, :mod:`elastic_ring.worker.accumulate`).
    """

    def __init__(self, job: Any, size: int, batch_size: int, seed: int, global_batch: int | None = None) -> None:
        from elastic_ring.data.stream import SampleStream

        self.job, self.batch_size, self.global_batch = job, batch_size, global_batch
        self.stream = SampleStream(size, seed)
        self.cursor = 0
        self._batch_start: int | None = None  # where the batch next_batch() took last starts
        self._loader = False  # iterated as a DataLoader's batch_sampler: the steps move the cursor
        self._rows: list = []  # this rank's batches of the next steps, prepared (last step first)
        self._rows_at: tuple | None = None  # (cursor, rank, world, batch) the first of them is for

    def next_batch(self):
        """This rank's indices (a LongTensor) for the current step; advances the cursor."""
        if self._loader:
            raise ContractError("the sampler feeds a DataLoader (batch_sampler=): do not also call "
                                "next_batch() on it")
        if self.global_batch:
            raise ContractError("a constant global batch is trained in micro-batches: take the step's "
                                "with data.next_micro_batches()")
        job, b, cursor = self.job, self.batch_size, self._cursor
        key = (cursor, job.rank, job.size, b)
        rows = self._rows
        if not rows or key != self._rows_at:  # (restored, resized, or the prepared steps used up)
            rows = self._rows = self._prepare(*key)
        nxt = cursor + b * key[2]
        self._rows_at = (nxt, *key[1:])
        self.last_start = cursor + key[1] * b
        self._cursor = nxt
        self._batch_start = cursor
        return rows.pop()

    def _prepare(self, cursor: int, rank: int, world: int, b: int) -> list:
        """This rank's batches of the next ``AHEAD`` steps (fewer where that is over ``CHUNK``
        positions) from ``cursor`` at world size ``world``,
        in one pass over the stream (last step first, for ``pop()``). A step's own batch is then
        taken with no tensor operation: right after a step the caches are cold, and every
        operation there costs tens of microseconds (docs/reports/worker.md, "The first
        microseconds after a step"). Each batch is a row of one new tensor (not of the stream's
        permutation): writing into it changes nothing else the job reads."""
        n = max(1, min(AHEAD, CHUNK // (world * b)))
        rows = self.stream.take(cursor, n * world * b).view(n, world, b)[:, rank].contiguous()
        out = list(rows.unbind(0))
        out.reverse()
        return out

    def layout(self):
        """The step's micro-batch layout at the current world size (a constant global batch)."""
        from elastic_ring.worker.accumulate import Layout

        if not self.global_batch:
            raise ContractError("job.sampler(..., global_batch=G) has a micro-batch layout; this one has none")
        return Layout(self.global_batch, self.batch_size, self.job.size)

    def next_micro_batches(self) -> list[tuple[int, Any]]:
        """This rank's micro-batches of the current step of a constant global batch, in order: a
        (stream position of its first sample, indices: a LongTensor of ``batch_size``) pair each
        (see :mod:`elastic_ring.worker.accumulate`); advances the cursor by the global batch."""
        lay = self.layout()
        cursor, b = self.cursor, self.batch_size
        out = [(cursor + m * b, self.stream.take(cursor + m * b, b)) for m in lay.share(self.job.rank)]
        self.last_start = out[0][0]
        self.cursor = cursor + lay.global_batch
        self._batch_start = cursor
        return out

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
        if self.global_batch:
            raise ContractError("a constant global batch is trained in micro-batches: take the step's "
                                "with data.next_micro_batches(), not through a DataLoader")
        # the shares of batches prefetched before an in-place resize are stale
        if self.job.elastic and self.job.ring.in_place:
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
