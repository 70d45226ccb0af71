"""Sharded models (FSDP2's ``fully_shard``): their checkpoints written by every rank through
``torch.distributed.checkpoint`` (DCP) and restored at any world size (DCP reshards).

A registered model whose parameters are DTensors is sharded (:func:`is_sharded`, told at
``job.restore()``, one line on rank 0). Its checkpoints are then no longer rank 0's full copy:

- **Write** (every rank, at the same steps): on the training thread each rank copies its own shards
  of the model and the optimizer state (``get_state_dict``: keyed by parameter name) to the CPU
  (1/N of the state, where a full checkpoint copies all of it on rank 0), and rank 0 the small rest
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
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch without DTensor has no sharded models
        return False
    return any(isinstance(p, DTensor) for p in model.parameters())


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
    return obj


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
        from elastic_ring.ckpt import snapshot
        from elastic_ring.ckpt.sharded import folder_name, partial_name

        st = self.state
        specs: dict = {}
        st.syncing = True  # get_state_dict steps a fresh optimizer once (lr 0) to make its state
        try:
            local = snapshot(split(state_dicts(st.model, st.optimizer), specs))
        finally:
            st.syncing = False
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
