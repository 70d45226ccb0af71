"""``elastic-ring simulate``: Table 3, a simulated GPU cluster under the scheduling policies.

The experiment is :func:`elastic_ring.experiment.cluster_sim.run_table3`; this command parses its
flags, runs it and prints its tables (or the summary as JSON).
"""

from __future__ import annotations

import json
import sys

import click

from elastic_ring.experiment.cluster_sim import METRICS, STRATEGIES, Table3, fmt, run_table3
from elastic_ring.sched.api import DEFAULT_RESIZE_OVERHEAD_S
from elastic_ring.sim.workload import builtin_workloads


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--gpus", type=int, default=64, show_default=True, help="GPUs in the simulated cluster.")
@click.option("--contention", default="moderate", show_default=True,
              help="Comma list of low (offered load 0.5), moderate (0.9), high (1.2), extreme (2.0), all, "
                   "or numbers (offered load = arrival rate x mean GPU-hours per job at 8 GPUs / GPUs).")
@click.option("--strategies", default=",".join(STRATEGIES[:4]), show_default=True,
              help="Comma list of eight, precompute, exploratory, optimus, srtf (ours: shortest predicted "
                   "remaining time first with rank-weighted doubling), and three published schedulers for "
                   "comparison: las (Tiresias least attained service), pollux (goodput "
                   "re-optimisation), hesrpt (SRPT for concave speed-ups); NAME-rc (not eight, exploratory): "
                   "the same, growing a running job only when the gain over 10 resize costs exceeds the resize.")
@click.option("--remaining", type=click.Choice(["eq1", "oracle"]), default="eq1", show_default=True,
              help="What policies know of a job's remaining work: the Eq. 1 prediction from its loss "
                   "curve so far, or the true value (oracle).")
@click.option("--seeds", type=int, default=10, show_default=True,
              help="Seeds per level (seed 0..N-1) when --eval-seeds is not given.")
@click.option("--tune-seeds", default=None,
              help="Seeds (e.g. 0-4) on which srtf's weighting exponent is chosen from --srtf-powers, per "
                   "level, on the --workload mix; the table then reports only --eval-seeds.")
@click.option("--eval-seeds", default=None,
              help="Seeds the table reports (e.g. 100-109); must not overlap --tune-seeds. Default 0..N-1.")
@click.option("--srtf-powers", default="1,2,3", show_default=True,
              help="Candidate exponents of srtf's rank weighting, tried on --tune-seeds.")
@click.option("--eval-workload", "eval_workloads", multiple=True,
              help="Held-out workload mix (repeatable): the evaluation runs draw jobs from these instead of "
                   "--workload (tuning always uses --workload).")
@click.option("--jobs", "n_jobs", type=int, default=200, show_default=True, help="Jobs per run.")
@click.option("--workload", "workloads", multiple=True,
              help="Built-in workload name or path to a profile.json (repeatable; jobs drawn uniformly). "
                   f"Default resnet110-cifar10. Built-ins: {', '.join(builtin_workloads())}.")
@click.option("--plan-workload", default=None,
              help="Held-out check: the planner uses this workload's speed model for every job.")
@click.option("--resize-overhead", type=float, default=None, metavar="SECONDS",
              help=f"Seconds lost per resize. [default: {DEFAULT_RESIZE_OVERHEAD_S:g}, measured on the CPU; "
                   "the paper's GPUs: about 10]")
@click.option("--min-hours", type=float, default=0.25, show_default=True, help="Shortest job: hours alone on 8 GPUs.")
@click.option("--max-hours", type=float, default=8.0, show_default=True, help="Longest job: hours alone on 8 GPUs.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="results/simulate", show_default=True,
              help="Folder for table3.json, table3.md, jct.png.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON instead of the table.")
@click.option("--compare-rules", "compare_rules", type=float, default=None, metavar="GLOBAL_BATCH",
              help="Instead of Table 3: run the same jobs with every job under Eq. 7 (linear) and under "
                   "constant-batch with this global batch in samples (0: the per-worker batch x 8), and "
                   "compare the strategies' allocations (rules.json, rules.md in --out).")
def simulate(gpus, contention, strategies, remaining, seeds, tune_seeds, eval_seeds, srtf_powers, eval_workloads,
             n_jobs, workloads, plan_workload, resize_overhead, min_hours, max_hours, out_dir, as_json,
             compare_rules):
    """Simulate a GPU cluster under scheduling policies and print Table 3.

    Jobs arrive as a Poisson process; each job's size is its run time alone on 8 GPUs, log-uniform
    in [--min-hours, --max-hours]; a policy decides at every arrival and completion. Strategies:
    eight (8 GPUs per job, FIFO queue), precompute (Eq. 6 doubling with known speed models),
    exploratory (measure at 1/2/4/8 GPUs for 10 min, then doubling), optimus (unit-step greedy),
    srtf (ours: shortest predicted remaining time first with rank-weighted doubling). Policies are
    told each job's remaining work as predicted by Eq. 1 (--remaining eq1) or the truth (oracle).

    Example: elastic-ring simulate --gpus 64 --contention all --seeds 10
    """
    command = "elastic-ring simulate " + " ".join(sys.argv[2:] if len(sys.argv) > 2 else [])
    if compare_rules is not None:
        _compare_rules(compare_rules, gpus, contention, strategies, remaining, seeds, eval_seeds, n_jobs,
                       workloads, resize_overhead, min_hours, max_hours, out_dir, as_json, command)
        return
    t3 = run_table3(gpus, contention, strategies, remaining, seeds, tune_seeds, eval_seeds, srtf_powers, eval_workloads,
                    n_jobs, workloads, plan_workload, resize_overhead, min_hours, max_hours, out_dir,
                    command=command)
    if as_json:
        click.echo(json.dumps({"meta": t3.meta, "summary": t3.summary}, indent=1))
        return
    _print_tables(t3)


def _print_tables(t3: Table3) -> None:
    from rich.console import Console
    from rich.table import Table

    meta, summary, seeds, heldout = t3.meta, t3.summary, t3.eval_seeds, t3.meta["heldout"]
    con = Console() if Console().is_terminal else Console(width=130)
    for lv, rho in t3.levels:
        t = Table(title=f"Table 3 — {lv} (offered load {rho:g}), {meta['gpus']} GPUs, {meta['jobs']} jobs, "
                        f"{len(seeds)} seeds {seeds[0]}..{seeds[-1]}, mean ± std")
        t.add_column("strategy")
        for _, h in METRICS:
            t.add_column(h, justify="right")
        for s in t3.strategies:
            row = summary[lv][s]
            t.add_row(s, *[fmt(row[k]["mean"], row[k]["std"], k) for k, _ in METRICS])
        con.print(t)
        g = summary[lv].get("_gain")
        if g:
            con.print("  " + "; ".join(f"Eight / {k}: {v['mean']:.2f} ± {v['std']:.2f}x "
                                       f"(> 2x in {v['more_than_halves_in_seeds']}/{v['seeds']} seeds)"
                                       for k, v in g.items()))
        if lv in heldout:
            con.print("  held-out: " + heldout[lv]["text"])
        if lv in t3.tuned:
            con.print(f"  srtf power {t3.tuned[lv]['power']:g} chosen on tuning seeds {t3.tune_seeds}; "
                      f"table on seeds {seeds}")
    out = t3.out
    con.print(f"wrote {out / 'table3.json'}, {out / 'table3.md'}, {out / 'jct.png'}")


def _compare_rules(global_batch, gpus, contention, strategies, remaining, seeds, eval_seeds, n_jobs, workloads,
                   resize_overhead, min_hours, max_hours, out_dir, as_json, command) -> None:
    """``--compare-rules``: :func:`elastic_ring.experiment.rules.run_rules`, its table printed."""
    from elastic_ring.experiment.cluster_sim import parse_levels
    from elastic_ring.experiment.rules import run_rules, table_lines

    result, md = run_rules(global_batch, gpus, contention, strategies, remaining, seeds, eval_seeds, n_jobs,
                           workloads, resize_overhead, min_hours, max_hours, out_dir, command)
    if as_json:
        click.echo(json.dumps({"meta": result["meta"], "summary": result["summary"]}, indent=1))
        return
    click.echo("\n".join(table_lines(result, parse_levels(contention), result["meta"]["strategies"])))
    click.echo(f"wrote {md}, {md.with_suffix('.json')}")
