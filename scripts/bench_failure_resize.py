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
3. The same on one host with ``--relaunch inplace`` (one Horovod Elastic job): rank 1's process
   killed, alternating rounds with ``--survive`` and without, with the survive rounds' time from the
   kill to the job back at 2 workers (the warm joiner's first step) and the training time that grow
   lost (``--side inplace`` runs only this
   part, ``--side ray`` only part 2; the copy's cost is measured either way).

    .venv/bin/python scripts/bench_failure_resize.py [--rounds 2] [--side both|ray|inplace]
        -> results/bench_failure_resize.json
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


def killed_run(address: str | None, survive: bool, kill_at: int, steps: int) -> dict:
    """One run whose rank 1 is killed at ``kill_at``: on the Ray cluster at ``address``, or (None) on
    this host under ``--relaunch inplace``."""
    where = ["--backend", "ray", "--ray-address", address] if address else ["--relaunch", "inplace"]
    args = [*where, "--gpus", "2", "--slots", "2", "--steps", str(steps),
            "--checkpoint-every", "10", *(["--survive"] if survive else [])]
    with tempfile.TemporaryDirectory(dir="/tmp") as d, TrainRun(args, Path(d) / "run") as run:
        run.wait_step(kill_at)
        t_kill = run.signal_rank(1, signal.SIGKILL)
        run.finish("the killed run")
        (rs,) = run.events("restart")
        (rc,) = run.events("recovered")
        back = [e for e in run.events("first_step_after_resize") if e.get("joiner")]  # inplace: the warm joiner
        return {"survive": survive, "path": rs.get("path", "disk"), "kill_at": kill_at,
                "kill_to_next_step_s": rc["time"] - t_kill, "steps_redone": rs["steps_redone"],
                "time_lost_s": rc["time_lost_s"], "rank": rs["rank"],
                "kill_to_back_at_size_s": back[0]["time"] - t_kill if back else None,
                "joiner_grow_lost_s": next((e["total_lost_s"] for e in run.events("resize_overhead")
                                            if back and e["step"] == back[0]["step"] - 1), None)}


def main() -> None:
    exit_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--kill-at", type=int, default=25)
    ap.add_argument("--copy-steps", type=int, default=15, help="steps per round of the copy's cost")
    ap.add_argument("--side", choices=("both", "ray", "inplace"), default="both",
                    help="which kill -9 comparison to run: on Ray, on one host in place, or both")
    ap.add_argument("--out", type=Path, default=None,
                    help="[default: results/bench_failure_resize.json; with --side inplace "
                         "results/bench_failure_resize_inplace.json]")
    a = ap.parse_args()
    if a.out is None:
        a.out = ROOT / "results" / ("bench_failure_resize_inplace.json" if a.side == "inplace"
                                    else "bench_failure_resize.json")
    load0 = os.getloadavg()[0]
    cost = copy_cost(2 * a.rounds, a.copy_steps)
    print(f"copy: {cost['copy_ms']:.2f} ms of a {cost['step_ms_without']:.1f} ms step "
          f"({cost['overhead_pct']:+.1f}% measured), {cost['memory_bytes_two_copies'] / MB:.1f} MB kept")

    out: dict = {"copy_cost": cost}
    if a.side in ("both", "inplace"):
        out["inplace"] = kill_rounds(None, a)
    if a.side in ("both", "ray"):
        out.update(ray_side(a))
    write_results(a.out, out, load0)


def kill_rounds(address: str | None, a: argparse.Namespace) -> dict:
    """Alternating rounds with and without ``--survive``: the runs and their medians."""
    runs = []
    for _ in range(a.rounds):
        for survive in (True, False):
            r = killed_run(address, survive, a.kill_at, a.steps)
            runs.append(r)
            print(f"{'ray' if address else 'inplace'} {'survive' if survive else 'restart'}: kill -> next step "
                  f"{r['kill_to_next_step_s']:.2f} s, {r['steps_redone']} step(s) redone, path {r['path']}")

    def med(survive: bool, key: str) -> float | None:
        got = [r[key] for r in runs if r["survive"] == survive and r[key] is not None]
        return statistics.median(got) if got else None

    return {"runs": runs, "medians": {
        name: {k: med(s, k) for k in ("kill_to_next_step_s", "steps_redone", "time_lost_s", "kill_to_back_at_size_s",
                                          "joiner_grow_lost_s")}
        for name, s in (("survive", True), ("restart", False))}}


def ray_side(a: argparse.Namespace) -> dict:
    """Part 2: the kill -9 rounds on a local Ray cluster of two one-CPU nodes started here."""
    import psutil
    from ray.cluster_utils import Cluster

    tmp = Path(tempfile.mkdtemp(prefix="bfr", dir="/tmp"))
    os.environ["RAY_TMPDIR"] = str(tmp)
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 80 * MB,
                                                       "include_dashboard": False})
    try:
        c.add_node(num_cpus=1, object_store_memory=80 * MB)
        c.wait_for_nodes()
        return kill_rounds(c.address, a)
    finally:
        started = psutil.Process().children(recursive=True)
        c.shutdown()
        _, alive = psutil.wait_procs(started, timeout=15)
        for p in alive:  # by pid: only what this cluster started
            p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
