"""How a CPU worker waits for Horovod's collectives: Horovod's own wait (a loop on ``sched_yield``,
``ELASTIC_RING_HOROVOD_WAIT=spin``) against elastic-ring's default (asleep between polls while
the machine's load is above 1.5 per core: :func:`elastic_ring.hvd_patches.wait_asleep`).

The same `elastic-ring train` of the tests' tiny ResNet (depth 8, width 4, batch 8, synthetic
data, 2 CPU workers, one intra-op thread each) in two settings, alternating the two waits in each
round (their order swapped every round):

- ``alone``: one job on the machine, each run started once the 1-min load has fallen to
  ``--quiet-load`` (at most ``--cool-s`` waited; the default waits as Horovod does below 1.5 per
  core: the two should match);
- ``crowded``: two jobs at once, the same wait in both (4 workers on this machine's cores: the
  test suite's case, and a shared CPU machine's). The default reads the load (a 1-min average), so
  each round's crowded runs come after an unmeasured pair of jobs (``--warm-steps``) that brings
  the machine to the load it has while crowded.

Per run: steps/s (the run's summary: over its throughput windows, start-up left out), and the CPU time of the job's processes
(user + system, from ``wait4``). Written: each run, the medians per setting and wait, the ratio
default/spin of steps/s and of CPU time (median of the per-round ratios, with their range), and
the 1-min load before and after each run.

    .venv/bin/python scripts/bench_hvd_wait.py --rounds 3 --steps 800
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import ROOT, exit_on_sigterm, spread, train_env, write_results  # noqa: E402

TINY = ["--dataset", "synthetic", "--set", "synthetic_size=40", "--depth", "8", "--set", "width=4",
        "--batch-size", "8", "--device", "cpu", "--gpus", "2"]
WAITS = ("spin", "default")


def _start(run: Path, steps: int, wait: str) -> subprocess.Popen:
    env = {**train_env(), "ELASTIC_RING_CPU_THREADS": "1"}
    env.pop("ELASTIC_RING_HOROVOD_WAIT", None)
    if wait == "spin":
        env["ELASTIC_RING_HOROVOD_WAIT"] = "spin"
    cmd = [sys.executable, "-m", "elastic_ring.cli.main", "train", *TINY, "--steps", str(steps),
           "--run-dir", str(run)]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _finish(p: subprocess.Popen, run: Path, steps: int, t0: float) -> dict:
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    err = p.stderr.read().decode(errors="replace") if p.stderr else ""
    if p.returncode != 0:
        raise SystemExit(f"bench_hvd_wait: a run failed (status {p.returncode}): {err.strip()[-500:]}")
    summary = json.loads((run / "summary.json").read_text())
    cpu = usage.ru_utime + usage.ru_stime  # the job's processes, each waited for by its parent
    return {"steps_per_s": summary["sizes"][0]["steps_per_s"],  # over the throughput windows
            "cpu_s": cpu, "cpu_ms_per_step": 1000 * cpu / steps, "wall_s": wall}


def one(setting: str, wait: str, steps: int, tmp: Path, label: str = "") -> dict:
    """One run of ``setting`` with ``wait``: one job, or two at once (their mean)."""
    jobs = 1 if setting == "alone" else 2
    load_before = os.getloadavg()[0]
    runs = [tmp / f"{setting}-{wait}-{i}" for i in range(jobs)]
    for r in runs:
        shutil.rmtree(r, ignore_errors=True)
    t0 = time.perf_counter()
    procs = [_start(r, steps, wait) for r in runs]
    each = [_finish(p, r, steps, t0) for p, r in zip(procs, runs)]
    out = {k: statistics.mean(e[k] for e in each) for k in each[0]}
    out.update(setting=setting, wait=wait, jobs=jobs, load_before=load_before, load_after=os.getloadavg()[0])
    print(f"{label or setting:8s} {wait:8s} {out['steps_per_s']:6.1f} steps/s  {out['cpu_ms_per_step']:5.1f} ms CPU/step "
          f"(load {load_before:.1f} -> {out['load_after']:.1f})", flush=True)
    return out


def _cool(load: float, longest_s: float) -> None:
    end = time.monotonic() + longest_s
    while os.getloadavg()[0] > load and time.monotonic() < end:
        time.sleep(2)


def main() -> int:
    exit_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    ap.add_argument("--steps", type=int, default=800, help="steps of each run (default 800)")
    ap.add_argument("--warm-steps", type=int, default=400,
                    help="steps of the unmeasured pair of jobs before each round's crowded runs (default 400)")
    ap.add_argument("--quiet-load", type=float, default=1.2,
                    help="1-min load an alone run waits for before it starts (default 1.2)")
    ap.add_argument("--cool-s", type=float, default=180, help="the longest wait for it (default 180 s)")
    ap.add_argument("--settings", nargs="+", default=["alone", "crowded"], choices=["alone", "crowded"])
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_hvd_wait.json")
    a = ap.parse_args()
    if a.rounds < 1 or a.steps < 50:
        ap.error("--rounds must be >= 1 and --steps >= 50")
    load0 = os.getloadavg()[0]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-wait-") as d:
        for r in range(a.rounds):
            for setting in a.settings:
                order = WAITS if r % 2 == 0 else WAITS[::-1]
                if setting == "crowded" and a.warm_steps:
                    one("crowded", "spin", a.warm_steps, Path(d), label="warm-up")
                for wait in order:
                    if setting == "alone":
                        _cool(a.quiet_load, a.cool_s)
                    rows.append({"round": r, **one(setting, wait, a.steps, Path(d))})
    summary: dict = {}
    for setting in a.settings:
        by = {w: [x for x in rows if x["setting"] == setting and x["wait"] == w] for w in WAITS}
        speed = [d["steps_per_s"] / s["steps_per_s"] for s, d in zip(by["spin"], by["default"])]
        cpu = [d["cpu_s"] / s["cpu_s"] for s, d in zip(by["spin"], by["default"])]
        summary[setting] = {
            **{f"{w}_steps_per_s": spread([x["steps_per_s"] for x in by[w]]) for w in WAITS},
            **{f"{w}_cpu_ms_per_step": spread([x["cpu_ms_per_step"] for x in by[w]]) for w in WAITS},
            "speed_default_over_spin": spread(speed),
            **{f"{w}_cpu_s": spread([x["cpu_s"] for x in by[w]]) for w in WAITS},
            "cpu_default_over_spin": spread(cpu),
            "load": spread([x["load_before"] for x in by["spin"] + by["default"]]),
        }
        print(f"{setting}: steps/s default/spin {statistics.median(speed):.3f} "
              f"({min(speed):.3f}-{max(speed):.3f}); CPU {statistics.median(cpu):.3f} "
              f"({min(cpu):.3f}-{max(cpu):.3f})")
    write_results(a.out, {"command": "scripts/bench_hvd_wait.py " + " ".join(sys.argv[1:]),
                          "rounds": a.rounds, "steps": a.steps, "config": TINY, "runs": rows,
                          "summary": summary}, load0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
