"""Checkpoint and resume, the worker's side: rank 0's checkpoints (periodic and final, written by a
background thread), the sync of rank 0's state to every rank at a start or an in-place reset, and
Eq. 7 at a new world size (:class:`CheckpointMixin`, mixed into
:class:`elastic_ring.worker.api.Job`, whose attributes it uses). What a checkpoint holds of the
script's objects, and how it is put back, is :mod:`elastic_ring.worker.state`.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from elastic_ring import protocol
from elastic_ring.worker.checks import check_scheduler_count
from elastic_ring.worker.state import _restore_in_place, _saved_form


def is_adasum(optimizer: Any, hvd: Any) -> bool:
    """Whether ``optimizer`` is a ``hvd.DistributedOptimizer(..., op=hvd.Adasum)`` (at one worker
    Horovod's usual wrapper with ``op``; at more its Adasum class, told by its methods)."""
    if optimizer is None:
        return False
    if hvd is not None and getattr(optimizer, "op", None) == getattr(hvd, "Adasum", object()):
        return True
    fn = getattr(type(optimizer), "synchronize", None)
    return getattr(fn, "__qualname__", "").startswith("_DistributedAdasumOptimizer")


class CheckpointMixin:
    """Checkpoints, the state sync and the LR rescale (part of :class:`~elastic_ring.worker.api.Job`)."""

    def _checkpoint_store(self):
        if self._store is None:
            from elastic_ring.ckpt import BackgroundWriter, CheckpointStore

            self._store = CheckpointStore(self.run_dir / "checkpoints", keep=self.info.keep)
            self._writer = BackgroundWriter(self._store)
        return self._store

    def _sync(self, meta: dict[str, Any] | None, local: bool = False) -> None:
        """Rank 0's ``meta`` (counters), optimizer state and weights to every rank; then apply them
        (and Eq. 7 when the world size differs from the one ``meta`` was saved at). ``local``: this
        process is rank 0 of a ring of one, resized in place: nothing to send, only apply."""
        hvd = self.hvd
        if not local:
            meta = hvd.broadcast_object(meta, root_rank=0, name="resume_meta")
            if meta is not None and self._optimizer is not None:
                hvd.broadcast_optimizer_state(self._optimizer, root_rank=0)
            if self._model is not None:
                hvd.broadcast_parameters(self._model.state_dict(), root_rank=0)
        self._marks["restore_broadcast"] = time.time()
        if meta is not None:
            self.resumed = True
            self.step = int(meta["step"])
            self.previous_world = int(meta["world_size"])
            self.lr_factor = float(meta.get("lr_factor") or 1.0)
            if meta.get("extras"):
                for key, saved in meta["extras"].items():
                    self._extras[key] = _restore_in_place(self._extras.get(key), saved)
            saved_scheds = meta.get("schedulers")  # None: a checkpoint from before schedulers
            saved_scheds = [] if saved_scheds is None else saved_scheds
            if meta.get("schedulers") is not None:
                check_scheduler_count(saved_scheds, self._schedulers)
            for sch, st in zip(self._schedulers, saved_scheds):
                sch.load_state_dict(st)
            if self._sampler is not None:
                self._sampler.cursor = int(meta.get("cursor") or 0)
            self._position.load(meta.get("data_position"))
            self.joined_live = meta.get("segment") is not None  # from the ring, not a checkpoint
            if meta.get("segment") is not None:  # an in-place reset: the segment goes on here
                self.segment, self.stop_at = int(meta["segment"]), int(meta["stop_at"])
            if self.previous_world != self.size:
                self._rescale(self.previous_world, self.size)
        self._last_ckpt_step = self.step

    def _rescale(self, old: int, new: int) -> None:
        """Eq. 7 (the run's rule) from ``old`` to ``new`` workers: the optimizer's LRs and all that
        the registered schedulers scale from (:func:`elastic_ring.worker.lr.scale_lr_state`), or
        the script's :meth:`on_resize` hooks instead."""
        from elastic_ring.worker.lr import RULES, rule_factor, scale_lr_state

        rule = RULES[self.info.lr_scaling]
        if not self._resize_hooks and is_adasum(self._optimizer, getattr(self, "hvd", None)):
            self._say_adasum()  # the script chose a reduction that does not scale: keep its LR
            return
        self._unscaled = (self.lr_factor, rule_factor(rule, old, new))
        self.lr_factor = rule.scale(self.lr_factor, old, new)
        if self._resize_hooks:
            self._unscaled = None
            for fn in self._resize_hooks:
                fn(old, new, self.step)
        elif self._optimizer is not None or self._schedulers:
            scale_lr_state(self._optimizer, self._schedulers, rule_factor(rule, old, new))

    def _say_adasum(self) -> None:
        if self.rank == 0:
            print("elastic-ring worker: the optimizer combines gradients with Adasum, whose update does not "
                  "grow with the workers: no Eq. 7, the LR stays", file=sys.stderr, flush=True)

    def _undo_rescale_for_adasum(self) -> None:
        """The optimizer registered at ``restore()`` was the one ``hvd.DistributedOptimizer(...,
        op=hvd.Adasum)`` wrapped afterwards: take back the Eq. 7 applied to it."""
        from elastic_ring.worker.lr import scale_lr_state

        if getattr(self, "_unscaled", None) and is_adasum(self._optimizer, getattr(self, "hvd", None)):
            before, factor = self._unscaled
            scale_lr_state(self._optimizer, self._schedulers, 1.0 / factor)
            self.lr_factor, self._unscaled = before, None
            self._say_adasum()

    def _maybe_periodic_checkpoint(self, step: int) -> None:
        info = self.info
        due = (info.checkpoint_every and step - self._last_ckpt_step >= info.checkpoint_every) or \
              (info.checkpoint_every_s and time.time() - self._last_ckpt_t >= info.checkpoint_every_s)
        if due and step < self.stop_at:
            self._checkpoint(step, wait=False)

    def _saved_extras(self) -> dict[str, Any]:
        return {k: _saved_form(v) for k, v in self._extras.items()}

    def _checkpoint(self, step: int, wait: bool) -> None:
        """Rank 0: snapshot now, write in the background (``wait``: and block until written).

        The stall on the training thread is the wait for the previous write (if it is still
        going), plus the copy of the state to the CPU; it is reported in ``checkpoint_written``.
        """
        from elastic_ring.events.api import CheckpointWritten

        self._checkpoint_store()
        self._heartbeat(step, "checkpoint")
        if not self._owner_is_current():
            raise RuntimeError("another controller owns the run folder now: not writing a checkpoint")
        t0 = time.perf_counter()
        self._writer.wait()
        state = self.state_dict(step)
        stall = time.perf_counter() - t0
        lr = self.current_lr()

        def done(path: Path, nbytes: int, secs: float) -> None:
            self._emit(CheckpointWritten(step=step, path=str(path.relative_to(self.run_dir)),
                                         seconds=secs, bytes=nbytes, world_size=self.size, lr=lr,
                                         stall_s=stall, background=not wait))

        self._writer.submit(state, done)
        if wait:
            self._writer.wait()
        self.checkpoint_stalls.append(time.perf_counter() - t0)
        self._last_ckpt_step, self._last_ckpt_t = step, time.time()

    def _owner_is_current(self) -> bool:
        if not self.info.owner:
            return True
        hb = protocol.read_json(protocol.control_dir(self.run_dir) / protocol.HEARTBEAT_FILE)
        return not isinstance(hb, dict) or hb.get("owner") in (None, self.info.owner)
