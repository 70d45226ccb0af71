"""What periodic checkpoints cost: the stall per checkpoint (background write against a synchronous
one) and the steady-state throughput with checkpoints every N steps against none.

Part 1, in one process (no Horovod; wall time, and the training thread's own CPU time, which a
loaded machine does not inflate): a CIFAR ResNet's full resume state (weights, momentum
buffers, RNG, counters), checkpointed R times in alternation the two ways:
  - synchronous: serialise + write + fsync + rename on the training thread (the pre-issue way);
  - background: the training thread only copies the state to the CPU (`ckpt.snapshot`) and hands
    it to `ckpt.BackgroundWriter`; the write runs in a thread.
Part 2, real `elastic-ring train` runs (horovodrun, gloo; the CPU default model), alternating:
`--checkpoint-every N` against no periodic checkpoint; median images/s of the throughput windows.

    .venv/bin/python scripts/bench_checkpoint.py            # prints the tables
    -> results/bench_checkpoint.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchlib import write_results  # noqa: E402


def _state(depth: int, width: int):
    import torch
    import torch.nn.functional as F

    from elastic_ring.nn import resnet
    from elastic_ring.worker.state import _rng_state

    torch.manual_seed(0)
    model = resnet(depth, width, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    F.cross_entropy(model(x), y).backward()
    opt.step()  # momentum buffers exist
    return {"step": 1, "cursor": 0, "world_size": 1, "model": model.state_dict(),
            "optimizer": opt.state_dict(), "rng": _rng_state(), "extras": {}}


def stall(depth: int, width: int, repeats: int) -> dict:
    import torch

    from elastic_ring.ckpt import BackgroundWriter, CheckpointStore, snapshot

    torch.set_num_threads(1)  # one training thread's cost, whatever the machine

    state = _state(depth, width)
    sync_s, bg_s, copy_s, write_s, sync_cpu, bg_cpu = [], [], [], [], [], []
    with tempfile.TemporaryDirectory() as d:
        store = CheckpointStore(Path(d), keep=2)
        writer = BackgroundWriter(store)
        for i in range(repeats):
            state["step"] = 2 * i + 1
            t0, c0 = time.perf_counter(), time.thread_time()
            store.save(snapshot(state))
            sync_s.append(time.perf_counter() - t0)
            sync_cpu.append(time.thread_time() - c0)
            state["step"] = 2 * i + 2
            t0, c0 = time.perf_counter(), time.thread_time()
            writer.wait()
            snap = snapshot(state)
            t1 = time.perf_counter()
            writer.submit(snap, lambda p, n, s: write_s.append(s))
            bg_s.append(time.perf_counter() - t0)
            bg_cpu.append(time.thread_time() - c0)
            copy_s.append(t1 - t0)
            writer.wait()  # training would go on meanwhile; here the next sample waits
        nbytes = max(p.stat().st_size for p in Path(d).glob("ckpt-*.pt"))
    med_sync, med_bg = statistics.median(sync_s), statistics.median(bg_s)
    return {"model": f"ResNet-{depth} width {width}", "bytes": nbytes, "repeats": repeats,
            "sync_stall_ms": 1000 * med_sync, "background_stall_ms": 1000 * med_bg,
            "background_copy_ms": 1000 * statistics.median(copy_s),
            "sync_cpu_ms": 1000 * statistics.median(sync_cpu),
            "background_cpu_ms": 1000 * statistics.median(bg_cpu),
            "background_write_ms": 1000 * statistics.median(write_s),
            "stall_ratio_background_to_sync": med_bg / med_sync}


def train_run(run_dir: Path, every: int, steps: int) -> dict:
    """The CPU default (ResNet-20 width 8 on digits, batch 32), 1 worker."""
    cmd = [sys.executable, "-m", "elastic_ring.cli.main", "train", "--gpus", "1", "--steps", str(steps),
           "--set", "throughput_window=20",
           "--slots", "2", "--checkpoint-every", str(every), "--checkpoint-every-s", "0",
           "--run-dir", str(run_dir)]
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"run failed: {p.stderr[-2000:]}")
    s = json.loads((run_dir / "summary.json").read_text())
    ev = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    stalls = [e["stall_s"] for e in ev if e["kind"] == "checkpoint_written" and e.get("background")]
    return {"images_per_s": s["sizes"][0]["images_per_s"], "checkpoints": len(stalls),
            "median_stall_ms": 1000 * statistics.median(stalls) if stalls else 0.0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=10, help="part 1: checkpoints per way")
    ap.add_argument("--rounds", type=int, default=3, help="part 2: alternating rounds")
    ap.add_argument("--every", type=int, default=10, help="part 2: --checkpoint-every")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--parts", default="1,2", help="which parts to run (the file holds only those: "
                    "one file per run, give another --out for a partial run)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_checkpoint.json")
    a = ap.parse_args()
    parts = {int(x) for x in a.parts.split(",")}
    load0 = os.getloadavg()[0]
    part1 = []
    if 1 in parts:
        print("part 1: stall per checkpoint on the training thread (median)")
        part1 = [stall(20, 16, a.repeats), stall(110, 16, a.repeats)]
    print(f"{'model':<22} {'MB':>6} {'sync ms':>8} {'bg ms':>7} {'of it copy':>10} {'ratio':>6} "
          f"{'bg write ms':>11} {'sync CPU ms':>11} {'bg CPU ms':>9}")
    for r in part1:
        print(f"{r['model']:<22} {r['bytes'] / 1e6:>6.2f} {r['sync_stall_ms']:>8.1f} "
              f"{r['background_stall_ms']:>7.2f} {r['background_copy_ms']:>10.2f} "
              f"{r['stall_ratio_background_to_sync']:>6.3f} {r['background_write_ms']:>11.1f} "
              f"{r['sync_cpu_ms']:>11.1f} {r['background_cpu_ms']:>9.2f}")
    if 2 not in parts:
        write_results(a.out, {"parts": sorted(parts), "part1_stall": part1}, load0)
        return
    print(f"\npart 2: ResNet-20 width 8 on digits, 1 worker, {a.steps} steps, checkpoint every {a.every} "
          f"steps vs none, {a.rounds} alternating rounds")
    runs: dict[str, list[dict]] = {"none": [], f"every_{a.every}": []}
    with tempfile.TemporaryDirectory() as d:
        for i in range(a.rounds):
            for key, every in (("none", 0), (f"every_{a.every}", a.every)):
                r = train_run(Path(d) / f"{key}-{i}", every, a.steps)
                runs[key].append(r)
                print(f"  round {i + 1} {key:<9} {r['images_per_s']:8.1f} img/s  "
                      f"{r['checkpoints']} checkpoints, median stall {r['median_stall_ms']:.2f} ms", flush=True)
    med = {k: statistics.median(x["images_per_s"] for x in v) for k, v in runs.items()}
    ratios = [b["images_per_s"] / n["images_per_s"] for n, b in zip(runs["none"], runs[f"every_{a.every}"])]
    print(f"median images/s: none {med['none']:.1f}, every {a.every}: {med[f'every_{a.every}']:.1f}; "
          f"paired ratio median {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f})")
    write_results(a.out, {"parts": sorted(parts), **({"part1_stall": part1} if part1 else {}),
                          "part2_throughput": {"runs": runs, "median_images_per_s": med,
                                               "paired_ratios": ratios,
                                               "median_ratio": statistics.median(ratios)}}, load0)


if __name__ == "__main__":
    main()
