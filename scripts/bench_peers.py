#!/usr/bin/env python
"""elastic-ring against what its users would run otherwise: plain Horovod, torch DDP under
torchrun, and Horovod Elastic. One run, side by side, alternating, on this machine.

Same model (CIFAR ResNet, ``--depth``/``--width``), per-worker batch, thread count (cores / local
workers), synthetic CIFAR-shaped data and batch assembly for every harness (``launch/peer_common.py``).

1. Steady state (``--part steady``): images/s at 1 and 2 workers over ``--steps`` steps, leaving
   out the first ``--warmup``:
     * ``ours``: ``elastic-ring train`` (the built-in worker, every option at its default: the stop
       check, throughput windows, events, periodic checkpoints); images/s from its throughput events;
     * ``horovod``: a plain hand-written Horovod loop (``launch/peer_hvd.py``) under horovodrun;
     * ``ddp``: DistributedDataParallel (``launch/peer_ddp.py``) under ``torchrun --standalone``.
   Ratios ours/horovod and ours/ddp per round (the harnesses alternate within a round), medians.
2. Resize cost (``--part resize``): grow 1 -> 2 at step S and shrink 2 -> 1 at step 2S of a
   3S-step run (``--resize-steps``), for each of our relaunch modes (``--relaunch``) against
   Horovod Elastic's own way (``launch/peer_elastic.py``: the discovery script reports one more /
   one fewer slot) and torch DDP (``launch/peer_ddp.py --ckpt-dir``: resume from the last
   checkpoint) resized two ways: ``torchrun``, its elastic agents restarting the workers when a
   second ``--nnodes 1:2`` agent joins at step S or is stopped (SIGTERM) S/2 steps after it joined
   (checkpoint every 10 steps; 3S + ``--torchrun-extra-steps`` steps, so that it can join in time:
   its wall times compare only with its own run without a resize); ``torchrun-relaunch``, what a
   single-node user does: checkpoint at the resize step, stop torchrun (SIGTERM), start
   ``torchrun --standalone --nproc-per-node N_new`` resuming from it. Time lost per
   resize = first step at the new size - last step whose work is kept - one steady step at the
   new size (for ours: the controller's ``resize_overhead.total_lost_s``, the same definition),
   and the whole run's wall time against the same harness running the same steps at 1 worker
   without a resize.

Prints the tables and writes ``--out`` (JSON) with every measurement, the medians, the ratios,
and the machine's load average before and after.

    .venv/bin/python scripts/bench_peers.py --repeats 3            # both parts (~25 min here)
    .venv/bin/python scripts/bench_peers.py --part steady --repeats 3 --steps 200
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from elastic_ring import protocol

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
LAUNCH = ROOT / "launch"


class BenchError(RuntimeError):
    pass


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    env.update(extra)
    return env


def _threads(n: int) -> str:
    return str(protocol.cpu_threads(n))  # the rule elastic-ring's own workers follow


def _read(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _run(cmd: list[str], env: dict[str, str], timeout: float, what: str) -> None:
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise BenchError(f"{what} failed (status {p.returncode}):\n{(p.stdout + p.stderr)[-3000:]}")


def _run_driven(cmd: list[str], env: dict[str, str], log: Path, what: str, drive=lambda proc: None,
                clock=time.time, tail: int = 2000, timeout: float = 1800) -> tuple[float, float, object]:
    """Run ``cmd`` in its own process group, output to ``log``; ``drive(proc)`` acts on it while it
    runs (the resizes, the node changes), then it is waited for. Killed with its group whatever
    happens. Returns (start time and wall seconds by ``clock``, what ``drive`` returned);
    BenchError with the log's last ``tail`` characters when it exits non-zero."""
    t0 = clock()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        got = drive(proc)
        rc = proc.wait(timeout=timeout)
    finally:
        _kill(proc)
    wall = clock() - t0
    if rc != 0:
        raise BenchError(f"{what} failed (status {rc}):\n{log.read_text()[-tail:]}")
    return t0, wall, got


def _model_args(a) -> list[str]:
    return ["--depth", str(a.depth), "--width", str(a.width), "--batch-size", str(a.batch_size),
            "--device", a.device]


def _train_cmd(a, run: Path, steps: int, workers: int, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "elastic_ring.cli.main", "train", "--gpus", str(workers),
            "--slots", "2", "--device", a.device, "--dataset", "synthetic", "--depth", str(a.depth),
            "--set", f"width={a.width}", "--batch-size", str(a.batch_size), "--set", "augment=false",
            "--steps", str(steps), "--run-dir", str(run), *extra]


# ---------------------------------------------------------------------------- steady state
def steady_ours(a, n: int, tmp: Path, tree: Path | None = None) -> float:
    """``tree``: another checkout of elastic-ring (e.g. ``git archive`` of an older commit) run
    with the same Python, to measure what a change of ours gained."""
    run = tmp / f"ours-{n}-{time.time_ns()}"
    env = _env() if tree is None else _env(PYTHONPATH=str(tree))
    p = subprocess.run(_train_cmd(a, run, a.steps, n, []), cwd=tree or ROOT, env=env, capture_output=True,
                       text=True, timeout=1800)
    if p.returncode != 0:
        raise BenchError(f"elastic-ring train failed:\n{(p.stdout + p.stderr)[-3000:]}")
    evs = _read(run / "events.jsonl")
    win = [e for e in evs if e["kind"] == "throughput" and e["step"] - e["steps"] >= a.warmup]
    if not win:
        raise BenchError("no throughput window after the warm-up: raise --steps")
    images = sum(e["images_per_s"] * e["seconds"] for e in win)
    shutil.rmtree(run, ignore_errors=True)
    return images / sum(e["seconds"] for e in win)


def steady_peer(a, harness: str, n: int, tmp: Path) -> float:
    out = tmp / f"{harness}-{n}-{time.time_ns()}.jsonl"
    args = [*_model_args(a), "--steps", str(a.steps), "--warmup", str(a.warmup), "--out", str(out)]
    env = _env(OMP_NUM_THREADS=_threads(n))
    env.pop("HOROVOD_CYCLE_TIME", None)  # plain Horovod: its own default (1 ms)
    if harness in ("horovod", "horovod-tuned"):
        if harness == "horovod-tuned":  # the settings elastic-ring's CPU workers start with
            env["HOROVOD_CYCLE_TIME"] = "5"
            args += ["--groups", "1"]
        cmd = [str(BIN / "horovodrun"), "-np", str(n), "-H", f"localhost:{n}", "--gloo",
               sys.executable, "-u", str(LAUNCH / "peer_hvd.py"), *args]
    else:
        cmd = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(n),
               str(LAUNCH / "peer_ddp.py"), *args]
    _run(cmd, env, 1800, harness)
    rec = [r for r in _read(out) if r["kind"] == "steady"]
    if not rec:
        raise BenchError(f"{harness} wrote no result")
    return float(rec[-1]["images_per_s"])


# horovod-tuned: the plain loop with the settings elastic-ring's CPU workers use (cycle time 5 ms,
# all gradients in one allreduce group)
STEADY = ("ours", "horovod", "horovod-tuned", "ddp")
PEERS = ("horovod-elastic", "torchrun", "torchrun-relaunch")


def part_steady(a, tmp: Path) -> dict:
    names = STEADY + (("ours-before",) if a.compare_tree else ())
    res: dict[str, dict[int, list[float]]] = {h: {1: [], 2: []} for h in names}
    for i in range(a.repeats):
        order = names if i % 2 == 0 else tuple(reversed(names))  # alternate who goes first
        for n in a.workers:
            for h in order:
                if h == "ours":
                    v = steady_ours(a, n, tmp)
                elif h == "ours-before":
                    v = steady_ours(a, n, tmp, a.compare_tree)
                else:
                    v = steady_peer(a, h, n, tmp)
                res[h][n].append(v)
                _log(f"round {i + 1}/{a.repeats} {h} x{n}: {v:.1f} img/s (load {os.getloadavg()[0]:.1f})")
    rows = []
    for n in a.workers:
        r = {"workers": n}
        for h in STEADY:
            r[f"{h}_images_per_s"] = res[h][n]
            r[f"{h}_median"] = statistics.median(res[h][n])
        for peer in ("horovod", "horovod-tuned", "ddp"):
            ratios = [o / p for o, p in zip(res["ours"][n], res[peer][n])]
            r[f"ours_over_{peer}"] = ratios
            r[f"ours_over_{peer}_median"] = statistics.median(ratios)
        hd = [h / d for h, d in zip(res["horovod"][n], res["ddp"][n])]
        r["horovod_over_ddp"], r["horovod_over_ddp_median"] = hd, statistics.median(hd)
        if a.compare_tree:
            ob = [o / b for o, b in zip(res["ours"][n], res["ours-before"][n])]
            r["ours_before_images_per_s"], r["ours_over_before"] = res["ours-before"][n], ob
            r["ours_over_before_median"] = statistics.median(ob)
        rows.append(r)
    print(f"\nsteady state, images/s (median of {a.repeats} alternating rounds; per-round ratios)")
    print(f"{'workers':>7} {'ours':>8} {'horovod':>8} {'hvd-tuned':>9} {'ddp':>8} {'ours/hvd':>9} {'ours/tuned':>10} "
          f"{'ours/ddp':>9} {'hvd/ddp':>8}")
    for r in rows:
        print(f"{r['workers']:>7} {r['ours_median']:>8.1f} {r['horovod_median']:>8.1f} "
              f"{r['horovod-tuned_median']:>9.1f} {r['ddp_median']:>8.1f} "
              f"{r['ours_over_horovod_median']:>9.2f} {r['ours_over_horovod-tuned_median']:>10.2f} "
              f"{r['ours_over_ddp_median']:>9.2f} {r['horovod_over_ddp_median']:>8.2f}")
        if a.compare_tree:
            print(f"{'':>7} ours / ours at {a.compare_tree}: {r['ours_over_before_median']:.2f} "
                  f"(per round {', '.join(f'{x:.2f}' for x in r['ours_over_before'])})")
    return {"rows": rows}


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["steady", "resize", "all"], default="all")
    ap.add_argument("--repeats", type=int, default=3, help="alternating rounds (>= 1)")
    ap.add_argument("--steps", type=int, default=200, help="steady state: steps per run")
    ap.add_argument("--warmup", type=int, default=20, help="steady state: steps left out")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="steady state: sizes")
    ap.add_argument("--resize-steps", type=int, default=40,
                    help="resize part: S (grow at S, shrink at 2S, 3S steps in all)")
    ap.add_argument("--relaunch", nargs="*", default=["overlap", "prelaunch", "sequential", "inplace"],
                    help="resize part: our relaunch modes to measure")
    ap.add_argument("--no-resize-repeats", type=int, default=3,
                    help="resize part: rounds in which the peers also run without a resize")
    ap.add_argument("--peers", nargs="*", default=list(PEERS), choices=PEERS,
                    help="resize part: the peers to measure (torchrun: two elastic agents; "
                         "torchrun-relaunch: stop torchrun, start it again at the new size)")
    ap.add_argument("--torchrun-extra-steps", type=int, default=100,
                    help="resize part, torchrun: steps beyond 3S, so that the second agent joins in time")
    ap.add_argument("--compare-tree", type=Path, default=None,
                    help="steady state: also run this other checkout of elastic-ring (ours-before)")
    ap.add_argument("--depth", type=int, default=20)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=32, help="per worker")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_peers.json")
    a = ap.parse_args(argv)
    if a.compare_tree is not None and not (a.compare_tree / "elastic_ring").is_dir():
        print(f"bench_peers: --compare-tree {a.compare_tree} is not an elastic-ring checkout", file=sys.stderr)
        return 2
    if a.repeats < 1 or a.steps <= a.warmup or a.warmup < 1 or a.resize_steps < 10:
        print("bench_peers: need --repeats >= 1, --steps > --warmup >= 1, --resize-steps >= 10",
              file=sys.stderr)
        return 2
    if a.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("bench_peers: --device cuda but no CUDA GPU is visible", file=sys.stderr)
            return 2
    load0 = os.getloadavg()
    def _rel(v):  # paths relative to the repository in the results: no machine path in them
        if not isinstance(v, Path):
            return v
        try:
            return str(v.resolve().relative_to(ROOT))
        except ValueError:
            return v.name
    result: dict = {"config": {k: _rel(v) for k, v in vars(a).items()},
                    "cpu_count": os.cpu_count(), "loadavg_before": load0, "time": time.time()}
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as d:
        if os.environ.get("BENCH_PEERS_KEEP"):
            d = tempfile.mkdtemp(prefix="bench-peers-kept-")
        tmp = Path(d)
        try:
            if a.part in ("steady", "all"):
                result["steady"] = part_steady(a, tmp)
            if a.part in ("resize", "all"):
                result["resize"] = part_resize(a, tmp)
        except BenchError as e:
            print(f"bench_peers: {e}", file=sys.stderr)
            return 1
    result["loadavg_after"] = os.getloadavg()
    print(f"\nload average before {load0[0]:.1f}, after {result['loadavg_after'][0]:.1f} "
          f"({os.cpu_count()} cores)")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    # one file per run: only what this run measured, under its own config (nothing carried over
    # from an earlier file, so no block can outlive the run that made it)
    a.out.write_text(json.dumps(result, indent=2))
    print(f"written {a.out}")
    return 0


# ---------------------------------------------------------------------------- resize cost
def _wait_step(records: Path, pred, proc: subprocess.Popen, timeout: float, what: str) -> dict:
    t0 = time.time()
    while time.time() - t0 < timeout:
        for r in reversed(_read(records)):
            if r["kind"] == "step" and pred(r):
                return r
        if proc.poll() is not None:
            raise BenchError(f"{what}: exited with status {proc.returncode} before that step")
        time.sleep(0.05)
    raise BenchError(f"{what}: timed out")


def _losses(records: list[dict]) -> list[float]:
    """Time lost at each change of world size in one harness's step records: the first step at
    the new size - the last step before it whose work is kept (the step before the one it
    resumes from) - one steady step at the new size."""
    steps = [r for r in records if r["kind"] == "step"]
    out = []
    for i in range(1, len(steps)):
        new = steps[i]
        if new["world"] == steps[i - 1]["world"]:
            continue
        kept = [r for r in steps[:i] if r["step"] == new["step"] - 1]
        if not kept:
            continue
        same = [r for r in steps[i:] if r["world"] == new["world"]]
        gaps = [b["time"] - a["time"] for a, b in zip(same[1:], same[2:]) if b["step"] == a["step"] + 1]
        steady = statistics.median(gaps) if gaps else 0.0
        out.append({"from": steps[i - 1]["world"], "to": new["world"],
                    "lost_s": max(0.0, new["time"] - kept[-1]["time"] - steady),
                    "redone_steps": steps[i - 1]["step"] - kept[-1]["step"],
                    "t_kept": kept[-1]["time"], "t_new": new["time"]})
    return out


def resize_ours(a, mode: str | None, tmp: Path) -> dict:
    s = a.resize_steps
    run = tmp / f"ours-{mode}-{time.time_ns()}"
    extra = ["--schedule", f"{s}:2,{2 * s}:1", "--relaunch", mode] if mode else []
    t0 = time.perf_counter()
    _run(_train_cmd(a, run, 3 * s, 1, extra), _env(), 1800, f"elastic-ring train {mode}")
    wall = time.perf_counter() - t0
    ov = [e for e in _read(run / "events.jsonl") if e["kind"] == "resize_overhead"]
    shutil.rmtree(run, ignore_errors=True)
    return {"wall_s": wall, "resizes": [{"from": e["from_workers"], "to": e["to_workers"],
                                         "lost_s": e["total_lost_s"], "redone_steps": 0} for e in ov]}


def resize_hvd_elastic(a, resize: bool, tmp: Path) -> dict:
    s = a.resize_steps
    d = tmp / f"hvd-elastic-{time.time_ns()}"
    d.mkdir()
    hosts, script, out = d / "hosts", d / "discover.sh", d / "steps.jsonl"
    hosts.write_text("localhost:1\n")
    script.write_text(f"#!/bin/sh\ncat '{hosts}'\n")
    script.chmod(0o755)
    cmd = [str(BIN / "horovodrun"), "-np", "1", "--min-np", "1", "--max-np", "2",
           "--host-discovery-script", str(script), "--network-interface", "lo", "--gloo",
           sys.executable, "-u", str(LAUNCH / "peer_elastic.py"), *_model_args(a),
           "--steps", str(3 * s), "--out", str(out)]

    def drive(proc: subprocess.Popen) -> None:
        if resize:
            _wait_step(out, lambda r: r["step"] >= s, proc, 600, "horovod elastic")
            hosts.write_text("localhost:2\n")
            _wait_step(out, lambda r: r["step"] >= 2 * s and r["world"] == 2, proc, 600, "horovod elastic")
            hosts.write_text("localhost:1\n")

    _, wall, _ = _run_driven(cmd, _env(OMP_NUM_THREADS=_threads(1)), d / "log", "horovod elastic", drive,
                             clock=time.perf_counter)
    return {"wall_s": wall, "resizes": _losses(_read(out))}


# torchrun's elastic agents on this torch (2.5 and later) share the rendezvous TCPStore with the
# workers by default, and only the agent that is rank 0 in the *first* round publishes MASTER_ADDR/
# MASTER_PORT (``DynamicRendezvousHandler.next_rendezvous`` caches its ``_bootstrap_store_info``).
# A node joining later as rank 1 waits for those keys under the new round's prefix, which nobody
# writes, while the old agent waits for the newcomer's ``role_info``: both time out after
# ``read_timeout`` (60 s), and no grow ever completes. Without the shared store every round's rank 0
# publishes them again, and a join works (torch's own opt-out, the workaround of pytorch#135712).
TORCHRUN_ELASTIC_ENV = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}


def _torchrun(a, out: Path, ckpt: Path, port: int, steps: int) -> list[str]:
    return [str(BIN / "torchrun"), "--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"localhost:{port}", "--rdzv-id", f"bench{port}", "--max-restarts", "5",
            "--monitor-interval", "0.5",
            # torchrun's knobs set in its favour: no 30 s wait for more nodes, a dead node noticed fast
            "--rdzv-conf", "join_timeout=300,last_call_timeout=3,keep_alive_interval=1,keep_alive_max_attempt=3",
            str(LAUNCH / "peer_ddp.py"), *_model_args(a), "--steps", str(steps), "--out", str(out),
            "--ckpt-dir", str(ckpt), "--ckpt-every", "10"]


def _torchrun_standalone(a, out: Path, ckpt: Path, n: int, steps: int, ckpt_at: list[int]) -> list[str]:
    return [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(n), str(LAUNCH / "peer_ddp.py"),
            *_model_args(a), "--steps", str(steps), "--out", str(out), "--ckpt-dir", str(ckpt),
            "--ckpt-every", "10", "--ckpt-at", ",".join(map(str, ckpt_at))]


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def _stop(proc: subprocess.Popen, timeout: float = 60) -> None:
    """SIGTERM to the agent alone (it stops its workers itself), as a user or a scheduler would."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(proc)


def _wait_record(records: Path, kind: str, pred, proc: subprocess.Popen, timeout: float, what: str) -> dict:
    t0 = time.time()
    while time.time() - t0 < timeout:
        for r in reversed(_read(records)):
            if r["kind"] == kind and pred(r):
                return r
        if proc.poll() is not None:
            raise BenchError(f"{what}: exited with status {proc.returncode} before that {kind}")
        time.sleep(0.05)
    raise BenchError(f"{what}: timed out")


def resize_torchrun(a, resize: bool, tmp: Path) -> dict:
    """torchrun's elastic way: a second ``--nnodes 1:2`` agent joins at step S (both agents restart
    their workers from the last periodic checkpoint at world size 2), and is stopped with SIGTERM
    S/2 steps after the join (the survivor's worker fails in gloo, its agent restarts it at world
    size 1 from the last checkpoint). ``3S + --torchrun-extra-steps`` steps, so that the second
    agent can start and join before the run ends (the same steps in the run without a resize)."""
    s = a.resize_steps
    d = tmp / f"torchrun-{time.time_ns()}"
    d.mkdir()
    out = d / "steps.jsonl"
    port = 29500 + (time.time_ns() // 1000) % 400
    env = _env(OMP_NUM_THREADS=_threads(1), **TORCHRUN_ELASTIC_ENV)
    t0 = time.perf_counter()
    logs = [open(d / f"agent{i}.log", "w") for i in (0, 1)]
    steps = 3 * s + a.torchrun_extra_steps
    first = subprocess.Popen(_torchrun(a, out, d, port, steps), cwd=ROOT, env=env, stdout=logs[0],
                             stderr=subprocess.STDOUT, start_new_session=True)
    second = None
    try:
        if resize:
            _wait_step(out, lambda r: r["step"] >= s, first, 600, "torchrun")
            second = subprocess.Popen(_torchrun(a, out, d, port, steps), cwd=ROOT, env=env, stdout=logs[1],
                                      stderr=subprocess.STDOUT, start_new_session=True)
            joined = _wait_step(out, lambda r: r["world"] == 2, first, 600, "torchrun (the join)")
            _wait_step(out, lambda r: r["step"] >= max(2 * s, joined["step"] + s // 2) and r["world"] == 2,
                       first, 600, "torchrun")
            _stop(second)  # the node leaves
        rc = first.wait(timeout=1800)
    finally:
        _kill(first)
        if second is not None:
            _kill(second)
        for f in logs:
            f.close()
    wall = time.perf_counter() - t0
    if rc != 0:
        raise BenchError(f"torchrun failed (status {rc}):\n{(d / 'agent0.log').read_text()[-2000:]}")
    return {"wall_s": wall, "resizes": _losses(_read(out))}


def relaunch_plan(s: int, resize: bool) -> list[tuple[int, int | None]]:
    """The segments of the stop-and-relaunch run: (workers, step after which it is stopped; None:
    it runs to the end). Grow 1 -> 2 after step S, shrink 2 -> 1 after step 2S, 3S steps."""
    return [(1, s), (2, 2 * s), (1, None)] if resize else [(1, None)]


def resize_torchrun_relaunch(a, resize: bool, tmp: Path) -> dict:
    """What a single-node DDP user does to resize: the worker checkpoints at the step at which the
    resize is due (``--ckpt-at``), the user stops torchrun (SIGTERM to the agent) once that
    checkpoint is written, and starts ``torchrun --standalone --nproc-per-node N_new``, which
    resumes from it. Work done after the checkpoint and before the stop is lost (redone)."""
    s = a.resize_steps
    d = tmp / f"torchrun-relaunch-{time.time_ns()}"
    d.mkdir()
    out = d / "steps.jsonl"
    plan = relaunch_plan(s, resize)
    ckpt_at = [stop for _, stop in plan if stop is not None]
    t0 = time.perf_counter()
    proc = None
    phases: list[dict] = []  # per resize: where the time between the checkpoint and the new start went
    try:
        for i, (n, stop) in enumerate(plan):
            launched = time.time()
            if phases:
                phases[-1]["launched"] = launched
            with open(d / f"agent{i}.log", "w") as log:
                proc = subprocess.Popen(_torchrun_standalone(a, out, d, n, 3 * s, ckpt_at), cwd=ROOT,
                                        env=_env(OMP_NUM_THREADS=_threads(n)), stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
            if stop is None:
                rc = proc.wait(timeout=1800)
                if rc != 0:
                    raise BenchError(f"torchrun --standalone x{n} failed (status {rc}):\n"
                                     f"{(d / f'agent{i}.log').read_text()[-2000:]}")
            else:
                ck = _wait_record(out, "ckpt", lambda r, n=n, stop=stop: r["step"] == stop and r["world"] == n,
                                  proc, 600, f"torchrun --standalone x{n}")
                seen = time.time()
                _stop(proc)
                phases.append({"ckpt": ck["time"], "seen": seen, "stopped": time.time()})
    finally:
        if proc is not None:
            _kill(proc)
    wall = time.perf_counter() - t0
    recs = _read(out)
    return {"wall_s": wall, "resizes": _losses(recs), "phases": relaunch_phases(phases, recs)}


def relaunch_phases(marks: list[dict], records: list[dict]) -> list[dict]:
    """Seconds from the resize step's checkpoint to: the benchmark seeing it, torchrun stopped (SIGTERM
    to the agent's exit), the new torchrun started, its worker's ``start`` record (after imports,
    rendezvous, model build and the checkpoint's load), its first step."""
    out = []
    for m in marks:
        if "launched" not in m:
            continue
        start = next((r for r in records if r["kind"] == "start" and r["time"] >= m["launched"]), None)
        first = next((r for r in records if r["kind"] == "step" and start is not None
                      and r["time"] >= start["time"]), None)
        ph = {"seen_s": m["seen"] - m["ckpt"], "stop_s": m["stopped"] - m["seen"],
              "relaunch_s": m["launched"] - m["stopped"]}
        if start is not None:
            ph["start_record_s"] = start["time"] - m["launched"]
        if first is not None:
            ph["first_step_s"] = first["time"] - start["time"]
        out.append(ph)
    return out


def part_resize(a, tmp: Path) -> dict:
    harnesses = [f"ours:{m}" for m in a.relaunch] + [h for h in PEERS if h in a.peers]
    res: dict[str, dict] = {h: {"grow_lost_s": [], "shrink_lost_s": [], "redone_steps": [], "wall_s": [],
                                "wall_no_resize_s": []} for h in harnesses}
    base_ours: list[float] = []
    for i in range(a.repeats):
        order = harnesses if i % 2 == 0 else list(reversed(harnesses))
        if a.relaunch:  # ours without a resize (the same steps at 1 worker)
            base_ours.append(resize_ours(a, None, tmp)["wall_s"])
        for h in order:
            try:  # a peer that fails on this loaded machine is recorded, not fatal
                if h.startswith("ours:"):
                    r = resize_ours(a, h.split(":", 1)[1], tmp)
                elif h == "horovod-elastic":
                    r = resize_hvd_elastic(a, True, tmp)
                    if i < a.no_resize_repeats:
                        res[h]["wall_no_resize_s"].append(resize_hvd_elastic(a, False, tmp)["wall_s"])
                else:
                    fn = resize_torchrun if h == "torchrun" else resize_torchrun_relaunch
                    r = fn(a, True, tmp)
                    if i < a.no_resize_repeats:
                        res[h]["wall_no_resize_s"].append(fn(a, False, tmp)["wall_s"])
            except (BenchError, subprocess.TimeoutExpired) as e:
                res[h].setdefault("errors", []).append(str(e)[:1500])
                _log(f"round {i + 1}/{a.repeats} {h}: FAILED: {str(e).splitlines()[0]}")
                continue
            res[h]["wall_s"].append(r["wall_s"])
            if "phases" in r:
                res[h].setdefault("phases", []).append(r["phases"])
            for z in r["resizes"]:
                res[h]["grow_lost_s" if z["to"] > z["from"] else "shrink_lost_s"].append(z["lost_s"])
                res[h]["redone_steps"].append(z["redone_steps"])
            partial = a.out.with_name(a.out.name + ".partial")  # what is done so far, each run
            partial.parent.mkdir(parents=True, exist_ok=True)
            partial.write_text(json.dumps({"resize_raw": res, "base_ours_wall_s": base_ours,
                                           "loadavg": os.getloadavg()}, indent=1))
            _log(f"round {i + 1}/{a.repeats} {h}: " + ", ".join(
                f"{z['from']}->{z['to']} {z['lost_s']:.2f}s" for z in r["resizes"])
                + f", wall {r['wall_s']:.1f}s (load {os.getloadavg()[0]:.1f})")
    for h in harnesses:
        if h.startswith("ours:"):
            res[h]["wall_no_resize_s"] = base_ours
    def med(v: list[float]) -> float:
        return statistics.median(v) if v else float("nan")

    rows = []
    s = a.resize_steps
    print(f"\nresize cost: grow 1->2 at step {s}, shrink 2->1 at step {2 * s}, {3 * s} steps "
          f"(median of {a.repeats} alternating rounds)")
    print(f"{'harness':>18} {'grow lost s':>11} {'shrink lost s':>13} {'run wall s':>10} "
          f"{'no-resize wall s':>16} {'wall diff s':>11}")
    for h in harnesses:
        r = res[h]
        row = {"harness": h, **r, "grow_lost_median_s": med(r["grow_lost_s"]),
               "shrink_lost_median_s": med(r["shrink_lost_s"]), "wall_median_s": med(r["wall_s"]),
               "wall_no_resize_median_s": med(r["wall_no_resize_s"])}
        row["wall_diff_median_s"] = row["wall_median_s"] - row["wall_no_resize_median_s"]
        rows.append(row)
        print(f"{h:>18} {row['grow_lost_median_s']:>11.2f} {row['shrink_lost_median_s']:>13.2f} "
              f"{row['wall_median_s']:>10.1f} {row['wall_no_resize_median_s']:>16.1f} "
              f"{row['wall_diff_median_s']:>11.1f}")
    return {"rows": rows, "resize_steps": s}


if __name__ == "__main__":
    sys.exit(main())
