"""The two batch rules' allocations on the same trace (``elastic-ring simulate --compare-rules``).

For each contention level and seed one job stream is drawn (the same jobs, the same work in
samples: :func:`~elastic_ring.sim.workload.make_jobs` sizes them with the per-worker batch's curve)
and each strategy runs it twice: every job under Eq. 7 (``linear``: a fixed per-worker batch, the
Eq. 5 curve) and every job under ``constant-batch`` (the global batch kept: the accumulated step's
curve, :mod:`elastic_ring.perfmodel.accumulated`). Neither rule has an accuracy cost in the
simulator (a job's work and loss curve in samples do not depend on its resizes), so what differs is
the speed curve the policy plans with and the jobs run at.

Per strategy and rule: average JCT, resizes, and the allocations the policy made: at every
decision each running job's GPU count is tallied (``share``: the fraction of those job-decisions at
each count; ``mean_gpus``: their mean), so the table shows where the rules move GPUs.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from elastic_ring.experiment.cluster_sim import mean_std

BINS = ("1", "2", "3-4", "5-8", ">8")


def _bin(w: int) -> str:
    return "1" if w == 1 else "2" if w == 2 else "3-4" if w <= 4 else "5-8" if w <= 8 else ">8"


class Recording:
    """A policy that hands every decision to ``inner`` and tallies the GPU counts it gives running
    jobs (every other attribute is the inner policy's)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.counts: Counter = Counter()
        if getattr(inner, "allocate_batch", None) is None:
            self.allocate_batch = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["inner"], name)

    def allocate(self, jobs, total_gpus, current):
        out = self.inner.allocate(jobs, total_gpus, current)
        self.counts.update(int(w) for w in out.values() if w > 0)
        return out

    def allocate_batch(self, b, total_gpus):  # noqa: F811 (replaced by None above where the inner has none)
        out = self.inner.allocate_batch(b, total_gpus)
        ws, n = np.unique(np.asarray(out)[np.asarray(out) > 0], return_counts=True)
        self.counts.update(dict(zip(ws.tolist(), n.tolist())))
        return out


def compare_rules(levels: list[tuple[str, float]], seeds: list[int], strategies: list[str], base: dict,
                  workloads: list, global_batch: float, overhead: float) -> dict:
    """Every (level, seed, strategy, rule) run (see the module docstring): the summary per level,
    strategy and rule, and the runs."""
    from elastic_ring.sched.registry import make_policy
    from elastic_ring.sim.api import SimConfig
    from elastic_ring.sim.engine import simulate as run_sim
    from elastic_ring.sim.workload import make_jobs, with_rule

    models = {rule: {w.name: with_rule(w, rule, global_batch).model for w in workloads}
              for rule in ("linear", "constant-batch")}
    runs: list[dict] = []
    for lv, rho in levels:
        for seed in seeds:
            cfg = SimConfig(contention=rho, seed=seed, **dict(base, workloads=tuple(models["linear"])))
            jobs = make_jobs(cfg, models["linear"])
            for s in strategies:
                for rule, ms in models.items():
                    pol = Recording(make_policy(s, overhead))
                    r = run_sim(cfg, pol, jobs, ms)
                    total = sum(pol.counts.values()) or 1
                    share = Counter()
                    for w, n in pol.counts.items():
                        share[_bin(w)] += n / total
                    runs.append({"level": lv, "seed": seed, "strategy": s, "rule": rule,
                                 "avg_jct_h": r.avg_jct_s / 3600, "resizes": r.resizes,
                                 "mean_gpus": sum(w * n for w, n in pol.counts.items()) / total,
                                 "share": {k: share.get(k, 0.0) for k in BINS}})
    summary: dict = {}
    for lv, _ in levels:
        for s in strategies:
            for rule in models:
                sel = [r for r in runs if r["level"] == lv and r["strategy"] == s and r["rule"] == rule]
                summary.setdefault(lv, {}).setdefault(s, {})[rule] = {
                    "avg_jct_h": mean_std([r["avg_jct_h"] for r in sel]),
                    "resizes": mean_std([float(r["resizes"]) for r in sel]),
                    "mean_gpus": mean_std([r["mean_gpus"] for r in sel]),
                    "share": {k: sum(r["share"][k] for r in sel) / len(sel) for k in BINS}}
    return {"summary": summary, "runs": runs}


def table_lines(result: dict, levels: list[tuple[str, float]], strategies: list[str]) -> list[str]:
    """The comparison as a markdown table per level."""
    lines: list[str] = []
    for lv, rho in levels:
        lines += [f"## {lv} (offered load {rho:g})", "",
                  "| strategy | rule | avg JCT (h) | resizes | GPUs per running job | "
                  + " | ".join(f"at {b}" for b in BINS) + " |", "|---" * (5 + len(BINS)) + "|"]
        for s in strategies:
            for rule, row in result["summary"][lv][s].items():
                (jm, js), (rm, _), (gm, _) = row["avg_jct_h"], row["resizes"], row["mean_gpus"]
                lines.append(f"| {s} | {rule} | {jm:.2f} ± {js:.2f} | {rm:.0f} | {gm:.2f} | "
                             + " | ".join(f"{100 * row['share'][b]:.0f}%" for b in BINS) + " |")
        lines.append("")
    return lines


def write(out: Path, meta: dict, result: dict, levels, strategies) -> Path:
    """``rules.json`` and ``rules.md`` under ``out``; returns the markdown's path."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "rules.json").write_text(json.dumps({"meta": meta, **result}, indent=1))
    md = out / "rules.md"
    md.write_text("\n".join([f"# Eq. 7 (linear) vs constant-batch (global batch {meta['global_batch']:g}): "
                             f"{meta['gpus']} GPUs, {meta['jobs']} jobs/run, seeds {meta['seeds']}", "",
                             "Allocations: the share of running jobs' GPU counts over the policy's decisions.",
                             ""] + table_lines(result, levels, strategies)))
    return md


def run_rules(global_batch: float, gpus: int = 64, contention: str = "moderate", strategies: str = "precompute",
              remaining: str = "eq1", seeds: int = 10, eval_seeds: str | None = None, n_jobs: int = 200,
              workloads: tuple[str, ...] = (), resize_overhead: float | None = None, min_hours: float = 0.25,
              max_hours: float = 8.0, out_dir: str | Path = "results/simulate", command: str = "") -> tuple[dict, Path]:
    """Check the settings (named by their flags), run :func:`compare_rules`, write ``rules.json``
    and ``rules.md`` to ``out_dir``; returns (the result with its meta, the markdown's path).

    Raises:
        ConfigError: a bad setting (one line naming the flag).
    """
    import math

    from elastic_ring.errors import ConfigError
    from elastic_ring.experiment.cluster_sim import check_sim_settings, parse_seeds
    from elastic_ring.sim.api import SimConfig
    from elastic_ring.sim.workload import load_workload, with_rule

    if not (global_batch >= 0 and math.isfinite(global_batch)):
        raise ConfigError(f"--compare-rules: the global batch must be a number of samples >= 0, got {global_batch:g}")
    levels, strats, overhead = check_sim_settings(gpus, seeds, n_jobs, min_hours, max_hours, resize_overhead,
                                                  contention, strategies)
    evals = parse_seeds(eval_seeds, "--eval-seeds") if eval_seeds else list(range(seeds))
    wls = [load_workload(w) for w in (workloads or ("resnet110-cifar10",))]
    for w in wls:
        try:
            with_rule(w, "constant-batch", global_batch)
        except ConfigError as e:
            raise ConfigError(f"--compare-rules: {e}") from None
    base = dict(gpus=gpus, jobs=n_jobs, min_hours_at_8=min_hours, max_hours_at_8=max_hours,
                resize_overhead_s=overhead, remaining=remaining)
    SimConfig(contention=1.0, workloads=tuple(w.name for w in wls), **base)  # validate before the runs
    result = compare_rules(levels, evals, strats, base, wls, global_batch, overhead)
    meta = {"gpus": gpus, "jobs": n_jobs, "seeds": evals, "levels": {lv: rho for lv, rho in levels},
            "strategies": strats, "workloads": [w.name for w in wls],
            "global_batch": {w.name: with_rule(w, "constant-batch", global_batch).global_batch for w in wls},
            "resize_overhead_s": overhead, "remaining": remaining, "command": command,
            "model": "constant-batch step t(w) = ceil(M/w)·T(1) + (T(w) - T(1)), T the workload's Eq. 5 step "
                     "(elastic_ring/perfmodel/accumulated.py); no accuracy cost under either rule"}
    try:
        md = write(Path(out_dir), dict(meta, global_batch=min(meta["global_batch"].values())), result, levels, strats)
    except OSError as e:
        raise ConfigError(f"--out: cannot write {out_dir}: {e}") from None
    return {"meta": meta, **result}, md
