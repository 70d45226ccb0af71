"""``elastic-ring export RUN_DIR --out model.pt``: a run's model weights as a plain ``torch.save``."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import click

from elastic_ring.errors import CheckpointError, UserError


@click.command("export")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--out", "out", type=click.Path(path_type=Path), required=True,
              help="file to write: torch.save of the model's state_dict (torch.load reads it); an existing "
                   "file is kept unless --force")
@click.option("--checkpoint", "ckpt", type=click.Path(path_type=Path), default=None,
              help="a given checkpoint file instead of the run's newest that verifies")
@click.option("--force", is_flag=True, help="overwrite OUT if it exists")
def export(run_dir: Path, out: Path, ckpt: Path | None, force: bool) -> None:
    """Write the model's state_dict of RUN_DIR's newest verified checkpoint to OUT.

    A corrupt newest checkpoint is skipped for the next older one that verifies, with a warning
    naming both; --checkpoint FILE picks one. A sharded (FSDP2) job's checkpoint is read in full
    from its torch.distributed.checkpoint folder: the full, unsharded state dict.
    """
    from elastic_ring.ckpt import load

    if not run_dir.is_dir():
        raise UserError(f"run folder {run_dir} does not exist")
    _check_out(out, force)
    try:
        state = load(ckpt if ckpt is not None else run_dir, warn=lambda m: click.echo(m, err=True))
    except CheckpointError as e:
        raise UserError(f"{e} (pick one with --checkpoint FILE)" if ckpt is None else str(e)) from None
    model = state.get("model")
    if not isinstance(model, dict):
        raise UserError(f"the checkpoint of step {state.get('step')} holds no model (the script "
                        "registered none)")
    import torch

    buf = io.BytesIO()
    torch.save(model, buf)
    _write(out, buf.getvalue())
    n = sum(int(v.numel()) for v in model.values() if hasattr(v, "numel"))
    click.echo(f"wrote {out}: the model of step {state.get('step')} ({len(model)} tensors, "
               f"{n:,} values; world size {state.get('world_size')})")


def _check_out(out: Path, force: bool) -> None:
    """Refuse an OUT that is a folder, or an existing file without --force (before any loading)."""
    if out.is_dir():
        raise UserError(f"--out {out} is a folder: give a file name, e.g. --out {out / 'model.pt'}")
    if out.exists() and not force:
        raise UserError(f"{out} already exists (overwrite it with --force)")


def _write(out: Path, data: bytes) -> None:
    """``data`` to ``out`` through a temporary file and a rename: a failed write leaves no half
    file and an existing ``out`` as it was."""
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        os.replace(tmp, out)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise UserError(f"cannot write {e.filename if e.filename and e.filename != str(tmp) else out}: "
                        f"{e.strerror or e}") from None
