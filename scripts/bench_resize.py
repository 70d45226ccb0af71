#!/usr/bin/env python
"""Resize overhead against the bare cost of starting the same number of workers, side by side.

For each repeat, in one process and alternating:
  * bare start: ``horovodrun -np N -H localhost:N --gloo python launch/bare_start.py``
    (horovodrun + ``import torch, horovod.torch`` + ``hvd.init()`` + one barrier), wall time;
  * resize: ``elastic-ring train`` runs whose schedule resizes 1 -> 2 -> 1 -> 2 -> 1, once per
    relaunch mode: ``prelaunch`` (ours, the default: the new workers start before the stop and
    wait, built, for the checkpoint), ``overlap`` (they start once the checkpoint is written) and
    ``sequential`` (they start after the old ones have exited, as in the paper). Each resize's
    ``total_lost_s`` (request to first step at the new size, minus one steady step) and its
    breakdown come from the run's ``resize_overhead`` events. Because pre-launched workers compete
    for the CPU with the training ones on this 2-core machine, the whole run's wall time per mode
    is reported too: it charges every mode for everything it costs.
Prints medians, the ratio resize / bare start per target size, and writes a JSON results file.
Target (issue 3): overhead <= 1.5 x the bare start.

    .venv/bin/python scripts/bench_resize.py --repeats 3 [--config configs/cpu_small.yaml]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import bare_start

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def resize_run(config: str, steps: int, schedule: str, extra: list[str]) -> tuple[list[dict], list[dict]]:
    with tempfile.TemporaryDirectory() as d:
        run = Path(d) / "run"
        cmd = [sys.executable, "-m", "elastic_ring.cli.main", "train", "--config", config,
               "--gpus", "1", "--steps", str(steps), "--schedule", schedule, "--slots", "2",
               "--run-dir", str(run), *extra]
        env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
        if p.returncode != 0:
            raise SystemExit(f"train failed:\n{p.stderr[-2000:]}")
        evs = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
        return ([e for e in evs if e["kind"] == "resize_overhead"],
                [e for e in evs if e["kind"] in ("first_step", "finished")])


def _median_phases(firsts: list[dict]) -> dict[str, float]:
    keys = firsts[0].get("phases", {}).keys() if firsts else []
    return {k: statistics.median(f["phases"][k] for f in firsts if k in f.get("phases", {})) for k in keys}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--config", default="configs/cpu_small.yaml")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--schedule", default="20:2,40:1,60:2,80:1")
    ap.add_argument("--set", dest="overrides", action="append", default=[],
                    help="config override passed to train (KEY=VALUE)")
    ap.add_argument("--out", default="results/bench_resize.json")
    a = ap.parse_args()
    extra = [x for kv in a.overrides for x in ("--set", kv)]
    modes = {m: ["--relaunch", m] for m in ("prelaunch", "overlap", "sequential")}

    bare: dict[int, list[float]] = {1: [], 2: []}
    res: dict[str, dict[int, list[dict]]] = {m: {1: [], 2: []} for m in modes}
    firsts: dict[str, list[dict]] = {m: [] for m in modes}
    walls: dict[str, list[float]] = {m: [] for m in modes}
    for i in range(a.repeats):
        for n in (1, 2):
            bare[n].append(bare_start(n))
        for m, flags in modes.items():
            ovs, fs = resize_run(a.config, a.steps, a.schedule, extra + flags)
            for ev in ovs:
                res[m][ev["to_workers"]].append(ev)
            firsts[m] += [f for f in fs if f["kind"] == "first_step" and f["segment"] > 0]
            walls[m] += [f["wall_s"] for f in fs if f["kind"] == "finished"]
        print(f"repeat {i + 1}/{a.repeats}: bare 1={bare[1][-1]:.2f}s 2={bare[2][-1]:.2f}s",
              file=sys.stderr, flush=True)

    rows = []
    print(f"\n{'mode':>10} {'to':>3} {'bare start s':>12} {'resize lost s':>13} {'ratio':>6} "
          f"{'stop s':>7} {'ckpt s':>7} {'relaunch->1st s':>15} {'n':>3}")
    for m in modes:
        for n in (1, 2):
            evs = res[m][n]
            b = statistics.median(bare[n])
            lost = statistics.median(e["total_lost_s"] for e in evs)
            row = {
                "mode": m, "to_workers": n, "bare_start_median_s": b, "bare_start_s": bare[n],
                "resize_lost_median_s": lost, "resize_lost_s": [e["total_lost_s"] for e in evs],
                "ratio": lost / b,
                "stop_latency_median_s": statistics.median(e["stop_latency_s"] for e in evs),
                "checkpoint_median_s": statistics.median(e["checkpoint_s"] for e in evs),
                "relaunch_to_first_step_median_s": statistics.median(e["relaunch_to_first_step_s"] for e in evs),
                "resizes": len(evs),
            }
            rows.append(row)
            print(f"{m:>10} {n:>3} {b:>12.2f} {lost:>13.2f} {row['ratio']:>6.2f} "
                  f"{row['stop_latency_median_s']:>7.2f} {row['checkpoint_median_s']:>7.3f} "
                  f"{row['relaunch_to_first_step_median_s']:>15.2f} {len(evs):>3}")
    summary = {m: statistics.median(r["ratio"] for r in rows if r["mode"] == m) for m in modes}
    gain = statistics.median(
        r_seq["resize_lost_median_s"] / r_ov["resize_lost_median_s"]
        for r_ov in rows if r_ov["mode"] == "prelaunch"
        for r_seq in rows if r_seq["mode"] == "sequential" and r_seq["to_workers"] == r_ov["to_workers"])
    phases = _median_phases(firsts["sequential"])
    print("\nrelaunched workers' start-up phases, median s: "
          + ", ".join(f"{k} {v:.2f}" for k, v in phases.items()))
    for m, r in summary.items():
        print(f"median ratio resize overhead / bare start, {m}: {r:.2f}x (target <= 1.5x)")
    print(f"sequential / prelaunch time lost: {gain:.2f}x")
    wall_med = {m: statistics.median(v) for m, v in walls.items()}
    print("whole-run wall time, median s: " + ", ".join(f"{m} {v:.2f}" for m, v in wall_med.items()))
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"config": a.config, "steps": a.steps, "schedule": a.schedule,
                               "repeats": a.repeats, "overrides": a.overrides, "rows": rows,
                               "median_ratio": summary, "sequential_over_prelaunch": gain,
                               "startup_phases_median_s": phases,
                               "run_wall_s": walls, "run_wall_median_s": wall_med,
                               "loadavg_at_end": os.getloadavg(), "cpu_count": os.cpu_count(),
                               "time": time.time()}, indent=2))
    print(f"written {out}")


if __name__ == "__main__":
    main()
