"""`elastic-ring profile`: measure throughput at each worker count, print Table 1, fit Eq. 5."""

from __future__ import annotations

import os
from pathlib import Path

import click

from elastic_ring.errors import UserError


@click.command(context_settings={"max_content_width": 100})
@click.option("--workers", "--gpus", "counts", default="1,2,4,8", show_default=True, metavar="N[,N...]",
              help="Worker counts to measure (a GPU each on a GPU node, a CPU process each otherwise); "
                   "any counts, e.g. 1,2,3,4 (--gpus is the same option).")
@click.option("--steps", type=int, default=None,
              help="Steps per count. [default: enough for 6 windows after the warm-up]")
@click.option("--warmup-windows", type=int, default=1, show_default=True,
              help="Throughput windows dropped at the start of each run (warm-up).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="YAML config. [default: configs/paper.yaml on GPUs, configs/cpu_small.yaml on the CPU]")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override any config key (repeatable), e.g. --set throughput_window=20.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="cuda: one GPU per worker; cpu: CPU processes with gloo.")
@click.option("--slots", type=int, default=None,
              help="Worker slots (CPU). [default: the largest count; more than the cores oversubscribes]")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="results/profile",
              show_default=True, help="Output folder: profile.json, table1.md, runs/w<N>/.")
@click.option("--fresh", is_flag=True, help="Rerun counts even if a finished run with the same config is there.")
def profile(counts, steps, warmup_windows, config_path, overrides, device, slots, out_dir, fresh):
    """Measure steady-state throughput at each worker count (Table 1) and fit Eq. 5.

    \b
    CPU scale (ResNet-20/8 on digits, gloo):
        elastic-ring profile --workers 1,2,3,4 --out results/profile_cpu
    8-GPU node (ResNet-110 on CIFAR-10):
        elastic-ring profile --workers 1,2,4,8 --steps 400

    Each count is one training run in OUT/runs/w<N>/. The first --warmup-windows throughput windows
    of each run (and a short last window) are dropped; the point is the remaining windows' steps
    (images) divided by the seconds they took, with the interquartile range of their steps/s as spread. Prints Table 1 (images/s, steps/s, speedup,
    scaling efficiency against the smallest count and against the previous one) and the Eq. 5 fit
    by NNLS with its residuals; writes OUT/profile.json (read by `elastic-ring simulate --workload`)
    and OUT/table1.md. Eq. 5 has 4 parameters: with fewer than 4 counts the profile is still written,
    with the fit marked as refused.
    """
    from elastic_ring.cli.train import _resolve_device
    from elastic_ring.config.api import load_config
    from elastic_ring.config.base import parse_overrides
    from elastic_ring.data import check_dataset
    from elastic_ring.profile.api import parse_worker_counts, render_fit, render_table1
    from elastic_ring.profile.profiler import run_profile

    ws = parse_worker_counts(counts)
    if warmup_windows < 0:
        raise UserError(f"--warmup-windows must be >= 0, got {warmup_windows}")
    device, ngpu = _resolve_device(device)
    if device == "cuda" and max(ws) > ngpu:
        raise UserError(f"--workers asks for {max(ws)} workers but only {ngpu} GPU(s) are visible")
    ov = parse_overrides(overrides)
    cfg = load_config(config_path, ov, device=device)
    if steps is None:
        steps = cfg.throughput_window * (warmup_windows + 6) + 1
    if steps < 2:
        raise UserError(f"--steps must be >= 2, got {steps}")
    min_steps = cfg.throughput_window * (warmup_windows + 1) + 1
    if steps < min_steps:
        raise UserError(f"--steps {steps} leaves no throughput window after {warmup_windows} warm-up "
                        f"window(s) of {cfg.throughput_window} steps: use >= {min_steps}")
    cfg = cfg.replace(total_steps=steps)
    check_dataset(cfg.dataset, cfg.data_dir)
    n_slots = slots if slots is not None else (ngpu if device == "cuda" else max(ws))
    if n_slots < max(ws):
        raise UserError(f"--slots {n_slots} is less than the largest count {max(ws)}")
    cores = os.cpu_count() or 1
    if device == "cpu" and max(ws) > cores:
        click.echo(f"elastic-ring: note: {cores} CPU cores; counts above {cores} oversubscribe them "
                   f"(workers share cores, so their throughput is not that of separate devices)", err=True)
    out = Path(out_dir)
    prof = run_profile(cfg, ws, out, n_slots, device, warmup_windows, reuse=not fresh)
    t1 = render_table1(prof["table1"])
    fit = render_fit(prof)
    (out / "table1.md").write_text(
        f"# Table 1: throughput per worker count ({prof['model']}/{prof['width']} on {prof['dataset']}, "
        f"{device})\n\n{render_table1(prof['table1'], markdown=True)}\n\n{render_fit(prof, markdown=True)}\n")
    click.echo(f"Table 1: {prof['model']} (width {prof['width']}) on {prof['dataset']}, {device}, "
               f"batch {prof['batch_per_worker']}/worker, {steps} steps per count, "
               f"{warmup_windows} warm-up window(s) dropped")
    click.echo(t1)
    click.echo("")
    click.echo(fit)
    click.echo("")
    click.echo(f"wrote {out / 'profile.json'} and {out / 'table1.md'}")
