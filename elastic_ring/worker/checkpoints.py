"""Rank 0's checkpoints (:class:`Checkpoints`): periodic and final, copied to the CPU on the
training thread and written by a background thread; the newest loadable one found at a restore.
What a checkpoint holds is the job's state sync's snapshot (:mod:`elastic_ring.worker.sync`).
A sharded model's (FSDP2) are written by every rank, each its shards, through
``torch.distributed.checkpoint`` (:mod:`elastic_ring.worker.sharded`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from elastic_ring import protocol
from elastic_ring.protocol import LaunchInfo


class Checkpoints:
    """Rank 0's checkpoint writer. ``snapshot(step)``: the state to save (a CPU copy);
    ``heartbeat``/``emit``: the job's progress (the watchdog's phase, the ``checkpoint_written``
    event); ``world_size``/``current_lr``: what the event reports."""

    def __init__(self, info: LaunchInfo, snapshot: Callable[[int], dict[str, Any]], progress: Any,
                 world_size: Callable[[], int], current_lr: Callable[[], float]) -> None:
        self.info, self.run_dir = info, Path(info.run_dir)
        self.snapshot, self.progress = snapshot, progress
        self.world_size, self.current_lr = world_size, current_lr
        self._store = None
        self._writer = None
        self.last_step = -1
        self._last_t = time.time()
        self.stalls: list[float] = []  # seconds on the training thread per checkpoint
        self.sharded = None  # a sharded model's part (worker.sharded.ShardedCheckpoints): every rank writes
        self.vote = None  # the stop vote, which carries rank 0's time-based "due" to a sharded job's ranks
        self._sharded_writer = None
        self._due_sent = False  # rank 0 of a sharded job: a vote carries the time-based due

    def writes(self, rank: int) -> bool:
        """Whether ``rank`` takes part in writing a checkpoint: rank 0, or every rank of a sharded job."""
        return rank == 0 or self.sharded is not None

    def shard(self, state: Any, ring: Any, vote: Any) -> None:
        """The model is sharded: from now on every rank writes its shards (worker.sharded)."""
        from elastic_ring.worker.sharded import ShardedCheckpoints

        if self.sharded is None:
            self.sharded = ShardedCheckpoints(state, ring, self.run_dir / "checkpoints", self.store())
        self.vote = vote
        vote.checkpoint_due = self.time_due

    def time_due(self) -> bool:
        """Rank 0: the time-based periodic checkpoint is due (its own clock), once until written."""
        s = self.info.checkpoint_every_s
        due = bool(s) and not self._due_sent and time.time() - self._last_t >= s
        self._due_sent = self._due_sent or due
        return due

    def store(self):
        if self._store is None:
            from elastic_ring.ckpt import BackgroundWriter, CheckpointStore

            self._store = CheckpointStore(self.run_dir / "checkpoints", keep=self.info.keep)
            self._writer = BackgroundWriter(self._store)
        return self._store

    def load_latest(self) -> dict[str, Any] | None:
        """The newest loadable checkpoint (falling back past a corrupt one, with a warning)."""
        return self.store().load_latest(warn=self.progress.warn)

    def due(self, step: int, stop_at: int) -> bool:
        """Whether a periodic checkpoint is due after ``step``."""
        info = self.info
        if self.sharded is not None:  # the same step on every rank: the time-based one as the vote agreed
            asked = self.vote is not None and self.vote.checkpoint_asked
            return bool((info.checkpoint_every and step - self.last_step >= info.checkpoint_every) or asked) \
                and step < stop_at
        due = (info.checkpoint_every and step - self.last_step >= info.checkpoint_every) or \
              (info.checkpoint_every_s and time.time() - self._last_t >= info.checkpoint_every_s)
        return bool(due) and step < stop_at

    def maybe_periodic(self, step: int, stop_at: int) -> None:
        if self.due(step, stop_at):
            self.write(step, wait=False)

    def write(self, step: int, wait: bool) -> None:
        """Rank 0: snapshot now, write in the background (``wait``: and block until written).

        The stall on the training thread is the wait for the previous write (if it is still
        going), plus the copy of the state to the CPU; it is reported in ``checkpoint_written``.
        """
        from elastic_ring.events.api import CheckpointWritten

        self.store()
        self.progress.heartbeat(step, "checkpoint")
        if not self._owner_is_current():
            raise RuntimeError("another controller owns the run folder now: not writing a checkpoint")
        t0 = time.perf_counter()
        writer = self._writer
        if self.sharded is not None:
            if self._sharded_writer is None:
                from elastic_ring.ckpt import BackgroundWriter

                self._sharded_writer = BackgroundWriter(self.sharded)
            writer = self._sharded_writer
            if self.vote is not None:
                self.vote.checkpoint_asked = False
            self._due_sent = False
        writer.wait()
        if self.sharded is not None:
            self.sharded.ensure_group()
            state = self.sharded.snapshot(step)
        else:
            state = self.snapshot(step)
        stall = time.perf_counter() - t0
        lr, size = self.current_lr(), self.world_size()

        def done(path: Path, nbytes: int, secs: float) -> None:
            self.progress.emit(CheckpointWritten(step=step, path=str(path.relative_to(self.run_dir)),
                                                 seconds=secs, bytes=nbytes, world_size=size, lr=lr,
                                                 stall_s=stall, background=not wait))

        rank0 = self.sharded is None or state.get("meta") is not None
        writer.submit(state, done if rank0 else None)
        if wait:
            writer.wait()
        self.stalls.append(time.perf_counter() - t0)
        self.last_step, self._last_t = step, time.time()

    def _owner_is_current(self) -> bool:
        if not self.info.owner:
            return True
        hb = protocol.read_json(protocol.control_dir(self.run_dir) / protocol.HEARTBEAT_FILE)
        return not isinstance(hb, dict) or hb.get("owner") in (None, self.info.owner)
