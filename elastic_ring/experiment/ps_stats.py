"""The Table I experiment's numbers (:mod:`elastic_ring.experiment.ps_sync`), pure functions: a
run's times and updates to the targets from its events (:func:`summarise_run`), the seed-by-seed
ratios with a percentile bootstrap interval (:func:`paired_ratio`), the per-heterogeneity table
(:func:`aggregate`) and the verdicts against the paper's Table I (:data:`PAPER_TABLE1`,
:func:`claim`, :func:`verdict`, :func:`direction`).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from elastic_ring.events.api import Event, as_event
from elastic_ring.experiment.ps_design import Design
from elastic_ring.ps.api import PSConfig
from elastic_ring.ps.events import PSAccuracy, PSController, PSFinished, PSLaunch, PSPush, PSWorkerSummary


# Table I of arXiv 1908.11848 (ResNet-110 / CIFAR-100, GTX 1060 + GTX 1080 Ti): seconds to test
# accuracy 0.67, the column every paradigm reached. Keyed by (sync, staleness).
PAPER_TABLE1 = {("bsp", ""): 6159.2, ("asp", ""): 2993.1, ("ssp", "3"): 5678.2, ("ssp", "6"): 5703.8,
                ("ssp", "15"): 5564.9, ("dssp", "3:15"): 3016.4}


# ------------------------------------------------------------------------------------- statistics


def _first_at_targets(events: Sequence[Event | Mapping[str, Any]], targets: Sequence[float],
                      field: str) -> dict[str, Any]:
    """``field`` of the first evaluation at or above each target (None: never reached)."""
    acc = sorted((e.t, getattr(e, field), e.test_accuracy) for e in map(as_event, events) if isinstance(e, PSAccuracy))
    out = {}
    for tgt in targets:
        hit = [x for _, x, a in acc if a >= tgt - 1e-12]
        out[f"{tgt:g}"] = hit[0] if hit else None
    return out


def time_to_targets(events: Sequence[Event | Mapping[str, Any]], targets: Sequence[float]) -> dict[str, float | None]:
    """Seconds (since the server started) of the first evaluation at or above each target."""
    return _first_at_targets(events, targets, "t")


def updates_to_targets(events: Sequence[Event | Mapping[str, Any]], targets: Sequence[float]) -> dict[str, int | None]:
    """Server version (applied pushes) at the first evaluation at or above each target."""
    return _first_at_targets(events, targets, "version")


def bootstrap_ci(log_ratios: Sequence[float], n_boot: int = 5000, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float, float]:
    """(geometric mean, lower, upper): percentile bootstrap over the seeds of mean log ratio."""
    x = np.asarray(log_ratios, dtype=float)
    if x.size == 0:
        return math.nan, math.nan, math.nan
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(axis=1)
    a = (1 - level) / 2
    return float(np.exp(x.mean())), float(np.exp(np.quantile(means, a))), float(np.exp(np.quantile(means, 1 - a)))


def paired_ratio(x: Sequence[float | None], ref: Sequence[float | None], budget_x: float, budget_ref: float,
                 n_boot: int = 5000, seed: int = 0) -> dict[str, Any]:
    """Seed-by-seed ratio x/ref with a bootstrap CI. A None (never reached) counts as its budget
    (a lower bound of its time) and is reported in ``censored``; a seed where both are None is dropped."""
    logs, per_seed, censored = [], [], 0
    for a, b in zip(x, ref):
        if a is None and b is None:
            per_seed.append(None)
            continue
        censored += (a is None) + (b is None)
        r = (budget_x if a is None else a) / max(budget_ref if b is None else b, 1e-9)
        per_seed.append(r)
        logs.append(math.log(max(r, 1e-9)))
    g, lo, hi = bootstrap_ci(logs, n_boot, seed)
    return {"n": len(logs), "censored": censored, "geomean": g, "lo": lo, "hi": hi, "per_seed": per_seed}


def claim(paper_ratio: float, margin: float) -> str:
    """The paper's claim read from its ratio: 'faster', 'slower' or 'as fast' (within the margin)."""
    if paper_ratio < 1 / margin:
        return "faster"
    if paper_ratio > margin:
        return "slower"
    return "as fast"


def verdict(lo: float, hi: float, paper_ratio: float, margin: float) -> str:
    """'reproduce' (CI inside the claim's region), 'contradict' (wholly outside) or 'cannot tell'."""
    if math.isnan(lo) or math.isnan(hi):
        return "cannot tell"
    c = claim(paper_ratio, margin)
    region = {"faster": (0.0, 1 / margin), "slower": (margin, math.inf), "as fast": (1 / margin, margin)}[c]
    if region[0] <= lo and hi <= region[1]:
        return "reproduce"
    if hi < region[0] or lo > region[1]:
        return "contradict"
    return "cannot tell"


def direction(lo: float, hi: float, paper_ratio: float, margin: float) -> str:
    """For a 'faster'/'slower' claim: is our effect significantly on the paper's side of 1 ('same'),
    on the other side ('opposite'), or neither ('unclear')? '-' for an 'as fast' claim."""
    c = claim(paper_ratio, margin)
    if c == "as fast" or math.isnan(lo):
        return "-"
    if (c == "faster" and hi < 1) or (c == "slower" and lo > 1):
        return "same"
    if (c == "faster" and lo > 1) or (c == "slower" and hi < 1):
        return "opposite"
    return "unclear"


# ----------------------------------------------------------------------------------------- per run


def summarise_run(events: Sequence[Event | Mapping[str, Any]], targets: Sequence[float]) -> dict[str, Any]:
    events = [as_event(e) for e in events]
    fin = next(e for e in events if isinstance(e, PSFinished))
    summ = sorted((e for e in events if isinstance(e, PSWorkerSummary)), key=lambda e: e.worker)
    pushes = [e for e in events if isinstance(e, PSPush)]
    launch = next((e for e in events if isinstance(e, PSLaunch)), None)
    cfg = (launch.config if launch is not None else None) or {}
    base = float(cfg.get("base_step_s") or 0.0)
    compute = np.array([p.compute_s for p in pushes]) if pushes else np.zeros(0)
    virtual = fin.clock == "virtual"  # the step length is emulated: nothing to overrun
    over = 0 if virtual else sum(1 for p in pushes if (p.target_s or 0) > 0 and p.compute_s > p.target_s)
    ratio = compute / base if base > 0 and compute.size else np.zeros(0)
    fast = min(summ, key=lambda s: (s.slowdown, s.worker)) if summ else None
    ctl = [e for e in events if isinstance(e, PSController)]
    return {
        "time_to": time_to_targets(events, targets),
        "updates_to": updates_to_targets(events, targets),
        "budget_s": float(cfg.get("time_budget_s") or fin.wall_s),
        "wall_s": fin.wall_s,
        "clock": fin.clock,
        "real_s": fin.real_s,
        "updates": fin.version,
        "best_accuracy": fin.best_accuracy,
        "max_release_gap": fin.max_release_gap,
        "max_staleness": fin.max_staleness,
        "mean_staleness": float(np.mean([p.staleness for p in pushes])) if pushes else 0.0,
        "compute_base": {"median": float(np.median(ratio)) if ratio.size else None,
                         "p99": float(np.quantile(ratio, 0.99)) if ratio.size else None,
                         "max": float(ratio.max()) if ratio.size else None},
        "overruns": over,
        "pushes": len(pushes),
        # transfer + apply per push, as the workers saw it (blocked minus held): the load-dependent rest
        "overhead_per_push_s": float(np.mean([(s.blocked_s - s.held_s) / max(s.pushes, 1) for s in summ]))
        if summ else None,
        "fast_held_frac": fast.held_s / max(fin.wall_s, 1e-9) if fast else None,
        "mean_allowance": float(np.mean([c.r for c in ctl])) if ctl else None,
        "accuracy_curve": [(e.t, e.test_accuracy) for e in events if isinstance(e, PSAccuracy)],
    }


# ---------------------------------------------------------------------------------------- aggregate


def _q(xs: Sequence[float], q: float) -> float | None:
    return float(np.quantile(xs, q)) if len(xs) else None


def aggregate(design: Design, runs: dict[tuple[str, str], dict[int, dict]]) -> dict[str, Any]:
    """Per heterogeneity: rows (paradigm medians, paired ratios to the references) and verdicts."""
    primary = f"{design.targets[0]:g}"
    out: dict[str, Any] = {"design": design.source, "seeds": list(design.seeds), "targets": list(design.targets),
                           "references": list(design.references), "margin": design.margin, "hets": []}
    for h in design.hets:
        seeds = [s for s in design.seeds if all(s in runs.get((h, p), {}) for p in design.paradigms)]
        het: dict[str, Any] = {"name": h, "slowdown": list(design.cell(h, design.paradigms[0]).cfg.slowdowns),
                               "paired_seeds": seeds, "rows": [], "verdicts": []}
        for p in design.paradigms:
            per = runs.get((h, p), {})
            row: dict[str, Any] = {"paradigm": p, "seeds": sorted(per), "time_to": {}, "updates_to": {}, "ratio_to": {}}
            for tgt in design.targets:
                k = f"{tgt:g}"
                ts = [per[s]["time_to"][k] for s in sorted(per)]
                hit = [t for t in ts if t is not None]
                row["time_to"][k] = {"per_seed": ts, "reached": len(hit), "runs": len(ts), "median": _q(hit, 0.5),
                                     "q25": _q(hit, 0.25), "q75": _q(hit, 0.75)}
                us = [per[s]["updates_to"][k] for s in sorted(per)]
                row["updates_to"][k] = {"per_seed": us, "median": _q([u for u in us if u is not None], 0.5)}
            for ref in design.references:
                rr = runs.get((h, ref), {})
                row["ratio_to"][ref] = {}
                for tgt in design.targets:
                    k = f"{tgt:g}"
                    row["ratio_to"][ref][k] = paired_ratio(
                        [per[s]["time_to"][k] for s in seeds], [rr[s]["time_to"][k] for s in seeds],
                        design.cell(h, p).cfg.time_budget_s, design.cell(h, ref).cfg.time_budget_s,
                        design.bootstrap, seed=len(row["ratio_to"]))
            vals = list(per.values())
            cb = [r["compute_base"]["max"] for r in vals if r["compute_base"]["max"] is not None]
            row["compute_base_p99"] = max((r["compute_base"]["p99"] for r in vals if r["compute_base"]["p99"] is not None), default=None)
            row["compute_base_median"] = _q([r["compute_base"]["median"] for r in vals if r["compute_base"]["median"] is not None], 0.5)
            row["compute_base_max"] = max(cb, default=None)
            row["overruns"] = sum(r["overruns"] for r in vals)
            row["pushes"] = sum(r["pushes"] for r in vals)
            row["fast_held_frac"] = _q([r["fast_held_frac"] for r in vals if r["fast_held_frac"] is not None], 0.5)
            row["max_release_gap"] = max((r["max_release_gap"] for r in vals), default=None)
            row["max_staleness"] = max((r["max_staleness"] for r in vals), default=None)
            row["best_accuracy"] = _q([r["best_accuracy"] for r in vals if r["best_accuracy"] is not None], 0.5)
            row["updates_per_s"] = _q([r["updates"] / r["wall_s"] for r in vals], 0.5)
            row["overhead_per_push_s"] = _q([r["overhead_per_push_s"] for r in vals if r["overhead_per_push_s"] is not None], 0.5)
            het["rows"].append(row)
        # the paper's claims are about a heterogeneous cluster: equal speeds are a control, not a test
        het["control"] = len(set(het["slowdown"])) == 1
        het["verdicts"] = [] if het["control"] else verdicts(design, het, primary)
        out["hets"].append(het)
    return out


def _paper_key(cfg: PSConfig) -> tuple[str, str]:
    return (cfg.sync, cfg.staleness)


def verdicts(design: Design, het: dict, target: str) -> list[dict]:
    """Each paradigm the paper measured against each reference the paper measured (no duplicates)."""
    rows = {r["paradigm"]: r for r in het["rows"]}
    paper = {p: PAPER_TABLE1.get(_paper_key(design.cell(het["name"], p).cfg)) for p in design.paradigms}
    out, seen = [], set()
    for ref in design.references:
        for p in design.paradigms:
            if p == ref or paper[p] is None or paper[ref] is None or frozenset((p, ref)) in seen:
                continue
            seen.add(frozenset((p, ref)))
            pr = paper[p] / paper[ref]
            r = rows[p]["ratio_to"][ref][target]
            out.append({"paradigm": p, "reference": ref, "paper_ratio": pr, "claim": claim(pr, design.margin),
                        "ours": r["geomean"], "lo": r["lo"], "hi": r["hi"], "n": r["n"], "censored": r["censored"],
                        "verdict": verdict(r["lo"], r["hi"], pr, design.margin),
                        "direction": direction(r["lo"], r["hi"], pr, design.margin),
                        "paper_in_ci": bool(r["lo"] <= pr <= r["hi"])})
    return out
