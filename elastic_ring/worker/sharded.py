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
- **--survive**: a dead rank's shards die with it; the survivors keep no copy in memory (theirs
  alone cannot make the state) and a failure restarts from the newest sharded checkpoint
  (:func:`say_no_survive`, one line at start).
"""

from __future__ import annotations

import copy
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
        if any(table.get(attr) is not t for _, table, attr, t in self.entries):
            return False
        if self.optimizer is None:
            return True
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        return len(params) == len(self.params) and all(a is b for a, b in zip(params, self.params)) \
            and not _needs_init(self.optimizer)

    def state_dicts(self) -> dict[str, Any]:
        """:func:`state_dicts`' result, from the live tensors (the caller checked :meth:`holds`)."""
        model = {name: t for name, _, _, t in self.entries}
        if self.optimizer is None:
            return {"model": model, "optimizer": {}}
        osd = self.optimizer.state_dict()
        fqns = self.fqns
        return {"model": model, "optimizer": {
            "state": {fqns[i]: v for i, v in osd["state"].items()},
            "param_groups": [{**g, "params": [fqns[i] for i in g["params"]]} for g in osd["param_groups"]]}}


class Copier:
    """A rank's shards copied to the CPU at each checkpoint, on the training thread, at the cost
    of the copy alone: the state dicts from a :class:`Plan` (DCP's ``get_state_dict`` only where
    there is none yet or it no longer holds), each DTensor's local tensor read directly (its mesh,
    placements, shape and stride kept while it is the same tensor), and all copied with one
    ``_foreach_copy_`` into the CPU tensors of the previous checkpoint (handed back by
    :meth:`release` once it was written; pinned for a GPU's shards), new ones only for a tensor
    that is new or changed its shape.

    :meth:`copy` returns what :func:`split` of DCP's state dicts, copied, would: ``(local, specs)``."""

    def __init__(self) -> None:
        self.plan: Plan | None = None
        self._for: tuple = ()  # the (model, optimizer) the plan was made for
        self._no_plan: tuple | None = None  # the (model, optimizer) no plan could be made for
        self._specs: dict = {}  # path -> (the DTensor, its spec): kept while it is the same tensor
        self._spare: dict = {}  # path -> a CPU tensor of a written checkpoint, to copy into
        self.calls = {"plan": 0, "dcp": 0}  # how often DCP's state dict was made, and a plan (tests)

    def invalidate(self) -> None:
        """The model's or optimizer's tensors were replaced (a restore): the plan made again."""
        self.plan, self._specs, self._no_plan = None, {}, None

    def copy(self, state: Any) -> tuple[Any, dict]:
        model, optimizer = state.model, state.optimizer
        if self.plan is not None and (self._for[0] is not model or self._for[1] is not optimizer
                                      or not self.plan.holds()):
            self.invalidate()
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
        local = self._split(sd, specs, (), spare, dst, src)
        if dst:
            import torch

            with torch.no_grad():  # (a parameter's local tensor: its copy is no part of any graph)
                torch._foreach_copy_(dst, src)
        return local, specs

    def release(self, local: Any) -> None:
        """``local`` (a :meth:`copy`'s) is written and held by nobody: its CPU tensors are reused."""
        import torch

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
    def load(self, name: str | None) -> None:
        """Every rank: the checkpoint folder ``name`` (rank 0's choice, sent to all here) into this
        rank's shards of the registered model and optimizer; nothing when rank 0 found none."""
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
                dcp.load(sd, storage_reader=dcp.FileSystemReader(str(folder)))
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
