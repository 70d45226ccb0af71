"""Summary of a run, computed from its events alone (so `status` works while it runs).

Per world size: images/s and steps/s as work over time (the steps, and images, of its throughput
windows divided by the seconds those windows took), with the windows' own steps/s spread beside it
(min, median, max: two jobs sharing cores show up as work over time far below the median of
their fastest windows); the scaling efficiency between consecutive sizes used,
``thr(w2) / (thr(w1) * w2 / w1)`` on those images/s, only when both sizes have at least
``MIN_WINDOWS`` windows, with its spread (the same ratio of the windows' quartiles: lower quartile
over upper, upper over lower); each resize's
overhead breakdown; each restart (cause, rank, steps redone, time lost); final train loss and test
accuracy. Steps redone after a restart or a resume are counted once: a launch from step s drops
the windows (or the parts of windows) after s that an earlier segment did not checkpoint.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any

from elastic_ring.events.api import EventLog, Finished, read_events

MIN_WINDOWS = 3  # windows per size before a scaling efficiency is reported


def _quartiles(xs: list[float]) -> tuple[float, float]:
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def scaling_efficiency(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Efficiency from size ``a`` to size ``b`` (entries of ``summarize()['sizes']`` with their
    windows' ``ips``), or None with the reason when either has too few windows."""
    out: dict[str, Any] = {"from": a["workers"], "to": b["workers"], "efficiency": None,
                           "low": None, "high": None, "windows": [a["windows"], b["windows"]]}
    if min(a["windows"], b["windows"]) < MIN_WINDOWS:
        out["reason"] = f"too few throughput windows ({a['windows']} and {b['windows']}; needs {MIN_WINDOWS} each)"
        return out
    k = b["workers"] / a["workers"]
    (a1, a3), (b1, b3) = _quartiles(a["ips"]), _quartiles(b["ips"])
    if a["images_per_s"] <= 0 or a1 <= 0:
        out["reason"] = "no throughput measured"
        return out
    out.update(efficiency=b["images_per_s"] / (a["images_per_s"] * k), low=b1 / (a3 * k), high=b3 / (a1 * k))
    return out


def _kept_windows(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    kept: list[dict[str, Any]] = []
    for e in events:
        if e["kind"] == "throughput":
            kept.append(e)
        elif e["kind"] == "launch":
            start = int(e.get("start_step", 1))
            out = []
            for w in kept:
                first = int(w["step"]) - int(w["steps"]) + 1
                if int(w["step"]) < start:
                    out.append(w)
                elif first < start:
                    cut = {**w, "steps": start - first, "step": start - 1}
                    if w.get("seconds") and int(w["steps"]) > 0:
                        cut["seconds"] = float(w["seconds"]) * (start - first) / int(w["steps"])
                    out.append(cut)
            kept = out
    return kept


def _steps_by_size(events: list[dict[str, Any]], last_step: int) -> dict[int, int]:
    """Steps done at each size, each step once: launch i covers its start step up to the next
    launch's start (a restart or resume starts again after its checkpoint) or the last step."""
    launches = [e for e in events if e["kind"] == "launch"]
    out: dict[int, int] = {}
    for a, b in zip(launches, launches[1:] + [None]):
        end = int(b.get("start_step", 1)) - 1 if b is not None else last_step
        n = max(0, end - int(a.get("start_step", 1)) + 1)
        out[int(a["world_size"])] = out.get(int(a["world_size"]), 0) + n
    return out


def summarize(events: list[dict[str, Any]]) -> dict[str, Any]:
    by_w: dict[int, list[dict[str, Any]]] = {}
    windows = _kept_windows(events)
    for e in windows:
        by_w.setdefault(int(e["world_size"]), []).append(e)
    last_step = max((e.get("step") or 0 for e in events if e["kind"] in
                     ("throughput", "segment_end", "first_step", "finished")), default=0)
    done = _steps_by_size(events, last_step)
    sizes = []
    for w in sorted(by_w):
        ev = by_w[w]
        ips = [float(e["images_per_s"]) for e in ev]
        sps = [float(e["steps_per_s"]) for e in ev]
        secs = [float(e["seconds"]) if e.get("seconds") else (int(e["steps"]) / r if r > 0 else 0.0)
                for e, r in zip(ev, sps)]
        total_s = sum(secs)
        if total_s > 0:
            steps_ps = sum(int(e["steps"]) for e in ev) / total_s
            images_ps = sum(i * t for i, t in zip(ips, secs)) / total_s
        else:
            steps_ps, images_ps = statistics.median(sps), statistics.median(ips)
        sizes.append({"workers": w, "images_per_s": images_ps, "steps_per_s": steps_ps, "windows": len(ev),
                      "window_seconds": total_s,
                      "window_steps_per_s": {"min": min(sps), "median": statistics.median(sps), "max": max(sps)},
                      "steps": done.get(w, 0), "ips": ips})
    eff = [scaling_efficiency(a, b) for a, b in zip(sizes, sizes[1:])]
    for sz in sizes:
        del sz["ips"]
    overheads = [{k: e[k] for k in ("from_workers", "to_workers", "step", "stop_latency_s",
                                    "checkpoint_s", "relaunch_to_first_step_s", "total_lost_s",
                                    "steady_step_s")}
                 for e in events if e["kind"] == "resize_overhead"]
    thr = windows
    rec = {e["attempt"]: e for e in events if e["kind"] == "recovered"}
    restarts = [{"attempt": e["attempt"], "cause": e["cause"], "rank": e["rank"],
                 "from_step": e["from_step"], "steps_redone": e["steps_redone"],
                 "world_size": e["new_world_size"], "gave_up": e.get("gave_up", False),
                 "time_lost_s": rec.get(e["attempt"], {}).get("time_lost_s"),
                 "detect_to_first_step_s": rec.get(e["attempt"], {}).get("detect_to_first_step_s")}
                for e in events if e["kind"] == "restart"]
    evals = [e for e in events if e["kind"] == "evaluation"]
    fin = [e for e in events if e["kind"] == "finished"]
    launches = [e for e in events if e["kind"] == "launch"]
    state = "finished" if fin else ("failed" if any(e["kind"] == "error" for e in events) else "running")
    return {
        "state": state,
        "step": last_step,
        "world_size": launches[-1]["world_size"] if launches else None,
        "sizes": sizes,
        "scaling_efficiency": eff,
        "resizes": overheads,
        "restarts": restarts,
        "steps_trained": sum(done.values()),
        "train_loss": thr[-1]["loss"] if thr else None,
        "train_loss_step": thr[-1]["step"] if thr else None,  # the last window's last step
        "test_accuracy": evals[-1]["test_accuracy"] if evals else None,
        "test_loss": evals[-1]["test_loss"] if evals else None,
        "wall_s": fin[-1]["wall_s"] if fin else None,
    }


def summarize_run(run_dir: str | Path) -> dict[str, Any]:
    return summarize(read_events(Path(run_dir) / "events.jsonl"))


def render(summary: dict[str, Any], total_steps: int | None = None) -> str:
    """Plain-text tables (also what `status` prints)."""
    lines = []
    from elastic_ring.worker.hvd_elastic import NO_STEP_CAP

    step = f"{summary['step']}" + (f"/{total_steps}" if total_steps and total_steps < NO_STEP_CAP else "")
    lines.append(f"state: {summary['state']}   step: {step}   workers: {summary['world_size']}"
                 + (f"   wall: {summary['wall_s']:.1f} s" if summary.get("wall_s") else ""))
    lines.append("")
    lines.append(f"{'workers':>7} {'images/s':>10} {'steps/s':>9} {'windows':>7}  window steps/s min/median/max")
    for s in summary["sizes"]:
        sp = s.get("window_steps_per_s") or {}
        spread = f"{sp['min']:.3f}/{sp['median']:.3f}/{sp['max']:.3f}" if sp else ""
        lines.append(f"{s['workers']:>7} {s['images_per_s']:>10.1f} {s['steps_per_s']:>9.3f} {s['windows']:>7}  {spread}")
    if summary["scaling_efficiency"]:
        lines.append("")
        for e in summary["scaling_efficiency"]:
            if e["efficiency"] is None:
                v = f"n/a ({e.get('reason', 'not measured')})"
            else:
                v = f"{100 * e['efficiency']:.1f}%"
                if e.get("low") is not None:
                    v += (f" (windows' quartiles: {100 * e['low']:.0f}-{100 * e['high']:.0f}%; "
                          f"{e['windows'][0]} and {e['windows'][1]} windows)")
            lines.append(f"scaling efficiency {e['from']} -> {e['to']} workers: {v}")
    if summary["resizes"]:
        lines.append("")
        lines.append(f"{'resize':>8} {'at step':>7} {'stop s':>7} {'ckpt s':>7} {'relaunch s':>10} {'lost s':>7}")
        for r in summary["resizes"]:
            lines.append(f"{r['from_workers']:>3} -> {r['to_workers']:<2} {r['step']:>7} "
                         f"{r['stop_latency_s']:>7.2f} {r['checkpoint_s']:>7.3f} "
                         f"{r['relaunch_to_first_step_s']:>10.2f} {r['total_lost_s']:>7.2f}")
    if summary.get("restarts"):
        lines.append("")
        lines.append(f"{'restart':>7} {'from step':>9} {'redone':>6} {'workers':>7} {'lost s':>7}  cause")
        for r in summary["restarts"]:
            lost = r.get("time_lost_s")
            lines.append(f"{r['attempt']:>7} {r['from_step']:>9} {r['steps_redone']:>6} "
                         f"{'-' if r.get('gave_up') else r['world_size']:>7} "
                         f"{'n/a' if lost is None else f'{lost:.2f}':>7}  {r['cause']}")
    lines.append("")
    tl = summary.get("train_loss")
    ta = summary.get("test_accuracy")
    if summary.get("state") == "finished":
        loss = f"final train loss: {'n/a' if tl is None else f'{tl:.4f}'}"
    else:  # running (or stopped): the newest window's mean, not a final figure
        at = summary.get("train_loss_step")
        loss = f"train loss: {'n/a' if tl is None else f'{tl:.4f}'}" + (
            f" (window ending at step {at})" if tl is not None and at is not None else "")
    lines.append(f"{loss}   test accuracy: {'n/a' if ta is None else f'{100 * ta:.2f}%'}")
    return "\n".join(lines)


def write_summary(run_dir: Path, events: EventLog, now: float, interrupted: bool = False) -> dict[str, Any]:
    """The run ended: write its ``finished`` event (unless ``interrupted``) and
    ``RUN_DIR/summary.json`` (atomically); returns the summary."""
    evs = read_events(run_dir / "events.jsonl")
    if not interrupted:
        launches = [e for e in evs if e["kind"] == "launch"] or [{"time": now}]
        s0 = summarize(evs)
        events.write(Finished(step=s0["step"], wall_s=now - launches[0]["time"], train_loss=s0["train_loss"],
                              test_accuracy=s0["test_accuracy"], test_loss=s0["test_loss"]))
        evs = read_events(run_dir / "events.jsonl")
    summary = summarize(evs)
    if interrupted:
        summary["state"] = "interrupted"
    tmp = run_dir / ".summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2))
    os.replace(tmp, run_dir / "summary.json")
    return summary
