"""`elastic-ring profile`: measure throughput at each worker count, print Table 1, fit Eq. 5
(the experiment: :mod:`elastic_ring.experiment.throughput`)."""

from __future__ import annotations

import click


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
    from elastic_ring.experiment.throughput import run_table1

    t1 = run_table1(counts, steps, warmup_windows, config_path, overrides, device, slots, out_dir, fresh,
                    note=lambda m: click.echo(m, err=True))
    click.echo(t1.text())
