"""Time the simulator across cluster sizes: a scaling curve (jobs x GPUs at 4 sizes) per policy.

Issue 22's target: 100,000 jobs on 16,384 GPUs in under 60 s for every policy. Each size runs
every strategy once on the same seeded job stream (built-in ResNet-110 workload, the given
contention, oracle remaining work: the engine's default). Each row records the wall time, the
run's figures and a digest of its per-job JCTs, so that a later run can show its results are
bit-identical to an earlier one (``--before FILE``: the rows of a run of this script with the
older engine, merged into the results file beside the new ones, with the speed-up and whether the
digests match). The machine's load (``os.getloadavg()``) is recorded before and after each run.

    .venv/bin/python scripts/bench_sim.py [--sizes 2500x256,5000x512,10000x1024,100000x16384]
        [--strategies eight,precompute,srtf,optimus,exploratory,precompute-rc,srtf-rc,optimus-rc]
        [--before FILE] [--before-note TEXT] [--cap-s 300] [--profile N] [--first N] [--out results/bench_sim.json]
    .venv/bin/python scripts/bench_sim.py --ab OLD_TREE [--before-note TEXT] [--rounds 3] [--first N] ...

``--first N`` plays only the first N jobs of each size's stream (a shorter horizon at the same cluster
size), in the in-process runs and in ``--ab``'s side-by-side runs alike.

The default sizes are the ones of the committed results, so that ``--before`` (an earlier run's
file) has a digest to compare at each of them. ``--profile N`` runs each under cProfile and stores
its N functions of most own time in the row (``profile``): where a policy's time goes; the times of
such a run include the profiler's overhead, so time with a run without it.

``--cap-s``: once one strategy takes more CPU seconds than this at a size, its larger sizes are
skipped (recorded as skipped, not extrapolated). Wall and CPU time (``time.process_time``) are
both recorded: on a loaded machine the CPU time is the steadier figure, and the comparison with
``--before`` is made on it. The file is rewritten after every run, so a run cut short leaves what
it measured (``finished``: false). ``--merge AFTER --before BEFORE`` runs nothing and writes the two
runs' rows into one file (how the committed results were put together: the old engine's run, made
from a copy of the tree before the change, and the new engine's run, made at the same time).
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import pstats
import json
import os
import platform
import subprocess
import time
from pathlib import Path

import numpy as np

from elastic_ring.sched.registry import make_policy
from elastic_ring.sim import CONTENTION, SimConfig, load_workload, make_jobs, simulate

LIMIT_S = 60.0
TARGET = (100_000, 16_384)


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _top(prof: cProfile.Profile, n: int) -> list[dict]:
    """The ``n`` functions of most own time: name, calls, own and cumulative seconds."""
    st = pstats.Stats(prof)
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:n]
    return [{"function": f"{Path(f).name}:{line}({name})", "calls": nc, "own_s": round(tt, 3), "cum_s": round(ct, 3)}
            for (f, line, name), (cc, nc, tt, ct, _) in rows]


def run_one(cfg: SimConfig, strategy: str, jobs, models, profile: int = 0) -> dict:
    load0 = _load()
    prof = cProfile.Profile() if profile else None
    t, c = time.perf_counter(), time.process_time()
    if prof:
        prof.enable()
    r = simulate(cfg, make_policy(strategy), jobs, models)
    if prof:
        prof.disable()
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    digest = hashlib.sha256(repr((r.avg_jct_s, r.p99_jct_s, r.makespan_s, r.utilisation, r.resizes,
                                  r.max_gpus_in_use, r.jct_s)).encode()).hexdigest()[:16]
    return {"strategy": strategy, "jobs": cfg.jobs, "gpus": cfg.gpus, "wall_s": round(wall, 3),
            "cpu_s": round(cpu, 3), "avg_jct_h": round(r.avg_jct_s / 3600, 4), "resizes": r.resizes, "completed": r.completed,
            "digest": digest, "load_before": load0, "load_after": _load(),
            **({"profile": _top(prof, profile)} if prof else {})}


def _child_run(tree: str, strategy: str, n_jobs: int, gpus: int, contention: str, first: int = 0) -> dict:
    """One run in a fresh interpreter on the code at ``tree`` (a checkout of the package)."""
    code = (
        "import hashlib, json, sys, time\n"
        "from elastic_ring.sched.registry import make_policy\n"
        "from elastic_ring.sim import CONTENTION, SimConfig, load_workload, make_jobs, simulate\n"
        f"wl = load_workload('resnet110-cifar10'); models = {{wl.name: wl.model}}\n"
        f"cfg = SimConfig(gpus={gpus}, contention=CONTENTION[{contention!r}], jobs={n_jobs}, seed=0)\n"
        "jobs = make_jobs(cfg, models)\n"
        f"jobs = jobs[:{first}] if {first} else jobs\n"
        "t, c = time.perf_counter(), time.process_time()\n"
        f"r = simulate(cfg, make_policy({strategy!r}), jobs, models)\n"
        "wall, cpu = time.perf_counter() - t, time.process_time() - c\n"
        "d = hashlib.sha256(repr((r.avg_jct_s, r.p99_jct_s, r.makespan_s, r.utilisation, r.resizes,\n"
        "    r.max_gpus_in_use, r.jct_s)).encode()).hexdigest()[:16]\n"
        "import elastic_ring\n"
        "print(json.dumps({'wall_s': wall, 'cpu_s': cpu, 'digest': d, 'package': elastic_ring.__file__}))\n")
    env = dict(os.environ, PYTHONPATH=tree)
    # cwd=tree: `python -c` puts the working directory first on sys.path, before PYTHONPATH (run from
    # this checkout, the old tree's side would import this checkout's package)
    out = subprocess.run([os.sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True,
                         cwd=tree)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    if not Path(row.pop("package")).resolve().is_relative_to(Path(tree).resolve()):
        raise RuntimeError(f"the run for {tree} did not import its package")
    return row


def side_by_side(old_tree: str, sizes, strategies, contention: str, rounds: int, first: int = 0) -> list[dict]:
    """The code at ``old_tree`` and this checkout, alternating, ``rounds`` times each: medians and
    the ratio old/new of CPU and wall seconds, and whether the digests match."""
    here = str(Path(__file__).resolve().parent.parent)
    out = []
    for n_jobs, gpus in sizes:
        for s in strategies:
            runs: dict[str, list[dict]] = {"old": [], "new": []}
            for _ in range(rounds):
                for name, tree in (("old", old_tree), ("new", here)):
                    runs[name].append(_child_run(tree, s, n_jobs, gpus, contention, first))
            med = {k: {m: round(float(np.median([r[m] for r in v])), 3) for m in ("wall_s", "cpu_s")}
                   for k, v in runs.items()}
            row = {"strategy": s, "jobs": n_jobs, "gpus": gpus, **({"first_jobs": first} if first else {}),
                   "rounds": rounds, "old": med["old"], "new": med["new"],
                   "cpu_ratio_old_over_new": round(med["old"]["cpu_s"] / max(med["new"]["cpu_s"], 1e-9), 2),
                   "wall_ratio_old_over_new": round(med["old"]["wall_s"] / max(med["new"]["wall_s"], 1e-9), 2),
                   "identical": len({r["digest"] for v in runs.values() for r in v}) == 1, "load_after": _load()}
            print(f"{s:>12} {n_jobs}x{gpus}: CPU old {med['old']['cpu_s']:.2f} s, new {med['new']['cpu_s']:.2f} s "
                  f"({row['cpu_ratio_old_over_new']}x), identical: {row['identical']}", flush=True)
            out.append(row)
    return out


def parse_sizes(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        j, g = part.lower().split("x")
        out.append((int(j), int(g)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="2500x256,5000x512,10000x1024,100000x16384")
    ap.add_argument("--contention", default="moderate", choices=list(CONTENTION))
    ap.add_argument("--strategies", default="eight,precompute,srtf,optimus,exploratory,precompute-rc,srtf-rc,optimus-rc")
    ap.add_argument("--before", default=None, help="results file of an earlier engine to compare with (its runs)")
    ap.add_argument("--before-note", default=None, help="where the --before file (or the --ab tree) came from (recorded)")
    ap.add_argument("--profile", type=int, default=0, help="profile each run: store its N top functions")
    ap.add_argument("--first", type=int, default=0,
                    help="play only the first N jobs of each size's stream (a shorter horizon, for --profile)")
    ap.add_argument("--cap-s", type=float, default=300.0)
    ap.add_argument("--merge", default=None,
                    help="run nothing: take the rows of this results file (a run of the newer engine) and "
                         "write them with --before's rows into --out")
    ap.add_argument("--ab", default=None, metavar="OLD_TREE",
                    help="side by side: the package at OLD_TREE (e.g. `git archive main` unpacked) and this "
                         "checkout, alternating, --rounds times each, in fresh interpreters; writes only that")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default="results/bench_sim.json")
    a = ap.parse_args()
    if a.ab:
        load0 = [round(x, 2) for x in os.getloadavg()]
        rows_ab = side_by_side(a.ab, parse_sizes(a.sizes), a.strategies.split(","), a.contention, a.rounds, a.first)
        Path(a.out).write_text(json.dumps({"machine": platform.platform(), "cpus": os.cpu_count(), "commit": _commit(),
                                           "old_tree": a.before_note or Path(a.ab).name, "load_at_start_1_5_15min": load0,
                                           **({"first_jobs": a.first} if a.first else {}),
                                           "contention": a.contention, "side_by_side": rows_ab}, indent=2) + "\n")
        print(f"wrote {a.out}")
        return
    wl = load_workload("resnet110-cifar10")
    models = {wl.name: wl.model}
    strategies = a.strategies.split(",")
    sizes = parse_sizes(a.sizes)
    rows: list[dict] = []
    before = json.loads(Path(a.before).read_text()) if a.before else None
    commit = _commit()  # the code this run measures (HEAD may move while it runs)
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    merged_finished = True
    parts: list[dict] = []  # --merge: the files the rows came from
    if a.merge:  # one or more results files of the newer engine (comma list), rows in that order
        files = [json.loads(Path(f).read_text()) for f in a.merge.split(",")]
        commits = {m.get("commit") for m in files}
        commit = ",".join(sorted(c for c in commits if c))
        strategies = list(dict.fromkeys(st for m in files for st in m.get("strategies", [])))
        sizes = list(dict.fromkeys(tuple(map(int, x.split("x"))) for m in files for x in m.get("sizes", [])))
        for f, m in zip(a.merge.split(","), files):
            rows.extend(r for r in m["runs"] if "wall_s" in r)
            merged_finished &= bool(m.get("finished"))
            parts.append({"file": f, "commit": m.get("commit"), "finished": m.get("finished"),
                          "load_at_start_1_5_15min": m.get("load_at_start_1_5_15min"), "profiled": m.get("profiled"),
                          "runs": [f"{r['strategy']} {r['jobs']}x{r['gpus']}" for r in m["runs"]]})

    def write(finished: bool) -> None:
        """The results file, rewritten after every run (a run cut short leaves what it measured)."""
        out: dict = {"machine": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                     "commit": commit, "load_at_start_1_5_15min": load_at_start, "profiled": bool(a.profile),
                     "contention": a.contention, "limit_s": LIMIT_S,
                     "sizes": [f"{j}x{g}" for j, g in sizes], "strategies": strategies, "finished": finished,
                     "note": "wall and CPU seconds per run (time.perf_counter, time.process_time); the load "
                             "average before and after each run says how much other work shared the machine",
                     "runs": rows, **({"merged_from": parts} if parts else {})}
        target = [r for r in rows if (r["jobs"], r["gpus"]) == TARGET and "wall_s" in r]
        if target:
            out["target_all_under_limit"] = len(target) == len(strategies) and all(r["wall_s"] < LIMIT_S for r in target)
            out["target_measured"] = {r["strategy"]: {"wall_s": r["wall_s"], "cpu_s": r["cpu_s"]} for r in target}
            out["target_over_limit"] = [r["strategy"] for r in target if not r["wall_s"] < LIMIT_S]
            out["target_not_measured"] = [st for st in strategies if st not in out["target_measured"]]
        if before is not None:
            by_key = {(r["strategy"], r["jobs"], r["gpus"]): r for r in before["runs"] if "cpu_s" in r}
            cmp = []
            for r in rows:
                b = by_key.get((r["strategy"], r["jobs"], r["gpus"]))
                if b is None or "cpu_s" not in r:
                    continue
                cmp.append({"strategy": r["strategy"], "jobs": r["jobs"], "gpus": r["gpus"],
                            "before_cpu_s": b["cpu_s"], "after_cpu_s": r["cpu_s"],
                            "cpu_speedup": round(b["cpu_s"] / max(r["cpu_s"], 1e-9), 2),
                            "before_wall_s": b["wall_s"], "after_wall_s": r["wall_s"],
                            "identical": b["digest"] == r["digest"]})
            out["before"] = {"commit": before.get("commit"), "source": a.before_note, "runs": before["runs"]}
            out["before_vs_after"] = cmp
            out["all_identical"] = all(c["identical"] for c in cmp) if cmp else None
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(out, indent=2) + "\n")

    capped: set[str] = set()
    for n_jobs, gpus in ([] if a.merge else sizes):
        cfg = SimConfig(gpus=gpus, contention=CONTENTION[a.contention], jobs=n_jobs, seed=0)
        jobs = make_jobs(cfg, models)
        if a.first:
            jobs = jobs[: a.first]
        for s in strategies:
            if s in capped:
                rows.append({"strategy": s, "jobs": n_jobs, "gpus": gpus,
                             "skipped": f"over {a.cap_s:.0f} CPU s at a smaller size"})
                print(f"{s:>12}: {n_jobs} jobs on {gpus} GPUs skipped (over the cap at a smaller size)", flush=True)
                continue
            row = run_one(cfg, s, jobs, models, a.profile)
            if a.first:
                row["first_jobs"] = len(jobs)
            rows.append(row)
            if row["cpu_s"] > a.cap_s:
                capped.add(s)
            print(f"{s:>12}: {n_jobs} jobs on {gpus} GPUs in {row['wall_s']:.2f} s, CPU {row['cpu_s']:.2f} s "
                  f"(avg JCT {row['avg_jct_h']:.3f} h, {row['resizes']} resizes, load {row['load_before']}), "
                  f"digest {row['digest']}", flush=True)
            write(False)
    write(merged_finished)
    if before is not None:
        for c in json.loads(Path(a.out).read_text()).get("before_vs_after", []):
            print(f"{c['strategy']:>12} {c['jobs']}x{c['gpus']}: CPU {c['before_cpu_s']:.2f} s -> "
                  f"{c['after_cpu_s']:.2f} s ({c['cpu_speedup']}x), identical results: {c['identical']}")
    print(f"wrote {a.out}")

if __name__ == "__main__":
    main()
