"""Markdown tables and PNG plots for a results folder.

What a folder holds decides what is written (several may apply):

* ``profile.json`` (``elastic-ring profile``): ``report.md`` with Table 1 and the Eq. 5 fit with its
  residuals; ``throughput.png`` — measured images/s and steps/s per worker count (work over time, with
  the steady windows and their spread), the fitted f(w) of Eq. 5 and linear scaling.
* ``table2.json`` (``elastic-ring experiment resize``): ``report.md`` with Table 2 and an Eq. 1 fit
  per run; ``loss_vs_time.png`` — training loss against wall time for the baselines and the
  resized runs, each resize marked (a line at the request, the lost interval shaded);
  ``accuracy_vs_time.png`` — final test accuracy against wall time per run (the worker evaluates
  once, at the end of the run, so each run is one point); ``loss_fit.png`` — loss against step
  with the fitted Eq. 1 curve per row.
* ``events.jsonl`` (one training run): ``report.md`` and ``loss_vs_time.png`` for that run.

Eq. 1 is checked out of sample too: fitted on the first half of a run's loss curve, it predicts the
step at which the run reaches the loss of its last window; the table shows prediction and truth.

matplotlib is imported inside the functions (Agg backend), never at import time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from elastic_ring.errors import UserError
from elastic_ring.events.api import (Evaluation, Event, Finished, FirstStepAfterResize, Launch, ResizeRequested,
                                     Throughput, read_events)

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# ---------------------------------------------------------------------------- Eq. 1 per run
def convergence_summary(events_path: Path) -> dict[str, Any]:
    """Eq. 1 fitted on a run's whole loss curve, and the out-of-sample check of the module docstring."""
    from elastic_ring.perfmodel import FitError, fit_convergence, losses_from_events

    k, l = losses_from_events(events_path)
    out: dict[str, Any] = {"points": int(k.size)}
    try:
        m = fit_convergence(k, l)
    except FitError as e:
        return {**out, "status": "refused", "message": str(e)}
    pred = np.asarray(m.predict(k), dtype=float)
    out.update(status="ok", model=m.to_dict(), rmse=float(np.sqrt(np.mean((pred - l) ** 2))))
    half = k <= k.max() / 2 if k.size else k
    if int(np.sum(half)) >= 3:
        try:
            mh = fit_convergence(k[half], l[half])
            target = float(l[-1])
            out["half_fit"] = {"model": mh.to_dict(), "target_loss": target,
                               "predicted_step": float(mh.steps_to_reach(target)),
                               "actual_step": float(k[-1])}
        except FitError as e:
            out["half_fit"] = {"status": "refused", "message": str(e)}
    return out


# ---------------------------------------------------------------------------- profile
def plot_profile(prof: dict[str, Any], path: Path) -> Path:
    from elastic_ring.perfmodel import SpeedModel

    plt = _plt()
    pts = prof["points"]
    w = np.array([p["workers"] for p in pts], dtype=float)
    sps = np.array([p["steps_per_s"] for p in pts])
    ips = np.array([p["images_per_s"] for p in pts])
    b = float(prof["batch_per_worker"])
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for p in pts:  # every steady window, faint
        ws = [p["workers"]] * len(p.get("windows") or [])
        a1.scatter(ws, [x["images_per_s"] for x in p.get("windows") or []], s=10, c="0.7", zorder=1)
        a2.scatter(ws, [x["steps_per_s"] for x in p.get("windows") or []], s=10, c="0.7", zorder=1)
    lo = np.array([p.get("steps_per_s_min", p["steps_per_s"]) for p in pts])
    hi = np.array([p.get("steps_per_s_max", p["steps_per_s"]) for p in pts])
    a2.errorbar(w, sps, yerr=[sps - lo, hi - sps], fmt="o", color=COLORS[0], capsize=3,
                label="measured (work over time, min-max of windows)", zorder=3)
    a1.errorbar(w, ips, yerr=[(sps - lo) * b * w, (hi - sps) * b * w], fmt="o", color=COLORS[0],
                capsize=3, label="measured (work over time, min-max of windows)", zorder=3)
    grid = np.linspace(1, max(w.max(), 1) * 1.25, 200)
    a1.plot(grid, ips[0] * grid / w[0], ls=":", c="0.4", label=f"linear from {int(w[0])} worker(s)")
    if prof.get("speed_model"):
        m = SpeedModel.from_dict(prof["speed_model"])
        a1.plot(grid, m.samples_per_s(grid), c=COLORS[1], label="Eq. 5 fit: m·w·f(w)")
        a2.plot(grid, m.predict(grid), c=COLORS[1], label="Eq. 5 fit: f(w)")
    else:
        msg = (prof.get("fit") or {}).get("message", "fit refused")
        import textwrap

        a2.text(0.02, 0.02, "Eq. 5 fit refused:\n" + textwrap.fill(msg, 60), transform=a2.transAxes,
                fontsize=7)
    a1.set(xlabel="workers", ylabel="images/s", title="Throughput")
    a2.set(xlabel="workers", ylabel="steps/s", title="Speed f(w)")
    for a in (a1, a2):
        a.set_xticks(w)
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    fig.suptitle(f"{prof.get('model', '')}/{prof.get('width', '')} on {prof.get('dataset', '')} "
                 f"({prof.get('device', '')}, batch {int(b)}/worker)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def report_profile(d: Path) -> tuple[str, list[Path]]:
    from elastic_ring.profile.api import render_fit, render_table1, table1_rows

    prof = json.loads((d / "profile.json").read_text())
    png = plot_profile(prof, d / "throughput.png")
    rows = prof.get("table1") or table1_rows(prof["points"])
    md = ["## Table 1: throughput per worker count", "",
          f"{prof.get('model')}/{prof.get('width')} on {prof.get('dataset')}, {prof.get('device')}, "
          f"batch {prof['batch_per_worker']}/worker, {prof.get('steps_per_count')} steps per count, "
          f"{prof.get('warmup_windows')} warm-up window(s) of {prof.get('throughput_window')} steps "
          f"dropped; rates are the steady windows' work over the seconds they took.", "",
          render_table1(rows, markdown=True), "", render_fit(prof, markdown=True), "",
          f"![throughput]({png.name})", ""]
    return "\n".join(md), [png]


# ---------------------------------------------------------------------------- runs
def _run_curve(events: list[Event]) -> dict[str, Any]:
    launches = [e for e in events if isinstance(e, Launch)]
    t0 = launches[0].time if launches else 0.0
    thr = [e for e in events if isinstance(e, Throughput)]
    req = [e for e in events if isinstance(e, ResizeRequested)]
    first = [e for e in events if isinstance(e, FirstStepAfterResize)]
    fin = [e for e in events if isinstance(e, Finished)]
    ev = [e for e in events if isinstance(e, Evaluation)]
    return {"t": [e.time - t0 for e in thr], "step": [e.step for e in thr],
            "loss": [e.loss for e in thr],
            "resizes": [(r.time - t0, f.time - t0 if f is not None else None, _resize_label(r, f))
                        for r, f in zip(req, first + [None] * len(req))],
            "wall_s": fin[-1].wall_s if fin else None,
            "accuracy": ev[-1].test_accuracy if ev else None,
            "acc_t": [e.time - t0 for e in ev], "acc": [100 * e.test_accuracy for e in ev]}


def _resize_label(req: ResizeRequested, first: FirstStepAfterResize | None) -> str:
    """A resize's marker: the step it came after (a live one's request names none: the step before
    the first at the new size), else its sizes."""
    at = req.at_step if req.at_step is not None else (first.step - 1 if first is not None else None)
    return f"resize @ {at}" if at is not None else f"resize {req.from_workers} -> {req.to_workers}"


def plot_runs(groups: list[tuple[str, list[Path]]], d: Path) -> list[Path]:
    """groups: (label, run folders of its repeats) -> loss_vs_time, accuracy_vs_time, loss_fit PNGs."""
    from elastic_ring.perfmodel import FitError, fit_convergence, losses_from_events

    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 5))
    fig2, ax2 = plt.subplots(figsize=(7, 4.5))
    fig3, ax3 = plt.subplots(figsize=(9, 5))
    for gi, (label, dirs) in enumerate(groups):
        c = COLORS[gi % len(COLORS)]
        accs, walls = [], []
        for ri, rd in enumerate(dirs):
            cur = _run_curve(read_events(rd / "events.jsonl"))
            ax.plot(cur["t"], cur["loss"], c=c, alpha=1.0 if ri == 0 else 0.45, lw=1.3,
                    label=label if ri == 0 else None)
            for (tr, tf, st) in cur["resizes"]:
                ax.axvline(tr, c=c, ls="--", lw=0.9, alpha=0.8)
                if tf is not None:
                    ax.axvspan(tr, tf, color=c, alpha=0.12)
                if ri == 0:
                    ax.annotate(st, (tr, 1.0), xycoords=("data", "axes fraction"),
                                fontsize=7, color=c, rotation=90, va="top", ha="right")
            if len(cur["acc"]) > 1:  # periodic evaluations (eval_every): a curve, resizes marked
                ax2.plot(cur["acc_t"], cur["acc"], c=c, lw=1.0, alpha=0.9 if ri == 0 else 0.4)
                for (tr, _tf, _st) in cur["resizes"]:
                    ax2.axvline(tr, c=c, ls="--", lw=0.8, alpha=0.6)
            if cur["wall_s"] is not None and cur["accuracy"] is not None:
                walls.append(cur["wall_s"])
                accs.append(100 * cur["accuracy"])
            if ri == 0:
                k, l = losses_from_events(rd / "events.jsonl")
                ax3.plot(k, l, "o", ms=3, c=c, label=f"{label} (measured)")
                try:
                    m = fit_convergence(k, l)
                    g = np.linspace(0, max(k.max(), 1), 200)
                    ax3.plot(g[1:], m.predict(g[1:]), c=c, lw=1.2,
                             label=f"Eq. 1 fit b0={m.b0:.3g} b1={m.b1:.3g} b2={m.b2:.3g}")
                except FitError:
                    pass
        if walls:
            ax2.scatter(walls, accs, c=c, s=30, label=label, alpha=0.8)
            if len(walls) > 1:
                ax2.errorbar([np.mean(walls)], [np.mean(accs)], xerr=[np.std(walls, ddof=1)],
                             yerr=[np.std(accs, ddof=1)], fmt="s", c=c, capsize=3, ms=6)
    ax.set(xlabel="wall time since launch (s)", ylabel="training loss (window mean)",
           title="Training loss against wall time (dashed: resize; shaded: stop to first step after)")
    _maybe_log(ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax2.set(xlabel="wall time since launch (s)", ylabel="test accuracy (%)",
            title="Test accuracy against wall time (lines: every eval_every steps;\n"
                  "dots: final, squares: mean ± sd; dashed: resize)")
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8)
    ax3.set(xlabel="step", ylabel="training loss", title="Eq. 1 fit l(k) = 1/(b0·k + b1) + b2 (first repeat)")
    _maybe_log(ax3)
    ax3.grid(alpha=0.3)
    ax3.legend(fontsize=7)
    paths = [d / "loss_vs_time.png", d / "accuracy_vs_time.png", d / "loss_fit.png"]
    for f, p in zip((fig, fig2, fig3), paths):
        f.tight_layout()
        f.savefig(p, dpi=110)
        plt.close(f)
    return paths


def _maybe_log(ax) -> None:
    lo, hi = ax.get_ylim()
    if lo > 0 and hi / lo > 4:
        ax.set_yscale("log")


def _conv_table(groups: list[tuple[str, list[Path]]]) -> str:
    lines = ["| run | points | b0 | b1 | b2 | rmse | fit on 1st half: predicted step to reach last loss | actual step |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for label, dirs in groups:
        if not dirs:
            continue
        c = convergence_summary(dirs[0] / "events.jsonl")
        if c.get("status") != "ok":
            lines.append(f"| {label} | {c['points']} | fit refused: {c.get('message')} | | | | | |")
            continue
        m = c["model"]
        h = c.get("half_fit") or {}
        pred = h.get("predicted_step")
        pred_s = "-" if pred is None else ("never (below the fitted floor b2)" if not np.isfinite(pred) else f"{pred:.0f}")
        act = h.get("actual_step")
        lines.append(f"| {label} | {c['points']} | {m['b0']:.4g} | {m['b1']:.4g} | {m['b2']:.4g} | "
                     f"{c['rmse']:.4f} | {pred_s} | {'-' if act is None else f'{act:.0f}'} |")
    return "\n".join(lines)


def report_table2(d: Path) -> tuple[str, list[Path]]:
    from elastic_ring.experiment.resize import render_table2

    res = json.loads((d / "table2.json").read_text())
    groups = []
    for r in res["rows"]:
        dirs = [Path(m["run_dir"]) for m in res["runs"].get(r["key"], []) if m]
        dirs = [p if p.is_absolute() or p.exists() else d / "runs" / p.name for p in dirs]
        groups.append((r["label"], [p for p in dirs if (p / "events.jsonl").exists()]))
    pngs = plot_runs(groups, d)
    c, ds = res["config"], res["design"]
    md = [f"## Table 2: resize {ds['w_init']} -> {ds['w_new']} workers", "",
          f"ResNet-{c['depth']}/{c['width']} on {c['dataset']} ({res['train_set_size']} training "
          f"samples), {res['device']}, {c['total_steps']} steps, batch {c['batch_size']}/worker, "
          f"{res['slots']} slot(s) on {res.get('cpu_count')} CPU core(s).", "",
          render_table2(res["rows"], markdown=True), "", res["notes"] + ".", "",
          "Resize overheads (mean over resizes and repeats): " + "; ".join(
              f"{r['label']}: stop {r['stop_latency_s']['mean']:.2f} s (checkpoint "
              f"{r['checkpoint_s']['mean']:.3f} s), relaunch to first step "
              f"{r['relaunch_to_first_step_s']['mean']:.2f} s, total lost {r['overhead_s']['mean']:.2f} s"
              for r in res["rows"] if r["overhead_s"]["mean"] is not None), "",
          "### Eq. 1 (convergence) per run, first repeat", "", _conv_table(groups), "",
          "![loss vs time](loss_vs_time.png)", "", "![accuracy vs time](accuracy_vs_time.png)", "",
          "![Eq. 1 fits](loss_fit.png)", ""]
    return "\n".join(md), pngs


def report_run(d: Path) -> tuple[str, list[Path]]:
    from elastic_ring.controller.summary import render, summarize_run

    pngs = plot_runs([(d.name, [d])], d)
    md = [f"## Run {d.name}", "", "```", render(summarize_run(d)), "```", "",
          "### Eq. 1 (convergence)", "", _conv_table([(d.name, [d])]), "",
          "![loss vs time](loss_vs_time.png)", "", "![accuracy vs time](accuracy_vs_time.png)", "",
          "![Eq. 1 fit](loss_fit.png)", ""]
    return "\n".join(md), pngs


def write_report(d: str | Path) -> tuple[Path, list[Path]]:
    """Write ``report.md`` and the PNGs into ``d``; returns (report path, PNG paths).

    Raises:
        UserError: ``d`` holds no profile.json, table2.json or events.jsonl.
    """
    d = Path(d)
    if not d.is_dir():
        raise UserError(f"{d} is not a folder")
    parts, pngs = [], []
    if (d / "profile.json").exists():
        md, p = report_profile(d)
        parts.append(md)
        pngs += p
    if (d / "table2.json").exists():
        md, p = report_table2(d)
        parts.append(md)
        pngs += p
    if not parts and (d / "events.jsonl").exists():
        md, p = report_run(d)
        parts.append(md)
        pngs += p
    if not parts:
        raise UserError(f"{d} holds no profile.json (elastic-ring profile), table2.json "
                        f"(elastic-ring experiment resize) or events.jsonl (elastic-ring train)")
    out = d / "report.md"
    out.write_text(f"# Report: {d}\n\n" + "\n".join(parts))
    return out, pngs
