"""``elastic-ring export RUN_DIR --out model.pt``: a run's model weights as a plain ``torch.save``."""

from __future__ import annotations

from pathlib import Path

import click

from elastic_ring.errors import CheckpointError, UserError


@click.command("export")
@click.argument("run_dir", type=click.Path(path_type=Path))
@click.option("--out", "out", type=click.Path(path_type=Path), required=True,
              help="file to write: torch.save of the model's state_dict (torch.load reads it)")
@click.option("--checkpoint", "ckpt", type=click.Path(path_type=Path), default=None,
              help="a given checkpoint file instead of the run's newest that verifies")
def export(run_dir: Path, out: Path, ckpt: Path | None) -> None:
    """Write the model's state_dict of RUN_DIR's newest verified checkpoint to OUT."""
    from elastic_ring.ckpt import load

    if not run_dir.is_dir():
        raise UserError(f"run folder {run_dir} does not exist")
    try:
        state = load(ckpt if ckpt is not None else run_dir)
    except CheckpointError as e:
        raise UserError(str(e)) from None
    model = state.get("model")
    if not isinstance(model, dict):
        raise UserError(f"the checkpoint of step {state.get('step')} holds no model (the script "
                        "registered none)")
    import torch

    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model, out)
    n = sum(int(v.numel()) for v in model.values() if hasattr(v, "numel"))
    click.echo(f"wrote {out}: the model of step {state.get('step')} ({len(model)} tensors, "
               f"{n:,} values; world size {state.get('world_size')})")
