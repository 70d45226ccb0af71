"""The Table I experiment of arXiv 1908.11848 at CPU scale, designed to answer its question: on a
heterogeneous cluster, which paradigm reaches the target accuracy first, and by how much?

The design (``configs/dssp_table1.yaml``)::

    out: results/ps_table1
    seeds: [0, 1, ..., 9]          # paired: a seed gives every paradigm the same weights, data, noise
    targets: [0.90, 0.95]          # the first is the primary target (ratios, verdicts)
    references: ["SSP s=3", ASP]   # every paradigm's time is divided by these, seed by seed
    parallel: 2                    # jobs at a time (honest only if the compute stays under the base step)
    base: {PSConfig keys shared by every run; base_step_s well above the compute}
    heterogeneity: [{name: "1:2", slowdown: [1, 1, 2, 2], time_budget_s: 30}, ...]
    paradigms: [{name: BSP, sync: bsp}, {name: "SSP s=3", sync: ssp, staleness: 3}, ...]

Unknown keys are errors (:class:`DesignSpec`, read like every config: :mod:`elastic_ring.config.base`);
``--set KEY=VALUE`` changes a design key, ``--set base.KEY=VALUE`` a ps setting of every run.

Every step of worker i lasts ``base_step_s * slowdown[i] * (1 + noise * z)`` (the compute is padded
by sleeping, see :mod:`elastic_ring.ps.worker`), so the speeds do not depend on the machine's load
as long as the compute stays under that target; each run records the compute/base ratio and the
steps where it did not (overruns). With ``eval_deferred`` the server never pauses to evaluate.

Statistics (pure functions, unit-tested): time to a target is the server time of the first
evaluation at or above it; a run that never got there is *censored* at its budget (its true time is
longer). The ratio of paradigm X to reference R is taken seed by seed (paired), summarised by the
geometric mean, with a 95% percentile bootstrap interval over seeds. A paper comparison is read
from the paper's ratio: below ``1/margin`` it claims "faster", above ``margin`` "slower", otherwise
"about as fast"; we *reproduce* it when the whole interval lies in that region, *contradict* it when
the interval lies wholly outside, and *cannot tell* otherwise.

Outputs in ``out``: ``runs/<heterogeneity>/<paradigm>-seed<k>/`` (events.jsonl, meta.json: load
average and wall time), ``table1.json``, ``table1.md``, ``accuracy_vs_time.png``. A run whose
events hold ``ps_finished`` is reused, so an interrupted experiment resumes.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Sequence

import numpy as np
from pydantic import Field, field_validator, model_validator

from elastic_ring.config.base import ConfigModel, Float, FloatTuple, Int, IntTuple, Section, Str, build, load
from elastic_ring.errors import ConfigError, ElasticRingError
from elastic_ring.events.api import Event, as_event, read_events
from elastic_ring.ps.api import PSConfig
from elastic_ring.ps.events import PSAccuracy, PSController, PSFinished, PSLaunch, PSPush, PSWorkerSummary

# Table I of arXiv 1908.11848 (ResNet-110 / CIFAR-100, GTX 1060 + GTX 1080 Ti): seconds to test
# accuracy 0.67, the column every paradigm reached. Keyed by (sync, staleness).
PAPER_TABLE1 = {("bsp", ""): 6159.2, ("asp", ""): 2993.1, ("ssp", "3"): 5678.2, ("ssp", "6"): 5703.8,
                ("ssp", "15"): 5564.9, ("dssp", "3:15"): 3016.4}


def _named(kind: str, entries: list[dict[str, Any]], required: tuple[str, ...]) -> list[dict[str, Any]]:
    if not entries:
        raise ValueError("must be a non-empty list")
    for i, e in enumerate(entries):
        if any(k not in e for k in required):
            raise ValueError(f"{kind} {i + 1} needs {' and '.join(required)}")
    if len({slug(str(e["name"])) for e in entries}) != len(entries):
        raise ValueError("names must be distinct")
    return entries


class DesignSpec(ConfigModel):
    """The design file as written (module docstring); :func:`load_design` expands it into a
    :class:`Design`. ``base``, each ``heterogeneity`` and each ``paradigms`` entry hold
    :class:`PSConfig` keys (besides ``name``), merged in that order into every cell's config."""

    out: Str = "results/ps_table1"
    seeds: IntTuple = (0,)
    targets: FloatTuple
    references: tuple[Str, ...] = ()
    parallel: Int = Field(1, ge=1)
    bootstrap: Int = Field(5000, ge=100)
    margin: Float = Field(1.25, gt=1)
    base: Section = {}
    heterogeneity: list[dict[str, Any]] = [{"name": "base"}]
    paradigms: list[dict[str, Any]]
    engine: Literal["mpi", "inprocess"] = "mpi"

    @field_validator("seeds")
    @classmethod
    def _distinct(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v or len(set(v)) != len(v):
            raise ValueError(f"need at least one seed, each once, got {list(v)}")
        return v

    @field_validator("targets")
    @classmethod
    def _fractions(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if not v or any(not 0 < t <= 1 for t in v):
            raise ValueError(f"need accuracies in (0, 1], got {list(v)}")
        return v

    @field_validator("heterogeneity")
    @classmethod
    def _hets(cls, v: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return _named("entry", v, ("name",))

    @field_validator("paradigms")
    @classmethod
    def _paradigms(cls, v: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return _named("entry", v, ("name", "sync"))

    @model_validator(mode="after")
    def _references(self) -> "DesignSpec":
        missing = sorted(set(self.references) - {str(p["name"]) for p in self.paradigms})
        if missing:
            raise ValueError(f"reference(s) {', '.join(missing)} not among the paradigms")
        return self


@dataclass(frozen=True)
class Cell:
    """One (heterogeneity, paradigm) of the design; per seed: ``cfg.replace(seed=...)``."""

    het: str
    paradigm: str
    cfg: PSConfig


@dataclass(frozen=True)
class Design:
    """A :class:`DesignSpec` expanded: every cell's :class:`PSConfig` built, seeds and paradigms
    narrowed by the command line."""

    out: Path
    seeds: tuple[int, ...]
    targets: tuple[float, ...]
    paradigms: tuple[str, ...]
    hets: tuple[str, ...]
    cells: dict[tuple[str, str], Cell]
    references: tuple[str, ...]
    parallel: int
    bootstrap: int
    margin: float
    source: str
    engine: str = "mpi"

    def cell(self, het: str, paradigm: str) -> Cell:
        return self.cells[(het, paradigm)]

    def run_dir(self, het: str, paradigm: str, seed: int) -> Path:
        return self.out / "runs" / slug(het) / f"{slug(paradigm)}-seed{seed}"


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower()


def load_design(path: str | Path, overrides: Sequence[str] | Mapping[str, Any] = (),
                seeds: int | None = None, only: tuple[str, ...] = ()) -> Design:
    """Read and validate a design, then build every cell's config.

    Args:
        overrides: ``--set`` of design keys (``parallel=3``, ``seeds=[0,1]``, ``out=...``) or of
            the shared ps settings (``base.time_budget_s=10``).
        seeds: keep only the first N seeds. only: keep only these paradigm names.

    Raises:
        ConfigError: the design or a cell's config is invalid (one line naming the cell).
    """
    spec = load(DesignSpec, path, overrides)
    source = f"{path} + overrides" if overrides else str(path)
    seed_list = spec.seeds
    if seeds is not None:
        if seeds < 1:
            raise ConfigError(f"--seeds must be >= 1, got {seeds}")
        seed_list = seed_list[:seeds]
    cells = {}
    for h in spec.heterogeneity:
        for p in spec.paradigms:
            values = spec.base | {k: v for k, v in h.items() if k != "name"} | {k: v for k, v in p.items() if k != "name"}
            src = f"{source} heterogeneity {h['name']!r} paradigm {p['name']!r}"
            cfg = build(PSConfig, values, src)
            if spec.engine == "inprocess" and cfg.clock != "virtual":
                raise ConfigError(f"{src}: engine inprocess needs clock: virtual")
            cells[(str(h["name"]), str(p["name"]))] = Cell(str(h["name"]), str(p["name"]), cfg)
    names = tuple(str(p["name"]) for p in spec.paradigms)
    if only:
        missing = sorted(set(only) - set(names))
        if missing:
            raise ConfigError(f"--only: no paradigm named {', '.join(missing)} (have: {', '.join(names)})")
        names = tuple(n for n in names if n in only)
    return Design(Path(spec.out), seed_list, spec.targets, names, tuple(str(h["name"]) for h in spec.heterogeneity),
                  cells, spec.references, spec.parallel, spec.bootstrap, spec.margin, str(path), spec.engine)


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


# ----------------------------------------------------------------------------------------- markdown


def _f(x: float | None, d: int = 1) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{d}f}"


def _ratio_cell(r: dict) -> str:
    if r["n"] == 0:
        return "-"
    c = f" ({r['censored']} cens.)" if r["censored"] else ""
    return f"{r['geomean']:.2f} [{r['lo']:.2f}, {r['hi']:.2f}]{c}"


def model_label(cfg: PSConfig) -> str:
    return f"an MLP with {cfg.width} hidden units" if cfg.model == "mlp" else f"ResNet-{cfg.depth} width {cfg.width}"


def markdown(table: dict[str, Any], design: Design) -> str:
    tg = f"{table['targets'][0]:g}"
    refs = table["references"]
    lines = []
    for het in table["hets"]:
        cfg = design.cell(het["name"], design.paradigms[0]).cfg
        lines.append(f"**Heterogeneity {het['name']}** (slowdown {het['slowdown']}, budget {cfg.time_budget_s:g} s, "
                     f"{len(het['paired_seeds'])} paired seeds)\n")
        head = (["paradigm", f"time to {tg} (s), median [IQR]", f"updates to {tg}"]
                + [f"÷ {r} [95% CI]" for r in refs]
                + ["fast held", "max gap", "compute/base p99"])
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in het["rows"]:
            tt = r["time_to"][tg]
            reach = "" if tt["reached"] == tt["runs"] else f" ({tt['reached']}/{tt['runs']})"
            t = "never" if tt["reached"] == 0 else f"{tt['median']:.1f} [{tt['q25']:.1f}, {tt['q75']:.1f}]{reach}"
            cells = [r["paradigm"], t, _f(r["updates_to"][tg]["median"], 0)]
            cells += [_ratio_cell(r["ratio_to"][ref][tg]) for ref in refs]
            cells += [f"{100 * r['fast_held_frac']:.0f} %" if r["fast_held_frac"] is not None else "-",
                      str(r["max_release_gap"]), _f(r["compute_base_p99"], 2)]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    lines.append(f"**Paper comparisons** (time to {tg}; the paper's ratio from its Table I at 0.67; claim region: "
                 f"ratio < {1 / table['margin']:.2f} faster, > {table['margin']:.2f} slower, else as fast)\n")
    head = ["heterogeneity", "comparison", "paper", "claim", "ours [95% CI]", "verdict", "direction",
            "paper's ratio in CI"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for het in table["hets"]:
        for v in het["verdicts"]:
            c = f" ({v['censored']} cens.)" if v["censored"] else ""
            lines.append(f"| {het['name']} | {v['paradigm']} ÷ {v['reference']} | {v['paper_ratio']:.2f} | {v['claim']} | "
                         f"{_f(v['ours'], 2)} [{_f(v['lo'], 2)}, {_f(v['hi'], 2)}]{c} | **{v['verdict']}** | "
                         f"{v['direction']} | {'yes' if v['paper_in_ci'] else 'no'} |")
    controls = [h["name"] for h in table["hets"] if h.get("control")]
    if controls:
        lines.append(f"\nNo verdicts for {', '.join(controls)}: equal speeds are a control (the paper's claims are "
                     "about a heterogeneous cluster). Direction: whether our interval lies wholly on the paper's side "
                     "of 1 (same), wholly on the other (opposite), or neither (unclear).")
    b = design.cell(design.hets[0], design.paradigms[0]).cfg
    cb = [r for het in table["hets"] for r in het["rows"]]
    over = sum(r["overruns"] for r in cb)
    pushes = sum(r["pushes"] for r in cb)
    lines.append("")
    lines.append(
        f"Times: seconds from the server's start to the first evaluation at or above {tg} (median and "
        f"interquartile range over the seeds that reached it; (n/N): n of N did). Ratios: geometric mean of "
        f"the per-seed ratio (paired seeds), 95% percentile bootstrap over seeds; a run that never reached "
        f"the target counts as its budget (cens.). {b.workers} workers, base step {b.base_step_s:g} s, noise "
        f"{b.noise:g}, {model_label(b)} on {b.dataset}, batch {b.batch_size}, lr {b.lr:g}, "
        f"momentum {b.momentum:g}, evaluation every {b.eval_every_s:g} s, stop at accuracy {b.stop_accuracy:g}, "
        f"clock {b.clock}"
        + (" (emulated seconds: every step lasts exactly its drawn length, pushes handled in that order; "
           "the numbers do not depend on the machine's load). " if b.clock == "virtual" else ". ")
        + "Compute/base: the real compute of a step divided by the base step; median "
        f"{_f(_q([r['compute_base_median'] for r in cb if r['compute_base_median'] is not None], 0.5), 3)}, "
        f"largest p99 {_f(max((r['compute_base_p99'] or 0) for r in cb), 2)}, max "
        f"{_f(max((r['compute_base_max'] or 0) for r in cb), 2)}"
        + (" (on the virtual clock this costs real time only)." if b.clock == "virtual" else
           f"; steps whose compute exceeded their padded target: {over} of {pushes}."))
    if table.get("timing"):
        tm = table["timing"]
        lines.append(f"\n{tm['runs']} runs, {tm['parallel']} at a time: {tm['span_s'] / 60:.1f} min of wall time from "
                     f"the first start to the last end (sum of the runs' wall times {tm['runs_wall_s'] / 60:.1f} min, "
                     f"start-up and evaluation included); load average {tm['load_min']:.1f} to "
                     f"{tm['load_max']:.1f} at the runs' starts.")
    return "\n".join(lines) + "\n"


def plot(design: Design, runs: dict[tuple[str, str], dict[int, dict]], path: Path) -> None:
    """Accuracy against time per heterogeneity: per paradigm the median over seeds (accuracy at t is
    the last evaluation at or before t) and a band from the 25th to the 75th percentile."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, axes = plt.subplots(1, len(design.hets), figsize=(5.2 * len(design.hets), 4.4), squeeze=False, sharey=True)
    for ax, h in zip(axes[0], design.hets):
        ends = [r["accuracy_curve"][-1][0] for p in design.paradigms for r in runs.get((h, p), {}).values()
                if r["accuracy_curve"]]
        tmax = max(ends, default=design.cell(h, design.paradigms[0]).cfg.time_budget_s)
        grid = np.linspace(0, tmax, 300)
        for i, p in enumerate(design.paradigms):
            curves = []
            for r in runs.get((h, p), {}).values():
                if not r["accuracy_curve"]:
                    continue
                t, a = map(np.asarray, zip(*sorted(r["accuracy_curve"])))
                idx = np.searchsorted(t, grid, side="right") - 1
                curves.append(np.where(idx >= 0, a[np.clip(idx, 0, None)], np.nan))
            if not curves:
                continue
            c = np.array(curves)
            col = colors[i % len(colors)]
            ax.plot(grid, np.nanmedian(c, axis=0), color=col, lw=1.4, label=p)
            ax.fill_between(grid, np.nanquantile(c, 0.25, axis=0), np.nanquantile(c, 0.75, axis=0), color=col, alpha=0.15)
        for tgt in design.targets:
            ax.axhline(tgt, color="grey", ls=":", lw=0.8)
        ax.set_title(f"heterogeneity {h}")
        ax.set_xlabel("seconds since the server started")
        lo = min(design.targets) - 0.15
        ax.set_ylim(max(0.0, lo), min(1.0, max(design.targets) + 0.03))
    axes[0][0].set_ylabel("test accuracy (median, IQR band over seeds)")
    fig.suptitle("Test accuracy against time; a run that stops at the highest target keeps its last value", fontsize=9)
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------- run


def _reusable(design: Design, h: str, p: str, s: int) -> bool:
    """A finished run of exactly this cell's config (a changed design reruns its runs)."""
    rdir = design.run_dir(h, p, s)
    try:
        saved = json.loads((rdir / "ps_config.json").read_text())
    except (OSError, ValueError):
        return False
    want = json.loads(json.dumps(design.cell(h, p).cfg.replace(seed=s).to_dict()))
    return saved == want and bool(read_events(rdir / "events.jsonl", PSFinished))


def _run_batch(design: Design, group: list[tuple[str, str, int]], run_job: Callable | None,
               echo: Callable[[str], None], failed: list[str]) -> None:
    """Run the jobs of one seed (one mpirun or process for all); a failed job goes to ``failed``."""
    from elastic_ring.ps.runner import run_batch

    specs = []
    for h, p, s in group:
        rdir = design.run_dir(h, p, s)
        if (rdir / "events.jsonl").exists():
            (rdir / "events.jsonl").unlink()
        rdir.mkdir(parents=True, exist_ok=True)
        cfg = design.cell(h, p).cfg.replace(seed=s)
        (rdir / "ps_config.json").write_text(json.dumps(cfg.to_dict(), indent=1))  # what reuse compares
        specs.append((cfg, rdir))
    load0, t0, u0 = os.getloadavg()[0], time.monotonic(), time.time()
    if run_job is None:
        results = run_batch(specs, engine=design.engine)
    else:
        results = []
        for cfg, rdir in specs:
            try:
                results.append(run_job(cfg, rdir))
            except ElasticRingError as e:
                results.append(e)
    share = (time.monotonic() - t0) / len(group)
    for (h, p, s), (cfg, rdir), res in zip(group, specs, results):
        if isinstance(res, Exception):
            failed.append(f"{h} {p} seed {s}: {res}")
            echo(f"  FAILED {h} {p} seed {s}: {res}")
            continue
        (rdir / "meta.json").write_text(json.dumps({"load_start": load0, "load_end": os.getloadavg()[0],
                                                    "job_wall_s": share, "start_unix": u0,
                                                    "end_unix": time.time()}))
        r = summarise_run(read_events(rdir / "events.jsonl"), design.targets)
        tt = ", ".join(f"{k}: {'never' if v is None else f'{v:.1f}s'}" for k, v in r["time_to"].items())
        echo(f"  {h} {p} seed {s}: {tt}; {r['updates']} updates; compute/base p99 "
             f"{_f(r['compute_base']['p99'], 2)}; max gap {r['max_release_gap']}; real {_f(r['real_s'], 0)} s")


def _finished_runs(design: Design, jobs: list[tuple[str, str, int]]
                   ) -> tuple[dict[tuple[str, str], dict[int, dict]], dict[str, Any]]:
    """The summaries of the finished runs per cell and seed, and the timing of the runs."""
    runs: dict[tuple[str, str], dict[int, dict]] = {}
    loads, walls, spans = [], [], []
    for h, p, s in jobs:
        rdir = design.run_dir(h, p, s)
        if _reusable(design, h, p, s):
            runs.setdefault((h, p), {})[s] = summarise_run(read_events(rdir / "events.jsonl"), design.targets)
            if (rdir / "meta.json").exists():
                m = json.loads((rdir / "meta.json").read_text())
                loads.append(m["load_start"])
                walls.append(m["job_wall_s"])
                spans += [m["start_unix"], m["end_unix"]]
    timing = {"runs": sum(len(v) for v in runs.values()), "parallel": design.parallel,
              "runs_wall_s": float(sum(walls)), "span_s": (max(spans) - min(spans)) if spans else 0.0,
              "load_min": min(loads, default=0.0), "load_max": max(loads, default=0.0)}
    return runs, timing


def run_experiment(design: Design, run: bool = True, echo: Callable[[str], None] = print,
                   run_job: Callable | None = None) -> dict[str, Any]:
    """Run (or reuse) every job, then write table1.json, table1.md and accuracy_vs_time.png.

    The jobs of one seed run one after the other in one mpirun or process (saving the processes'
    start-up), ``design.parallel`` such batches at a time. ``run_job(cfg, run_dir)``
    replaces the launcher (tests); a failed job is reported and left out (its seed drops from the
    pairs)."""
    design.out.mkdir(parents=True, exist_ok=True)
    # Seed-major order: every cell of seed 0, then of seed 1, ...
    jobs = [(h, p, s) for s in design.seeds for h in design.hets for p in design.paradigms]
    todo = [j for j in jobs if not _reusable(design, *j)]
    groups: dict[int, list[tuple[str, str, int]]] = {}
    for h, p, s in todo:  # one batch per seed: the processes start once for all its runs
        groups.setdefault(s, []).append((h, p, s))
    failed: list[str] = []
    if run and todo:
        echo(f"running {len(todo)} of {len(jobs)} jobs in {len(groups)} batches, {design.parallel} at a time "
             f"-> {design.out / 'runs'}")
        with ThreadPoolExecutor(max_workers=design.parallel) as pool:
            list(pool.map(lambda g: _run_batch(design, g, run_job, echo, failed), groups.values()))
    runs, timing = _finished_runs(design, jobs)
    if not runs:
        raise ConfigError(f"no finished runs in {design.out / 'runs'}")
    table = aggregate(design, runs)
    table["timing"] = timing
    table["failed"] = failed
    table["runs"] = {f"{h} | {p}": {str(s): {k: v for k, v in r.items() if k != "accuracy_curve"} for s, r in per.items()}
                     for (h, p), per in runs.items()}
    md = markdown(table, design)
    (design.out / "table1.json").write_text(json.dumps(table, indent=1, default=str))
    (design.out / "table1.md").write_text(md)
    plot(design, runs, design.out / "accuracy_vs_time.png")
    return {"table": table, "markdown": md}
