"""Training-step images/s with the controller writing TensorBoard curves against without, side by
side in one run.

Both arms are real `elastic-ring train` jobs (horovodrun, gloo) of the CPU default
(configs/cpu_small.yaml: ResNet-20 width 8 on the digits, batch 32 per worker); the only
difference is ``ELASTIC_RING_TENSORBOARD=1`` or ``0``. Rounds alternate the order of the arms.
The figure is the median images/s of each run's throughput windows (start-up excluded, as in
summary.json), and the paired ratio on / off per round and worker count. The on arm's curves are
counted (TensorBoard's own reader) so a silent no-op would show. Then the sink's own cost in
the controller, timed alone: per throughput record written, per poll with nothing new. Default 2 workers with
``--slots 2``: on a 2-core machine the controller then shares the cores with the workers, the
case where its extra work would show in the step rate.

    .venv/bin/python scripts/bench_tensorboard.py [--rounds 3] [--steps 100] [--workers 2]
    -> results/bench_tensorboard.json
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

from benchlib import write_results

ROOT = Path(__file__).resolve().parents[1]


def run(run_dir: Path, workers: int, steps: int, tb: bool) -> tuple[float, int]:
    cmd = [sys.executable, "-m", "elastic_ring.cli.main", "train", "--gpus", str(workers),
           "--steps", str(steps), "--slots", "2", "--run-dir", str(run_dir)]
    env = dict(os.environ, ELASTIC_RING_TENSORBOARD="1" if tb else "0",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    env.pop("ELASTIC_RING_TENSORBOARD_DIR", None)
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"run failed:\n{p.stderr[-3000:]}")
    ips = json.loads((run_dir / "summary.json").read_text())["sizes"][0]["images_per_s"]
    return ips, count_scalars(run_dir / "tensorboard")


def count_scalars(logdir: Path) -> int:
    if not logdir.exists():
        return 0
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    return sum(len(ev.summary.value) for f in logdir.glob("events.out.tfevents.*")
               for ev in EventFileLoader(str(f)).Load())


def sink_cost(n: int = 2000, polls: int = 2000) -> dict[str, float]:
    """The controller-side cost itself: seconds per ``throughput`` record written as scalars, and
    per relay poll with nothing new (what the sink adds to every 0.1 s of the controller's loop)."""
    import time

    from elastic_ring.telemetry.tensorboard import TensorBoardSink

    with tempfile.TemporaryDirectory() as d:
        ev = Path(d) / "events.jsonl"
        sink = TensorBoardSink(ev, Path(d) / "tb")
        ev.write_text("")
        sink.sync()
        rec = {"kind": "throughput", "segment": 0, "world_size": 2, "steps": 10, "seconds": 1.0,
               "images_per_s": 640.0, "steps_per_s": 10.0, "lr": 0.1, "epoch": 0, "telemetry": {}}
        with ev.open("a") as f:  # the writer's import and start-up, once, outside the timing
            f.write(json.dumps({**rec, "step": 0, "loss": 1.0, "time": 0.0}) + "\n")
        sink.sync()
        t0 = time.perf_counter()
        for i in range(1, n + 1):
            with ev.open("a") as f:
                f.write(json.dumps({**rec, "step": i * 10, "loss": 1.0 / i, "time": float(i)}) + "\n")
            sink.sync()
        per_event = (time.perf_counter() - t0) / n
        t0 = time.perf_counter()
        for _ in range(polls):
            sink.sync()
        per_idle_poll = (time.perf_counter() - t0) / polls
        sink.close()
    # the writer's first use in a fresh process (TensorBoard's import and start-up): CPU seconds
    code = ("import tempfile, time; t = time.process_time(); "
            "from elastic_ring.telemetry.tensorboard import EventFileScalars; "
            "w = EventFileScalars(tempfile.mkdtemp()); w.add('a', 1.0, 1, 0.0); w.flush(); w.close(); "
            "print(time.process_time() - t)")
    first = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                  cwd=ROOT).stdout) for _ in range(3)]
    return {"seconds_per_throughput_event": per_event, "seconds_per_idle_poll": per_idle_poll,
            "events": n, "idle_polls": polls, "first_use_cpu_s": statistics.median(first)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--workers", default="2")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_tensorboard.json")
    a = ap.parse_args()
    counts = [int(x) for x in a.workers.split(",")]
    load0 = os.getloadavg()[0]
    res: dict[str, dict[int, list[float]]] = {"on": {w: [] for w in counts}, "off": {w: [] for w in counts}}
    scalars: dict[int, list[int]] = {w: [] for w in counts}
    loads: list[float] = []
    with tempfile.TemporaryDirectory() as d:
        for i in range(a.rounds):
            for w in counts:
                order = ["off", "on"] if i % 2 == 0 else ["on", "off"]
                for arm in order:
                    ips, n = run(Path(d) / f"{arm}-w{w}-{i}", w, a.steps, arm == "on")
                    res[arm][w].append(ips)
                    loads.append(os.getloadavg()[0])
                    if arm == "on":
                        scalars[w].append(n)
                    elif n:
                        raise SystemExit("the off arm wrote TensorBoard files")
                    print(f"round {i + 1}  {w} worker(s)  tensorboard {arm:<3} {ips:8.1f} images/s"
                          + (f"  ({n} scalars written)" if arm == "on" else ""), flush=True)
    cost = sink_cost()
    print(f"sink alone: {cost['seconds_per_throughput_event'] * 1e6:.0f} us per throughput event "
          f"(5 scalars, flushed), {cost['seconds_per_idle_poll'] * 1e6:.0f} us per poll with nothing new, "
          f"{cost['first_use_cpu_s']:.2f} CPU s at first use (import, once per controller)")
    table = []
    print(f"\n{'workers':>7} {'off':>9} {'on':>9} {'on/off (paired median, range)':>32}")
    for w in counts:
        ratios = [on / off for on, off in zip(res["on"][w], res["off"][w])]
        row = {"workers": w, "off_images_per_s": statistics.median(res["off"][w]),
               "on_images_per_s": statistics.median(res["on"][w]), "paired_ratios": ratios,
               "median_ratio": statistics.median(ratios), "scalars_written": scalars[w]}
        table.append(row)
        print(f"{w:>7} {row['off_images_per_s']:>9.1f} {row['on_images_per_s']:>9.1f} "
              f"{row['median_ratio']:>12.3f} ({min(ratios):.3f}-{max(ratios):.3f})")
    write_results(a.out, {"steps": a.steps, "rounds": a.rounds, "table": table, "runs": res,
                          "load_after_each_run": loads, "sink_cost": cost}, load0)


if __name__ == "__main__":
    main()
