"""The Table I experiment of arXiv 1908.11848 at CPU scale: every paradigm x every seed with
heterogeneous workers; time to each target accuracy (mean +- std over seeds), waiting time, gaps.

The design (``configs/dssp_table1.yaml``)::

    out: results/ps_table1
    seeds: [0, 1, 2]
    targets: [0.90, 0.95]
    base: {PSConfig keys shared by every run}
    paradigms: [{name: BSP, sync: bsp}, {name: "SSP s=3", sync: ssp, staleness: 3}, ...]

Outputs in ``out``: ``runs/<paradigm>-seed<k>/events.jsonl`` (one job each), ``table1.json``,
``table1.md``, ``accuracy_vs_time.png``, ``waiting_time.png``. A run whose events already hold
``ps_finished`` is reused.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from elastic_ring.config.api import read_yaml
from elastic_ring.errors import ConfigError
from elastic_ring.events.api import read_events
from elastic_ring.ps.api import PSConfig, config_from_dict


@dataclass(frozen=True)
class Paradigm:
    name: str
    cfg: PSConfig  # seed 0's config; per seed: cfg.replace(seed=...)


@dataclass(frozen=True)
class Design:
    out: Path
    seeds: tuple[int, ...]
    targets: tuple[float, ...]
    paradigms: tuple[Paradigm, ...]
    source: str


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower()


def load_design(path: str | Path, out: str | None = None, seeds: int | None = None,
                only: tuple[str, ...] = ()) -> Design:
    """Read and validate a design. Raises :class:`ConfigError` (one line) on any problem."""
    d = read_yaml(path)
    unknown = sorted(set(d) - {"out", "seeds", "targets", "base", "paradigms"})
    if unknown:
        raise ConfigError(f"{path}: unknown design key(s): {', '.join(unknown)}")
    base = d.get("base") or {}
    if not isinstance(base, dict):
        raise ConfigError(f"{path}: base must be a mapping of ps settings")
    try:
        seed_list = tuple(int(s) for s in d.get("seeds", [0]))
        targets = tuple(sorted(float(t) for t in d.get("targets", [])))
    except (TypeError, ValueError):
        raise ConfigError(f"{path}: seeds must be integers and targets numbers") from None
    if not seed_list or not targets or any(not 0 < t <= 1 for t in targets):
        raise ConfigError(f"{path}: need at least one seed and targets in (0, 1]")
    if seeds is not None:
        if seeds < 1:
            raise ConfigError(f"--seeds must be >= 1, got {seeds}")
        seed_list = seed_list[:seeds]
    raw = d.get("paradigms") or []
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{path}: paradigms must be a non-empty list")
    paradigms = []
    for i, p in enumerate(raw):
        if not isinstance(p, dict) or "name" not in p or "sync" not in p:
            raise ConfigError(f"{path}: paradigm {i + 1} needs a name and a sync")
        values = dict(base) | {k: v for k, v in p.items() if k != "name"}
        paradigms.append(Paradigm(str(p["name"]), config_from_dict(values, source=f"{path} paradigm {p['name']!r}")))
    names = [p.name for p in paradigms]
    if len(set(map(slug, names))) != len(names):
        raise ConfigError(f"{path}: paradigm names must be distinct")
    if only:
        missing = sorted(set(only) - set(names))
        if missing:
            raise ConfigError(f"--only: no paradigm named {', '.join(missing)} (have: {', '.join(names)})")
        paradigms = [p for p in paradigms if p.name in only]
    return Design(Path(out or d.get("out", "results/ps_table1")), seed_list, targets, tuple(paradigms), str(path))


# ----------------------------------------------------------------------------------------- analysis


def _first_at_targets(events: list[dict], targets: tuple[float, ...], field: str) -> dict[str, Any]:
    """``field`` of the first evaluation at or above each target (None: never reached)."""
    acc = [(e[field], e["test_accuracy"]) for e in events if e["kind"] == "ps_accuracy"]
    out = {}
    for tgt in targets:
        hit = [x for x, a in acc if a >= tgt - 1e-12]
        out[f"{tgt:g}"] = min(hit) if hit else None
    return out


def time_to_targets(events: list[dict], targets: tuple[float, ...]) -> dict[str, float | None]:
    """Seconds (since the server started) of the first evaluation at or above each target."""
    return _first_at_targets(events, targets, "t")


def updates_to_targets(events: list[dict], targets: tuple[float, ...]) -> dict[str, int | None]:
    """Server version (applied pushes) at the first evaluation at or above each target."""
    return _first_at_targets(events, targets, "version")


def summarise_run(events: list[dict], targets: tuple[float, ...]) -> dict[str, Any]:
    fin = next(e for e in events if e["kind"] == "ps_finished")
    summ = sorted((e for e in events if e["kind"] == "ps_worker_summary"), key=lambda e: e["worker"])
    pushes = [e for e in events if e["kind"] == "ps_push"]
    ctl = [e for e in events if e["kind"] == "ps_controller"]
    launch = next((e for e in events if e["kind"] == "ps_launch"), {})
    return {
        "config": launch.get("config"),
        "time_to": time_to_targets(events, targets),
        "updates_to": updates_to_targets(events, targets),
        "compute_per_push_s": float(np.mean([p["compute_s"] for p in pushes])) if pushes else None,
        "wall_s": fin["wall_s"],
        "updates": fin["version"],
        "final_accuracy": fin["test_accuracy"],
        "best_accuracy": fin["best_accuracy"],
        "max_release_gap": fin["max_release_gap"],
        "max_push_gap": fin["max_push_gap"],
        "max_staleness": fin["max_staleness"],
        "mean_staleness": float(np.mean([p["staleness"] for p in pushes])) if pushes else 0.0,
        "release_bound": fin["release_bound"],
        "workers": [{"worker": s["worker"], "slowdown": s["slowdown"], "pushes": s["pushes"],
                     "held_s": s["held_s"], "blocked_s": s["blocked_s"], "wall_s": s["wall_s"],
                     "held_frac": s["held_s"] / max(fin["wall_s"], 1e-9)} for s in summ],
        "controller_decisions": len(ctl),
        "mean_allowance": float(np.mean([c["r"] for c in ctl])) if ctl else None,
        "accuracy_curve": [(e["t"], e["test_accuracy"]) for e in events if e["kind"] == "ps_accuracy"],
    }


def _mean_std(xs: list[float]) -> tuple[float | None, float | None]:
    if not xs:
        return None, None
    return float(np.mean(xs)), float(np.std(xs, ddof=1)) if len(xs) > 1 else 0.0


def aggregate(design: Design, runs: dict[str, dict[int, dict]]) -> dict[str, Any]:
    rows = []
    for p in design.paradigms:
        per_seed = runs.get(p.name, {})
        row: dict[str, Any] = {"paradigm": p.name, "sync": p.cfg.sync, "staleness": p.cfg.staleness,
                               "seeds": sorted(per_seed), "time_to": {}}
        for tgt in design.targets:
            key = f"{tgt:g}"
            ts = [r["time_to"][key] for r in per_seed.values()]
            hit = [t for t in ts if t is not None]
            m, s = _mean_std(hit)
            row["time_to"][key] = {"per_seed": ts, "reached": len(hit), "runs": len(ts), "mean": m, "std": s,
                                   "median": float(np.median(hit)) if hit else None}
        row["updates_to"] = {}
        for tgt in design.targets:
            us = [r["updates_to"][f"{tgt:g}"] for r in per_seed.values()]
            row["updates_to"][f"{tgt:g}"] = {"per_seed": us, **dict(zip(("mean", "std"), _mean_std([u for u in us if u is not None])))}
        row["compute_per_push_s"] = _mean_std([r["compute_per_push_s"] for r in per_seed.values() if r["compute_per_push_s"]])
        fast = [min(r["workers"], key=lambda w: w["slowdown"]) for r in per_seed.values()]
        row["fast_held_frac"] = _mean_std([w["held_frac"] for w in fast])
        row["fast_pushes_per_s"] = _mean_std([w["pushes"] / w["wall_s"] for w in fast])
        row["updates_per_s"] = _mean_std([r["updates"] / r["wall_s"] for r in per_seed.values()])
        row["max_release_gap"] = max((r["max_release_gap"] for r in per_seed.values()), default=None)
        row["max_staleness"] = max((r["max_staleness"] for r in per_seed.values()), default=None)
        row["mean_staleness"] = _mean_std([r["mean_staleness"] for r in per_seed.values()])
        row["best_accuracy"] = _mean_std([r["best_accuracy"] for r in per_seed.values() if r["best_accuracy"] is not None])
        row["release_bound"] = next(iter(per_seed.values()))["release_bound"] if per_seed else None
        row["mean_allowance"] = _mean_std([r["mean_allowance"] for r in per_seed.values() if r["mean_allowance"] is not None])
        rows.append(row)
    return {"design": design.source, "seeds": list(design.seeds), "targets": list(design.targets), "rows": rows}


def _fmt(ms: tuple[float | None, float | None], digits: int = 1, pct: bool = False) -> str:
    m, s = ms
    if m is None:
        return "-"
    k = 100.0 if pct else 1.0
    return f"{m * k:.{digits}f} ± {s * k:.{digits}f}"


def markdown(table: dict[str, Any], base: PSConfig | None = None) -> str:
    tg = [f"{t:g}" for t in table["targets"]]
    head = ["paradigm"] + [f"time to {t} (s)" for t in tg] + [f"updates to {tg[0]}",
        "fast worker held (%)", "updates/s", "max gap at release", "max staleness", "best acc."]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in table["rows"]:
        cells = [r["paradigm"]]
        for t in tg:
            tt = r["time_to"][t]
            if tt["reached"] == 0:
                cells.append(f"never (0/{tt['runs']})")
            else:
                extra = "" if tt["reached"] == tt["runs"] else f" ({tt['reached']}/{tt['runs']})"
                cells.append(f"{tt['mean']:.1f} ± {tt['std']:.1f}{extra}")
        cells.append(_fmt((r["updates_to"][tg[0]]["mean"], r["updates_to"][tg[0]]["std"]), 0))
        bound = "" if r["release_bound"] is None else f" (≤ {r['release_bound']:g})"
        cells += [_fmt(r["fast_held_frac"], 1, pct=True), _fmt(r["updates_per_s"], 1),
                  f"{r['max_release_gap']}{bound}", str(r["max_staleness"]), _fmt(r["best_accuracy"], 3)]
        lines.append("| " + " | ".join(cells) + " |")
    note = (f"\nMean ± std (sample std) over seeds {table['seeds']} of the seconds from the server's start to the "
            "first evaluation at or above the target; (n/N): only n of N runs reached it within the budget; the "
            "mean is over those n. Updates: applied pushes (server version) at that evaluation.")
    if base is not None:
        note += (f" {base.workers} workers, slowdown {list(base.slowdowns)}, noise {base.noise:g}, base step "
                 f"{base.base_step_s:g} s, ResNet-{base.depth} width {base.width} on {base.dataset}, batch "
                 f"{base.batch_size}, lr {base.lr:g}, budget {base.time_budget_s:g} s, stop at accuracy "
                 f"{base.stop_accuracy:g}, evaluation every {base.eval_every_s:g} s.")
    return "\n".join(lines) + "\n" + note + "\n"


def plot(design: Design, runs: dict[str, dict[int, dict]], table: dict[str, Any]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, p in enumerate(design.paradigms):
        for j, (seed, r) in enumerate(sorted(runs.get(p.name, {}).items())):
            t, a = zip(*r["accuracy_curve"]) if r["accuracy_curve"] else ((), ())
            ax.plot(t, a, color=colors[i % len(colors)], alpha=0.8 if j == 0 else 0.35, lw=1.2,
                    label=p.name if j == 0 else None)
    for tgt in design.targets:
        ax.axhline(tgt, color="grey", ls=":", lw=0.8)
    ax.set_xlabel("seconds since the server started")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0, 1)
    ax.set_title("Test accuracy against time (every seed; heterogeneous workers)")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(design.out / "accuracy_vs_time.png", dpi=120)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4.5))
    names = [r["paradigm"] for r in table["rows"]]
    x = np.arange(len(names))
    K = design.paradigms[0].cfg.workers
    width = 0.8 / K
    for w in range(K):
        means, stds = [], []
        for p in design.paradigms:
            fr = [r["workers"][w]["held_frac"] * 100 for r in runs.get(p.name, {}).values()]
            means.append(np.mean(fr) if fr else 0.0)
            stds.append(np.std(fr, ddof=1) if len(fr) > 1 else 0.0)
        sd = design.paradigms[0].cfg.slowdowns[w]
        ax.bar(x + (w - (K - 1) / 2) * width, means, width, yerr=stds, capsize=3,
               label=f"worker {w + 1} (slowdown {sd:g})")
    ax.set_xticks(x, names, rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("time held by the server (% of run)")
    ax.set_title("Waiting time per paradigm (mean ± std over seeds)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(design.out / "waiting_time.png", dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------- run


def run_experiment(design: Design, run: bool = True, echo: Callable[[str], None] = print,
                   run_job: Callable | None = None) -> dict[str, Any]:
    """Run (or reuse) every job, then write table1.json, table1.md and the plots."""
    if run_job is None:
        from elastic_ring.ps.runner import run_job
    design.out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, dict[int, dict]] = {}
    # Seed-major order: every paradigm of seed 0, then of seed 1, ...; load from other jobs on the
    # machine then falls on all paradigms alike instead of on whichever ran at a busy moment.
    for seed in design.seeds:
        for p in design.paradigms:
            rdir = design.out / "runs" / f"{slug(p.name)}-seed{seed}"
            ev_path = rdir / "events.jsonl"
            done = bool(read_events(ev_path, "ps_finished"))
            if not done and run:
                if ev_path.exists():
                    ev_path.unlink()
                echo(f"running {p.name} seed {seed} -> {rdir}")
                run_job(p.cfg.replace(seed=seed), rdir)
            if read_events(ev_path, "ps_finished"):
                r = summarise_run(read_events(ev_path), design.targets)
                runs.setdefault(p.name, {})[seed] = r
                tt = ", ".join(f"{k}: {'never' if v is None else f'{v:.1f}s'}" for k, v in r["time_to"].items())
                echo(f"  {p.name} seed {seed}: {tt}; best {r['best_accuracy']:.3f}; max gap {r['max_release_gap']}")
    if not runs:
        raise ConfigError(f"no finished runs in {design.out / 'runs'}")
    table = aggregate(design, runs)
    table["runs"] = {name: {str(s): {k: v for k, v in r.items() if k != "accuracy_curve"} for s, r in per.items()}
                     for name, per in runs.items()}
    first = next(r for per in runs.values() for r in per.values())
    base = config_from_dict(first["config"], source="ps_launch") if first.get("config") else design.paradigms[0].cfg
    md = markdown(table, base)
    (design.out / "table1.json").write_text(json.dumps(table, indent=1, default=lambda o: None if o is None else str(o)))
    (design.out / "table1.md").write_text(md)
    plot(design, runs, table)
    return {"table": table, "markdown": md}
