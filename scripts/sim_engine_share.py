"""Where a simulator run's time goes: the policy's decisions against the engine's own work.

Runs one job stream (as ``scripts/bench_sim.py``: built-in ResNet-110 workload, oracle remaining
work, seed 0) under each strategy, with the policy wrapped in a timer (``time.perf_counter``
around every ``allocate`` / ``allocate_batch`` call) and, for Exploratory, the engine's Eq. 5 fit
of each explored job timed too. The engine's own time is the run's time minus the policy's: the
event loop, the remaining work handed to the policy, applying each decision, completions and
exploration phases. No profiler (its overhead falls on per-call Python code, i.e. on the engine).

    .venv/bin/python scripts/sim_engine_share.py [--size 100000x16384] [--first 20000]
        [--strategies srtf,optimus,exploratory] [--out results/sim_engine_share.json]

Run it with ``PYTHONPATH`` set to another checkout to measure that engine (the "before" of a
change): the script only uses the simulator's public API, plus the name of the fit function
(``_fit_model`` or, in older engines, ``fit_speed_few``) in ``elastic_ring.sim.engine``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from pathlib import Path

import elastic_ring
from elastic_ring.sched.registry import make_policy
from elastic_ring.sim import CONTENTION, SimConfig, load_workload, make_jobs, simulate
from elastic_ring.sim import engine


class TimedPolicy:
    """A policy whose every decision is timed (the rest is delegated unchanged)."""

    def __init__(self, policy) -> None:  # noqa: ANN001 - any policy
        self._p = policy
        self.seconds = 0.0
        self.calls = 0
        if getattr(policy, "allocate_batch", None) is None:
            self.allocate_batch = None

    def __getattr__(self, name: str):  # noqa: ANN204 - name, explores, uses_remaining, ...
        return getattr(self._p, name)

    def _timed(self, call, a):  # noqa: ANN001, ANN202
        t = time.perf_counter()
        try:
            return call(*a)
        finally:
            self.seconds += time.perf_counter() - t
            self.calls += 1

    def allocate(self, *a):  # noqa: ANN002, ANN201
        return self._timed(self._p.allocate, a)

    def allocate_batch(self, *a):  # noqa: ANN002, ANN201, F811
        return self._timed(self._p.allocate_batch, a)


def _timed_fit(name: str) -> dict:
    """Wrap the engine's fit function ``name`` in a timer; returns the counter."""
    box = {"seconds": 0.0, "calls": 0}
    inner = getattr(engine, name)

    def fit(*a, **k):  # noqa: ANN002, ANN003, ANN202
        t = time.perf_counter()
        try:
            return inner(*a, **k)
        finally:
            box["seconds"] += time.perf_counter() - t
            box["calls"] += 1

    setattr(engine, name, fit)
    return box


def run(strategy: str, cfg: SimConfig, jobs, models) -> dict:  # noqa: ANN001
    fit_name = "_fit_model" if hasattr(engine, "_fit_model") else "fit_speed_few"
    inner_fit = getattr(engine, fit_name)
    fit = _timed_fit(fit_name)
    pol = TimedPolicy(make_policy(strategy))
    t, c = time.perf_counter(), time.process_time()
    try:
        r = simulate(cfg, pol, jobs, models)
    finally:
        setattr(engine, fit_name, inner_fit)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    eng = wall - pol.seconds
    return {"strategy": strategy, "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
            "policy_s": round(pol.seconds, 3), "engine_s": round(eng, 3),
            "engine_share": round(eng / wall, 3), "decisions": pol.calls,
            "engine_us_per_decision": round(1e6 * eng / max(pol.calls, 1), 1), "resizes": r.resizes,
            "fit_s": round(fit["seconds"], 3), "fits": fit["calls"],
            "fit_us_per_job": round(1e6 * fit["seconds"] / fit["calls"], 1) if fit["calls"] else None,
            "avg_jct_s": r.avg_jct_s, "load_before": round(os.getloadavg()[0], 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="100000x16384")
    ap.add_argument("--first", type=int, default=20000, help="play only the first N jobs (0: all)")
    ap.add_argument("--strategies", default="srtf,optimus,exploratory")
    ap.add_argument("--out", default="results/sim_engine_share.json")
    a = ap.parse_args()
    n_jobs, gpus = (int(x) for x in a.size.lower().split("x"))
    wl = load_workload("resnet110-cifar10")
    models = {wl.name: wl.model}
    cfg = SimConfig(gpus=gpus, contention=CONTENTION["moderate"], jobs=n_jobs, seed=0)
    jobs = make_jobs(cfg, models)
    if a.first:
        jobs = jobs[: a.first]
    tree = str(Path(elastic_ring.__file__).resolve().parent.parent)
    try:
        commit = subprocess.run(["git", "-C", tree, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "not a git checkout"
    load0 = [round(x, 2) for x in os.getloadavg()]
    rows = []
    for s in a.strategies.split(","):
        rows.append(run(s, cfg, jobs, models))
        r = rows[-1]
        print(f"{s:>14}: {r['wall_s']:.2f} s wall, policy {r['policy_s']:.2f} s, engine {r['engine_s']:.2f} s "
              f"({r['engine_us_per_decision']} us per decision of {r['decisions']}), fit {r['fit_s']:.2f} s", flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({"machine": platform.platform(), "cpus": os.cpu_count(), "commit": commit,
                                       "load_at_start_1_5_15min": load0, "size": a.size, "first_jobs": len(jobs),
                                       "runs": rows}, indent=2) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
