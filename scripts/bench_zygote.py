#!/usr/bin/env python
"""Worker starts from the controller's zygote against fresh processes, side by side.

Each round runs the same ``elastic-ring train`` job twice, alternating which goes first: with the
zygote (the default on CPUs: every worker forks from a process that imported torch and Horovod
once, :mod:`elastic_ring.worker.zygote`) and without it (``ELASTIC_RING_NO_ZYGOTE=1``: every
worker a fresh interpreter, as before). The job: the built-in ResNet on the CPU digits, 1 worker,
resized 1 -> 2 -> 1 -> 2 by relaunch (``--relaunch MODE``), so that each resize starts new
processes. Per side: each resize's relaunch s (new workers started -> their first step) and lost s
(the training time the resize cost), from the run's ``resize_overhead`` events; the whole run's
wall time; and the CPU seconds of the run's processes (user + system of the controller and every
process it waited for: the workers, and the zygote with its children). Medians over the rounds,
and the ratios with/without.

    .venv/bin/python scripts/bench_zygote.py --rounds 3 [--relaunch sequential]
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

from benchlib import ROOT, train_env, write_results


def one_run(relaunch: str, steps: int, schedule: str, zygote: bool) -> dict:
    with tempfile.TemporaryDirectory() as d:
        run = Path(d) / "run"
        cmd = [sys.executable, "-m", "elastic_ring.cli.main", "train", "--gpus", "1", "--steps", str(steps),
               "--schedule", schedule, "--relaunch", relaunch, "--slots", "2", "--run-dir", str(run)]
        env = train_env()
        env.pop("ELASTIC_RING_NO_ZYGOTE", None)
        if not zygote:
            env["ELASTIC_RING_NO_ZYGOTE"] = "1"
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if p.returncode != 0:
            raise SystemExit(f"train failed (zygote {zygote}):\n{p.stderr[-2000:]}")
        evs = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
        ov = [e for e in evs if e["kind"] == "resize_overhead"]
        return {"wall_s": wall, "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
                "relaunch_s": [e["relaunch_to_first_step_s"] for e in ov], "lost_s": [e["total_lost_s"] for e in ov]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--relaunch", default="sequential", choices=["sequential", "overlap", "prelaunch"])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--schedule", default="15:2,30:1,45:2")
    ap.add_argument("--out", default="results/bench_zygote.json")
    a = ap.parse_args()
    load_before = os.getloadavg()[0]
    runs: dict[str, list[dict]] = {"zygote": [], "fresh": []}
    for i in range(a.rounds):
        order = ("zygote", "fresh") if i % 2 == 0 else ("fresh", "zygote")
        for side in order:
            r = one_run(a.relaunch, a.steps, a.schedule, side == "zygote")
            runs[side].append(r)
            print(f"round {i + 1} {side:6s}: wall {r['wall_s']:.1f} s, CPU {r['cpu_s']:.1f} s, relaunch s "
                  f"{', '.join(f'{x:.2f}' for x in r['relaunch_s'] if x is not None)}, lost s "
                  f"{', '.join(f'{x:.2f}' for x in r['lost_s'])}", flush=True)

    def med(side: str, key: str) -> float:
        if key in ("relaunch_s", "lost_s"):
            return statistics.median(x for r in runs[side] for x in r[key] if x is not None)
        return statistics.median(r[key] for r in runs[side])

    medians = {side: {k: round(med(side, k), 3) for k in ("wall_s", "cpu_s", "relaunch_s", "lost_s")} for side in runs}
    ratios = {k: round(medians["zygote"][k] / medians["fresh"][k], 3) for k in medians["zygote"]}
    print(f"medians: {json.dumps(medians)}\nratios zygote/fresh: {json.dumps(ratios)}")
    out = {"config": {"relaunch": a.relaunch, "steps": a.steps, "schedule": a.schedule, "rounds": a.rounds,
                      "model": "built-in ResNet-20 (width 8) on the digits, batch 32/worker, CPU, gloo"},
           "runs": runs, "medians": medians, "ratios_zygote_over_fresh": ratios,
           "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    write_results(ROOT / a.out, out, load_before)


if __name__ == "__main__":
    main()
