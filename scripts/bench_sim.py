"""Time the simulator: 10,000 jobs on 1,024 GPUs must take under 30 s (issue 5).

Runs each strategy once at the given size and contention with the built-in ResNet-110 workload,
then the Eq. 6 allocator with the heap against the naive full-scan reference on a smaller run
(same decisions; the ratio is the heap's speed-up). Prints the figures and writes
``results/bench_sim.json``.

    .venv/bin/python scripts/bench_sim.py [--jobs 10000] [--gpus 1024] [--contention moderate]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

from elastic_ring.sched.policies import Precompute, doubling_allocate_naive, make_policy
from elastic_ring.sim import CONTENTION, SimConfig, load_workload, make_jobs, simulate


class NaivePrecompute(Precompute):
    name = "precompute-naive"

    def allocate(self, jobs, total_gpus, current):
        return doubling_allocate_naive([(j.id, j.remaining, j.rate) for j in jobs], total_gpus)


def run_one(cfg, policy, jobs, models) -> dict:
    t = time.perf_counter()
    r = simulate(cfg, policy, jobs, models)
    wall = time.perf_counter() - t
    return {"strategy": policy.name, "jobs": cfg.jobs, "gpus": cfg.gpus, "wall_s": round(wall, 3),
            "avg_jct_h": round(r.avg_jct_s / 3600, 3), "resizes": r.resizes, "completed": r.completed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--gpus", type=int, default=1024)
    ap.add_argument("--contention", default="moderate", choices=list(CONTENTION))
    ap.add_argument("--strategies", default="eight,precompute,exploratory,optimus")
    ap.add_argument("--naive-jobs", type=int, default=2000)
    ap.add_argument("--naive-gpus", type=int, default=256)
    ap.add_argument("--out", default="results/bench_sim.json")
    a = ap.parse_args()
    wl = load_workload("resnet110-cifar10")
    models = {wl.name: wl.model}
    cfg = SimConfig(gpus=a.gpus, contention=CONTENTION[a.contention], jobs=a.jobs, seed=0)
    jobs = make_jobs(cfg, models)
    rows = []
    for s in a.strategies.split(","):
        row = run_one(cfg, make_policy(s), jobs, models)
        rows.append(row)
        print(f"{row['strategy']:>12}: {row['jobs']} jobs on {row['gpus']} GPUs in {row['wall_s']:.2f} s "
              f"(avg JCT {row['avg_jct_h']:.2f} h, {row['resizes']} resizes)", flush=True)
    small = SimConfig(gpus=a.naive_gpus, contention=CONTENTION[a.contention], jobs=a.naive_jobs, seed=0)
    sjobs = make_jobs(small, models)
    heap_row = run_one(small, make_policy("precompute"), sjobs, models)
    naive_row = run_one(small, NaivePrecompute(), sjobs, models)
    same = heap_row["avg_jct_h"] == naive_row["avg_jct_h"] and heap_row["resizes"] == naive_row["resizes"]
    ratio = naive_row["wall_s"] / max(heap_row["wall_s"], 1e-9)
    print(f"heap vs naive doubling, {a.naive_jobs} jobs on {a.naive_gpus} GPUs: {heap_row['wall_s']:.2f} s vs "
          f"{naive_row['wall_s']:.2f} s (naive/heap = {ratio:.1f}x), same result: {same}")
    out = {"machine": platform.platform(), "python": platform.python_version(),
           "contention": a.contention, "runs": rows,
           "heap_vs_naive": {"heap": heap_row, "naive": naive_row, "naive_over_heap": round(ratio, 2),
                             "same_result": same},
           "limit_s": 30.0, "all_under_limit": all(r["wall_s"] < 30.0 for r in rows)}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
