"""`elastic-ring experiment resize`: the Table 2 design (baselines and resized runs)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from elastic_ring.errors import UserError
from elastic_ring.words import count


@click.group(context_settings={"max_content_width": 100})
def experiment() -> None:
    """Run experiment designs that reproduce the papers' tables."""


@experiment.command(context_settings={"max_content_width": 100})
@click.option("--config", "design_path", type=click.Path(dir_okay=False), required=True,
              help="Experiment design YAML (e.g. configs/table2_cpu.yaml, configs/table2.yaml).")
@click.option("--repeats", type=int, default=None, help="Runs per row (design: repeats).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Output folder (design: out).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a design key (w_init, w_new, resize_steps, vary_seed, ...) or a training "
                   "config key, on top of the design's overrides (repeatable), e.g. --set total_steps=300.")
@click.option("--slots", type=int, default=None, help="Worker slots (design: slots).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default=None,
              help="Device (design: device).")
@click.option("--relaunch", type=click.Choice(["prelaunch", "overlap", "sequential"]), default=None,
              help="How a resize relaunches the workers, as in `train --relaunch` (design: relaunch; "
                   "default sequential, the paper's stop-checkpoint-restart).")
def resize(design_path, repeats, out_dir, overrides, slots, device, relaunch):
    """Table 2: baselines at w_init and w_new, and runs resized w_init -> w_new at each step.

    \b
    CPU scale (minutes here):
        elastic-ring experiment resize --config configs/table2_cpu.yaml --repeats 2
    The paper's scale (8-GPU node, ResNet-110, 4 -> 8 GPUs at 5k and 10k steps):
        elastic-ring experiment resize --config configs/table2.yaml

    Every run is a real training run in OUT/runs/<row>-r<repeat>/. Writes OUT/table2.json and
    OUT/table2.md: steps, epochs, wall time, resize overheads, time saved against the w_init
    baseline, final test accuracy and loss, train loss, as mean ± sd over repeats (repeat r uses
    seed + r unless vary_seed: false). Finished runs with the same config are reused, so a rerun
    with more --repeats only adds runs. Then: elastic-ring report OUT.
    """
    from elastic_ring.cli.train import _resolve_device
    from elastic_ring.config.api import load_config
    from elastic_ring.config.base import parse_overrides
    from elastic_ring.data import check_dataset
    from elastic_ring.experiment.api import load_design, render_table2, resolve_path
    from elastic_ring.experiment.runner import run_design

    flags = {k: v for k, v in (("repeats", repeats), ("relaunch", relaunch)) if v is not None}
    design = load_design(design_path, parse_overrides(overrides) | flags)
    dev, ngpu = _resolve_device(device or design.device)
    cfg_path = resolve_path(design.config, Path(design_path).resolve().parent)
    cfg = load_config(cfg_path, design.overrides, device=dev)
    last = max(design.resize_steps)
    if last >= cfg.total_steps:
        raise UserError(f"resize step {last} is not before the last step ({cfg.total_steps})")
    need = max(design.w_init, design.w_new)
    n_slots = slots or design.slots or (ngpu if dev == "cuda" else max(need, os.cpu_count() or 1))
    if n_slots < need:
        raise UserError(f"{count(need, 'worker')} needed but only {n_slots} slot(s)")
    if dev == "cuda" and need > ngpu:
        raise UserError(f"the design needs {need} GPUs but {ngpu} are visible")
    check_dataset(cfg.dataset, cfg.data_dir)
    out = Path(out_dir or design.out)
    if dev == "cpu" and need > (os.cpu_count() or 1):
        click.echo(f"elastic-ring: note: {need} workers on {os.cpu_count()} CPU cores oversubscribe them",
                   err=True)
    result = run_design(design, cfg, out, n_slots, dev, design_path=str(design_path))
    click.echo(f"Table 2: {design.w_init} -> {design.w_new} workers, ResNet-{cfg.depth}/{cfg.width} on "
               f"{cfg.dataset} ({dev}), {cfg.total_steps} steps, batch {cfg.batch_size}/worker, "
               f"relaunch {design.relaunch}; "
               f"mean ± sd over {design.repeats} repeat(s)")
    click.echo(render_table2(result["rows"]))
    click.echo("")
    click.echo(f"wrote {out / 'table2.json'} and {out / 'table2.md'}; plots: elastic-ring report {out}")
