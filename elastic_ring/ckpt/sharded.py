"""Sharded checkpoints on disk: a ``torch.distributed.checkpoint`` (DCP) folder per checkpoint, next
to the run's ``ckpt-<step>.pt`` files.

A sharded checkpoint of step S is two things in the run's ``checkpoints`` folder:

- ``dcp-<S>/``: DCP's folder (``__<rank>_0.distcp``, one per rank that wrote, and ``.metadata``),
  holding ``{"model": ..., "optimizer": ...}`` as ``torch.distributed.checkpoint.state_dict``'s
  ``get_state_dict`` gives them (parameter names, not indices: loadable at any world size, DCP
  reshards). Every rank writes its shards into ``.dcp-<S>.partial-<segment>/``; rank 0 renames
  that folder to ``dcp-<S>`` once DCP's save has returned everywhere (its ``.metadata`` is written
  last, after every rank's files), and only then
- ``ckpt-<S>.pt``: rank 0's usual atomic, checksummed checkpoint (:mod:`elastic_ring.ckpt.store`)
  of everything else (step, data position, LR factor, RNG, schedulers, extras), with ``model`` and
  ``optimizer`` None and ``sharded`` naming the folder. It enters ``latest.json`` last.

So a checkpoint listed in ``latest.json`` always has its complete DCP folder; a crash mid-write
leaves a ``.partial`` folder nobody resumes from (removed at the next checkpoint) and the previous
checkpoint current. Folders of checkpoints no longer kept are removed with their ``ckpt-*.pt``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

PREFIX = "dcp-"


def folder_name(step: int) -> str:
    return f"{PREFIX}{int(step):08d}"


def partial_name(step: int, segment: int) -> str:
    return f".{folder_name(step)}.partial-{int(segment)}"


def complete(folder: str | Path) -> bool:
    """Whether a DCP folder was finished (DCP writes its ``.metadata`` after every rank's shards)."""
    return (Path(folder) / ".metadata").is_file()


def publish(checkpoints: Path, partial: Path, step: int) -> Path:
    """Rank 0, after DCP's save returned: the partial folder under its final name (a rename, then
    the folder fsynced); an older folder of the same step (an earlier try) is replaced."""
    from elastic_ring.ckpt.store import _fsync_dir

    final = checkpoints / folder_name(step)
    if final.exists():
        shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    _fsync_dir(checkpoints)
    return final


def prune(checkpoints: Path, kept: list[str], segment: int | None = None) -> None:
    """Remove the DCP folders of checkpoints no longer kept (``kept``: the ``ckpt-*.pt`` names in
    ``latest.json``) and partial folders left by the writers of earlier segments (a crash; not
    ``segment``'s: another rank may already be writing the next checkpoint's)."""
    steps = {n[len("ckpt-"):-len(".pt")] for n in kept}
    for f in checkpoints.glob(f"{PREFIX}*"):
        if f.is_dir() and f.name[len(PREFIX):] not in steps:
            shutil.rmtree(f, ignore_errors=True)
    for f in checkpoints.glob(f".{PREFIX}*.partial-*"):
        if f.is_dir() and (segment is None or not f.name.endswith(f".partial-{int(segment)}")):
            shutil.rmtree(f, ignore_errors=True)


def load_full(folder: str | Path) -> dict[str, Any]:
    """A DCP folder's whole contents as plain (full, unsharded) tensors, in this process alone (no
    process group): ``{"model": {name: tensor}, "optimizer": {...}}``. What ``export`` writes and
    :func:`elastic_ring.ckpt.load` returns for a sharded checkpoint.

    Raises:
        CheckpointError: the folder is missing, incomplete, or DCP cannot read it.
    """
    from elastic_ring.errors import CheckpointError

    p = Path(folder)
    if not complete(p):
        raise CheckpointError(f"sharded checkpoint {p} is missing or incomplete (no .metadata)")
    import io

    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    buf = io.BytesIO()
    try:
        dcp_to_torch_save(str(p), buf)
        buf.seek(0)
        return torch.load(buf, map_location="cpu", weights_only=False)
    except Exception as e:  # noqa: BLE001 - DCP's own errors, named in one line
        raise CheckpointError(f"sharded checkpoint {p} does not load: {type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''}") from None


def resolve(state: dict[str, Any], checkpoints: Path) -> dict[str, Any]:
    """``state`` (a ``ckpt-*.pt``'s contents) with a sharded checkpoint's model and optimizer
    filled in from its DCP folder (full tensors, optimizer state keyed by parameter name); any
    other checkpoint as it is."""
    name = state.get("sharded")
    if not name:
        return state
    full = load_full(Path(checkpoints) / name)
    return {**state, "model": full.get("model"), "optimizer": full.get("optimizer")}

