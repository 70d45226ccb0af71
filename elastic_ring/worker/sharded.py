"""Sharded models (FSDP2's ``fully_shard``): their checkpoints written by every rank through
``torch.distributed.checkpoint`` (DCP) and restored at any world size (DCP reshards).

A registered model whose parameters are DTensors is sharded (:func:`is_sharded`, told at
``job.restore()``, one line on rank 0). Its checkpoints are then no longer rank 0's full copy:

- **Write** (every rank, at the same steps): on the training thread each rank copies its own shards
  of the model and the optimizer state (``get_state_dict``'s dicts: keyed by parameter name) to the
  CPU (1/N of the state, where a full checkpoint copies all of it on rank 0; :class:`Copier`: DCP's
  call only to make a :class:`Plan` of where they come from, then the live tensors copied into the
  previous checkpoint's CPU tensors, so that a small state's copy costs no more than a full
  one's), and rank 0 the small rest
  (step, data position, LR factor, RNG, schedulers, extras); a background thread runs DCP's save
  of the shards over a gloo group of its own (so that it never interleaves with the training's
  collectives) into a partial folder, then rank 0 publishes it and writes its usual checkpoint file
  naming it (:mod:`elastic_ring.ckpt.sharded`: a half-written checkpoint is never the one resumed).
- **Periodic ones** must fall on the same step on every rank: ``--checkpoint-every N`` does; the
  time-based ``--checkpoint-every-s`` is rank 0's clock, so its "due" travels in the stop vote
  (:class:`~elastic_ring.worker.segment.StopVote`) and every rank writes after the vote is read.
- **Restore**: rank 0 picks the newest checkpoint as for any job and sends its folder's name;
  every rank loads its part of it with DCP's ``load`` into its (new-size) shards and
  ``set_state_dict``; the counters and the rest go by the usual sync (no broadcast of weights: each
  rank read its own). Eq. 7 or the constant-batch rule then apply as for a data-parallel job.
- **--survive**: a dead rank's shards die with it, so each rank keeps in memory, at every step,
  its shards and rank r-1's (:class:`Replica`: sent to r+1 and received from r-1 over the ring's
  gloo group; :class:`elastic_ring.worker.survive.ShardedCopy` keeps two steps' copies). After one
  failure the survivors hold every rank's shards (:func:`owners`) and rebuild the state at the new
  size from them (:meth:`ShardedCheckpoints.from_memory`); two neighbours' deaths at once, or a
  job at one worker (:func:`why_no_replica`), restart from the newest sharded checkpoint (the
  controller's agreement refuses the memory path: :func:`elastic_ring.seam.agreement`).
"""

from __future__ import annotations

import copy
import operator
import sys
import time
from pathlib import Path
from typing import Any

DETECTED = ("elastic-ring worker: the model's parameters are sharded (DTensor: FSDP2's fully_shard): "
            "sharded checkpoints chosen: every rank writes its shards through torch.distributed.checkpoint "
            "(checkpoints/dcp-<step>/), restored at any world size")
NO_SURVIVE = ("elastic-ring worker: --survive on a sharded model: a dead rank's shards are lost with it and the "
              "survivors' alone do not make the state, so a failure restarts from the newest sharded checkpoint")


def is_sharded(model: Any) -> bool:
    """Whether ``model``'s parameters are DTensors (FSDP2's ``fully_shard``, or tensor parallelism)."""
    if model is None or not hasattr(model, "parameters"):
        return False
    # a model whose parameters are DTensors imported DTensor's module: where it is not imported,
    # none is (and its import, about 0.45 s, is not paid by every worker's start)
    mod = sys.modules.get("torch.distributed.tensor")
    dtensor = getattr(mod, "DTensor", None)
    return dtensor is not None and any(isinstance(p, dtensor) for p in model.parameters())


def check_optimizer(model: Any, optimizer: Any) -> None:
    """The registered optimizer steps the sharded model's parameters.

    Raises:
        ContractError: it holds other tensors (built before ``fully_shard`` replaced them)."""
    from elastic_ring.worker.errors import ContractError

    if optimizer is None:
        return
    own = {id(p) for p in model.parameters()}
    if any(id(p) not in own for g in optimizer.param_groups for p in g["params"]):
        raise ContractError("the registered optimizer holds parameters the sharded model no longer has: "
                            "build it after fully_shard(model), on model.parameters()")


def forget_meshes() -> None:
    """Before a sharded script runs again in a re-formed ring: DTensor's cache of its operations'
    output layouts let go. It is keyed by a device mesh's ranks and shape, not by this process's
    rank in it, so a mesh of the same size from an earlier ring (where this process had another
    rank: a survivor after a failure) would come back on the new ring's tensors (seen: DCP's
    save of a 3 -> 2 -> 3 run then placed two ranks' shards at one offset)."""
    mod = sys.modules.get("torch.distributed.tensor")
    dtensor = getattr(mod, "DTensor", None)
    if dtensor is None:
        return
    import torch

    native = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)  # (its C++ fast path's)
    if native is not None:
        native()
    prop = getattr(getattr(dtensor, "_op_dispatcher", None), "sharding_propagator", None)
    for cache in (getattr(prop, "propagate_op_sharding", None), getattr(prop, "_propagate_tensor_meta_cached", None)):
        if hasattr(cache, "cache_clear"):
            cache.cache_clear()


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def state_dicts(model: Any, optimizer: Any) -> dict[str, Any]:
    """``{"model": ..., "optimizer": ...}``: DCP's state dicts (``get_state_dict``, keyed by
    parameter name: loadable into the same model sharded over any number of ranks)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, optimizer if optimizer is not None else [])
    return {"model": msd, "optimizer": osd if optimizer is not None else {}}


def split(obj: Any, specs: dict, path: tuple = ()) -> Any:
    """``obj`` (a state dict) with each DTensor replaced by its local shard (a plain tensor, which
    :func:`elastic_ring.ckpt.snapshot` copies at the speed of any tensor, where a DTensor's clone
    dispatches through DTensor's machinery: measured 1.5-2x the time for an MLP's shards); its
    mesh, placements, shape and stride go to ``specs`` under its path, for :func:`join`."""
    from torch.distributed.tensor import DTensor

    if isinstance(obj, DTensor):
        specs[path] = (obj.device_mesh, obj.placements, obj.shape, obj.stride())
        return obj.to_local()
    if isinstance(obj, dict):
        return {k: split(v, specs, path + (k,)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [split(v, specs, path + (i,)) for i, v in enumerate(obj)]
    return obj


def join(obj: Any, specs: dict, path: tuple = ()) -> Any:
    """What :func:`split` took apart: the local copies as DTensors again (no communication)."""
    spec = specs.get(path)
    if spec is not None:
        from torch.distributed.tensor import DTensor

        mesh, placements, shape, stride = spec
        return DTensor.from_local(obj, mesh, placements, run_check=False, shape=shape, stride=stride)
    if isinstance(obj, dict):
        return {k: join(v, specs, path + (k,)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [join(v, specs, path + (i,)) for i, v in enumerate(obj)]
    if type(obj) is tuple and any(path + (i,) in specs for i in range(len(obj))):  # (Copier descends tuples)
        return tuple(join(v, specs, path + (i,)) for i, v in enumerate(obj))
    return obj


def _needs_init(optimizer: Any) -> bool:
    """Whether DCP's ``get_state_dict`` would step ``optimizer`` once to make its state (no state
    yet and no gradient anywhere): then only it gives the optimizer's state dict."""
    if optimizer is None or optimizer.state:
        return False
    return all(p.grad is None for g in optimizer.param_groups for p in g["params"])


def _same(a: Any, b: Any) -> bool:
    """Whether two state dicts hold the same tensors (the same local data: a parameter and its
    detached alias are the same) in the same places, and equal other values."""
    import torch
    from torch.distributed.tensor import DTensor

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or \
                isinstance(a, DTensor) != isinstance(b, DTensor):
            return False
        if isinstance(a, DTensor):
            return a.placements == b.placements and a.shape == b.shape and _same(a._local_tensor, b._local_tensor)
        return a.shape == b.shape and a.dtype == b.dtype and a.data_ptr() == b.data_ptr()
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


class Plan:
    """Where a sharded model's and its optimizer's state dicts come from, found once (at the
    first checkpoint, again when it no longer holds): what DCP's ``get_state_dict`` computes at
    every call (each parameter's name, the optimizer's parameters by name; ~0.3-0.6 ms for an MLP,
    more than the copy of a small model's shards). :meth:`state_dicts` then gives the same dicts
    from the live module attributes and ``optimizer.state_dict()``; :meth:`build` returns None
    (DCP's call every time) for a model whose state dict is not plainly its parameters and
    buffers under their names (state-dict hooks, extra state, a compiled wrapper's prefixes)."""

    def __init__(self, model: Any, optimizer: Any, entries: list, params: list, fqns: list) -> None:
        self.model, self.optimizer = model, optimizer
        self.entries = entries  # (name, owning module's _parameters or _buffers, attribute, the tensor)
        self.params = params  # the optimizer's parameters in its state dict's order
        self.fqns = fqns  # and their names
        self._names = {id(p): n for p, n in zip(params, fqns)}
        self._tensors = [t for _, _, _, t in entries]
        self._model: dict | None = None  # the model's state dict (its tensors fixed while the plan holds)

    @classmethod
    def build(cls, model: Any, optimizer: Any, dcp_dicts: dict[str, Any]) -> Plan | None:
        """The plan of ``model`` and ``optimizer``, checked against ``dcp_dicts`` (what
        :func:`state_dicts` gave for them just now): None where they differ."""
        try:
            live = model.state_dict(keep_vars=True)
            entries = []
            for name, t in live.items():
                owner, _, attr = name.rpartition(".")
                mod = model.get_submodule(owner) if owner else model
                table = mod._parameters if attr in mod._parameters else mod._buffers
                if table.get(attr) is not t:
                    return None
                entries.append((name, table, attr, t))
            params = [p for g in optimizer.param_groups for p in g["params"]] if optimizer is not None else []
            names = {id(t): name for name, _, _, t in entries}
            if any(id(p) not in names for p in params):
                return None
            plan = cls(model, optimizer, entries, params, [names[id(p)] for p in params])
            return plan if plan.holds() and _same(plan.state_dicts(), dcp_dicts) else None
        except Exception:  # noqa: BLE001 - an unusual model: DCP's own call every time
            return None

    def holds(self) -> bool:
        """Whether the model still has the same tensors under the same names and the optimizer the
        same parameters (not after a restore that replaced them, nor FSDP2's unsharded parameters
        registered), and the optimizer needs no first step for its state (:func:`_needs_init`)."""
        if not all(map(operator.is_, [table.get(attr) for _, table, attr, _ in self.entries], self._tensors)):
            return False
        if self.optimizer is None:
            return True
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        return len(params) == len(self.params) and all(map(operator.is_, params, self.params)) \
            and not _needs_init(self.optimizer)

    def state_dicts(self) -> dict[str, Any]:
        """:func:`state_dicts`' result, from the live tensors (the caller checked :meth:`holds`).
        The optimizer's part is what ``optimizer.state_dict()`` gives, keyed by name, read from its
        ``state`` and ``param_groups`` directly where it has no state-dict hooks (its own call
        first numbers the parameters and packs every group: the larger part of this call's time
        for a small model)."""
        if self._model is None:
            self._model = {name: t for name, _, _, t in self.entries}
        model = dict(self._model)
        opt = self.optimizer
        if opt is None:
            return {"model": model, "optimizer": {}}
        if getattr(opt, "_optimizer_state_dict_pre_hooks", None) or \
                getattr(opt, "_optimizer_state_dict_post_hooks", None):
            osd = opt.state_dict()
            fqns = self.fqns
            return {"model": model, "optimizer": {
                "state": {fqns[i]: v for i, v in osd["state"].items()},
                "param_groups": [{**g, "params": [fqns[i] for i in g["params"]]} for g in osd["param_groups"]]}}
        names = self._names
        return {"model": model, "optimizer": {
            "state": {names[id(p)]: v for p, v in opt.state.items()},
            "param_groups": [{**{k: v for k, v in g.items() if k != "params"},
                              "params": [names[id(p)] for p in g["params"]]} for g in opt.param_groups]}}


class Copier:
    """A rank's shards copied to the CPU at each checkpoint, on the training thread, at the cost
    of the copy alone: the state dicts from a :class:`Plan` (DCP's ``get_state_dict`` only where
    there is none yet or it no longer holds), each DTensor's local tensor read directly (its mesh,
    placements, shape and stride kept while it is the same tensor), and all copied with one
    ``_foreach_copy_`` into the CPU tensors of the previous checkpoint (handed back by
    :meth:`release` once it was written; pinned for a GPU's shards), new ones only for a tensor
    that is new or changed its shape.

    While the plan holds and the optimizer's state is the same tensors, a copy follows a
    :class:`_Layout` made at the copy before (every tensor in one list: an identity check of them,
    the copy, the dicts built from lists), not a walk of the state dicts with a path per tensor:
    that walk was most of a small model's copy (measured in process, 24 tensors: 30 of 48 us).

    :meth:`copy` returns what :func:`split` of DCP's state dicts, copied, would: ``(local, specs)``."""

    def __init__(self) -> None:
        self.plan: Plan | None = None
        self._for: tuple = ()  # the (model, optimizer) the plan was made for
        self._no_plan: tuple | None = None  # the (model, optimizer) no plan could be made for
        self._specs: dict = {}  # path -> (the DTensor, its spec): kept while it is the same tensor
        self._spare: Any = {}  # a written checkpoint's CPU tensors, to copy into: path -> tensor, or
        #                        (the _Layout it was made by, its tensors in the layout's order)
        self._layout: _Layout | None = None
        self._no_layout: Plan | None = None  # the plan no layout could be made for
        self._made: dict = {}  # id(local) -> (local, its _Layout, its CPU tensors): until released
        self.calls = {"plan": 0, "dcp": 0}  # how often DCP's state dict was made, and a plan (tests)
        self.laid_out = 0  # how many copies followed a layout (tests)

    def invalidate(self) -> None:
        """The model's or optimizer's tensors were replaced (a restore): the plan made again."""
        self.plan, self._specs, self._no_plan = None, {}, None
        self._layout, self._no_layout = None, None

    def copy(self, state: Any) -> tuple[Any, dict]:
        model, optimizer = state.model, state.optimizer
        if self.plan is not None and (self._for[0] is not model or self._for[1] is not optimizer
                                      or not self.plan.holds()):
            self.invalidate()
        if self.plan is not None and self._layout is not None:
            out = self._copy_laid_out(self._layout)
            if out is not None:
                return out
            self._layout = None  # (the optimizer's state was replaced: the layout made again below)
        if self.plan is None:
            state.syncing = True  # get_state_dict steps a fresh optimizer once (lr 0) to make its state
            try:
                sd = state_dicts(model, optimizer)
            finally:
                state.syncing = False
            self.calls["dcp"] += 1
            if self._no_plan != (model, optimizer):  # (none for these: not tried again until a restore)
                self.plan, self._for = Plan.build(model, optimizer, sd), (model, optimizer)
                self._no_plan = (model, optimizer) if self.plan is None else None
            if self.plan is not None:
                self.calls["plan"] += 1
        else:
            sd = self.plan.state_dicts()
        specs: dict = {}
        dst: list = []
        src: list = []
        spare, self._spare = self._spare, {}
        if type(spare) is tuple:  # (a laid-out copy's tensors, by path)
            spare = dict(zip(spare[0].paths, spare[1]))
        local = self._split(sd, specs, (), spare, dst, src)
        if dst:
            import torch

            with torch.no_grad():  # (a parameter's local tensor: its copy is no part of any graph)
                torch._foreach_copy_(dst, src)
        if self.plan is not None and self._no_layout is not self.plan:
            lay = _Layout.build(self.plan, self._specs)
            self._layout = lay
            if lay is None:
                self._no_layout = self.plan
            elif len(src) == len(lay.locals) and all(a is b for a, b in zip(src, lay.locals)):
                self._keep(local, lay, dst)  # (this copy's tensors are in the layout's order)
        return local, specs

    def _copy_laid_out(self, lay: _Layout) -> tuple[Any, dict] | None:
        """:meth:`copy` by ``lay`` (the plan holds); None where it no longer fits: another
        optimizer state (a tensor replaced or added, a key or group value of another kind), a local
        tensor of another shape or dtype, state-dict hooks. What it returns is what the walk
        (:meth:`_split` of :meth:`Plan.state_dicts`) gives: the same dicts in the same order."""
        import torch

        opt = self.plan.optimizer
        kept = []  # each optimizer state's values (only its non-tensor ones are read from it)
        groups: list = []
        if opt is not None:  # (the model's tensors are the layout's: the plan holds)
            if _has_hooks(opt):
                return None
            state = opt.state
            if len(state) != len(lay.state):
                return None
            imm, same = _IMMUTABLE, operator.is_
            for (p, s), (q, _, keys, kinds, was) in zip(state.items(), lay.state):
                if p is not q or tuple(s) != keys:
                    return None
                vals = tuple(s.values())
                if kinds is True:
                    if not all(map(same, vals, was)):
                        return None
                else:
                    for v, w, is_t in zip(vals, was, kinds):
                        if (v is not w) if is_t else (type(v) not in imm):
                            return None
                kept.append(vals)
            groups = _plain_groups(opt, self.plan._names)
            if groups is None:
                return None
        src = [t._local_tensor if d else t for t, d in zip(lay.leaves, lay.dtensor)]
        # (a tensor keeps its identity through ``.data =`` or ``resize_``: its shape and dtype read)
        if list(map(_SHAPE, src)) != lay.shapes or list(map(_DTYPE, src)) != lay.dtypes:
            return None
        spare, self._spare = self._spare, {}
        if type(spare) is tuple and spare[0] is lay:
            dst = spare[1]
        else:  # (a walked copy's, by path; or none)
            if type(spare) is tuple:
                spare = dict(zip(spare[0].paths, spare[1]))
            dst = []
            for t, path in zip(src, lay.paths):
                old = spare.get(path)
                if old is None or old.shape != t.shape or old.dtype != t.dtype:
                    old = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.device.type == "cuda")
                dst.append(old)
        with torch.no_grad():  # (a parameter's local tensor: its copy is no part of any graph)
            torch._foreach_copy_(dst, src)
        model = dict(zip(lay.names, dst))
        if opt is None:
            local = {"model": model, "optimizer": {}}
        else:
            out = {}
            i = len(model)
            for (_, fqn, keys, kinds, _), vals in zip(lay.state, kept):
                if kinds is True:
                    j = i + len(keys)
                    out[fqn] = dict(zip(keys, dst[i:j]))
                    i = j
                else:
                    d = {}
                    for k, v, is_t in zip(keys, vals, kinds):
                        if is_t:
                            d[k] = dst[i]
                            i += 1
                        else:
                            d[k] = v
                    out[fqn] = d
            local = {"model": model, "optimizer": {"state": out, "param_groups": groups}}
        self._keep(local, lay, dst)
        self.laid_out += 1
        return local, dict(lay.specs)

    def _keep(self, local: Any, lay: _Layout, dst: list) -> None:
        """``local``'s CPU tensors in ``lay``'s order, for :meth:`release` (three copies at most:
        two held by ``--survive``'s replica and this one; one never released, after a failed
        write, is let go)."""
        made = self._made
        while len(made) >= 3:
            made.pop(next(iter(made)), None)
        made[id(local)] = (local, lay, dst)

    def release(self, local: Any) -> None:
        """``local`` (a :meth:`copy`'s) is written and held by nobody: its CPU tensors are reused."""
        import torch

        made = self._made.pop(id(local), None)
        if made is not None and made[0] is local:
            self._spare = (made[1], made[2])
            return
        spare: dict = {}

        def walk(obj: Any, path: tuple) -> None:
            if isinstance(obj, torch.Tensor):
                spare[path] = obj
            elif isinstance(obj, dict):
                for k, v in obj.items():
                    walk(v, path + (k,))
            elif isinstance(obj, list):
                for i, v in enumerate(obj):
                    walk(v, path + (i,))

        walk(local, ())
        self._spare = spare

    def _split(self, obj: Any, specs: dict, path: tuple, spare: dict, dst: list, src: list) -> Any:
        """``obj`` with each tensor replaced by its CPU copy to be (into ``dst``, from ``src``) and
        each DTensor's spec put in ``specs``; other values as they are, or copied when mutable."""
        import torch
        from torch.distributed.tensor import DTensor

        known_specs, tensor, immutable = self._specs, torch.Tensor, _IMMUTABLE

        def leaf(t: Any, path: tuple) -> Any:
            if isinstance(t, DTensor):
                known = known_specs.get(path)
                if known is None or known[0] is not t:
                    known = (t, (t.device_mesh, t.placements, t.shape, t.stride()))
                    known_specs[path] = known
                specs[path] = known[1]
                t = t._local_tensor
            if t.is_sparse:
                return t.detach().to("cpu", copy=True)
            old = spare.get(path)
            if old is None or old.shape != t.shape or old.dtype != t.dtype:
                old = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.device.type == "cuda")
            dst.append(old)
            src.append(t)
            return old

        def walk(obj: Any, path: tuple) -> Any:
            if type(obj) in immutable:
                return obj
            if isinstance(obj, tensor):
                return leaf(obj, path)
            if isinstance(obj, dict):
                out = {}
                for k, v in obj.items():  # (a tensor's leaf called here: a third fewer calls)
                    out[k] = v if type(v) in immutable else leaf(v, path + (k,)) if isinstance(v, tensor) \
                        else walk(v, path + (k,))
                return out
            if isinstance(obj, list):
                return [v if type(v) in immutable else walk(v, path + (i,)) for i, v in enumerate(obj)]
            if type(obj) is tuple:
                return tuple(walk(v, path + (i,)) for i, v in enumerate(obj))
            return copy.deepcopy(obj)

        return walk(obj, path)


_IMMUTABLE = frozenset((int, float, str, bool, bytes, type(None)))
_SHAPE, _DTYPE = operator.attrgetter("shape"), operator.attrgetter("dtype")


def _has_hooks(opt: Any) -> bool:
    """Whether the optimizer's state dict passes through hooks (then :meth:`Plan.state_dicts` calls it)."""
    return bool(getattr(opt, "_optimizer_state_dict_pre_hooks", None) or
                getattr(opt, "_optimizer_state_dict_post_hooks", None))


def _plain_groups(opt: Any, names: dict) -> list | None:
    """The optimizer's groups as :meth:`Plan.state_dicts` names them, each value as it is (every
    one immutable: a number, a flag, a tuple of numbers), or None where one is not (a tensor LR:
    then the walk copies it)."""
    imm = _IMMUTABLE
    groups = []
    for g in opt.param_groups:
        out = {}
        for k, v in g.items():
            if k == "params":
                continue
            t = type(v)
            if t not in imm and not (t is tuple and all(type(x) in imm for x in v)):
                return None
            out[k] = v
        out["params"] = [names[id(p)] for p in g["params"]]
        groups.append(out)
    return groups


class _Layout:
    """Where each tensor of a :class:`Copier`'s copy comes from while its :class:`Plan` holds and
    the optimizer's state is the same tensors: the model's (the plan's, fixed), then each
    optimizer state's in its order (its parameter, name, keys, which values are tensors, and the
    values), in
    the order the walk (:meth:`Copier._split`) meets them, with their paths, the DTensors' specs,
    and the local tensors' shapes and dtypes (the CPU tensors to copy into are made for those)."""

    __slots__ = ("names", "state", "leaves", "paths", "dtensor", "specs", "locals", "shapes", "dtypes")

    @classmethod
    def build(cls, plan: Plan, known_specs: dict) -> _Layout | None:
        """The layout of ``plan``'s model and optimizer now; None where a copy cannot follow one
        (state-dict hooks, a sparse tensor, a state value neither a tensor nor immutable, a group
        value that is not plain): the walk every time. ``known_specs``: the walk's specs by path
        (read, and kept for the live tensors, so both give the same)."""
        import torch
        from torch.distributed.tensor import DTensor

        lay = cls()
        opt = plan.optimizer
        lay.names = [name for name, _, _, _ in plan.entries]
        leaves = [t for _, _, _, t in plan.entries]
        paths = [("model", n) for n in lay.names]
        lay.state = []
        if opt is not None:
            if _has_hooks(opt) or _plain_groups(opt, plan._names) is None:
                return None
            for p, s in opt.state.items():
                fqn = plan._names.get(id(p))
                if fqn is None:
                    return None
                kinds = []
                for k, v in s.items():
                    if isinstance(v, torch.Tensor):
                        leaves.append(v)
                        paths.append(("optimizer", "state", fqn, k))
                    elif type(v) not in _IMMUTABLE:
                        return None
                    kinds.append(isinstance(v, torch.Tensor))
                lay.state.append((p, fqn, tuple(s), True if all(kinds) else tuple(kinds), tuple(s.values())))
        lay.leaves, lay.paths = leaves, paths
        lay.dtensor = [isinstance(t, DTensor) for t in leaves]
        lay.locals = [t._local_tensor if d else t for t, d in zip(leaves, lay.dtensor)]
        if any(t.is_sparse for t in lay.locals):
            return None
        lay.shapes = [t.shape for t in lay.locals]
        lay.dtypes = [t.dtype for t in lay.locals]
        lay.specs = {}
        for t, d, path in zip(leaves, lay.dtensor, paths):
            if d:
                known = known_specs.get(path)
                if known is None or known[0] is not t:  # (the walk met DCP's alias of it)
                    known = (t, (t.device_mesh, t.placements, t.shape, t.stride()))
                    known_specs[path] = known
                lay.specs[path] = known[1]
        return lay


class ShardedCheckpoints:
    """A sharded job's side of its checkpoints: what each rank saves, the DCP save (for
    :class:`elastic_ring.ckpt.BackgroundWriter`, as a store: :meth:`save`) and the load.

    ``state``: the job's :class:`~elastic_ring.worker.sync.StateSync`; ``ring``: its ring;
    ``folder``: the run's ``checkpoints`` folder; ``store``: its
    :class:`~elastic_ring.ckpt.CheckpointStore` (rank 0 writes the checkpoint file there)."""

    def __init__(self, state: Any, ring: Any, folder: Path, store: Any) -> None:
        self.state, self.ring, self.folder, self.store = state, ring, Path(folder), store
        self._group = None
        self._group_of = None  # the default process group the DCP group was made beside
        self.copier = Copier()

    # ------------------------------------------------------------------ the DCP group
    def ensure_group(self) -> None:
        """A gloo group of the ring's ranks for DCP's own collectives (made beside the default
        group, again after the ring was re-formed in place). Every rank calls it at the same
        checkpoint, on the training thread."""
        import torch.distributed as dist
        from torch.distributed.distributed_c10d import _get_default_group

        default = _get_default_group()
        if self._group is None or self._group_of is not default:
            self._group = dist.new_group(backend="gloo")
            self._group_of = default

    # ------------------------------------------------------------------ write
    def snapshot(self, step: int) -> dict[str, Any]:
        """On the training thread: this rank's shards copied to the CPU, and on rank 0 the rest of
        the job's state (the checkpoint file's contents, naming the DCP folder)."""
        from elastic_ring.ckpt.sharded import folder_name, partial_name

        st = self.state
        local, specs = self.copier.copy(st)
        meta = None
        if self.ring.rank == 0:
            meta = st.snapshot(step, weights=False)
            meta["sharded"] = folder_name(step)
        return {"step": step, "local": local, "specs": specs, "meta": meta,
                "partial": self.folder / partial_name(step, st.seg.number)}

    def save(self, snap: dict[str, Any]) -> tuple[Path, int, float]:
        """In the writer thread: DCP's save of this rank's shards into the partial folder (all
        ranks), then on rank 0 the folder published and the checkpoint file written (atomic, kept
        and pruned as any). Returns (path, bytes, seconds): rank 0's checkpoint file and the
        checkpoint's bytes on disk; another rank's partial folder and 0."""
        import torch.distributed.checkpoint as dcp

        from elastic_ring.ckpt.sharded import publish

        t0 = time.perf_counter()
        partial = snap["partial"]
        dcp.save(join(snap["local"], snap["specs"]), storage_writer=dcp.FileSystemWriter(str(partial)), process_group=self._group)
        self.copier.release(snap["local"])  # written: the next checkpoint copies into its tensors
        if snap["meta"] is None:
            return partial, 0, time.perf_counter() - t0
        final = publish(self.folder, partial, snap["step"])
        path, nbytes, _ = self.store.save(snap["meta"])
        nbytes += sum(f.stat().st_size for f in final.iterdir() if f.is_file())
        return path, nbytes, time.perf_counter() - t0

    # ------------------------------------------------------------------ restore
    def load(self, name: str | None, kept: dict[str, Any] | None = None) -> None:
        """Every rank: the checkpoint folder ``name`` (rank 0's choice, sent to all here) into this
        rank's shards of the registered model and optimizer; nothing when rank 0 found none.
        :data:`MEMORY`: the survivors of a failure rebuild the state from their replicas instead
        (``kept``: this rank's copy of the step they roll back to, None on a joiner:
        :meth:`from_memory`)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        from elastic_ring.errors import CheckpointError

        name = self.ring.coll.broadcast_object(name, 0, name="sharded_checkpoint")
        if not name:
            return
        st = self.state
        folder = self.folder / name
        self.copier.invalidate()
        st.syncing = True
        try:
            sd = state_dicts(st.model, st.optimizer)
            try:
                if name == MEMORY:
                    self.from_memory(sd, kept)
                else:
                    dcp.load(sd, storage_reader=dcp.FileSystemReader(str(folder)))
            except CheckpointError:
                raise
            except Exception as e:  # noqa: BLE001 - one line naming the folder
                raise CheckpointError(f"sharded checkpoint {folder} does not load: {type(e).__name__}: "
                                      f"{(str(e).splitlines() or [''])[0][:300]}") from None
            if st.optimizer is not None:
                set_state_dict(st.model, st.optimizer, model_state_dict=sd["model"],
                               optim_state_dict=sd["optimizer"])
            else:
                set_state_dict(st.model, [], model_state_dict=sd["model"], optim_state_dict={})
        finally:
            st.syncing = False

    def from_memory(self, sd: dict[str, Any], kept: dict[str, Any] | None) -> None:
        """Every rank of the survivors' new ring: ``sd`` (this rank's state dicts at the new size)
        filled from the replicas the survivors hold (:class:`Replica`). Each says which old ranks'
        shards it holds (an ``all_gather_object``), :func:`owners` picks one holder of each, and
        those send them to all (a second one); every rank puts each tensor together
        (:func:`assemble`) and keeps its new piece (:func:`piece_of`); the other values (the
        optimizer's step counts and groups, the buffers) are rank 0's. The full state passes
        through each rank's memory once, here only.

        Raises:
            CheckpointError: the survivors do not hold every shard (:func:`owners`)."""
        import torch
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor

        rep = kept.get("replica") if kept else None
        world = dist.get_world_size()
        have = {"world": rep["world"], "step": rep["step"], "ranks": sorted(rep["pieces"])} if rep else None
        haves: list = [None] * world
        dist.all_gather_object(haves, have)
        own = owners(haves)
        me = dist.get_rank()
        # (a clone each: a received piece is a view of its flat buffer, which would be pickled whole)
        mine = {k: {p: t.clone() for p, t in rep["pieces"][k].items()} for k, n in own.items() if n == me}
        rest = (rep["own"], rep["layout"]) if me == 0 else None
        gathered: list = [None] * world
        dist.all_gather_object(gathered, (mine, rest))
        pieces: dict[int, dict] = {}
        for part, _ in gathered:
            pieces.update(part)
        template, layout = gathered[0][1]
        old_world = haves[own[0]]["world"]

        def fill(obj: Any, tmpl: Any, path: tuple) -> Any:
            if isinstance(obj, DTensor):
                shape, ly = layout[path]
                full = assemble(shape, ly, old_world, {k: pieces[k][path] for k in range(old_world)})
                new_ly = layout_of(obj.placements)
                coord = obj.device_mesh.get_coordinate()
                obj._local_tensor.copy_(piece_of(full, new_ly, obj.device_mesh.size(), coord[0] if coord else 0))
                return obj
            if isinstance(obj, dict):
                return {k: fill(obj[k], tmpl[k], path + (k,)) for k in tmpl}
            if isinstance(obj, list):
                return [fill(obj[i] if i < len(obj) else None, v, path + (i,)) for i, v in enumerate(tmpl)]
            if isinstance(tmpl, torch.Tensor):
                return tmpl.clone()
            return copy.deepcopy(tmpl)

        for key in ("model", "optimizer"):
            sd[key] = fill(sd[key], template[key], (key,))


# ---------------------------------------------------------------------- --survive: a neighbour's replica
REPLICA = ("elastic-ring worker: --survive on a sharded model: each rank keeps in memory a copy of its shards and "
           "of rank r-1's (HSDP-style), so the survivors of one failure hold every shard and go on from memory; "
           "two failures at once restart from the newest sharded checkpoint")
MEMORY = ":memory:"  # rank 0's "folder" when the survivors rebuild the state from their replicas


def chunk(n: int, parts: int, i: int) -> tuple[int, int]:
    """``(offset, length)`` of part ``i`` of ``n`` rows split in ``parts`` as ``torch.chunk`` (and
    DTensor's ``Shard``) splits them: ``ceil(n / parts)`` each, the last ones short or empty."""
    c = -(-n // parts) if n else 0
    off = min(i * c, n)
    return off, max(0, min(c, n - off))


def layout_of(placements: Any) -> tuple | None:
    """A DTensor's placements on a 1-D mesh as ``(("shard", dim),)`` or ``(("replicate",),)``; None
    for any other (a 2-D mesh, a strided or partial placement): no replica kept for those."""
    from torch.distributed.tensor import Replicate, Shard

    if len(placements) != 1:
        return None
    p = placements[0]
    if type(p) is Shard:
        return (("shard", int(p.dim)),)
    if type(p) is Replicate:
        return (("replicate",),)
    return None


def box(shape: tuple, layout: tuple, world: int, rank: int) -> tuple[tuple[int, int], ...]:
    """Where rank ``rank`` of ``world`` holds its piece of a tensor of ``shape`` laid out as
    ``layout`` (:func:`layout_of`): ``(offset, length)`` per dimension."""
    (kind, *dim), = layout
    out = [(0, int(n)) for n in shape]
    if kind == "shard":
        d = dim[0] % max(1, len(shape))
        out[d] = chunk(int(shape[d]), world, rank)
    return tuple(out)


def _at(obj: Any, path: tuple) -> Any:
    for k in path:
        obj = obj[k]
    return obj


def why_no_replica(model: Any, world: int) -> str | None:
    """Why a sharded model's ranks cannot keep each other's shards, or None when they can: at one
    worker there is no other rank; each parameter a DTensor on one 1-D mesh of the whole ring,
    sharded on a dimension or replicated (FSDP2's ``fully_shard``)."""
    from torch.distributed.tensor import DTensor

    if world < 2:
        return "one worker: no other rank to hold a copy of its shards"
    for name, p in model.named_parameters():
        if not isinstance(p, DTensor):
            continue
        mesh = p.device_mesh
        if mesh.ndim != 1 or mesh.mesh.flatten().tolist() != list(range(world)) or layout_of(p.placements) is None:
            return f"parameter {name} is not sharded on one dimension over all {world} ranks"
    return None


class Replica:
    """``--survive`` on a sharded model (:func:`elastic_ring.worker.survive.memory_copy`): the take
    of its per-step copy (:class:`~elastic_ring.worker.survive.MemoryCopy`). On every rank at the
    same step: the rest of the state (``StateSync.snapshot`` without the weights), this rank's
    shards copied to the CPU (a :class:`Copier` of its own) and sent to rank r+1 while rank r-1's
    are received (point-to-point over the ring's default gloo group, one flat buffer per dtype:
    1/N of the state each way). The copy then holds the shards of ranks r and r-1: after one
    failure, the survivors' copies together hold every rank's (:func:`owners`), and
    :meth:`ShardedCheckpoints.load` rebuilds the state from them at the new size."""

    def __init__(self, state: Any, rank: int, world: int) -> None:
        self.state, self.rank, self.world = state, rank, world
        self.copier = Copier()
        self._layout: tuple | None = None  # (the specs' key, {path: (shape, dtype, layout)}, paths by dtype)

    def _plan(self, specs: dict, local: Any) -> tuple[dict, dict]:
        key = tuple((p, s[2], s[1]) for p, s in specs.items())
        if self._layout is None or self._layout[0] != key:
            lay, by_dtype = {}, {}
            for path, (_, placements, shape, _) in specs.items():
                dtype = _at(local, path).dtype
                lay[path] = (tuple(shape), dtype, layout_of(placements))
                by_dtype.setdefault(dtype, []).append(path)
            self._layout = (key, lay, by_dtype)
        return self._layout[1], self._layout[2]

    def take(self, step: int, into: dict[str, Any] | None) -> dict[str, Any] | None:
        """The copy of ``step`` (``into``: the oldest one, let go, whose tensors it reuses); None
        while the optimizer has no state yet (DCP's state dict would step it once to make it: the
        first copy is of the first completed step)."""
        import torch
        import torch.distributed as dist

        if _needs_init(self.state.optimizer):
            return None
        if into is not None:  # let go: its CPU tensors are reused
            self.copier.release(into["replica"]["own"])
        meta = self.state.snapshot(step, weights=False)
        local, specs = self.copier.copy(self.state)
        lay, by_dtype = self._plan(specs, local)
        w, r = self.world, self.rank
        src = (r - 1) % w
        old = into["replica"]["bufs"] if into is not None else {}
        sends, bufs, ops = [], {}, []
        for i, (dtype, paths) in enumerate(by_dtype.items()):
            parts = [_at(local, p).reshape(-1) for p in paths]
            send = torch.cat(parts) if len(parts) > 1 else parts[0].clone()
            n = sum(_numel(box(lay[p][0], lay[p][2], w, src)) for p in paths)
            buf = old.get(dtype)
            if buf is None or buf.numel() != n:
                buf = torch.empty(n, dtype=dtype)
            sends.append(send)
            bufs[dtype] = buf
            ops.append(dist.isend(send, (r + 1) % w, tag=i))
            ops.append(dist.irecv(buf, src, tag=i))
        for op in ops:
            op.wait()
        theirs = {}
        for dtype, paths in by_dtype.items():
            at = 0
            for p in paths:
                lengths = tuple(n for _, n in box(lay[p][0], lay[p][2], w, src))
                k = _numel(box(lay[p][0], lay[p][2], w, src))
                theirs[p] = bufs[dtype][at:at + k].view(lengths)
                at += k
        mine = {p: _at(local, p) for p in lay}
        return {**meta, "model": None, "optimizer": None, "sharded": MEMORY, "replica": {
            "step": step, "world": w, "rank": r, "own": local, "bufs": bufs,
            "layout": {p: (s, ly) for p, (s, _, ly) in lay.items()}, "pieces": {r: mine, src: theirs}}}


def _numel(b: tuple) -> int:
    n = 1
    for _, k in b:
        n *= k
    return n


def owners(haves: list[dict[str, Any] | None]) -> dict[int, int]:
    """Which new rank gives each old rank's shards, from what every rank of the new ring holds
    (``haves[new rank]``: ``{"world", "step", "ranks"}`` of its replica, None for a joiner): the
    lowest new rank holding it.

    Raises:
        CheckpointError: the holders' copies are of different steps or worlds, or no one holds
            some old rank's shards (more than one failure)."""
    from elastic_ring.errors import CheckpointError

    held = [(n, h) for n, h in enumerate(haves) if h]
    kinds = {(int(h["world"]), int(h["step"])) for _, h in held}
    if len(kinds) != 1:
        raise CheckpointError(f"the survivors' replicas of the sharded state do not match (world, step: "
                              f"{sorted(kinds)})")
    (world, _), = kinds
    own: dict[int, int] = {}
    for n, h in held:
        for k in sorted(h["ranks"]):
            own.setdefault(int(k), n)
    missing = [k for k in range(world) if k not in own]
    if missing:
        raise CheckpointError(f"the survivors hold no copy of the shards of rank(s) {missing} of {world} "
                              "(more than one failure): restart from the sharded checkpoint")
    return own


def assemble(shape: tuple, layout: tuple, world: int, pieces: dict[int, Any]) -> Any:
    """The full tensor of ``shape`` from its pieces (old rank -> its local tensor) laid out as
    ``layout`` over ``world`` ranks (every rank's piece given: :func:`owners`)."""
    import torch

    first = next(iter(pieces.values()))
    full = torch.empty(shape, dtype=first.dtype)
    for k in range(world):
        b = box(shape, layout, world, k)
        if _numel(b) == 0 and len(shape):
            continue
        full[tuple(slice(o, o + n) for o, n in b)] = pieces[k].reshape(tuple(n for _, n in b))
    return full


def piece_of(full: Any, layout: tuple, world: int, rank: int) -> Any:
    """Rank ``rank``'s piece of ``full`` at ``world`` ranks (a view)."""
    b = box(tuple(full.shape), layout, world, rank)
    return full[tuple(slice(o, o + n) for o, n in b)]
