"""Recovery time after a kill -9 against the bare start of the same workers, side by side.

For each repeat, alternating:
  * bare start: ``horovodrun -np 2 -H localhost:2 --gloo python launch/bare_start.py`` (horovodrun
    + ``import torch, horovod.torch`` + ``hvd.init()`` + one barrier), wall time;
  * recovery: a 2-worker ``elastic-ring train`` run (ResNet-20/8 on digits, the CPU default,
    ``--checkpoint-every 10``), rank 1 killed with SIGKILL at a step drawn from a seeded RNG; the
    time from the kill to the first step done after the automatic restart (the ``recovered``
    event), its part from the controller noticing the failure, the steps redone, and the whole
    time lost (``time_lost_s``: last progress before the kill to the first step after, plus the
    redone steps at the steady step time).

    .venv/bin/python scripts/bench_recovery.py [--repeats 3]   -> results/bench_recovery.json
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

from benchlib import TrainRun, bare_start, exit_on_sigterm, write_results  # noqa: E402


def killed_run(kill_at: int, steps: int, every: int) -> dict:
    with tempfile.TemporaryDirectory() as d, TrainRun(
            ["--gpus", "2", "--steps", str(steps), "--slots", "2", "--checkpoint-every", str(every)],
            Path(d) / "run") as run:
        run.wait_step(kill_at)
        t_kill = run.signal_rank(1, signal.SIGKILL)
        run.finish("the killed run")
        (rs,) = run.events("restart")
        (rc,) = run.events("recovered")
        return {"kill_at": kill_at, "kill_to_first_step_s": rc["time"] - t_kill,
                "detect_s": rs["time"] - t_kill, "detect_to_first_step_s": rc["detect_to_first_step_s"],
                "steps_redone": rs["steps_redone"], "time_lost_s": rc["time_lost_s"],
                "first_failed_rank": rs["rank"], "wall_s": run.events("finished")[-1]["wall_s"]}


def main() -> None:
    exit_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--every", type=int, default=10)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_recovery.json")
    a = ap.parse_args()
    load0 = os.getloadavg()[0]
    rng = random.Random(0)
    bare, rec = [], []
    for i in range(a.repeats):
        bare.append(bare_start(2))
        r = killed_run(rng.randint(60, 200), a.steps, a.every)
        rec.append(r)
        print(f"repeat {i + 1}: bare start {bare[-1]:.2f} s; killed at step {r['kill_at']}: "
              f"kill -> first step {r['kill_to_first_step_s']:.2f} s (detected after {r['detect_s']:.2f} s), "
              f"{r['steps_redone']} step(s) redone, time lost {r['time_lost_s']:.2f} s, first failed rank "
              f"{r['first_failed_rank']}", flush=True)
    med = {k: statistics.median(r[k] for r in rec) for k in ("kill_to_first_step_s", "detect_s",
                                                           "steps_redone", "time_lost_s")}
    ratio = statistics.median(r["kill_to_first_step_s"] / b for r, b in zip(rec, bare))
    print(f"\nmedian: bare start {statistics.median(bare):.2f} s, kill -> first step "
          f"{med['kill_to_first_step_s']:.2f} s (ratio {ratio:.2f}x), detection {med['detect_s']:.2f} s, "
          f"steps redone {med['steps_redone']:.0f}, time lost {med['time_lost_s']:.2f} s")
    write_results(a.out, {"bare_start_s": bare, "recoveries": rec, "median": med,
                          "median_ratio_to_bare_start": ratio, "checkpoint_every": a.every,
                          "steps": a.steps}, load0)


if __name__ == "__main__":
    main()
