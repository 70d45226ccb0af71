"""The state that survives a resize, and its sync (:class:`StateSync`): what the script registered
(model, optimizer, schedulers, extras, the data position), rank 0's checkpoint loaded into it,
rank 0's state sent to every rank at a start or an in-place reset, and the LR rule at a new world
size (Eq. 7, ``lr_new = w_new / w_last * lr_last``, the script's own scaling with ``--lr-scaling auto``,
or the script's own hooks).

What a checkpoint holds of the script's objects, and how it is put back, is
:mod:`elastic_ring.worker.state`.
"""

from __future__ import annotations

import sys
from typing import Any, Callable

from elastic_ring.worker.checks import check_registration, check_scheduler_count
from elastic_ring.worker.data import EpochData
from elastic_ring.worker.segment import Segment
from elastic_ring.worker.state import (_bind_scheduler, _distributed_optimizers, _restore_in_place, _rng_state,
                                       _saved_form, _set_rng_state)

_META_KEYS = ("step", "cursor", "world_size", "lr_factor", "extras", "schedulers", "data_position", "built_lrs")


def is_adasum(optimizer: Any, hvd: Any) -> bool:
    """Whether ``optimizer`` is a ``hvd.DistributedOptimizer(..., op=hvd.Adasum)`` (at one worker
    Horovod's usual wrapper with ``op``; at more its Adasum class, told by its methods)."""
    if optimizer is None:
        return False
    if hvd is not None and getattr(optimizer, "op", None) == getattr(hvd, "Adasum", object()):
        return True
    fn = getattr(type(optimizer), "synchronize", None)
    return getattr(fn, "__qualname__", "").startswith("_DistributedAdasumOptimizer")


def _weights_sum(p: Any) -> float:
    """The sum of a tensor's values in float64: the same tensor gives the same sum."""
    import torch

    with torch.no_grad():
        p = p.to_local() if hasattr(p, "to_local") else p  # a DTensor: this rank's shard, no collective
        return float(p.detach().double().sum().item())


class StateSync:
    """The registered state and its sync over ``ring`` (rank 0's to all); ``seg``: the job's
    counters (set from the synced state); ``lr_rule``: the run's rule name (``lr.RULES``)."""

    def __init__(self, ring: Any, seg: Segment, lr_rule: str) -> None:
        self.ring, self.seg, self.lr_rule = ring, seg, lr_rule
        self.model = None
        self.optimizer = None
        self.schedulers: list[Any] = []
        self.extras: dict[str, Any] = {}
        self.sampler = None  # the flat loop's job.sampler()
        self.epoch_data = EpochData()  # the epoch loop's samplers and data position
        self.resize_hooks: list[Callable[[int, int, int], None]] = []
        self.resumed = False
        self.previous_world: int | None = None
        self.joined_live = False  # synced from a running ring, not from a checkpoint
        self.lr_factor = 1.0
        self.saved_rng: dict[str, Any] | None = None  # the RNG state to checkpoint (epoch loop)
        self.syncing = False  # inside a broadcast, which steps a fresh optimizer once
        self.sharded = False  # the model is sharded: each rank loads its own shards (worker.sharded)
        self._unscaled: tuple[float, float] | None = None
        self._restored_weights: list[tuple[Any, int, float]] | None = None
        # the LR the script builds its optimizer with at each world size it ran at (before a
        # checkpoint is loaded into it): what --lr-scaling auto follows (lr.script_rule)
        self.built_lrs: dict[int, float] = {}
        # this segment's rescale: (the rule applied, the LR it left in the optimizer); None: none
        self.rescaled: tuple[str, float | None] | None = None

    # ------------------------------------------------------------------ the restored weights kept
    def remember_restored_weights(self) -> None:
        """After a resume: note each registered parameter's version counter and sum, so that
        :meth:`restored_weights_overwritten` can tell whether the script wrote other weights over
        the restored ones (its own checkpoint loaded after ``restore()``). Costs one pass over the
        weights per resume."""
        self._restored_weights = None
        if self.resumed and self.model is not None and hasattr(self.model, "parameters"):
            self._restored_weights = [(p, p._version, _weights_sum(p)) for p in self.model.parameters()]

    def restored_weights_overwritten(self) -> bool:
        """True once, if a parameter restored by the last resume now holds other values (an
        in-place write that leaves the values, such as a broadcast of equal weights, does not
        count). Asked before the first optimizer step after the resume."""
        kept, self._restored_weights = self._restored_weights, None
        return any(p._version != v and _weights_sum(p) != d for p, v, d in kept or ())

    # ------------------------------------------------------------------ registration
    def register(self, model=None, optimizer=None, scheduler=None, hooks: tuple = (), **extras: Any) -> None:
        """See :meth:`elastic_ring.worker.api.Job.register`; ``hooks``: the (pre, post) step hooks
        a newly registered optimizer gets."""
        scheds = check_registration(model, optimizer, scheduler, extras, self.optimizer,
                                    _distributed_optimizers)
        if model is not None:
            self.model = model
        if optimizer is not None:
            if optimizer is not self.optimizer and hooks and hasattr(optimizer, "register_step_pre_hook"):
                optimizer.register_step_pre_hook(hooks[0])
                optimizer.register_step_post_hook(hooks[1])
            self.optimizer = optimizer
        self.schedulers.extend(s for s in scheds if all(s is not t for t in self.schedulers))
        self.extras.update(extras)

    def adopt_distributed_optimizer(self, hooks: tuple = ()) -> None:
        """A plain Horovod script broadcasts (so registers and restores) its optimizer before
        ``hvd.DistributedOptimizer`` wraps it: the wrapper, which shares its param groups, is the
        one that steps and holds the momentum from then on. Register it instead, with the state
        restored into the wrapped one, and the schedulers re-pointed."""
        opt = self.optimizer
        if opt is None or hasattr(type(opt), "_allreduce_grad_async"):
            return
        for d in _distributed_optimizers():
            if len(d.param_groups) == len(opt.param_groups) and all(
                    a is b for a, b in zip(d.param_groups, opt.param_groups)):
                for p, st in opt.state.items():
                    d.state[p] = st
                self.register(optimizer=d, hooks=hooks)
                for s in self.schedulers:
                    _bind_scheduler(s, d)
                self.undo_rescale_for_adasum()
                return

    def current_lr(self) -> float:
        if self.optimizer is not None and self.optimizer.param_groups:
            return float(self.optimizer.param_groups[0]["lr"])
        return float("nan")

    # ------------------------------------------------------------------ checkpoint <-> objects
    def load(self, ckpt: dict[str, Any]) -> dict[str, Any]:
        """Rank 0: a checkpoint into the model, the optimizer and the RNGs; returns the counters
        and the rest, to be synced (:meth:`sync`)."""
        built = self.current_lr()  # as the script built it at this size, before the checkpoint's
        if self.model is not None and not self.sharded:  # (a sharded one: every rank, from DCP)
            self.model.load_state_dict(ckpt["model"])
        if self.optimizer is not None and ckpt.get("optimizer") is not None and not self.sharded:
            self.optimizer.load_state_dict(ckpt["optimizer"])
        if ckpt.get("rng") is not None:
            _set_rng_state(ckpt["rng"])
            self.epoch_data.resume_rng = ckpt["rng"]  # again where an epoch loop's loader resumes (data.py)
        return {**{k: ckpt.get(k) for k in _META_KEYS}, "built_lr_now": built}

    def snapshot(self, step: int, into: dict[str, Any] | None = None, weights: bool = True) -> dict[str, Any]:
        """A CPU snapshot of everything a resume needs (taken on the training thread); ``into``: an
        earlier one nobody holds any more, whose tensors it reuses (:func:`elastic_ring.ckpt.snapshot`);
        not ``weights``: without the model and the optimizer (a sharded job's: in DCP's folder)."""
        from elastic_ring.ckpt import snapshot

        return snapshot({
            "step": step, "cursor": self.sampler.cursor if self.sampler is not None else 0,
            "world_size": self.ring.size, "lr_factor": self.lr_factor, "lr_last": self.current_lr(),
            "model": self.model.state_dict() if self.model is not None and weights else None,
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None and weights else None,
            "rng": self.saved_rng or _rng_state(), "extras": self.saved_extras(), "segment": self.seg.number,
            "schedulers": [sch.state_dict() for sch in self.schedulers],
            "data_position": self.epoch_data.position.state(), "built_lrs": dict(self.built_lrs),
        }, into)

    def live_meta(self, next_segment: int, stop_at: int) -> dict[str, Any]:
        """Rank 0's counters for an in-place reset (the ring's state is the live one)."""
        return {"step": self.seg.step, "cursor": self.sampler.cursor if self.sampler is not None else 0,
                "world_size": self.ring.size, "lr_factor": self.lr_factor, "extras": self.saved_extras(),
                "schedulers": [sch.state_dict() for sch in self.schedulers],
                "data_position": self.epoch_data.position.state(), "segment": next_segment, "stop_at": stop_at,
                "built_lrs": dict(self.built_lrs)}

    def saved_extras(self) -> dict[str, Any]:
        return {k: _saved_form(v) for k, v in self.extras.items()}

    # ------------------------------------------------------------------ the sync
    def sync(self, meta: dict[str, Any] | None, local: bool = False) -> None:
        """Rank 0's ``meta`` (counters), optimizer state and weights to every rank; then apply them
        (and the LR rule when the world size differs from the one ``meta`` was saved at). ``local``:
        this process is the whole ring, resized in place: nothing to send, only apply."""
        coll = self.ring.coll
        self.rescaled = None
        self.syncing = True  # Horovod's broadcast of a fresh optimizer's state steps it once
        try:
            if not local:
                meta = coll.broadcast_object(meta, 0, name="resume_meta")
                if meta is not None and self.optimizer is not None and not self.sharded:
                    coll.broadcast_optimizer_state(self.optimizer, 0)
                if self.model is not None and not self.sharded:  # (a sharded one: loaded by every rank)
                    coll.broadcast_parameters(self.model.state_dict(), 0)
        finally:
            self.syncing = False
        if meta is not None:
            self._apply(meta)
        elif self.optimizer is not None:  # a fresh start: the LR as the script built it at this size
            self.built_lrs[self.ring.size] = self.current_lr()

    def _apply(self, meta: dict[str, Any]) -> None:
        seg = self.seg
        self.resumed = True
        seg.step = int(meta["step"])
        self.previous_world = int(meta["world_size"])
        self.lr_factor = float(meta.get("lr_factor") or 1.0)
        self.built_lrs = {int(w): float(lr) for w, lr in (meta.get("built_lrs") or {}).items()}
        now = meta.get("built_lr_now")  # the script built its optimizer again, at this size
        if now is not None and now == now and self.optimizer is not None:
            self.built_lrs[self.ring.size] = float(now)
        for key, saved in (meta.get("extras") or {}).items():
            self.extras[key] = _restore_in_place(self.extras.get(key), saved)
        saved_scheds = meta.get("schedulers")  # None: a checkpoint from before schedulers
        if saved_scheds is not None:
            check_scheduler_count(saved_scheds, self.schedulers)
        for sch, st in zip(self.schedulers, saved_scheds or []):
            sch.load_state_dict(st)
        if self.sampler is not None:
            self.sampler.cursor = int(meta.get("cursor") or 0)
        self.epoch_data.position.load(meta.get("data_position"))
        self.joined_live = meta.get("segment") is not None  # from the ring, not a checkpoint
        if self.joined_live:  # an in-place reset: the segment goes on here
            seg.number, seg.stop_at = int(meta["segment"]), int(meta["stop_at"])
        if self.previous_world != self.ring.size:
            self.rescale(self.previous_world, self.ring.size)

    # ------------------------------------------------------------------ the LR at a new size
    def on_resize(self, fn: Callable[[int, int, int], None]) -> None:
        self.resize_hooks.append(fn)

    def rescale(self, old: int, new: int) -> None:
        """Eq. 7 (the run's rule) from ``old`` to ``new`` workers: the optimizer's LRs and all that
        the registered schedulers scale from (:func:`elastic_ring.worker.lr.scale_lr_state`), or
        the script's ``on_resize`` hooks instead."""
        from elastic_ring.worker.lr import RULES, rule_factor, scale_lr_state, script_rule

        if not self.resize_hooks and is_adasum(self.optimizer, self.ring.hvd):
            self._say_adasum()  # the script chose a reduction that does not scale: keep its LR
            self.rescaled = ("adasum", self.current_lr())
            return
        if self.lr_rule == "auto":
            name, factor = script_rule(self.built_lrs, old, new)
        else:
            name, factor = self.lr_rule, rule_factor(RULES[self.lr_rule], old, new)
        self._unscaled = (self.lr_factor, factor)
        self.lr_factor *= factor
        if self.resize_hooks:  # the script owns the LR (its hooks, Horovod Elastic's reset callbacks)
            self._unscaled = None
            for fn in self.resize_hooks:
                fn(old, new, self.seg.step)
            self.rescaled = ("on_resize", None)
            return
        if self.optimizer is not None or self.schedulers:
            scale_lr_state(self.optimizer, self.schedulers, factor)
        self.rescaled = (name, self.current_lr())

    def _say_adasum(self) -> None:
        if self.ring.rank == 0:
            print("elastic-ring worker: the optimizer combines gradients with Adasum, whose update does not "
                  "grow with the workers: no Eq. 7, the LR stays", file=sys.stderr, flush=True)

    def undo_rescale_for_adasum(self) -> None:
        """The optimizer registered at ``restore()`` was the one ``hvd.DistributedOptimizer(...,
        op=hvd.Adasum)`` wrapped afterwards: take back the Eq. 7 applied to it."""
        from elastic_ring.worker.lr import scale_lr_state

        if self._unscaled and is_adasum(self.optimizer, self.ring.hvd):
            before, factor = self._unscaled
            scale_lr_state(self.optimizer, self.schedulers, 1.0 / factor)
            self.lr_factor, self._unscaled = before, None
            self.rescaled = ("adasum", self.current_lr())
            self._say_adasum()
