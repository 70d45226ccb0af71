#!/usr/bin/env python
"""A hung worker: how soon it is found and how much time it costs, with and without the watchdog.

A 2-worker ``elastic-ring train`` run (ResNet-20/8 on digits, the CPU default,
``--checkpoint-every 10``); at a step drawn from a seeded RNG, rank 1 gets SIGSTOP (the stand-in
for a deadlocked data loader, a hung GPU or a vanished host: no crash, its peers just wait). Two
arms, alternating within each repeat (which goes first alternates too):
  * ``watchdog``: the default (no ``--stall-timeout``: a stopped worker is found after 5 s without
    a step, any other stall after max(10x the median step, 30 s));
  * ``off``: ``--stall-timeout 0``, the behaviour before the watchdog (Gloo's timeout in rank 0).
Per run: the time from the SIGSTOP to the ``restart`` event (detection), from the job's last step
to it (``stalled.idle_s``, watchdog only), the time lost (``recovered.time_lost_s``: last progress
to the first step after the restart, plus the redone steps), and the rank the restart blamed.

    .venv/bin/python scripts/bench_stall.py [--repeats 3] [--out results/bench_stall.json]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchlib import TrainRun, exit_on_sigterm, write_results  # noqa: E402

ARMS = {"watchdog": [], "off": ["--stall-timeout", "0"]}


def stopped_run(arm: str, stop_at: int, steps: int, every: int) -> dict:
    with tempfile.TemporaryDirectory() as d, TrainRun(
            ["--gpus", "2", "--steps", str(steps), "--slots", "2", "--checkpoint-every", str(every), *ARMS[arm]],
            Path(d) / "run") as run:
        run.wait_step(stop_at)
        t_stop = run.signal_rank(1, signal.SIGSTOP)
        run.finish(f"the {arm} run")
        (rs,) = run.events("restart")
        (rc,) = run.events("recovered")
        st = run.events("stalled")
        return {"arm": arm, "stop_at": stop_at, "detect_s": rs["time"] - t_stop,
                "last_step_to_detect_s": st[0]["idle_s"] if st else None,
                "steps_redone": rs["steps_redone"], "time_lost_s": rc["time_lost_s"],
                "blamed_rank": rs["rank"], "cause": rs["cause"], "wall_s": run.events("finished")[-1]["wall_s"]}


def main() -> None:
    exit_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=240)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_stall.json")
    a = ap.parse_args()
    load0 = os.getloadavg()[0]
    rng = random.Random(0)
    runs: list[dict] = []
    for i in range(a.repeats):
        at = rng.randint(40, 150)
        order = ["watchdog", "off"] if i % 2 == 0 else ["off", "watchdog"]
        for arm in order:
            r = stopped_run(arm, at, a.steps, a.every)
            r["load"] = os.getloadavg()[0]
            runs.append(r)
            print(f"repeat {i + 1} {arm:8s}: SIGSTOP at step {at}: detected after {r['detect_s']:.2f} s, "
                  f"time lost {r['time_lost_s']:.2f} s, blamed rank {r['blamed_rank']} ({r['cause']})",
                  flush=True)
    med = {}
    for arm in ARMS:
        rs = [r for r in runs if r["arm"] == arm]
        med[arm] = {k: statistics.median(r[k] for r in rs) for k in ("detect_s", "time_lost_s", "steps_redone")}
        med[arm]["blamed_ranks"] = [r["blamed_rank"] for r in rs]
    med["watchdog"]["last_step_to_detect_s"] = statistics.median(
        r["last_step_to_detect_s"] for r in runs if r["arm"] == "watchdog")
    ratio = {k: med["watchdog"][k] / med["off"][k] for k in ("detect_s", "time_lost_s")}
    for arm in ARMS:
        print(f"median {arm:8s}: detection {med[arm]['detect_s']:.2f} s, time lost {med[arm]['time_lost_s']:.2f} s, "
              f"blamed ranks {med[arm]['blamed_ranks']}")
    print(f"watchdog / off: detection {ratio['detect_s']:.2f}x, time lost {ratio['time_lost_s']:.2f}x")
    write_results(a.out, {"command": " ".join(["scripts/bench_stall.py", *sys.argv[1:]]), "runs": runs,
                          "median": med, "ratio_watchdog_to_off": ratio, "steps": a.steps,
                          "checkpoint_every": a.every}, load0)


if __name__ == "__main__":
    main()
