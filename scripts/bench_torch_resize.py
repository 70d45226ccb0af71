#!/usr/bin/env python
"""The resize cost of elastic-ring's torch path (``--collective torch``) against torchrun's
stop-and-restart of the same model, and against elastic-ring's Horovod path: grow 1 -> 2 at step S
and shrink 2 -> 1 at step 2S of a 3S-step run, alternating rounds, medians.

Same model (CIFAR ResNet, ``--depth``/``--width``), per-worker batch, thread count and synthetic
data as ``scripts/bench_peers.py``'s resize part, whose harnesses this script runs:

* ``torch-inplace``: ``elastic-ring train --collective torch --relaunch inplace`` (the survivors
  keep their processes and re-form their process group; the joiner is started ahead);
* ``torch-ray`` (with ``--ray``): ``elastic-ring train --collective torch --backend ray`` (warm
  actors) on ``--ray-address``, else on a one-node Ray cluster this script starts for all its runs
  and stops at the end (``ray.cluster_utils.Cluster``: only its own processes);
* ``horovod-inplace``: ``elastic-ring train --relaunch inplace`` (Horovod Elastic), and
  ``horovod-ray`` with ``--ray``: our Horovod path's same resizes;
* ``torchrun-relaunch``: ``launch/peer_ddp.py`` (DistributedDataParallel) under ``torchrun
  --standalone``: it checkpoints at the resize step, torchrun is stopped (SIGTERM) and started again
  with the new ``--nproc-per-node``, resuming from the checkpoint (``bench_peers.resize_torchrun_relaunch``).

Time lost per resize, the same definition for all (``bench_peers``): the first step at the new
size - the last step whose work is kept - one steady step at the new size; for ours the
controller's ``resize_overhead.total_lost_s``, which is that. Per round, each torch harness's
time lost over torchrun-relaunch's and over the Horovod path's (same backend), per resize kind;
medians over the rounds. Target: at most 0.2x torchrun's.

    .venv/bin/python scripts/bench_torch_resize.py --repeats 3 [--ray [--ray-address HOST:PORT]]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import ROOT, exit_on_sigterm, write_results  # noqa: E402

OURS = {"torch-inplace": ["--collective", "torch", "--relaunch", "inplace"],
        "torch-ray": ["--collective", "torch", "--backend", "ray"],
        "horovod-inplace": ["--relaunch", "inplace"],
        "horovod-ray": ["--backend", "ray"]}
RAY_CPUS = 4  # the bench's own Ray node: two workers, a spare, and room for a restarted one
PEER = "torchrun-relaunch"
KINDS = ("grow", "shrink")


def _peers():
    spec = importlib.util.spec_from_file_location("bench_peers", ROOT / "scripts" / "bench_peers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@contextmanager
def ray_cluster(a, tmp: Path) -> Iterator[str | None]:
    """The Ray address the Ray harnesses use: ``--ray-address``, or a one-node cluster started here
    (Ray's files under ``tmp``: its socket paths must stay short) and stopped at the end."""
    if not a.ray or a.ray_address:
        yield a.ray_address
        return
    from ray.cluster_utils import Cluster

    os.environ["RAY_TMPDIR"] = str(tmp / "ray")
    (tmp / "ray").mkdir(exist_ok=True)
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": RAY_CPUS, "include_dashboard": False,
                                                       "object_store_memory": 80 * 1024 * 1024})
    try:
        c.wait_for_nodes()
        yield c.address
    finally:
        c.shutdown()


def resize_ours(a, bp, flags: list[str], tmp: Path) -> dict:
    """One ``elastic-ring train`` with the grow and the shrink: each resize's ``total_lost_s``."""
    s = a.resize_steps
    run = tmp / f"ours-{time.time_ns()}"
    t0 = time.perf_counter()
    bp._run(bp._train_cmd(a, run, 3 * s, 1, ["--schedule", f"{s}:2,{2 * s}:1", *flags]), bp._env(), 1800,
            "elastic-ring train " + " ".join(flags))
    wall = time.perf_counter() - t0
    ov = [e for e in bp._read(run / "events.jsonl") if e["kind"] == "resize_overhead"]
    shutil.rmtree(run, ignore_errors=True)
    return {"wall_s": wall, "resizes": [{"from": e["from_workers"], "to": e["to_workers"],
                                         "lost_s": e["total_lost_s"]} for e in ov]}


def _lost(r: dict, kind: str) -> float | None:
    v = [z["lost_s"] for z in r["resizes"] if (z["to"] > z["from"]) == (kind == "grow")]
    return v[0] if v else None


def _ratio(x: float | None, y: float | None) -> float | None:
    return x / y if x is not None and y else None


def summarise(rounds: list[dict], names: list[str]) -> dict:
    """Medians of each harness's time lost, and of the per-round ratios of each torch harness."""
    def med(v: list) -> float | None:
        v = [x for x in v if x is not None]
        return statistics.median(v) if v else None

    out: dict = {h: {f"{k}_lost_median_s": med([_lost(r[h], k) for r in rounds if h in r]) for k in KINDS}
                 for h in names}
    for h in (n for n in names if n.startswith("torch-")):
        hvd = "horovod-" + h.split("-", 1)[1]
        for k in KINDS:
            out[h][f"{k}_over_torchrun_median"] = med([_ratio(_lost(r[h], k), _lost(r[PEER], k))
                                                       for r in rounds if h in r and PEER in r])
            out[h][f"{k}_over_horovod_median"] = med([_ratio(_lost(r[h], k), _lost(r[hvd], k))
                                                      for r in rounds if h in r and hvd in r])
    return out


def main(argv: list[str] | None = None) -> int:
    exit_on_sigterm()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3, help="alternating rounds (>= 1)")
    p.add_argument("--resize-steps", type=int, default=20, help="S: grow after step S, shrink after 2S, 3S steps")
    p.add_argument("--ray", action="store_true", help="also the Ray backend")
    p.add_argument("--ray-address", default=None, help="with --ray: a running cluster (else one started here)")
    p.add_argument("--harnesses", nargs="*", default=None, choices=[*OURS, PEER],
                   help="only these (default: all; the Ray ones with --ray)")
    p.add_argument("--depth", type=int, default=20)
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--out", type=Path, default=ROOT / "results" / "bench_torch_resize.json")
    a = p.parse_args(argv)
    if a.repeats < 1 or a.resize_steps < 4:
        print("bench_torch_resize: need --repeats >= 1 and --resize-steps >= 4", file=sys.stderr)
        return 2
    bp = _peers()
    names = ["torch-inplace", "horovod-inplace", *(["torch-ray", "horovod-ray"] if a.ray else []), PEER]
    if a.harnesses:
        names = [h for h in ("torch-inplace", "horovod-inplace", "torch-ray", "horovod-ray", PEER) if h in a.harnesses]
        a.ray = any(h.endswith("-ray") for h in names)
    load_before = os.getloadavg()[0]
    rounds: list[dict] = []
    errors: list[str] = []
    with tempfile.TemporaryDirectory(prefix="btr") as t, ray_cluster(a, Path(t)) as address:
        tmp = Path(t)
        ray_flags = ["--ray-address", address] if address else []
        for i in range(a.repeats):
            order = names if i % 2 == 0 else names[::-1]
            r: dict = {}
            for h in order:
                try:
                    r[h] = (bp.resize_torchrun_relaunch(a, True, tmp) if h == PEER else
                            resize_ours(a, bp, OURS[h] + (ray_flags if h.endswith("-ray") else []), tmp))
                except (bp.BenchError, subprocess.TimeoutExpired) as e:  # recorded, not fatal
                    errors.append(f"round {i + 1} {h}: {str(e)[:1500]}")
                    print(f"round {i + 1} {h}: FAILED: {str(e).splitlines()[0]}", file=sys.stderr, flush=True)
                    continue
                print(f"round {i + 1} {h}: " + ", ".join(f"{z['from']}->{z['to']} {z['lost_s']:.2f} s lost"
                                                         for z in r[h]["resizes"])
                      + f" (wall {r[h]['wall_s']:.1f} s, load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
            rounds.append(r)
    summary = summarise(rounds, names)
    for h in names:
        s = summary[h]
        line = f"{h:>18}: " + ", ".join(f"{k} {s[f'{k}_lost_median_s']:.2f} s" if s[f"{k}_lost_median_s"] is not None
                                        else f"{k} -" for k in KINDS)
        if h.startswith("torch-"):
            line += "; over torchrun-relaunch " + ", ".join(
                f"{k} {s[f'{k}_over_torchrun_median']:.3f}x" for k in KINDS
                if s[f"{k}_over_torchrun_median"] is not None) + " (target <= 0.2x)"
            line += "; over our Horovod path " + ", ".join(
                f"{k} {s[f'{k}_over_horovod_median']:.2f}x" for k in KINDS if s[f"{k}_over_horovod_median"] is not None)
        print(line)
    out = {"model": {"depth": a.depth, "width": a.width, "batch_size": a.batch_size, "device": a.device},
           "resize_steps": a.resize_steps, "repeats": a.repeats, "harnesses": names, "rounds": rounds,
           "summary": summary, "errors": errors}
    write_results(a.out, out, load_before)
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
