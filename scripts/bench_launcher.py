#!/usr/bin/env python
"""Our launcher (``elastic_ring.controller.hvdrun``) against plain ``horovodrun``, side by side.

Both run Horovod's own launcher on the same arguments; ours asks Horovod's build check once per
install instead of forking a process that imports torch at every launch. In each round, alternating
which goes first:
  * start: ``LAUNCHER -np N -H localhost:N --gloo python launch/bare_start.py`` (imports,
    ``hvd.init()``, one barrier), wall time and CPU time of the whole process tree, N = 1 and 2;
  * resize: ``elastic-ring train`` (tiny ResNet-8 on synthetic data) growing 1 -> 2 and shrinking
    2 -> 1, relaunch mode ``sequential`` (the new workers start after the old ones exited: the
    launcher is all on the critical path), with ``ELASTIC_RING_PLAIN_HOROVODRUN=1`` for the plain
    one; ``total_lost_s`` of each resize (request to first step at the new size, minus one steady
    step) and the run's wall time.
Prints medians and the ratio ours / plain (below 1 is faster), writes a JSON results file.

    .venv/bin/python scripts/bench_launcher.py --repeats 5 [--out results/bench_launcher.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import write_results

from elastic_ring.controller.hvdrun import command_prefix

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
LAUNCHERS = {"ours": command_prefix(plain=False), "plain": command_prefix(plain=True)}
TINY = ["--dataset", "synthetic", "--set", "synthetic_size=64", "--depth", "8", "--set", "width=4",
        "--batch-size", "8", "--set", "throughput_window=5"]


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def start(launcher: str, n: int) -> dict[str, float]:
    cmd = [*LAUNCHERS[launcher], "-np", str(n), "-H", f"localhost:{n}", "--gloo", sys.executable,
           str(ROOT / "launch" / "bare_start.py")]
    c0, t0 = _children_cpu(), time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
    return {"wall_s": time.perf_counter() - t0, "cpu_s": _children_cpu() - c0}


def resize(launcher: str, steps: int) -> dict[str, float]:
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    env.pop("ELASTIC_RING_PLAIN_HOROVODRUN", None)
    if launcher == "plain":
        env["ELASTIC_RING_PLAIN_HOROVODRUN"] = "1"
    with tempfile.TemporaryDirectory() as d:
        run = Path(d) / "run"
        cmd = [sys.executable, "-m", "elastic_ring.cli.main", "train", "--gpus", "1", "--steps", str(steps),
               "--schedule", f"{steps // 3}:2,{2 * steps // 3}:1", "--slots", "2", "--relaunch", "sequential",
               *TINY, "--run-dir", str(run)]
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            raise SystemExit(f"train with the {launcher} launcher failed:\n{p.stderr[-2000:]}")
        evs = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    launches = [e for e in evs if e["kind"] == "launch"]
    expect = LAUNCHERS[launcher][-1]
    if not all(expect in e["command"] for e in launches):
        raise SystemExit(f"the {launcher} run did not launch with {expect}")
    ov = [e for e in evs if e["kind"] == "resize_overhead"]
    if len(ov) != 2:
        raise SystemExit(f"expected 2 resizes, got {len(ov)}")
    return {"grow_lost_s": ov[0]["total_lost_s"], "shrink_lost_s": ov[1]["total_lost_s"], "run_wall_s": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5, help="alternating rounds (default 5)")
    ap.add_argument("--steps", type=int, default=60, help="steps of each resize run (default 60)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_launcher.json")
    a = ap.parse_args()
    if a.repeats < 1 or a.steps < 6:
        ap.error("--repeats must be >= 1 and --steps >= 6")
    load0 = os.getloadavg()[0]
    rows: dict[str, dict[str, list[float]]] = {}
    for r in range(a.repeats):
        order = ["ours", "plain"] if r % 2 == 0 else ["plain", "ours"]
        for launcher in order:
            for n in (1, 2):
                for k, v in start(launcher, n).items():
                    rows.setdefault(f"start {n} worker(s)", {}).setdefault(f"{launcher} {k}", []).append(v)
            for k, v in resize(launcher, a.steps).items():
                rows.setdefault("resize 1 -> 2 -> 1", {}).setdefault(f"{launcher} {k}", []).append(v)
        print(f"round {r + 1}/{a.repeats} done", file=sys.stderr)

    table = []
    for part, cols in rows.items():
        for metric in sorted({k.split(" ", 1)[1] for k in cols}):
            ours, plain = cols[f"ours {metric}"], cols[f"plain {metric}"]
            ratios = [o / p for o, p in zip(ours, plain) if p > 0]
            table.append({"part": part, "metric": metric, "ours_median": statistics.median(ours),
                          "plain_median": statistics.median(plain), "ratio_median": statistics.median(ratios),
                          "ours": ours, "plain": plain, "ratios": ratios})
    print(f"\n{'part':<20} {'metric':<14} {'ours':>8} {'plain':>8} {'ours/plain':>10}  per-round ratios")
    for t in table:
        print(f"{t['part']:<20} {t['metric']:<14} {t['ours_median']:8.2f} {t['plain_median']:8.2f} "
              f"{t['ratio_median']:9.2f}x  {', '.join(f'{x:.2f}' for x in t['ratios'])}")
    write_results(a.out, {"command": " ".join(["scripts/bench_launcher.py", *sys.argv[1:]]),
                          "repeats": a.repeats, "steps": a.steps, "rows": table}, load0)


if __name__ == "__main__":
    main()
