"""A failure as a resize (``--survive``) against today's restart from the checkpoint, and what the
in-memory copy that makes it possible costs a step.

1. The copy's cost: the built-in ResNet (ResNet-20 width 16, batch 32, SGD with momentum, one
   torch thread), rounds of training steps alternating with and without the copy the workers keep
   of each completed step (``worker.survive.MemoryCopy`` over the same CPU snapshot a checkpoint
   holds); medians of the step times, and the bytes of the two copies kept.
2. kill -9 -> the next completed step: a 2-worker ``elastic-ring train --backend ray`` of the CPU
   default (ResNet-20/8 on digits) on a local Ray cluster of two one-CPU nodes started here, rank 1
   killed at a step; alternating rounds with ``--survive`` (the survivor goes on from memory) and
   without (restart from the checkpoint, ``--checkpoint-every 10``): the time from the kill to
   the first step done after it, the steps redone, and the ``recovered`` event's time lost.
3. The grow back (``--survive``, the same runs): a new actor in the killed worker's bundle starts
   after the kill, and once it waits for its go the ring grows back to 2 at a step boundary: the
   time from the kill to the first step at 2 again, when the joiner was ready, and the training
   time that grow lost more than the survivors' path (its ``resize_overhead`` ``total_lost_s``:
   the survivor's stop at the step boundary, the ring's re-forming and the sync of the joiner).
   A survive run is stopped (Ctrl-C) a few steps after the grow, whatever ``--steps``.

    .venv/bin/python scripts/bench_failure_resize.py [--rounds 2]   -> results/bench_failure_resize.json
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchlib import TrainRun, exit_on_sigterm, write_results  # noqa: E402

MB = 1024 * 1024


def copy_cost(rounds: int, steps: int) -> dict:
    import torch
    import torch.nn.functional as F

    from elastic_ring.ckpt import snapshot
    from elastic_ring.nn import resnet
    from elastic_ring.worker.state import _rng_state
    from elastic_ring.worker.survive import MemoryCopy

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = resnet(20, 16, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))

    def take(step: int) -> dict:  # what StateSync.snapshot copies
        return snapshot({"step": step, "model": model.state_dict(), "optimizer": opt.state_dict(),
                         "rng": _rng_state()})

    copy = MemoryCopy(take)
    on, off, copy_s = [], [], []
    step = 0
    for r in range(2 * rounds):
        keeping = r % 2 == 0
        for _ in range(steps):
            t0 = time.perf_counter()
            if keeping:
                copy.keep(step)
                copy_s.append(time.perf_counter() - t0)
            opt.zero_grad()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            step += 1
            (on if keeping else off).append(time.perf_counter() - t0)
    nbytes = sum(t.numel() * t.element_size() for c in copy.copies.values()
                 for part in (c["model"], *c["optimizer"]["state"].values()) for t in part.values()
                 if torch.is_tensor(t))
    m_on, m_off = statistics.median(on), statistics.median(off)
    return {"model": "ResNet-20 width 16, batch 32, 1 thread", "steps_each": len(on),
            "step_ms_with_copy": 1000 * m_on, "step_ms_without": 1000 * m_off,
            "copy_ms": 1000 * statistics.median(copy_s), "overhead_pct": 100 * (m_on - m_off) / m_off,
            "copy_of_step_pct": 100 * statistics.median(copy_s) / m_off, "memory_bytes_two_copies": nbytes}


def _grown_back(run: TrainRun) -> dict | None:
    """The first step at 2 workers after the survivors' segment (None before the grow)."""
    return next((e for e in run.events("first_step") if e["segment"] >= 2 and e["world_size"] == 2), None)


def grow_back(run: TrainRun, t_kill: float, timeout_s: float = 600.0) -> dict:
    """Wait for the grow back, stop the run with Ctrl-C a few steps later; what the grow cost."""
    t0 = time.time()
    while (first := _grown_back(run)) is None:
        if run.p.poll() is not None or time.time() - t0 > timeout_s:
            raise SystemExit("the survive run did not grow back to 2 workers (raise --steps on a slow machine)")
        time.sleep(0.1)
    run.wait_step(int(first["step"]) + 3)
    run.p.send_signal(signal.SIGINT)
    run.p.communicate(timeout=300)
    (req,) = [e for e in run.events("resize_requested") if e.get("source") == "heal"]
    (ov,) = [e for e in run.events("resize_overhead") if e["to_workers"] == 2]
    return {"joiner_ready_s": req["time"] - t_kill, "kill_to_back_at_2_s": first["time"] - t_kill,
            "grow_lost_s": ov["total_lost_s"], "grow_at_step": ov["step"],
            "grow_hvd_reinit_s": (first.get("phases") or {}).get("hvd_reinit")}


def killed_run(address: str, survive: bool, kill_at: int, steps: int) -> dict:
    args = ["--backend", "ray", "--ray-address", address, "--gpus", "2", "--slots", "2", "--steps", str(steps),
            "--checkpoint-every", "10", *(["--survive"] if survive else [])]
    with tempfile.TemporaryDirectory(dir="/tmp") as d, TrainRun(args, Path(d) / "run") as run:
        run.wait_step(kill_at)
        t_kill = run.signal_rank(1, signal.SIGKILL)
        grown = grow_back(run, t_kill) if survive else {}
        if not survive:
            run.finish("the killed run")
        (rs,) = run.events("restart")
        (rc,) = run.events("recovered")
        return {"survive": survive, "path": rs.get("path", "disk"), "kill_at": kill_at,
                "kill_to_next_step_s": rc["time"] - t_kill, "steps_redone": rs["steps_redone"],
                "time_lost_s": rc["time_lost_s"], "rank": rs["rank"], **grown}


def main() -> None:
    exit_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=60, help="steps of a restart run")
    ap.add_argument("--survive-steps", type=int, default=2000,
                    help="steps of a survive run (stopped a few steps after its grow back)")
    ap.add_argument("--kill-at", type=int, default=25)
    ap.add_argument("--copy-steps", type=int, default=15, help="steps per round of the copy's cost")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_failure_resize.json")
    a = ap.parse_args()
    load0 = os.getloadavg()[0]
    cost = copy_cost(2 * a.rounds, a.copy_steps)
    print(f"copy: {cost['copy_ms']:.2f} ms of a {cost['step_ms_without']:.1f} ms step "
          f"({cost['overhead_pct']:+.1f}% measured), {cost['memory_bytes_two_copies'] / MB:.1f} MB kept")

    import psutil
    from ray.cluster_utils import Cluster

    tmp = Path(tempfile.mkdtemp(prefix="bfr", dir="/tmp"))
    os.environ["RAY_TMPDIR"] = str(tmp)
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 80 * MB,
                                                       "include_dashboard": False})
    runs = []
    try:
        c.add_node(num_cpus=1, object_store_memory=80 * MB)
        c.wait_for_nodes()
        for _ in range(a.rounds):
            for survive in (True, False):
                r = killed_run(c.address, survive, a.kill_at, a.survive_steps if survive else a.steps)
                runs.append(r)
                print(f"{'survive' if survive else 'restart'}: kill -> next step {r['kill_to_next_step_s']:.2f} s, "
                      f"{r['steps_redone']} step(s) redone, path {r['path']}"
                      + (f"; joiner ready {r['joiner_ready_s']:.2f} s, back at 2 {r['kill_to_back_at_2_s']:.2f} s "
                         f"after the kill, the grow lost {r['grow_lost_s']:.2f} s" if survive else ""))
    finally:
        started = psutil.Process().children(recursive=True)
        c.shutdown()
        _, alive = psutil.wait_procs(started, timeout=15)
        for p in alive:  # by pid: only what this cluster started
            p.kill()
        shutil.rmtree(tmp, ignore_errors=True)

    def med(survive: bool, key: str) -> float:
        return statistics.median(r[key] for r in runs if r["survive"] == survive)

    out = {"copy_cost": cost, "runs": runs, "medians": {
        name: {k: med(s, k) for k in ("kill_to_next_step_s", "steps_redone", "time_lost_s")}
        for name, s in (("survive", True), ("restart", False))}}
    out["medians"]["grow_back"] = {k: med(True, k) for k in ("joiner_ready_s", "kill_to_back_at_2_s", "grow_lost_s")}
    write_results(a.out, out, load0)


if __name__ == "__main__":
    main()
