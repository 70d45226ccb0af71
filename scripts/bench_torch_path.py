#!/usr/bin/env python
"""elastic-ring's torch path (``--collective torch``) against a plain DDP script under torchrun,
per step, on this machine: alternating rounds, medians.

Same model (CIFAR ResNet, ``--depth``/``--width``), per-worker batch, thread count and synthetic
data as ``scripts/bench_peers.py``'s steady state, whose harnesses this script runs:

* ``ours-torch``: ``elastic-ring train --collective torch`` (the built-in worker on
  DistributedDataParallel, every option at its default: the stop vote, throughput windows, events,
  periodic checkpoints); images/s from its throughput events after ``--warmup`` steps;
* ``ddp``: ``launch/peer_ddp.py`` under ``torchrun --standalone``;
* ``ours-horovod`` (with ``--with-horovod``): ``elastic-ring train`` on Horovod, for reference;
* ``ddp-allocator`` (with ``--with-ddp-allocator``): ``ddp`` with glibc's thresholds that
  elastic-ring's CPU workers set (``elastic_ring.worker.allocator``), given in its environment: how
  much of ours-torch/ddp is the allocator's, for reference (the ratio stays against ``ddp``).

Ratios ours-torch/ddp per round (who goes first alternates), medians; written to ``--out``.

    .venv/bin/python scripts/bench_torch_path.py --repeats 3 --steps 200 --workers 2
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _peers():
    spec = importlib.util.spec_from_file_location("bench_peers", ROOT / "scripts" / "bench_peers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def measure(a, bp, tmp: Path) -> dict:
    names = (["ours-torch", "ddp"] + (["ours-horovod"] if a.with_horovod else [])
             + (["ddp-allocator"] if a.with_ddp_allocator else []))
    res: dict[str, dict[int, list[float]]] = {h: {n: [] for n in a.workers} for h in names}
    loads: list[float] = []
    for i in range(a.repeats):
        order = names if i % 2 == 0 else list(reversed(names))
        for n in a.workers:
            for h in order:
                if h == "ddp":
                    v = bp.steady_peer(a, "ddp", n, tmp)
                elif h == "ddp-allocator":
                    with _allocator_env():
                        v = bp.steady_peer(a, "ddp", n, tmp)
                else:
                    a.extra = ["--collective", "torch"] if h == "ours-torch" else []
                    v = _ours(a, bp, n, tmp)
                res[h][n].append(v)
                loads.append(os.getloadavg()[0])
                print(f"round {i + 1}/{a.repeats} {h} x{n}: {v:.1f} img/s (load {os.getloadavg()[0]:.1f})",
                      file=sys.stderr, flush=True)
    rows = []
    for n in a.workers:
        r: dict = {"workers": n}
        for h in names:
            r[f"{h}_images_per_s"], r[f"{h}_median"] = res[h][n], statistics.median(res[h][n])
        ratios = [o / d for o, d in zip(res["ours-torch"][n], res["ddp"][n])]
        r["ours_torch_over_ddp"], r["ours_torch_over_ddp_median"] = ratios, statistics.median(ratios)
        if "ddp-allocator" in res:
            ra = [o / d for o, d in zip(res["ours-torch"][n], res["ddp-allocator"][n])]
            r["ours_torch_over_ddp_allocator"] = ra
            r["ours_torch_over_ddp_allocator_median"] = statistics.median(ra)
        rows.append(r)
        print(f"x{n}: ours-torch {r['ours-torch_median']:.1f} img/s, ddp {r['ddp_median']:.1f} img/s, "
              f"ours-torch/ddp {r['ours_torch_over_ddp_median']:.3f} (per round "
              f"{', '.join(f'{x:.3f}' for x in ratios)})")
    return {"rows": rows, "loadavg_1min_after_each_run": loads}


@contextmanager
def _allocator_env():
    """The environment variables that give a process the allocator thresholds of ours."""
    from elastic_ring.worker import allocator

    extra = {"MALLOC_MMAP_THRESHOLD_": str(allocator.MMAP_THRESHOLD),
             "MALLOC_TRIM_THRESHOLD_": str(allocator.TRIM_THRESHOLD)}
    old = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _ours(a, bp, n: int, tmp: Path) -> float:
    """``bench_peers.steady_ours`` with this harness's extra options."""
    import shutil
    import subprocess

    run = tmp / f"ours-{n}-{time.time_ns()}"
    p = subprocess.run(bp._train_cmd(a, run, a.steps, n, a.extra), cwd=ROOT, env=bp._env(), capture_output=True,
                       text=True, timeout=1800)
    if p.returncode != 0:
        raise bp.BenchError(f"elastic-ring train failed:\n{(p.stdout + p.stderr)[-3000:]}")
    win = [e for e in bp._read(run / "events.jsonl")
           if e["kind"] == "throughput" and e["step"] - e["steps"] >= a.warmup]
    if not win:
        raise bp.BenchError("no throughput window after the warm-up: raise --steps")
    shutil.rmtree(run, ignore_errors=True)
    return sum(e["images_per_s"] * e["seconds"] for e in win) / sum(e["seconds"] for e in win)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="alternating rounds (>= 1)")
    ap.add_argument("--steps", type=int, default=200, help="steps per run")
    ap.add_argument("--warmup", type=int, default=20, help="steps left out")
    ap.add_argument("--workers", type=int, nargs="+", default=[2])
    ap.add_argument("--with-horovod", action="store_true", help="also elastic-ring on Horovod")
    ap.add_argument("--with-ddp-allocator", action="store_true",
                    help="also the DDP script with our CPU workers' allocator thresholds (reference)")
    ap.add_argument("--depth", type=int, default=20)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=32, help="per worker")
    ap.add_argument("--device", choices=["cpu"], default="cpu")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_torch_path.json")
    a = ap.parse_args(argv)
    if a.repeats < 1 or a.steps <= a.warmup or a.warmup < 1:
        print("bench_torch_path: need --repeats >= 1 and --steps > --warmup >= 1", file=sys.stderr)
        return 2
    bp = _peers()
    load0 = os.getloadavg()
    config = {k: (v.name if isinstance(v, Path) else v) for k, v in vars(a).items()}
    result: dict = {"config": config, "cpu_count": os.cpu_count(), "loadavg_before": load0, "time": time.time()}
    with tempfile.TemporaryDirectory(prefix="bench-torch-") as d:
        try:
            result["steady"] = measure(a, bp, Path(d))
        except bp.BenchError as e:
            print(f"bench_torch_path: {e}", file=sys.stderr)
            return 1
    result["loadavg_after"] = os.getloadavg()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2))
    print(f"written {a.out.name} (load {load0[0]:.1f} -> {result['loadavg_after'][0]:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
