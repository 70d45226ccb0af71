"""``elastic-ring ps``: parameter-server training with BSP, ASP, SSP and DSSP over MPI."""

from __future__ import annotations

import click

SYNC_HELP = ("bsp | asp | ssp | dssp (Algorithm 2 of the paper, unchanged) | dssp-exact (the allowance "
             "minimising the predicted wait at the worker's next check, assuming no refill, with the hard "
             "cap gap <= hi)")


@click.group("ps", invoke_without_command=True, context_settings={"max_content_width": 100})
@click.option("--sync", type=str, default=None, help=SYNC_HELP + ". Default: asp.")
@click.option("--staleness", type=str, default=None,
              help="ssp: the threshold s (default 3); dssp/dssp-exact: the range lo:hi (default 3:15). "
                   "Not allowed for bsp/asp.")
@click.option("--workers", "-k", type=int, default=None, help="Number of worker ranks K (default 2).")
@click.option("--slowdown", type=str, default=None,
              help="Per-worker step-time factors, one per worker, each >= 1, e.g. 1.0,1.8 (default all 1).")
@click.option("--noise", type=float, default=None,
              help="Coefficient of variation of each step time (Gaussian, seeded; default 0).")
@click.option("--base-step", "base_step_s", type=float, default=None,
              help="Floor of the base step in seconds (compute padded by sleeping) so emulated speeds "
                   "do not depend on CPU contention (default 0: measured compute).")
@click.option("--time-budget", "time_budget_s", type=float, default=None, help="Stop after this many seconds (default 60).")
@click.option("--max-pushes", type=int, default=None, help="Stop after this many applied pushes (0: no limit).")
@click.option("--stop-accuracy", type=float, default=None, help="Stop once the test accuracy reaches this (0: never).")
@click.option("--dataset", type=click.Choice(["digits", "cifar10", "synthetic"]), default=None,
              help="digits (offline, learns in seconds; default), cifar10 or synthetic.")
@click.option("--depth", type=int, default=None, help="CIFAR ResNet depth 6n+2 (default 8).")
@click.option("--width", type=int, default=None, help="Channels of the first stage (default 8).")
@click.option("--batch-size", type=int, default=None, help="Per-worker minibatch (default 32).")
@click.option("--lr", type=float, default=None, help="Server learning rate, one SGD step per push (default 0.05).")
@click.option("--seed", type=int, default=None, help="Seed of weights, sample order and noise (default 0).")
@click.option("--config", "config", type=click.Path(dir_okay=False), default=None,
              help="YAML file of ps settings (keys of PSConfig); flags override it.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override any setting (eval_every_s, momentum, weight_decay, data_dir, ...). Repeatable.")
@click.option("--run-dir", type=click.Path(file_okay=False), default=None,
              help="Output folder, new or empty (default runs/ps/<sync>-<time>): events.jsonl, ps_config.json, "
                   "mpirun.log.")
@click.pass_context
def ps(ctx: click.Context, config, sets, run_dir, **flags) -> None:
    """Parameter-server training (arXiv 1908.11848) with MPI ranks: rank 0 is the server
    (Algorithm 1), ranks 1..K are workers that pull, compute, push.

    \b
    Examples:
      elastic-ring ps --sync ssp --staleness 3 --workers 2 --slowdown 1.0,1.8
      elastic-ring ps --sync dssp --staleness 3:15 --workers 2 --slowdown 1.0,1.8 --time-budget 30
      elastic-ring ps --sync dssp-exact --staleness 3:15 --workers 3 --noise 0.2
      elastic-ring ps experiment --config configs/dssp_table1.yaml

    Every push, controller decision, hold, release and accuracy is written to
    RUN_DIR/events.jsonl. A bad argument is one line and exit status 2; a failed rank is one line
    (its rank and cause) and exit status 1.
    """
    if ctx.invoked_subcommand is not None:
        if any(v is not None for v in flags.values()) or config or sets or run_dir:
            raise click.UsageError("job options go before no subcommand: `elastic-ring ps [OPTIONS]` runs a "
                                   "job, `elastic-ring ps experiment --config FILE` runs a design")
        return
    from elastic_ring.ps.api import build_config
    from elastic_ring.ps.runner import new_run_dir, run_job

    cfg = build_config(config, sets, **flags)
    out = new_run_dir(cfg, run_dir)
    click.echo(f"elastic-ring ps: {cfg.policy.label()}, {cfg.workers} worker(s), slowdown "
               f"{','.join(f'{s:g}' for s in cfg.slowdowns)}, run dir {out}")
    res = run_job(cfg, out)
    f = res.finished
    bound = ("unbounded under this policy" if f["release_bound"] is None
             else f"the policy's bound: {f['release_bound']:g}")
    click.echo(f"stopped ({f['reason']}) after {f['wall_s']:.1f} s, {f['version']} updates; test accuracy "
               f"{f['test_accuracy']:.4f} (best {f['best_accuracy']:.4f})")
    click.echo(f"largest push gap at a release: {f['max_release_gap']} ({bound}), "
               f"max staleness {f['max_staleness']}")
    click.echo(f"{'worker':>6} {'slowdown':>8} {'pushes':>7} {'compute_s':>9} {'sleep_s':>8} {'held_s':>7} "
               f"{'blocked_s':>9} {'staleness max/mean':>18}")
    for s in res.summaries:
        click.echo(f"{s['worker']:>6} {s['slowdown']:>8.2f} {s['pushes']:>7} {s['compute_s']:>9.2f} {s['sleep_s']:>8.2f} "
                   f"{s['held_s']:>7.2f} {s['blocked_s']:>9.2f} {s['max_staleness']:>9}/{s['mean_staleness']:.2f}")


@ps.command("experiment")
@click.option("--config", "config", type=click.Path(dir_okay=False), required=True,
              help="Experiment design YAML (e.g. configs/dssp_table1.yaml).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override a design key (targets, seeds, engine, bootstrap, margin, ...) or, as "
                   "base.KEY=VALUE, a ps setting of every run (e.g. base.time_budget_s=10). Repeatable.")
@click.option("--out", type=click.Path(file_okay=False), default=None, help="Output folder (overrides the design's `out`).")
@click.option("--seeds", type=int, default=None, help="Use only the first N seeds of the design.")
@click.option("--only", multiple=True, help="Run only these paradigm names (repeatable).")
@click.option("--parallel", type=int, default=None,
              help="Jobs at a time (overrides the design's `parallel`; honest only while the compute/base "
                   "ratio stays well under 1, which table1.md reports).")
@click.option("--report-only", is_flag=True, help="Do not run; rebuild table and plots from the runs in --out.")
def experiment(config, sets, out, seeds, only, parallel, report_only) -> None:
    """Run the Table I design: every heterogeneity x paradigm x seed (seeds paired), then write
    table1.json, table1.md (times to target, paired ratios to the references with 95% bootstrap
    intervals, a verdict per paper comparison, the compute/base ratio) and accuracy_vs_time.png into
    the output folder (runs under OUT/runs/). A run already finished (its events.jsonl has
    ps_finished) is reused, so an interrupted experiment resumes."""
    from elastic_ring.config.base import parse_overrides
    from elastic_ring.experiment.ps_design import load_design
    from elastic_ring.experiment.ps_sync import run_experiment

    overrides = parse_overrides(sets) | {k: v for k, v in (("out", out), ("parallel", parallel)) if v is not None}
    design = load_design(config, overrides, seeds=seeds, only=only)
    res = run_experiment(design, run=not report_only, echo=click.echo)
    click.echo(res["markdown"])
    click.echo(f"wrote {design.out}/table1.json, table1.md, accuracy_vs_time.png")
