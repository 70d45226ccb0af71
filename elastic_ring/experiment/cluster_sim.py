"""Table 3: a simulated GPU cluster under the scheduling policies (``elastic-ring simulate``).

For each contention level and seed, one job stream is drawn (Poisson arrivals, log-uniform job
sizes, workloads drawn uniformly from ``--workload``) and every strategy runs on the same stream.
The table gives mean +- std over seeds of average JCT, p99 JCT, makespan (hours), GPU utilisation
and the number of resizes. Files written to ``--out``: ``table3.json`` (settings, every run, the
summary), ``table3.md`` and ``jct.png`` (average JCT per strategy per contention level).

Remaining work (``--remaining``): ``eq1`` (default) tells every policy the Eq. 1 prediction from
each job's loss curve observed so far; ``oracle`` the true remaining work (the paper's simulator).

Held-out check (``--plan-workload``): the planners (Precompute, Optimus) use the speed model of
the plan workload while jobs run at their own workload's true speed; Precompute with the true
models is added as ``precompute-oracle`` so the shrinkage of the gain over Eight can be read off.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from elastic_ring.errors import ConfigError
from elastic_ring.sched.api import DEFAULT_RESIZE_OVERHEAD_S, NOT_RESIZE_AWARE

STRATEGIES = ("eight", "precompute", "exploratory", "optimus", "srtf", "las", "pollux", "hesrpt")
# NAME-rc: grows only when they pay for their resize
RC_STRATEGIES = tuple(n for n in STRATEGIES if n not in NOT_RESIZE_AWARE)
METRICS = (("avg_jct_h", "avg JCT (h)"), ("p99_jct_h", "p99 JCT (h)"), ("makespan_h", "makespan (h)"),
           ("utilisation", "GPU util"), ("resizes", "resizes"))


def parse_levels(spec: str) -> list[tuple[str, float]]:
    from elastic_ring.sim.api import CONTENTION

    out = []
    for part in [p.strip() for p in spec.split(",") if p.strip()]:
        if part == "all":
            out.extend(CONTENTION.items())
        elif part in CONTENTION:
            out.append((part, CONTENTION[part]))
        else:
            try:
                v = float(part)
            except ValueError:
                raise ConfigError(f"--contention: {part!r} is not one of low, moderate, high, extreme, "
                                  f"all or a number (offered load)") from None
            if not (v > 0 and math.isfinite(v)):
                raise ConfigError(f"--contention: offered load must be > 0, got {part}")
            out.append((f"rho={v:g}", v))
    if not out:
        raise ConfigError("--contention: give at least one level")
    seen, uniq = set(), []
    for name, v in out:
        if name not in seen:
            seen.add(name)
            uniq.append((name, v))
    return uniq


def parse_strategies(spec: str) -> list[str]:
    names = [p.strip() for p in spec.split(",") if p.strip()]
    bad = [n for n in names if n not in STRATEGIES and not (n.endswith("-rc") and n[:-3] in RC_STRATEGIES)]
    if bad or not names:
        raise ConfigError(f"--strategies: unknown {', '.join(bad) or '(empty)'}; choose from {', '.join(STRATEGIES)}")
    return list(dict.fromkeys(names))


def parse_seeds(spec: str, flag: str) -> list[int]:
    """``0-4,9`` -> [0, 1, 2, 3, 4, 9]."""
    out: list[int] = []
    for part in [p.strip() for p in spec.split(",") if p.strip()]:
        try:
            if "-" in part:
                a, b = part.split("-", 1)
                lo, hi = int(a), int(b)
                if hi < lo:
                    raise ValueError
                out.extend(range(lo, hi + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise ConfigError(f"{flag}: {part!r} is not a seed or a range like 0-4") from None
    if not out or min(out) < 0:
        raise ConfigError(f"{flag}: give seeds >= 0, e.g. 0-4 or 0,1,2")
    return list(dict.fromkeys(out))


def parse_powers(spec: str) -> list[float]:
    try:
        out = [float(p) for p in spec.split(",") if p.strip()]
    except ValueError:
        raise ConfigError(f"--srtf-powers: {spec!r} is not a comma list of numbers") from None
    if not out or any(not (math.isfinite(x) and x >= 0) for x in out):
        raise ConfigError(f"--srtf-powers: give numbers >= 0, got {spec!r}")
    return out


def mean_std(xs: list[float]) -> tuple[float, float]:
    n = len(xs)
    m = sum(xs) / n
    s = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1)) if n > 1 else 0.0
    return m, s


def fmt(m: float, s: float, key: str) -> str:
    if key == "utilisation":
        return f"{m:.3f} ± {s:.3f}"
    if key == "resizes":
        return f"{m:.0f} ± {s:.0f}"
    return f"{m:.2f} ± {s:.2f}"


def _plot(summary: dict, levels: list[str], strategies: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(levels) + 3), 4.2))
    width = 0.8 / len(strategies)
    for i, s in enumerate(strategies):
        xs = [k + (i - (len(strategies) - 1) / 2) * width for k in range(len(levels))]
        ms = [summary[lv][s]["avg_jct_h"]["mean"] for lv in levels]
        ss = [summary[lv][s]["avg_jct_h"]["std"] for lv in levels]
        ax.bar(xs, ms, width, yerr=ss, capsize=3, label=s)
    ax.set_xticks(range(len(levels)), levels)
    ax.set_xlabel("contention level")
    ax.set_ylabel("average JCT (hours), mean ± std over seeds")
    ax.set_title("Simulated cluster: average job completion time")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _markdown(summary: dict, levels: list[str], strategies: list[str], meta: dict) -> str:
    lines = [f"# Table 3 (simulated): {meta['gpus']} GPUs, {meta['jobs']} jobs/run, {meta['seeds']} seeds, "
             f"mean ± std over seeds", "",
             f"workloads: {', '.join(meta['workloads'])}; "
             f"planner's model: {meta['plan_workload'] or 'each job’s own'}; "
             f"resize overhead {meta['resize_overhead_s']:g} s; remaining work told to policies: "
             f"{meta['remaining']}", ""]
    for lv in levels:
        lines += [f"## {lv} (offered load {meta['levels'][lv]:g})", "",
                  "| strategy | " + " | ".join(h for _, h in METRICS) + " |",
                  "|---" * (len(METRICS) + 1) + "|"]
        for s in strategies:
            row = summary[lv][s]
            lines.append(f"| {s} | " + " | ".join(fmt(row[k]["mean"], row[k]["std"], k) for k, _ in METRICS) + " |")
        g = summary[lv].get("_gain")
        if g:
            lines += ["", "; ".join(f"Eight / {k}: {v['mean']:.2f} ± {v['std']:.2f}x" for k, v in g.items())]
        lines.append("")
    sp = meta.get("seed_split")
    if sp:
        lines += ["## Seeds", "",
                  f"- tuning seeds (constants chosen on these only): {sp['tune_seeds'] or 'none'}",
                  f"- evaluation seeds (every figure above): {sp['eval_seeds']}",
                  f"- tuning workloads: {', '.join(sp['tune_workloads'])}; evaluation workloads: "
                  f"{', '.join(sp['eval_workloads'])}"]
        for lv, t in (sp.get("tuned") or {}).items():
            lines.append(f"- {lv}: srtf power {t['power']:g} chosen on the tuning seeds "
                         f"(mean Eight/srtf avg JCT there: {t['tune_gain']:.2f}x; candidates "
                         + ", ".join(f"{k}: {v:.2f}x" for k, v in t["candidates"].items()) + ")")
        lines.append("")
    ho = meta.get("heldout")
    if ho:
        lines += ["## Held-out check", ""]
        for lv, h in ho.items():
            lines.append(f"- {lv}: {h['text']}")
        lines.append("")
    return "\n".join(lines)


def _tune(levels, tune: list[int], powers: list[float], base: dict, tune_models: dict, plan) -> tuple[dict, list]:
    """srtf's exponent per level, chosen on the tuning seeds and workloads only: the candidate with
    the best mean Eight/srtf ratio of average JCT there (ties: the smaller exponent)."""
    from elastic_ring.sched.policies import SRTF
    from elastic_ring.sched.registry import make_policy
    from elastic_ring.sim.api import SimConfig
    from elastic_ring.sim.engine import simulate as run_sim
    from elastic_ring.sim.workload import make_jobs

    tbase = dict(base, workloads=tuple(tune_models))
    tplan = {k: plan.model for k in tune_models} if plan else None
    tuned: dict = {}
    rows: list[dict] = []
    for lv, rho in levels:
        gains: dict[float, list[float]] = {p: [] for p in powers}
        for seed in tune:
            cfg = SimConfig(contention=rho, seed=seed, **tbase)
            jobs = make_jobs(cfg, tune_models)
            eight = run_sim(cfg, make_policy("eight"), jobs, tune_models, tplan).avg_jct_s
            for p in powers:
                r = run_sim(cfg, SRTF(power=p), jobs, tune_models, tplan)
                gains[p].append(eight / r.avg_jct_s)
                rows.append({"level": lv, "seed": seed, "power": p, "avg_jct_h": r.avg_jct_s / 3600,
                             "p99_jct_h": r.p99_jct_s / 3600, "eight_avg_jct_h": eight / 3600})
        means = {p: sum(g) / len(g) for p, g in gains.items()}
        power = max(powers, key=lambda p: (means[p], -p))
        tuned[lv] = {"power": power, "tune_gain": means[power], "candidates": {f"{p:g}": m for p, m in means.items()}}
    return tuned, rows


def _run_all(levels, seeds: list[int], runs_strats, base, true_models, plan_models, overhead: float,
             tuned: dict) -> list[dict]:
    """Every (level, seed, strategy) run, with a progress bar on a terminal; srtf with the exponent
    tuned for the level when there is one."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from elastic_ring.sched.policies import SRTF
    from elastic_ring.sched.registry import make_policy
    from elastic_ring.sim.api import SimConfig
    from elastic_ring.sim.engine import simulate as run_sim
    from elastic_ring.sim.workload import make_jobs

    rows: list[dict] = []
    total = len(levels) * len(seeds) * len(runs_strats)
    err = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True, disable=not err.is_terminal) as prog:
        task = prog.add_task("simulating", total=total)
        for lv, rho in levels:
            for seed in seeds:
                cfg = SimConfig(contention=rho, seed=seed, **base)
                jobs = make_jobs(cfg, true_models)
                for s in runs_strats:
                    prog.update(task, description=f"{lv} seed {seed} {s}")
                    if s == "precompute-oracle":
                        pol, pm = make_policy("precompute"), None
                    elif s == "srtf" and lv in tuned:
                        pol, pm = SRTF(power=tuned[lv]["power"]), plan_models
                    else:
                        pol, pm = make_policy(s, overhead), plan_models
                    r = run_sim(cfg, pol, jobs, true_models, pm)
                    d = r.summary()
                    d.update(strategy=s, level=lv, offered_load=rho)
                    rows.append(d)
                    prog.advance(task)
    return rows


def _summarise(rows: list[dict], levels, runs_strats) -> dict:
    """Mean ± std per level and strategy, and each strategy's gain over Eight per seed."""
    summary: dict = {}
    for lv, _ in levels:
        summary[lv] = {}
        for s in runs_strats:
            sel = [r for r in rows if r["level"] == lv and r["strategy"] == s]
            summary[lv][s] = {k: dict(zip(("mean", "std"), mean_std([r[k] for r in sel]))) for k, _ in METRICS}
        if "eight" in runs_strats:
            gain = {}
            for s in runs_strats:
                if s == "eight":
                    continue
                e = {r["seed"]: r["avg_jct_h"] for r in rows if r["level"] == lv and r["strategy"] == "eight"}
                ratios = [e[r["seed"]] / r["avg_jct_h"] for r in rows
                          if r["level"] == lv and r["strategy"] == s and r["avg_jct_h"] > 0]
                m, sd = mean_std(ratios)
                gain[s] = {"mean": m, "std": sd, "more_than_halves_in_seeds": sum(x > 2 for x in ratios),
                           "seeds": len(ratios)}
            summary[lv]["_gain"] = gain
    return summary


def _heldout(summary: dict, levels, plan, strats) -> dict:
    """Precompute planning with another workload's model against the true models, per level."""
    heldout = {}
    if plan and "precompute" in strats and "eight" in strats:
        for lv, _ in levels:
            e = summary[lv]["eight"]["avg_jct_h"]["mean"]
            p = summary[lv]["precompute"]["avg_jct_h"]["mean"]
            o = summary[lv]["precompute-oracle"]["avg_jct_h"]["mean"]
            red_o, red_h = 1 - o / e, 1 - p / e
            heldout[lv] = {"eight_h": e, "precompute_oracle_h": o, "precompute_heldout_h": p,
                           "reduction_oracle": red_o, "reduction_heldout": red_h,
                           "shrink_points": red_o - red_h,
                           "text": f"Eight {e:.2f} h; Precompute with true models {o:.2f} h (-{100 * red_o:.1f}%), "
                                   f"planning with {plan.name}'s model {p:.2f} h (-{100 * red_h:.1f}%): the gain "
                                   f"shrinks by {100 * (red_o - red_h):.1f} percentage points"}
    return heldout


@dataclass(frozen=True)
class Table3:
    """One run of the experiment: what ``table3.json`` holds, and what its table is printed from."""

    meta: dict
    summary: dict
    runs: list[dict]
    levels: list[tuple[str, float]]
    strategies: list[str]  # the strategies run (precompute-oracle added for a held-out check)
    tuned: dict  # level -> srtf's exponent chosen on the tuning seeds
    tune_seeds: list[int]
    eval_seeds: list[int]
    out: Path


def check_sim_settings(gpus: int, seeds: int, n_jobs: int, min_hours: float, max_hours: float,
                       resize_overhead: float | None, contention: str,
                       strategies: str) -> tuple[list, list[str], float]:
    """The settings every simulator command shares (Table 3, ``--compare-rules``), checked: returns
    (the contention levels, the strategies, the resize overhead in seconds).

    Raises:
        ConfigError: a bad setting (one line naming the flag).
    """
    for flag, v in (("--gpus", gpus), ("--seeds", seeds), ("--jobs", n_jobs)):
        if v < 1:
            raise ConfigError(f"{flag} must be >= 1, got {v}")
    _check_flags(min_hours, max_hours, resize_overhead)
    levels = parse_levels(contention)
    strats = parse_strategies(strategies)
    if "exploratory" in strats and gpus < 8:
        raise ConfigError("--strategies exploratory needs --gpus >= 8 (a new job measures itself on 8 GPUs)")
    return levels, strats, DEFAULT_RESIZE_OVERHEAD_S if resize_overhead is None else resize_overhead


def run_table3(gpus: int = 64, contention: str = "moderate", strategies: str = ",".join(STRATEGIES[:4]),
               remaining: str = "eq1", seeds: int = 10, tune_seeds: str | None = None,
               eval_seeds: str | None = None, srtf_powers: str = "1,2,3", eval_workloads: tuple[str, ...] = (),
               n_jobs: int = 200, workloads: tuple[str, ...] = (), plan_workload: str | None = None,
               resize_overhead: float | None = None, min_hours: float = 0.25, max_hours: float = 8.0,
               out_dir: str | Path = "results/simulate", command: str = "") -> Table3:
    """Check the settings (given as the command's flags, named in errors), tune srtf on the tuning
    seeds, run every level x evaluation seed x strategy, and write ``table3.json``, ``table3.md`` and
    ``jct.png`` to ``out_dir``.

    Raises:
        ConfigError: a bad setting (one line naming the flag).
    """
    from elastic_ring.sim.api import SimConfig
    from elastic_ring.sim.workload import load_workload

    levels, strats, overhead = check_sim_settings(gpus, seeds, n_jobs, min_hours, max_hours, resize_overhead,
                                                  contention, strategies)
    tune, evals = _split_seeds(tune_seeds, eval_seeds, seeds)
    powers = parse_powers(srtf_powers)
    tune_wls = [load_workload(w) for w in (workloads or ("resnet110-cifar10",))]
    wls = [load_workload(w) for w in eval_workloads] if eval_workloads else tune_wls
    true_models = {w.name: w.model for w in wls}
    plan = load_workload(plan_workload) if plan_workload else None
    plan_models = {k: plan.model for k in true_models} if plan else None
    runs_strats = list(strats)
    if plan and "precompute" in strats:
        runs_strats.append("precompute-oracle")

    base = dict(gpus=gpus, jobs=n_jobs, min_hours_at_8=min_hours, max_hours_at_8=max_hours,
                resize_overhead_s=overhead, workloads=tuple(true_models), remaining=remaining)
    SimConfig(contention=1.0, **base)  # validate once before the long loop
    tuned, tune_rows = (_tune(levels, tune, powers, base, {w.name: w.model for w in tune_wls}, plan)
                        if tune and "srtf" in strats else ({}, []))
    rows = _run_all(levels, evals, runs_strats, base, true_models, plan_models, overhead, tuned)

    summary = _summarise(rows, levels, runs_strats)
    heldout = _heldout(summary, levels, plan, strats)
    seed_split = {"tune_seeds": tune, "eval_seeds": evals, "tune_workloads": [w.name for w in tune_wls],
                  "eval_workloads": [w.name for w in wls], "srtf_powers": powers if tuned else None,
                  "tuned": tuned, "tuning_runs": tune_rows,
                  "note": ("srtf's exponent chosen per level on the tuning seeds; every table figure is on the "
                           "evaluation seeds" if tuned else
                           "no tuning in this run: srtf uses its default exponent (2, chosen on seeds 0-9 of "
                           "the built-in workload in an earlier run)")}
    meta = {"gpus": gpus, "jobs": n_jobs, "seeds": len(evals), "levels": {lv: rho for lv, rho in levels},
            "seed_split": seed_split,
            "strategies": runs_strats, "workloads": [w.name for w in wls],
            "workload_sources": {w.name: w.source for w in wls},
            "plan_workload": plan.name if plan else None, "resize_overhead_s": overhead, "remaining": remaining,
            "min_hours_at_8": min_hours, "max_hours_at_8": max_hours,
            "command": command,
            "heldout": heldout}
    out = _write_outputs(Path(out_dir), meta, summary, rows, levels, runs_strats)
    return Table3(meta, summary, rows, levels, runs_strats, tuned, tune, evals, out)


def _check_flags(min_hours: float, max_hours: float, resize_overhead: float | None) -> None:
    """The checks of SimConfig that concern a flag, said with the flag's name (not the field's)."""
    if not (0 < min_hours and math.isfinite(max_hours)):
        raise ConfigError(f"--min-hours must be > 0 and --max-hours finite, got {min_hours:g} and {max_hours:g}")
    if min_hours > max_hours:
        raise ConfigError(f"--min-hours {min_hours:g} is above --max-hours {max_hours:g}")
    if resize_overhead is not None and not (resize_overhead >= 0 and math.isfinite(resize_overhead)):
        raise ConfigError(f"--resize-overhead must be >= 0 seconds, got {resize_overhead:g}")


def _split_seeds(tune_seeds: str | None, eval_seeds: str | None, seeds: int) -> tuple[list[int], list[int]]:
    """The tuning and the evaluation seeds; overlapping ones are refused."""
    tune = parse_seeds(tune_seeds, "--tune-seeds") if tune_seeds else []
    evals = parse_seeds(eval_seeds, "--eval-seeds") if eval_seeds else list(range(seeds))
    overlap = sorted(set(tune) & set(evals))
    if overlap:
        raise ConfigError(f"--tune-seeds and --eval-seeds overlap on {overlap}: a constant tuned on a seed "
                          f"cannot be reported on it")
    return tune, evals


def _write_outputs(out: Path, meta: dict, summary: dict, rows: list[dict], levels, runs_strats) -> Path:
    """table3.json, table3.md and jct.png in ``out``."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--out: cannot create {out}: {e}") from None
    lvnames = [lv for lv, _ in levels]
    (out / "table3.json").write_text(json.dumps({"meta": meta, "summary": summary, "runs": rows}, indent=1) + "\n")
    (out / "table3.md").write_text(_markdown(summary, lvnames, runs_strats, meta))
    _plot(summary, lvnames, runs_strats, out / "jct.png")
    return out
