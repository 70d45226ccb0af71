"""`elastic-ring experiment resize`: the Table 2 design (baselines and resized runs; the experiment:
:mod:`elastic_ring.experiment.resize_runs`)."""

from __future__ import annotations

import click


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
@click.option("--rules", default=None, metavar="RULE,RULE",
              help="Run the rows under each batch rule and compare them (design: rules), e.g. "
                   "linear,constant-batch: no resize, Eq. 7 and constant-batch under the same resizes, with "
                   "the final test accuracy and the time to reach it per row (spread over --repeats seeds) "
                   "and a plot, OUT/table2_rules.png.")
def resize(design_path, repeats, out_dir, overrides, slots, device, relaunch, rules):
    """Table 2: baselines at w_init and w_new, and runs resized w_init -> w_new at each step.

    \b
    CPU scale (minutes here):
        elastic-ring experiment resize --config configs/table2_cpu.yaml --repeats 2
    The paper's scale (8-GPU node, ResNet-110, 4 -> 8 GPUs at 5k and 10k steps):
        elastic-ring experiment resize --config configs/table2.yaml
    No resize, Eq. 7 and constant-batch compared, 5 seeds:
        elastic-ring experiment resize --config configs/table2_cpu.yaml --rules linear,constant-batch --repeats 5

    Every run is a real training run in OUT/runs/<row>-r<repeat>/. Writes OUT/table2.json and
    OUT/table2.md: steps, epochs, wall time, resize overheads, time saved against the w_init
    baseline, final test accuracy and loss, train loss, as mean ± sd over repeats (repeat r uses
    seed + r unless vary_seed: false). Finished runs with the same config are reused, so a rerun
    with more --repeats only adds runs. Then: elastic-ring report OUT.
    """
    from elastic_ring.experiment.resize_runs import run_table2

    t2 = run_table2(design_path, repeats, out_dir, overrides, slots, device, relaunch,
                    note=lambda m: click.echo(m, err=True), rules=rules)
    click.echo(t2.text())
