"""Resize-cost-aware decisions in simulation (issue 22, point 3): each policy with and without
the :class:`~elastic_ring.sched.policies.ResizeAware` gate (a running job is grown only when the
work it gains over a horizon of 10 resize costs exceeds the work the resize costs it).

For each resize cost and job-size range, every policy runs on the same seeded job streams (seeds
100.. : not the seeds any constant was tuned on; the gate has no tuned constant). Reports mean
average and p99 JCT, resizes per job and job-seconds lost to resizes per job (resizes x cost / jobs).
Writes ``results/sim_resize_cost.json``.

    .venv/bin/python scripts/sim_resize_cost.py [--seeds 3] [--gpus 64] [--jobs 200]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

from elastic_ring.sched.registry import make_policy
from elastic_ring.sim import CONTENTION, SimConfig, load_workload, make_jobs, simulate

SIZES = {"paper (0.25-8 h at 8 GPUs)": (0.25, 8.0), "short (36 s-6 min at 8 GPUs)": (0.01, 0.1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--costs", default="3.5,10")
    ap.add_argument("--out", default="results/sim_resize_cost.json")
    a = ap.parse_args()
    wl = load_workload("resnet110-cifar10")
    models = {wl.name: wl.model}
    seeds = list(range(100, 100 + a.seeds))
    rows = []
    for size, (lo, hi) in SIZES.items():
        for cost in [float(x) for x in a.costs.split(",")]:
            for name in ("eight", "precompute", "precompute-rc", "srtf", "srtf-rc", "optimus", "optimus-rc"):
                rs = []
                for seed in seeds:
                    cfg = SimConfig(gpus=a.gpus, contention=CONTENTION["moderate"], jobs=a.jobs, seed=seed,
                                    resize_overhead_s=cost, min_hours_at_8=lo, max_hours_at_8=hi,
                                    explore_phase_s=max(150.0, cost + 1))
                    rs.append(simulate(cfg, make_policy(name, cost), make_jobs(cfg, models), models))
                row = {"jobs": size, "resize_cost_s": cost, "strategy": name,
                       "avg_jct_s": float(np.mean([r.avg_jct_s for r in rs])),
                       "p99_jct_s": float(np.mean([r.p99_jct_s for r in rs])),
                       "resizes_per_job": float(np.mean([r.resizes / r.jobs for r in rs])),
                       "seconds_lost_per_job": float(np.mean([r.resizes * cost / r.jobs for r in rs]))}
                rows.append(row)
                print(f"{size:>28} cost {cost:>4g} s {name:>14}: avg JCT {row['avg_jct_s']:9.1f} s, p99 "
                      f"{row['p99_jct_s']:9.1f} s, {row['resizes_per_job']:.2f} resizes/job, "
                      f"{row['seconds_lost_per_job']:.1f} s lost/job", flush=True)
    out = {"seeds": seeds, "gpus": a.gpus, "jobs_per_run": a.jobs, "offered_load": CONTENTION["moderate"],
           "remaining": "oracle", "load": [round(x, 2) for x in os.getloadavg()], "runs": rows}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
