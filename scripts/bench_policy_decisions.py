"""Time the policies' array decisions alone (``allocate_batch``), old code against new, on decisions
captured from the simulator at cluster scale (issue 22, point 4: 100,000 jobs on 16,384 GPUs).

For each strategy, the simulator plays the first ``--first`` jobs of the 100,000-job / 16,384-GPU
stream (built-in ResNet-110 workload, moderate contention, seed 0) with this checkout's code and
records the inputs of ``--count`` consecutive decisions from decision ``--start`` on. Then fresh
interpreters replay them in order, on one policy object each (as the simulator calls it: the
policies keep state between decisions), with the package at ``--old-tree`` and this checkout,
alternating, ``--rounds`` times each. Per decision the least of the rounds is kept; reported: the
median and mean microseconds per decision, the first call (numba's import and cache load, or its
compilation on a fresh checkout) apart, and whether the two codes gave the same answers.

    .venv/bin/python scripts/bench_policy_decisions.py --old-tree DIR [--strategies ...]
        [--first 12000] [--start 12000] [--count 300] [--rounds 3] [--out results/bench_policy_decisions.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent.parent
STRATEGIES = "precompute,srtf,optimus,exploratory,precompute-rc,srtf-rc,optimus-rc"


class _Captured(Exception):
    pass


def _model_of(rate):
    """The SpeedModel behind a :func:`~elastic_ring.sched.api.model_rate` closure."""
    for cell in rate.__closure__ or ():
        v = cell.cell_contents
        if hasattr(v, "__self__"):
            return v.__self__
    raise TypeError("not a model_rate")


def capture(strategy: str, first: int, start: int, count: int) -> list:
    """The inputs of decisions ``start .. start+count-1`` of the stream's first ``first`` jobs."""
    from elastic_ring.sched.registry import make_policy
    from elastic_ring.sim import CONTENTION, SimConfig, load_workload, make_jobs, simulate

    caps: list = []
    pol = make_policy(strategy)
    inner = pol.allocate_batch
    seen = [0]

    def hook(b, gpus):
        if seen[0] >= start:
            used = np.unique(b.rows[b.rows >= 0])  # only the rows the decision uses, renumbered
            remap = np.full(max(len(b.rates), 1), -1, dtype=np.int64)
            remap[used] = np.arange(used.size)
            caps.append(({"ids": b.ids.copy(), "remaining": b.remaining.copy(), "current": b.current.copy(),
                          "rows": np.where(b.rows >= 0, remap[np.maximum(b.rows, 0)], -1),
                          "needs": b.needs_exploration.copy(), "exploring": b.exploring.copy(),
                          "tables": b.tables[used].copy(), "models": [_model_of(b.rates[r]) for r in used],
                          "rate1": b.rate1[used].copy(),
                          "monotone": None if b.monotone is None else b.monotone[used].copy()}, gpus))
            if len(caps) >= count:
                raise _Captured
        seen[0] += 1
        return inner(b, gpus)

    pol.allocate_batch = hook
    wl = load_workload("resnet110-cifar10")
    models = {wl.name: wl.model}
    cfg = SimConfig(gpus=16384, contention=CONTENTION["moderate"], jobs=100_000, seed=0)
    try:
        simulate(cfg, pol, make_jobs(cfg, models)[:first], models)
    except _Captured:
        pass
    return caps


def replay(path: str, strategy: str) -> dict:
    """Child side: the decisions of ``path`` on the package found first on sys.path."""
    from elastic_ring.sched.api import JobBatch, model_rate
    from elastic_ring.sched.registry import make_policy

    caps = pickle.loads(Path(path).read_bytes())
    rates: dict = {}
    lists: dict = {}
    batches = []
    for c, gpus in caps:
        rs = [rates.setdefault(id(m), (m, model_rate(m)))[1] for m in c["models"]]
        rs = lists.setdefault(tuple(map(id, rs)), rs)  # one list object, as the simulator's
        batches.append((JobBatch(c["ids"], c["remaining"], c["current"], c["rows"], c["needs"], c["exploring"],
                                 c["tables"], rs, c["rate1"], c["monotone"]), gpus))
    pol = make_policy(strategy)
    times, digest = [], hashlib.sha256()
    for i, (b, gpus) in enumerate(batches):
        t = time.perf_counter()
        out = pol.allocate_batch(b, gpus)
        times.append(time.perf_counter() - t)
        digest.update(np.asarray(out, dtype=np.int64).tobytes())
    digest.update(repr((getattr(pol, "vetoed", None), getattr(pol, "last_vetoed", None))).encode())
    return {"us": [round(x * 1e6, 2) for x in times], "digest": digest.hexdigest()[:16]}


def _child(tree: str, path: str, strategy: str) -> dict:
    env = dict(os.environ, PYTHONPATH=tree)
    out = subprocess.run([sys.executable, __file__, "--child", path, "--strategies", strategy], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old-tree", help="a copy of the package before the change (e.g. `git archive main` unpacked)")
    ap.add_argument("--old-note", default=None, help="what the old tree is (recorded instead of its path)")
    ap.add_argument("--strategies", default=STRATEGIES)
    ap.add_argument("--first", type=int, default=12000)
    ap.add_argument("--start", type=int, default=12000)
    ap.add_argument("--count", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="results/bench_policy_decisions.json")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(replay(a.child, a.strategies)))
        return
    if not a.old_tree or not (Path(a.old_tree) / "elastic_ring").is_dir():
        print(f"error: --old-tree must be a folder with the elastic_ring package, got {a.old_tree!r}", file=sys.stderr)
        raise SystemExit(2)
    load0 = [round(x, 2) for x in os.getloadavg()]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for s in a.strategies.split(","):
            caps = capture(s, a.first, a.start, a.count)
            path = str(Path(tmp) / f"{s}.pkl")
            Path(path).write_bytes(pickle.dumps(caps))
            runs: dict[str, list[dict]] = {"old": [], "new": []}
            for _ in range(a.rounds):
                for name, tree in (("old", a.old_tree), ("new", str(HERE))):
                    runs[name].append(_child(tree, path, s))
            row = {"strategy": s, "decisions": len(caps), "jobs_per_decision": round(float(np.mean(
                [c["ids"].size for c, _ in caps])), 1), "identical": len({r["digest"] for v in runs.values() for r in v}) == 1}
            for name, rs in runs.items():
                best = np.min(np.array([r["us"] for r in rs]), axis=0)  # per decision, the least of the rounds
                row[name] = {"median_us": round(float(np.median(best[1:])), 1), "mean_us": round(float(np.mean(best[1:])), 1),
                             "first_call_ms": [round(r["us"][0] / 1e3, 1) for r in rs]}
            row["median_ratio_old_over_new"] = round(row["old"]["median_us"] / row["new"]["median_us"], 2)
            rows.append(row)
            print(f"{s:>14}: {row['decisions']} decisions, {row['jobs_per_decision']:.0f} jobs each; median "
                  f"{row['old']['median_us']:.1f} -> {row['new']['median_us']:.1f} us per decision "
                  f"({row['median_ratio_old_over_new']}x); identical: {row['identical']}", flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps({
        "machine": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
        "load_at_start_1_5_15min": load0, "load_at_end_1_5_15min": [round(x, 2) for x in os.getloadavg()],
        "old_tree": a.old_note or Path(a.old_tree).name, "stream": "100000 jobs x 16384 GPUs, moderate, seed 0",
        "first_jobs": a.first, "start": a.start, "count": a.count, "rounds": a.rounds,
        "note": "microseconds per allocate_batch call (time.perf_counter), the first call of each replay left out of "
                "the median/mean (it holds numba's import and cache load); per decision the least of the rounds",
        "runs": rows}, indent=2) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
