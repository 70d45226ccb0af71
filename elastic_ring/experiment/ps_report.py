"""The Table I experiment's outputs (:mod:`elastic_ring.experiment.ps_sync`): the table as markdown
(``table1.md``, :func:`markdown`) and accuracy against time per heterogeneity
(``accuracy_vs_time.png``, :func:`plot`), both from :func:`~elastic_ring.experiment.ps_stats.aggregate`'s
table and the runs' summaries.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from elastic_ring.experiment.ps_design import Design
from elastic_ring.experiment.ps_stats import _q
from elastic_ring.ps.api import PSConfig


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
