"""The built-in ResNet worker through the worker library against the worker before it (a git
revision, default the last commit before the library), side by side in one run.

Both run as real `elastic-ring train` jobs (horovodrun, gloo) with the same model, per-worker
batch, data and thread count: the CPU default (configs/cpu_small.yaml: ResNet-20 width 8 on the
digits, batch 32 per worker), 1 and 2 workers, rounds alternating between the two versions. The figure
is the median images/s of each run's throughput windows (start-up excluded), and the paired ratio
library / before.

    .venv/bin/python scripts/bench_worker.py [--baseline REV] [--rounds 3] [--steps 200]
    -> results/bench_worker.json

The baseline is checked out with `git worktree` into a temporary folder and imported from there
(PYTHONPATH), with this checkout's venv (same torch and Horovod).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchlib import write_results

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "f2ff12a"  # main before the worker library (issue 10)


def run(tree: Path, run_dir: Path, workers: int, steps: int) -> float:
    cmd = [sys.executable, "-m", "elastic_ring.cli.main", "train", "--gpus", str(workers),
           "--steps", str(steps), "--set", "throughput_window=20", "--slots", "2",
           "--run-dir", str(run_dir)]
    env = dict(os.environ, PYTHONPATH=str(tree),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    p = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"run in {tree} failed:\n{p.stderr[-3000:]}")
    launch = json.loads((run_dir / "events.jsonl").read_text().splitlines()[0])
    entry = " ".join(launch["command"])
    assert str(tree) in entry, f"run did not use {tree}: {entry}"
    return json.loads((run_dir / "summary.json").read_text())["sizes"][0]["images_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default=BASELINE, help="git revision of the worker before")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_worker.json")
    a = ap.parse_args()
    counts = [int(x) for x in a.workers.split(",")]
    load0 = os.getloadavg()[0]
    res: dict[str, dict[int, list[float]]] = {"library": {w: [] for w in counts},
                                              "before": {w: [] for w in counts}}
    with tempfile.TemporaryDirectory() as d:
        base = Path(d) / "baseline"
        subprocess.run(["git", "worktree", "add", "--detach", str(base), a.baseline], cwd=ROOT,
                       check=True, capture_output=True)
        try:
            for i in range(a.rounds):
                for w in counts:
                    order = [("before", base), ("library", ROOT)]
                    if i % 2:
                        order.reverse()
                    for name, tree in order:
                        ips = run(tree, Path(d) / f"{name}-w{w}-{i}", w, a.steps)
                        res[name][w].append(ips)
                        print(f"round {i + 1}  {w} worker(s)  {name:<8} {ips:8.1f} images/s", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, capture_output=True)
    table = []
    print(f"\n{'workers':>7} {'before':>9} {'library':>9} {'ratio (paired median)':>22}")
    for w in counts:
        ratios = [lib / bef for lib, bef in zip(res["library"][w], res["before"][w])]
        row = {"workers": w, "before_images_per_s": statistics.median(res["before"][w]),
               "library_images_per_s": statistics.median(res["library"][w]),
               "paired_ratios": ratios, "median_ratio": statistics.median(ratios)}
        table.append(row)
        print(f"{w:>7} {row['before_images_per_s']:>9.1f} {row['library_images_per_s']:>9.1f} "
              f"{row['median_ratio']:>10.3f} ({min(ratios):.3f}-{max(ratios):.3f})")
    write_results(a.out, {"baseline": a.baseline, "steps": a.steps, "rounds": a.rounds, "table": table,
                          "runs": res}, load0)


if __name__ == "__main__":
    main()
