"""Summary of a run, computed from its events alone (so `status` works while it runs).

Per world size: images/s and steps/s as work over time (the steps, and images, of its throughput
windows divided by the seconds those windows took), with the windows' own steps/s spread beside it
(min, median, max: two jobs sharing cores show up as work over time far below the median of
their fastest windows); the scaling efficiency between consecutive sizes used,
``thr(w2) / (thr(w1) * w2 / w1)`` on those images/s, only when both sizes have at least
``MIN_WINDOWS`` windows, with its spread (the same ratio of the windows' quartiles: lower quartile
over upper, upper over lower); each resize's
overhead breakdown; each restart (cause, rank, steps redone, time lost); each change of the job's
members (its cause, and where the next ring's state came from: memory, a peer, the checkpoint); the train loss (the newest
window with a loss recorded: a script that never calls ``job.record(loss)`` has none) and the test
accuracy (the newest evaluation, if any). Steps redone after a restart or a resume are counted once: a launch from step s drops
the windows (or the parts of windows) after s that an earlier segment did not checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
from pathlib import Path
from typing import Any, Iterable, Mapping, TypeVar

from elastic_ring.controller.api import RunState
from elastic_ring.events.api import (ErrorEvent, Evaluation, Event, EventLog, Finished, FirstStep, Launch,
                                     MembershipChanged, Recovered, ResizeOverhead, Restart, SegmentEnd, Throughput,
                                     as_event, read_events)

E = TypeVar("E", bound=Event)

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


def _kept_windows(events: list[Event]) -> list[Throughput]:
    kept: list[Throughput] = []
    for e in events:
        if isinstance(e, Throughput):
            kept.append(e)
        elif isinstance(e, Launch):
            start = _int(e.start_step, 1)
            out = []
            for w in kept:
                first = w.step - w.steps + 1
                if w.step < start:
                    out.append(w)
                elif first < start:
                    secs = w.seconds * (start - first) / w.steps if w.seconds and w.steps > 0 else w.seconds
                    out.append(dataclasses.replace(w, steps=start - first, step=start - 1, seconds=secs))
            kept = out
    return kept


def _int(v: Any, default: int) -> int:
    return default if v is None else int(v)


def _steps_by_size(launches: list[Launch], last_step: int) -> dict[int, int]:
    """Steps done at each size, each step once: launch i covers its start step up to the next
    launch's start (a restart or resume starts again after its checkpoint) or the last step."""
    out: dict[int, int] = {}
    for a, b in zip(launches, [*launches[1:], None]):
        end = _int(b.start_step, 1) - 1 if b is not None else last_step
        n = max(0, end - _int(a.start_step, 1) + 1)
        out[int(a.world_size)] = out.get(int(a.world_size), 0) + n
    return out


def _of(events: list[Event], kind: type[E]) -> list[E]:
    return [e for e in events if isinstance(e, kind)]


def last_step(events: list[Event]) -> int:
    """The newest step the events name: a window's, a segment end's, a first step's, the finish's,
    or the last step known done before a failure. A run that finished ended at its last segment's
    end (an earlier segment killed past its checkpoint may have named later steps, trained again
    after the resume)."""
    ends = [e for e in events if isinstance(e, SegmentEnd)]
    if ends and ends[-1].reason == "finished" and ends[-1].step:
        return int(ends[-1].step)
    return max([e.step or 0 for e in events if isinstance(e, (Throughput, SegmentEnd, FirstStep, Finished))]
               + [e.failed_at_step or 0 for e in _of(events, Restart)], default=0)


def summarize(events: Iterable[Event | Mapping[str, Any]]) -> dict[str, Any]:
    """The summary of a run from its events (records, or their JSON objects)."""
    events = [as_event(e) for e in events]
    by_w: dict[int, list[Throughput]] = {}
    windows = _kept_windows(events)
    for e in windows:
        by_w.setdefault(int(e.world_size), []).append(e)
    last = last_step(events)
    launches = _of(events, Launch)
    done = _steps_by_size(launches, last)
    sizes = []
    for w in sorted(by_w):
        ev = by_w[w]
        ips = [float(e.images_per_s) for e in ev]
        sps = [float(e.steps_per_s) for e in ev]
        secs = [float(e.seconds) if e.seconds else (int(e.steps) / r if r > 0 else 0.0)
                for e, r in zip(ev, sps)]
        total_s = sum(secs)
        if total_s > 0:
            steps_ps = sum(int(e.steps) for e in ev) / total_s
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
    overheads = [{k: getattr(e, k) for k in ("from_workers", "to_workers", "step", "stop_latency_s",
                                             "checkpoint_s", "relaunch_to_first_step_s", "total_lost_s",
                                             "steady_step_s")}
                 for e in _of(events, ResizeOverhead)]
    thr = windows
    rec = {e.attempt: e for e in _of(events, Recovered)}
    restarts = [{"attempt": e.attempt, "cause": e.cause, "rank": e.rank,
                 "from_step": e.from_step, "steps_redone": e.steps_redone,
                 "world_size": e.new_world_size, "gave_up": e.gave_up,
                 "failed_at_step": e.failed_at_step,
                 "time_lost_s": rec[e.attempt].time_lost_s if e.attempt in rec else None,
                 "detect_to_first_step_s": rec[e.attempt].detect_to_first_step_s if e.attempt in rec else None}
                for e in _of(events, Restart)]
    evals = _of(events, Evaluation)
    fin = _of(events, Finished)
    lossy = [e for e in thr if e.loss is not None and math.isfinite(float(e.loss))]
    state = (RunState.FINISHED if fin else RunState.FAILED if _of(events, ErrorEvent) else RunState.RUNNING).value
    return {
        "state": state,
        "step": last,
        "world_size": launches[-1].world_size if launches else None,
        "sizes": sizes,
        "scaling_efficiency": eff,
        "resizes": overheads,
        "restarts": restarts,
        "membership_changes": [membership_change(e) for e in _of(events, MembershipChanged)],
        "steps_trained": sum(done.values()),
        "train_loss": lossy[-1].loss if lossy else None,  # None: no loss recorded (job.record)
        "train_loss_step": lossy[-1].step if lossy else None,  # that window's last step
        "test_accuracy": evals[-1].test_accuracy if evals else None,
        "test_loss": evals[-1].test_loss if evals else None,
        "wall_s": fin[-1].wall_s if fin else None,
        "elapsed_s": fin[-1].elapsed_s if fin else None,
    }


def membership_change(e: MembershipChanged) -> dict[str, Any]:
    """One ``membership_change`` event as the summary (and the cluster's web page) shows it."""
    from elastic_ring.controller.membership import from_event

    c = from_event(e)
    what = c.describe() if c is not None else f"{e.cause} at step {e.step}: {e.members_before} -> {e.members_after}"
    return {"cause": e.cause, "step": e.step, "from_workers": e.members_before, "to_workers": e.members_after,
            "state_source": e.state_source, "segment": e.segment, "time": e.time, "what": what}


def summarize_run(run_dir: str | Path) -> dict[str, Any]:
    return summarize(read_events(Path(run_dir) / "events.jsonl"))


# what the resize table's columns measure, printed under it (and in `train --help`)
RESIZE_COLUMNS = (
    "stop s: resize asked (a scheduled one: its step done) -> old workers exited; ckpt s (the checkpoint) is in it",
    "relaunch s: new workers started -> their first step; started before the old ones exit (all but --relaunch",
    "  sequential), it overlaps the stop, so it can exceed lost s",
    "lost s: resize asked -> first step at the new size, less one steady step: the training time the resize cost",
)


def render(summary: dict[str, Any], total_steps: int | None = None) -> str:
    """Plain-text tables (also what `status` prints)."""
    lines = []
    from elastic_ring.protocol import NO_STEP_LIMIT

    step = f"{summary['step']}" + (f"/{total_steps}" if total_steps and total_steps < NO_STEP_LIMIT else "")
    workers = "-" if summary.get("world_size") is None else summary["world_size"]
    wall, elapsed = summary.get("wall_s"), summary.get("elapsed_s")
    lines.append(f"state: {summary['state']}   step: {step}   workers: {workers}"
                 + (f"   wall: {wall:.1f} s" if wall else "")
                 + (f" (elapsed {elapsed:.1f} s, of which {elapsed - wall:.1f} s stopped)"
                    if wall and elapsed and elapsed - wall >= 1.0 else ""))
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
        lines.extend(RESIZE_COLUMNS)
    done = [r for r in summary.get("restarts") or [] if not r.get("gave_up")]
    if done:
        lines.append("")
        lines.append(f"{'restart':>7} {'from step':>9} {'redone':>6} {'workers':>7} {'lost s':>7}  cause")
        for r in done:
            lost = r.get("time_lost_s")
            lines.append(f"{r['attempt']:>7} {r['from_step']:>9} {r['steps_redone']:>6} {r['world_size']:>7} "
                         f"{'n/a' if lost is None else f'{lost:.2f}':>7}  {r['cause']}")
    for r in summary.get("restarts") or []:
        if r.get("gave_up"):  # the failure that ended the run: not a restart
            at = r.get("failed_at_step")
            lines.append("")
            lines.append(f"not restarted{f' after step {at}' if at is not None else ''} "
                         f"({len(done)} restart(s) before): {r['cause']}")
    changes = summary.get("membership_changes") or []
    if changes:
        lines.append("")
        lines.append("membership changes (cause at step: workers, the state from):")
        lines.extend(f"  {c['what']}" for c in changes)
    lines.append("")
    tl = summary.get("train_loss")
    ta = summary.get("test_accuracy")
    at = summary.get("train_loss_step")
    if tl is None:
        loss = ("train loss: not recorded (the script does not call job.record(loss))" if summary["sizes"]
                else "train loss: no throughput window yet")
    else:  # the newest window's mean with a loss: 'final' once the run finished
        final = summary.get("state") == RunState.FINISHED.value
        loss = f"{'final ' if final else ''}train loss: {tl:.4f}" + (
            f" (window ending at step {at})" if at is not None and not (final and at == summary.get("step")) else "")
    acc = "no evaluation" if ta is None else f"{100 * ta:.2f}%"
    lines.append(f"{loss}   test accuracy: {acc}")
    return "\n".join(lines)


def run_times(events: list[Event], now: float) -> tuple[float, float]:
    """(running, elapsed) seconds of a run ending at ``now``: elapsed from its first launch;
    running without the gaps between a controller's end (its last event) and the next one's first
    launch (a ``--resume`` after a stop or a dead controller)."""
    running, start, last = 0.0, None, None
    for e in events:
        t = e.time
        if not isinstance(t, (int, float)):
            continue
        if isinstance(e, Launch) and (start is None or e.session_start):
            if start is not None and last is not None:
                running += max(0.0, last - start)
            start = t
        last = t
    if start is None:
        return 0.0, 0.0
    first = next(e.time for e in events if isinstance(e, Launch))
    return running + max(0.0, now - start), max(0.0, now - first)


def write_summary(run_dir: Path, events: EventLog, now: float, interrupted: bool = False) -> dict[str, Any]:
    """The run ended: write its ``finished`` event (unless ``interrupted``) and
    ``RUN_DIR/summary.json`` (atomically; its ``state`` a :class:`~.api.RunState`: ``stopped`` when
    ``interrupted``); returns the summary."""
    evs = read_events(run_dir / "events.jsonl")
    if not interrupted:
        s0 = summarize(evs)
        running, elapsed = run_times(evs, now)
        events.write(Finished(step=s0["step"], wall_s=running, elapsed_s=elapsed, train_loss=s0["train_loss"],
                              test_accuracy=s0["test_accuracy"], test_loss=s0["test_loss"]))
        evs = read_events(run_dir / "events.jsonl")
    summary = summarize(evs)
    if interrupted:
        summary["state"] = RunState.STOPPED.value
    tmp = run_dir / ".summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2))
    os.replace(tmp, run_dir / "summary.json")
    return summary
