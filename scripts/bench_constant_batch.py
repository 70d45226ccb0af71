#!/usr/bin/env python
"""What a constant global batch costs (issue 46's targets), side by side in alternating rounds.

(a) Accumulation, per sample: the built-in model (configs/cpu_small.yaml: ResNet-20 width 8 on the
    digits, per-worker batch b = 32) at 1 worker, ``--lr-scaling constant-batch --global-batch 2b``
    (each step 2 micro-batches of b accumulated, one optimizer update) against the plain run of
    batch b (``--lr-scaling linear``), over the same samples (the plain run twice the steps, its
    throughput window twice as many steps, so every window covers the same samples). The figure is
    seconds per sample: the throughput windows' seconds over their samples (``images_per_s x
    seconds``), the first window of each run (warm-up) left out. Target: the accumulated run's cost
    per sample at most 3% over the plain one's (paired ratio constant-batch / plain <= 1.03).
(b) A resize: the same model resized 1 -> 2 workers mid-run, under ``constant-batch`` (global batch
    2b: 2 micro-batches at 1 worker, 1 each at 2) and under Eq. 7 (``linear``, batch b per worker):
    the ``total_lost_s`` of the run's ``resize_overhead`` event (resize asked -> first step at the
    new size, less one steady step). Target: constant-batch's at most Eq. 7's (paired ratio <= 1).
    The measure is fair to both rules: the request is the moment the ranks finished the resize
    step, so the old size's steps (constant-batch's at 1 worker: 2 micro-batches, twice Eq. 7's
    work) are not in it; at 2 workers both rules' steps train the same 64 samples (one micro-batch
    of b per worker against a batch of b per worker), and the step subtracted is each rule's own
    steady step at the new size, constant-batch's with the BatchNorm statistics' combine of every
    step at more than one worker (its allreduce and the buffers' arithmetic), which its first step
    makes too. What is left is the time not training: the stop, the checkpoint, the relaunch and
    what the first step costs beyond a steady one. Beside the ratio, each part's paired difference
    (constant-batch - Eq. 7, median over rounds, and in how many rounds constant-batch's was the
    larger): the relaunch's start of horovodrun varies by tens of ms from run to run, more than
    the rules' difference, and the first step's own time (``first_step_s``: the workers' restore
    done -> first step done, from the ``first_step`` event's phases) tells a difference in the
    step apart from that noise.

Each round runs every case once, the order of the two sides alternating from round to round; the
figures are medians over rounds and the paired ratios (round by round), with the machine's load
before and after (scripts/benchlib.py).

    .venv/bin/python scripts/bench_constant_batch.py [--rounds 5] [--steps 200]
    .venv/bin/python scripts/bench_constant_batch.py --quick     # one short round: does it work
    -> results/bench_constant_batch.json
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

from benchlib import exit_on_sigterm, train_env, write_results

ROOT = Path(__file__).resolve().parents[1]
B = 32  # configs/cpu_small.yaml's per-worker batch


def train(run: Path, args: list[str]) -> list[dict]:
    """One ``elastic-ring train`` (configs/cpu_small.yaml), its events."""
    cmd = [sys.executable, "-m", "elastic_ring.cli.main", "train", "--config", "configs/cpu_small.yaml",
           "--batch-size", str(B), "--slots", "2", "--run-dir", str(run), *args]
    p = subprocess.run(cmd, cwd=ROOT, env=train_env(), capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"train {' '.join(args)} failed:\n{p.stderr[-3000:]}")
    return [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines() if x.strip()]


def seconds_per_sample(events: list[dict]) -> float:
    """The throughput windows' seconds over their samples, the first window left out."""
    wins = [e for e in events if e["kind"] == "throughput" and e.get("world_size") == 1][1:]
    if not wins:
        raise SystemExit("a run had no throughput window after its first: give more --steps")
    return sum(e["seconds"] for e in wins) / sum(e["images_per_s"] * e["seconds"] for e in wins)


def accumulation_case(d: Path, name: str, steps: int, window: int) -> float:
    if name == "constant-batch":
        args = ["--lr-scaling", "constant-batch", "--global-batch", str(2 * B), "--steps", str(steps // 2),
                "--set", f"throughput_window={window}"]
    else:
        args = ["--lr-scaling", "linear", "--steps", str(steps), "--set", f"throughput_window={2 * window}"]
    return seconds_per_sample(train(d / "run", ["--gpus", "1", "--set", "eval_every=0", *args]))


def resize_case(d: Path, name: str, steps: int) -> dict:
    rule = ["--lr-scaling", "constant-batch", "--global-batch", str(2 * B)] if name == "constant-batch" else \
        ["--lr-scaling", "linear"]
    ev = train(d / "run", ["--gpus", "1", "--steps", str(steps), "--schedule", f"{steps // 2}:2",
                           "--set", "throughput_window=10", *rule])
    ov = [e for e in ev if e["kind"] == "resize_overhead"]
    if len(ov) != 1:
        raise SystemExit(f"{name}: expected one resize_overhead event, got {len(ov)}")
    out = {k: ov[0][k] for k in ("total_lost_s", "stop_latency_s", "checkpoint_s", "relaunch_to_first_step_s",
                                 "steady_step_s") if k in ov[0]}
    first = [e for e in ev if e["kind"] == "first_step" and e.get("world_size") == 2]
    if first and first[0].get("phases"):  # restore done -> first step done: the step itself
        out["first_step_s"] = first[0]["since_launch_s"] - sum(first[0]["phases"].values())
    return out


def paired_differences(a: list[dict], b: list[dict]) -> dict:
    """Per part of the resize: the median of the rounds' differences ``a - b`` (seconds) and the
    rounds where ``a``'s was the larger."""
    out = {}
    for k in a[0] if a else ():
        d = [x[k] - y[k] for x, y in zip(a, b) if k in x and k in y]
        if d:
            out[k] = {"median_s": statistics.median(d), "rounds_larger": sum(v > 0 for v in d), "rounds": len(d)}
    return out


def _paired(a: list[float], b: list[float]) -> dict:
    ratios = [x / y for x, y in zip(a, b)]
    return {"paired_ratios": ratios, "median_ratio": statistics.median(ratios),
            "min_ratio": min(ratios), "max_ratio": max(ratios)}


def main() -> None:
    exit_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200, help="(a): the plain run's steps (constant-batch: half)")
    ap.add_argument("--window", type=int, default=10, help="(a): constant-batch's throughput window, in steps")
    ap.add_argument("--resize-steps", type=int, default=60, help="(b): steps of each run, resized at half")
    ap.add_argument("--quick", action="store_true", help="one short round (a check that it works, no figure)")
    ap.add_argument("--only", choices=("accumulation", "resize"), default=None,
                    help="measure only (a) the accumulation or (b) the resize (more rounds of one; give --out)")
    ap.add_argument("--out", type=Path, default=None,
                    help="results file [default: results/bench_constant_batch.json; --quick: one in the temp folder]")
    a = ap.parse_args()
    if a.quick:
        a.rounds, a.steps, a.window, a.resize_steps = 1, 60, 5, 30
    if a.out is None:
        a.out = Path(tempfile.gettempdir()) / "bench_constant_batch.quick.json" if a.quick else \
            ROOT / "results" / "bench_constant_batch.json"
    if a.rounds < 1 or a.steps < 4 * a.window or a.resize_steps < 10:
        raise SystemExit("need --rounds >= 1, --steps >= 4 x --window (windows after the first) "
                         "and --resize-steps >= 10")
    load0 = os.getloadavg()[0]
    sides = ["plain", "constant-batch"]
    acc: dict[str, list[float]] = {s: [] for s in sides}
    rsz: dict[str, list[dict]] = {s: [] for s in ("linear", "constant-batch")}
    loads: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.rounds):
            before = os.getloadavg()[0]
            order = sides if i % 2 == 0 else sides[::-1]
            for s in order if a.only != "resize" else ():
                d = Path(tmp) / f"acc-{s}-{i}"
                acc[s].append(accumulation_case(d, s, a.steps, a.window))
                print(f"round {i + 1}  (a) {s:<15} {1e6 * acc[s][-1]:8.1f} us/sample", flush=True)
            for s in (["linear", "constant-batch"] if i % 2 == 0 else ["constant-batch", "linear"]) \
                    if a.only != "accumulation" else ():
                d = Path(tmp) / f"rsz-{s}-{i}"
                rsz[s].append(resize_case(d, s, a.resize_steps))
                print(f"round {i + 1}  (b) {s:<15} resize 1 -> 2 lost {rsz[s][-1]['total_lost_s']:.3f} s", flush=True)
            loads.append({"round": i + 1, "load_before": before, "load_after": os.getloadavg()[0]})
    out: dict = {"quick": a.quick, "rounds": a.rounds, "per_worker_batch": B, "global_batch": 2 * B,
                 "only": a.only}
    if a.only != "resize":
        a_ratio = _paired(acc["constant-batch"], acc["plain"])
        out["accumulation"] = {
            "what": "seconds per sample at 1 worker: constant-batch (2 micro-batches of b per step) vs plain batch b",
            "steps_plain": a.steps, "steps_constant_batch": a.steps // 2,
            "median_s_per_sample": {s: statistics.median(v) for s, v in acc.items()}, "runs": acc,
            **a_ratio, "target": "median paired ratio <= 1.03",
            "met": a_ratio["median_ratio"] <= 1.03}
        print(f"\n(a) s/sample median: plain {1e6 * out['accumulation']['median_s_per_sample']['plain']:.1f} us, "
              f"constant-batch {1e6 * out['accumulation']['median_s_per_sample']['constant-batch']:.1f} us; paired "
              f"ratio {a_ratio['median_ratio']:.3f} ({a_ratio['min_ratio']:.3f}-{a_ratio['max_ratio']:.3f}), "
              f"target <= 1.03")
    if a.only != "accumulation":
        lost = {s: [r["total_lost_s"] for r in v] for s, v in rsz.items()}
        b_ratio = _paired(lost["constant-batch"], lost["linear"])
        out["resize"] = {
            "what": "total_lost_s of the 1 -> 2 resize: constant-batch (global batch 2b) vs Eq. 7 "
                    "(linear, b per worker)",
            "steps": a.resize_steps, "median_total_lost_s": {s: statistics.median(v) for s, v in lost.items()},
            "runs": rsz, **b_ratio, "target": "median paired ratio <= 1",
            "met": b_ratio["median_ratio"] <= 1.0,
            "paired_difference": {"what": "constant-batch - linear per part, seconds: the median over rounds "
                                          "and the rounds where constant-batch's was the larger",
                                  **paired_differences(rsz["constant-batch"], rsz["linear"])}}
        print(f"(b) resize lost median: linear {out['resize']['median_total_lost_s']['linear']:.3f} s, "
              f"constant-batch {out['resize']['median_total_lost_s']['constant-batch']:.3f} s; paired ratio "
              f"{b_ratio['median_ratio']:.3f} ({b_ratio['min_ratio']:.3f}-{b_ratio['max_ratio']:.3f}), target <= 1")
        for k, v in out["resize"]["paired_difference"].items():
            if k != "what":
                print(f"    {k:<26} constant-batch - linear: median {1e3 * v['median_s']:+7.1f} ms, "
                      f"larger in {v['rounds_larger']}/{v['rounds']} rounds")
    out["round_loads"] = loads
    if a.quick:
        print("--quick: one short round, a check that the benchmark works; not a measurement")
    write_results(a.out, out, load0)


if __name__ == "__main__":
    main()
