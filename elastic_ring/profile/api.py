"""Table 1: steady-state throughput per worker count, its scaling efficiency, and the Eq. 5 fit.

Pure logic, no processes: :mod:`elastic_ring.profile.profiler` runs the workers and hands the
``throughput`` events of each run to the functions here.

Steady state. The worker emits one ``throughput`` event per ``throughput_window`` steps; the first
step of a segment (start-up: process launch, data load, first allreduce) is never inside a window.
:func:`steady_windows` further drops the first ``warmup_windows`` windows of every segment (caches,
allocator and gloo buffers still settling) and a last window shorter than the configured length
(the tail of the schedule: few steps, a noisy rate). What remains gives the point's rate as work
over time — steps/s = the windows' steps / the seconds they took, images/s = their images / the same
seconds — and, beside it, the spread of the windows' own steps/s (interquartile range, min, median,
max). A median of window rates is not a rate: a short fast window and a long slow one have a median
far above the steps the run did per second.

Table 1 columns, on images/s (at a fixed per-worker batch, images/s = batch * w * steps/s):

* speedup(w) = thr(w) / thr(w_ref), w_ref = 1 worker (or the smallest count measured);
* efficiency vs 1 = speedup(w) / (w / w_ref) — 100% is linear scaling;
* efficiency vs previous = thr(w) / (thr(w_prev) * w / w_prev), w_prev the next smaller count
  (the paper's "94.5% from 4 to 8 GPUs").

``profile.json`` (what :func:`build_profile` returns; :func:`elastic_ring.perfmodel.load_profile`,
the simulator and the live scheduler's ``--profile`` read it): ``points`` (workers, steps_per_s and
images_per_s as work over time, steps_per_s_spread, steps_per_s_min / _median / _max of the windows,
windows, ``rate: "work_over_time"``), ``batch_per_worker``, ``n_params``, ``speed_model`` (Eq. 5 parameters, or ``null`` when the
fit is refused), ``residuals`` (measured - predicted steps/s per point, or ``null``), ``fit``
(status ``ok`` / ``refused`` and a message), ``table1`` and ``source``.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping

import numpy as np

from elastic_ring.errors import UserError
from elastic_ring.events.api import Event, Throughput, as_event


@dataclass(frozen=True)
class ProfilePoint:
    """The measurement at one worker count: work over time of the steady windows, and their spread."""

    workers: int
    steps_per_s: float  # the steady windows' steps / their seconds
    images_per_s: float  # their images / their seconds
    steps_per_s_spread: float  # interquartile range of the windows' steps/s
    steps_per_s_min: float
    steps_per_s_max: float
    windows: list[dict[str, float]] = field(default_factory=list)  # the steady windows used
    warmup_windows_dropped: int = 0
    steps_per_s_median: float = float("nan")  # the windows' median steps/s (beside the rate, not it)
    rate: str = "work_over_time"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_worker_counts(text: str) -> list[int]:
    """``"1,2,3,4"`` -> [1, 2, 3, 4] (sorted, distinct, each >= 1).

    Raises:
        UserError: empty, not integers, below 1, or repeated.
    """
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            w = int(part)
        except ValueError:
            raise UserError(f"--workers expects worker counts like 1,2,3,4, got {part!r}") from None
        if w < 1:
            raise UserError(f"--workers: worker counts must be >= 1, got {w}")
        if w in out:
            raise UserError(f"--workers: worker count {w} given twice")
        out.append(w)
    if not out:
        raise UserError("--workers is empty (give worker counts like 1,2,3,4)")
    return sorted(out)


def _windows(events: Iterable[Event | Mapping[str, Any]]) -> list[Throughput]:
    """The throughput windows of ``events``: records, or JSON objects (one without a ``kind`` is a
    window); other kinds are left out."""
    out = []
    for e in events:
        e = as_event(e if isinstance(e, Event) or "kind" in e else {"kind": Throughput.kind, **e})
        if isinstance(e, Throughput):
            out.append(e)
    return out


def steady_windows(events: Iterable[Event | Mapping[str, Any]], warmup_windows: int = 1,
                   window: int | None = None) -> tuple[list[Throughput], int]:
    """The ``throughput`` events of steady state, and how many were dropped as warm-up.

    Per segment: drop the first ``warmup_windows`` windows; drop a final window with fewer than
    ``window`` steps (when ``window`` is given) unless it is the only one left.
    """
    by_seg: dict[int, list[Throughput]] = {}
    for e in _windows(events):
        by_seg.setdefault(int(e.segment or 0), []).append(e)
    kept, dropped = [], 0
    for seg in sorted(by_seg):
        ev = sorted(by_seg[seg], key=lambda e: e.step)
        n_drop = min(warmup_windows, len(ev))
        dropped += n_drop
        ev = ev[n_drop:]
        if window is not None and len(ev) > 1 and ev[-1].steps < window:
            ev = ev[:-1]
        kept.extend(ev)
    return kept, dropped


def _quantile(xs: list[float], q: float) -> float:
    return float(np.quantile(np.asarray(xs, dtype=float), q))


def _seconds(e: Throughput) -> float:
    """A window's seconds (older events without ``seconds``: its steps / its steps/s)."""
    if e.seconds is not None:
        return float(e.seconds)
    sps = float(e.steps_per_s)
    return float(e.steps) / sps if sps > 0 else 0.0


def measure_point(workers: int, events: Iterable[Event | Mapping[str, Any]], warmup_windows: int = 1,
                  window: int | None = None) -> ProfilePoint:
    """Work over time and spread of the steady windows of one run at ``workers`` workers.

    Raises:
        UserError: no window left after the warm-up (the run was too short: more --steps).
    """
    evs = [e for e in _windows(events) if (workers if e.world_size is None else int(e.world_size)) == workers]
    kept, dropped = steady_windows(evs, warmup_windows, window)
    if not kept:
        raise UserError(f"no throughput window left at {workers} worker(s) after dropping "
                        f"{dropped} warm-up window(s): run more steps (--steps)")
    sps = [float(e.steps_per_s) for e in kept]
    secs = [_seconds(e) for e in kept]
    total_s = sum(secs)
    if not total_s > 0:
        raise UserError(f"the throughput windows at {workers} worker(s) took no time: no rate")
    steps = sum(float(e.steps) for e in kept)
    images = sum(float(e.images_per_s) * t for e, t in zip(kept, secs))
    return ProfilePoint(
        workers=workers, steps_per_s=steps / total_s, images_per_s=images / total_s,
        steps_per_s_spread=_quantile(sps, 0.75) - _quantile(sps, 0.25),
        steps_per_s_min=min(sps), steps_per_s_max=max(sps), steps_per_s_median=statistics.median(sps),
        windows=[{"step": int(e.step), "steps": int(e.steps), "seconds": t,
                  "steps_per_s": float(e.steps_per_s), "images_per_s": float(e.images_per_s)}
                 for e, t in zip(kept, secs)],
        warmup_windows_dropped=dropped)


def table1_rows(points: Iterable[ProfilePoint | dict[str, Any]]) -> list[dict[str, Any]]:
    """Table 1 rows (see the module docstring), sorted by worker count."""
    pts = sorted((p if isinstance(p, dict) else p.to_dict() for p in points), key=lambda p: p["workers"])
    if not pts:
        return []
    ref = pts[0]
    rows = []
    prev = None
    for p in pts:
        w, thr = p["workers"], p["images_per_s"]
        speedup = thr / ref["images_per_s"] if ref["images_per_s"] > 0 else float("nan")
        eff_ref = speedup / (w / ref["workers"])
        eff_prev = None
        if prev is not None and prev["images_per_s"] > 0:
            eff_prev = thr / (prev["images_per_s"] * w / prev["workers"])
        rows.append({"workers": w, "images_per_s": thr, "steps_per_s": p["steps_per_s"],
                     "steps_per_s_spread": p.get("steps_per_s_spread", 0.0),
                     "windows": len(p.get("windows") or []), "speedup": speedup,
                     "efficiency_vs_ref": eff_ref, "ref_workers": ref["workers"],
                     "efficiency_vs_prev": eff_prev, "prev_workers": prev["workers"] if prev else None})
        prev = p
    return rows


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def render_table1(rows: list[dict[str, Any]], markdown: bool = False) -> str:
    """Table 1 as plain text (what `profile` prints) or as a Markdown table."""
    if not rows:
        return "(no points)"
    ref = rows[0]["ref_workers"]
    head = ["workers", "images/s", "steps/s", "steps/s IQR", "windows", f"speedup vs {ref}",
            f"efficiency vs {ref}", "efficiency vs prev"]
    body = []
    for r in rows:
        prev = "-" if r["efficiency_vs_prev"] is None else \
            f"{_pct(r['efficiency_vs_prev'])} ({r['prev_workers']}->{r['workers']})"
        body.append([str(r["workers"]), f"{r['images_per_s']:.1f}", f"{r['steps_per_s']:.3f}",
                     f"{r['steps_per_s_spread']:.3f}", str(r["windows"]), f"{r['speedup']:.2f}x",
                     _pct(r["efficiency_vs_ref"]), prev])
    return _render(head, body, markdown)


def _render(head: list[str], body: list[list[str]], markdown: bool) -> str:
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join(":---" if i == 0 and not body[0][0].isdigit()
                                                               else "---:" for i in range(len(head))) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in body]
        return "\n".join(lines)
    widths = [max(len(h), *(len(r[i]) for r in body)) for i, h in enumerate(head)]
    lines = ["  ".join(h.rjust(wd) for h, wd in zip(head, widths))]
    lines += ["  ".join(c.rjust(wd) for c, wd in zip(r, widths)) for r in body]
    return "\n".join(lines)


def fit_profile(points: list[ProfilePoint | dict[str, Any]], batch_per_worker: int,
                n_params: int) -> dict[str, Any]:
    """Fit Eq. 5 (NNLS, :func:`elastic_ring.perfmodel.fit_speed`) to the points.

    Never raises for too few points: a refused fit comes back as ``status: refused`` with the
    reason, so the measurements are still saved.
    """
    from elastic_ring.perfmodel import FitError, fit_speed

    pts = [p if isinstance(p, dict) else p.to_dict() for p in points]
    w = [p["workers"] for p in pts]
    f = [p["steps_per_s"] for p in pts]
    try:
        fit = fit_speed(w, f, batch_per_worker, n_params)
    except FitError as e:
        return {"status": "refused", "message": str(e), "speed_model": None, "residuals": None,
                "rel_residuals": None, "rmse": None}
    return {"status": "ok", "message": f"Eq. 5 fitted by NNLS on {len(pts)} point(s); "
                                       f"rmse {fit.rmse:.4g} steps/s",
            "speed_model": fit.model.to_dict(), "residuals": [float(x) for x in fit.residuals],
            "rel_residuals": [float(x) for x in fit.rel_residuals], "rmse": float(fit.rmse),
            "predicted_steps_per_s": [float(x) for x in np.atleast_1d(fit.model.predict(np.asarray(w, float)))]}


def build_profile(points: list[ProfilePoint], batch_per_worker: int, n_params: int,
                  meta: dict[str, Any]) -> dict[str, Any]:
    """The ``profile.json`` object (module docstring)."""
    fit = fit_profile(points, batch_per_worker, n_params)
    return {
        **meta,
        "batch_per_worker": batch_per_worker,
        "n_params": n_params,
        "points": [p.to_dict() for p in sorted(points, key=lambda p: p.workers)],
        "speed_model": fit["speed_model"],
        "residuals": fit["residuals"],
        "fit": fit,
        "table1": table1_rows(points),
    }


def render_fit(profile: dict[str, Any], markdown: bool = False) -> str:
    """The Eq. 5 fit and its residuals per point (or why it was refused)."""
    fit = profile.get("fit") or {}
    if fit.get("status") != "ok":
        return f"Eq. 5 fit refused: {fit.get('message', 'no fit')}"
    m = fit["speed_model"]
    lines = [f"Eq. 5 fit (NNLS, m = per-worker batch {m['m']:g}, n = {m['n']:.0f} parameters): "
             f"t0 = {m['t0']:.4g} s, t1 = {m['t1']:.4g} s, t2 = {m['t2']:.4g} s, t3 = {m['t3']:.4g} s; "
             f"rmse {fit['rmse']:.4g} steps/s"]
    head = ["workers", "measured steps/s", "f(w) steps/s", "residual", "relative"]
    body = []
    for p, pred, r, rr in zip(profile["points"], fit["predicted_steps_per_s"], fit["residuals"],
                              fit["rel_residuals"]):
        body.append([str(p["workers"]), f"{p['steps_per_s']:.3f}", f"{pred:.3f}", f"{r:+.4f}",
                     f"{100 * rr:+.1f}%"])
    lines.append("")
    lines.append(_render(head, body, markdown))
    return "\n".join(lines)
