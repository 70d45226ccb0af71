"""A failure as a resize (``--survive``) against today's restart from the checkpoint, and what the
in-memory copy that makes it possible costs a step.

1. The copy's cost: the built-in ResNet (ResNet-20 width 16, batch 32, SGD with momentum, one
   torch thread), rounds of training steps alternating with and without the copy the workers keep
   of each completed step (``worker.survive.MemoryCopy`` over the same CPU snapshot a checkpoint
   holds); medians of the step times, the median over the rounds of each round's median with the
   copy over the next round's without it (``--copy-steps 1``: every other step), and the bytes of
   the two copies kept. ``--copy-only`` measures only this (``results/bench_survive_copy.json``).
2. kill -9 -> the next completed step: a 2-worker ``elastic-ring train --backend ray`` of the CPU
   default (ResNet-20/8 on digits) on a local Ray cluster of two one-CPU nodes started here, rank 1
   killed at a step; alternating rounds with ``--survive`` (the survivor goes on from memory) and
   without (restart from the checkpoint, ``--checkpoint-every 10``): the time from the kill to
   the first step done after it, the steps redone, and the ``recovered`` event's time lost.
3. The same on one host with ``--relaunch inplace`` (one Horovod Elastic job): rank 1's process
   (``--kill-rank 0``: rank 0's; the survivor then goes on as rank 0) killed, alternating rounds with ``--survive`` and without, with the survive rounds' time from the
   kill to the job back at 2 workers (the warm joiner's first step) and the training time that grow
   lost (``--side inplace`` runs only this part, ``--side ray`` only part 2; the copy's cost is
   measured either way).
4. The grow back (Ray, the ``--survive`` runs of part 2): a new actor in the killed worker's bundle
   starts after the kill, and once it waits for its go the ring grows back to 2 at a step
   boundary: the time from the kill to the first step at 2 again, when the joiner was ready, and
   the training time that grow lost more than the survivors' path (its ``resize_overhead``
   ``total_lost_s``: from the survivors' pause at the step boundary, as a scheduled grow is
   measured, to the first step at 2, less one steady step at 2: the ring's re-forming and the
   joiner's sync). Such a run is stopped (Ctrl-C) once the first throughput window at 2 is done
   (the steady step it gives; ``--survive-steps`` only bounds the run).
5. Horovod Elastic's own recovery of the same kill (``--horovod-elastic``): ``horovodrun -np 2
   --min-np 1 --max-np 2`` of ``examples/hvd_elastic_mlp.py`` (it commits after every batch) on two
   host names of this machine (``localhost:1``, ``127.0.0.1:1``: Horovod blacklists the host of a
   failed worker, so the survivor needs a host of its own), ``--blacklist-cooldown-range 1 2`` so
   that the killed worker's host comes back; rank 1 killed once rank 0 has done ``--kill-at``
   steps: rank 0 rolls back to its last ``commit()`` and goes on alone, and a cold joiner brings it
   back to 2. From rank 0's step records: the kill to its next step, the kill to its first step at
   2 again, and the time each change of size lost (``bench_hvd_elastic.losses``). Another model than
   parts 2-4 (an MLP on digits: a Horovod Elastic script keeps no copy under ``--survive``), so the
   comparison is of the recovery's own seconds, not of the step times.
6. A lost Ray node (``--lost-node``: only this part, in its own results file): the same 2-worker
   Ray run on a local cluster of a head with no CPU (the controller's node, never the lost one) and
   two one-CPU nodes, one worker each; once the run has done ``--kill-at`` steps, the node of rank 1
   is removed the way ``tests/integration/test_ray.py`` removes one (``Cluster.remove_node(node,
   allow_graceful=False)``: that node's raylet and its other Ray processes SIGKILLed, the worker on
   it ending with its raylet: a machine that died, not a network partition), alternating rounds with
   ``--survive`` (the survivor goes on alone from memory) and without (the restart from the
   checkpoint, at the size the node left holds). From the removal: the controller's ``restart``
   event (its detection; its ``cause`` says whether Ray reported the node lost or the worker's
   process was seen gone on this host), the survivors' next completed step (the ``recovered``
   event), when the removed node's worker process was gone, and when Ray's GCS marked that worker's
   actor and the node dead (its actor and node tables, polled). A node is added back before the next round.

    .venv/bin/python scripts/bench_failure_resize.py [--rounds 2] [--side both|ray|inplace]
        -> results/bench_failure_resize.json
    .venv/bin/python scripts/bench_failure_resize.py --lost-node [--rounds 2]
        -> results/bench_lost_node.json
    .venv/bin/python scripts/bench_failure_resize.py --side inplace --collective torch
        -> results/bench_failure_resize_inplace_torch.json (parts 1 and 3 on torch.distributed, gloo)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchlib import TrainRun, exit_on_sigterm, write_results  # noqa: E402

MB = 1024 * 1024
THROUGHPUT_WINDOW = 20  # steps per throughput event (the default config)


def copy_cost(rounds: int, steps: int) -> dict:
    import torch
    import torch.nn.functional as F

    from elastic_ring.ckpt import snapshot
    from elastic_ring.nn import resnet
    from elastic_ring.worker.state import _rng_state
    from elastic_ring.worker.survive import MemoryCopy

    from elastic_ring.worker.allocator import keep_freed_memory

    keep_freed_memory()  # as a CPU worker does (its Job): freed memory reused, no page faults per copy
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = resnet(20, 16, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    x, y = torch.randn(32, 3, 32, 32), torch.randint(0, 10, (32,))

    def take(step: int, into: dict | None) -> dict:  # what StateSync.snapshot copies
        return snapshot({"step": step, "model": model.state_dict(), "optimizer": opt.state_dict(),
                         "rng": _rng_state()}, into)

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
    # each round with the copy beside the round without it that follows: the drift of a shared machine cancels
    per_round = [statistics.median(on[i * steps:(i + 1) * steps]) / statistics.median(off[i * steps:(i + 1) * steps])
                 for i in range(min(len(on), len(off)) // steps)]
    return {"model": "ResNet-20 width 16, batch 32, 1 thread", "steps_each": len(on), "steps_per_round": steps,
            "paired_ratio_median": statistics.median(per_round),
            "paired_overhead_pct": 100 * (statistics.median(per_round) - 1),
            "step_ms_with_copy": 1000 * m_on, "step_ms_without": 1000 * m_off,
            "copy_ms": 1000 * statistics.median(copy_s), "overhead_pct": 100 * (m_on - m_off) / m_off,
            "copy_of_step_pct": 100 * statistics.median(copy_s) / m_off, "memory_bytes_two_copies": nbytes}


def killed_run(address: str | None, survive: bool, kill_at: int, steps: int, collective: str = "horovod",
               rank: int = 1) -> dict:
    """One run whose ``rank`` is killed at ``kill_at``: on the Ray cluster at ``address``, or (None) on
    this host under ``--relaunch inplace``; on ``collective``'s workers."""
    where = ["--backend", "ray", "--ray-address", address] if address else ["--relaunch", "inplace"]
    args = [*where, "--collective", collective, "--gpus", "2", "--slots", "2", "--steps", str(steps),
            "--checkpoint-every", "10", "--survive" if survive else "--no-survive"]
    heals = bool(address) and survive  # on Ray the survivors grow back to 2 (part 4)
    with tempfile.TemporaryDirectory(dir="/tmp") as d, TrainRun(args, Path(d) / "run") as run:
        run.wait_step(kill_at)
        t_kill = run.signal_rank(rank, signal.SIGKILL)
        grown = grow_back(run, t_kill) if heals else {}
        if not heals:
            run.finish("the killed run")
        (rs,) = run.events("restart")
        (rc,) = run.events("recovered")
        back = [e for e in run.events("first_step_after_resize") if e.get("joiner")]  # inplace: the warm joiner
        return {"survive": survive, "collective": collective, "path": rs.get("path", "disk"), "kill_at": kill_at,
                "kill_to_next_step_s": rc["time"] - t_kill, "steps_redone": rs["steps_redone"],
                "time_lost_s": rc["time_lost_s"], "rank": rs["rank"], **grown,
                "kill_to_back_at_size_s": back[0]["time"] - t_kill if back else None,
                "joiner_grow_lost_s": next((e["total_lost_s"] for e in run.events("resize_overhead")
                                            if back and e["step"] == back[0]["step"] - 1), None),
                # rank 0's first step back at the size: the ring's re-forming (a joiner still starting
                # is waited for there) and the state's broadcast
                "joiner_grow_phases": next((e.get("phases") for e in run.events("first_step")
                                            if back and e["segment"] == back[0]["segment"]), None)}


def _grown_back(run: TrainRun) -> dict | None:
    """The first step at 2 workers after the survivors' segment (None before the grow)."""
    return next((e for e in run.events("first_step") if e["segment"] >= 2 and e["world_size"] == 2), None)


def grow_back(run: TrainRun, t_kill: float, timeout_s: float = 600.0) -> dict:
    """Wait for the grow back, stop the run with Ctrl-C a few steps later; what the grow cost."""
    t0 = time.time()
    while (first := _grown_back(run)) is None:
        if run.p.poll() is not None or time.time() - t0 > timeout_s:
            raise SystemExit("the survive run did not grow back to 2 workers (raise --survive-steps on a slow "
                             "machine)")
        time.sleep(0.1)
    # past the first throughput window at 2 (its steady step is what the overhead subtracts)
    run.wait_step(int(first["step"]) + THROUGHPUT_WINDOW + 2)
    run.p.send_signal(signal.SIGINT)
    run.p.communicate(timeout=300)
    (req,) = [e for e in run.events("resize_requested") if e.get("source") == "joiner"]
    (ov,) = [e for e in run.events("resize_overhead") if e["to_workers"] == 2]
    return {"joiner_ready_s": req["time"] - t_kill, "kill_to_back_at_2_s": first["time"] - t_kill,
            "grow_lost_s": ov["total_lost_s"], "grow_at_step": ov["step"], "grow_steady_step_s": ov["steady_step_s"],
            "grow_relaunch_to_first_step_s": ov["relaunch_to_first_step_s"],
            "grow_hvd_reinit_s": (first.get("phases") or {}).get("hvd_reinit")}


def horovod_elastic_kill(a: argparse.Namespace, tmp: Path) -> dict:
    """Part 5: one Horovod Elastic run whose rank 1 is killed (see the module docstring)."""
    import subprocess

    from bench_hvd_elastic import BIN, SCRIPT, losses

    d = Path(tempfile.mkdtemp(prefix="hek", dir=tmp))
    hosts, disc, log = d / "hosts", d / "discover.sh", d / "log"
    hosts.write_text("localhost:1\n127.0.0.1:1\n")
    disc.write_text(f"#!/bin/sh\ncat '{hosts}'\n")
    disc.chmod(0o755)
    cmd = [str(BIN / "horovodrun"), "-np", "2", "--min-np", "1", "--max-np", "2", "--host-discovery-script",
           str(disc), "--blacklist-cooldown-range", "1", "2", "--network-interface", "lo", "--gloo",
           sys.executable, "-u", str(SCRIPT), "--epochs", "1000", "--train-size", "384", "--log-samples", str(log)]

    def rows() -> list[dict]:
        out = []
        for f in log.glob("samples-*.jsonl"):
            for ln in f.read_text().splitlines():
                try:
                    out.append({**json.loads(ln), "pid": int(f.stem.split("-")[1])})
                except (json.JSONDecodeError, ValueError):
                    pass
        return sorted(out, key=lambda r: r["t"])

    # a cold joiner may take more than Gloo's 30 s to start on a loaded machine: the survivor would abort
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", PYTHONUNBUFFERED="1",
               HOROVOD_GLOO_TIMEOUT_SECONDS="300")
    t0 = time.time()
    with open(d / "out.txt", "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            def wait(until, what: str) -> list[dict]:
                while not until(r := rows()):
                    if proc.poll() is not None or time.time() - t0 > 1200:
                        raise SystemExit(f"horovod elastic: {what} not seen: {(d / 'out.txt').read_text()[-2000:]}")
                    time.sleep(0.05)
                return r

            r = wait(lambda r: sum(x["rank"] == 0 and x["size"] == 2 for x in r) >= a.kill_at, "the steps at 2")
            pid0, pid1 = (next(x["pid"] for x in reversed(r) if x["rank"] == k) for k in (0, 1))
            t_kill = time.time()
            os.kill(pid1, signal.SIGKILL)
            r = wait(lambda r: any(x["rank"] == 0 and x["t"] > t_kill and x["size"] == 2 and (x["pid"] != pid0 or any(
                y["rank"] == 0 and t_kill < y["t"] < x["t"] and y["size"] == 1 for y in r)) for x in r),
                "the grow back to 2")
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    r0 = [x for x in r if x["rank"] == 0]
    after = [x for x in r0 if x["t"] > t_kill]
    back = next(x for i, x in enumerate(after) if x["size"] == 2 and (x["pid"] != pid0 or any(
        y["size"] == 1 for y in after[:i])))
    shutil.rmtree(d, ignore_errors=True)
    return {"kill_to_next_step_s": after[0]["t"] - t_kill, "kill_to_back_at_2_s": back["t"] - t_kill,
            "survivor_kept": all(x["pid"] == pid0 for x in after),  # else rank 0 died too: no recovery in memory
            "resizes": losses(r0[len(r0) - len(after) - 1:])}  # from the last step before the kill


def main() -> None:
    exit_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=60, help="steps of a run (a Ray --survive run: --survive-steps)")
    ap.add_argument("--survive-steps", type=int, default=2000,
                    help="steps of a Ray --survive run (stopped a few steps after its grow back)")
    ap.add_argument("--kill-at", type=int, default=25)
    ap.add_argument("--kill-rank", type=int, choices=(0, 1), default=1,
                    help="the rank killed in the kill -9 rounds (parts 2-4) [default: 1]")
    ap.add_argument("--copy-steps", type=int, default=15, help="steps per round of the copy's cost")
    ap.add_argument("--copy-rounds", type=int, default=0,
                    help="rounds of the copy's cost, each way, alternating [default: 2 x --rounds]")
    ap.add_argument("--copy-only", action="store_true",
                    help="only the copy's cost (part 1), into results/bench_survive_copy.json")
    ap.add_argument("--horovod-elastic", action="store_true",
                    help="also Horovod Elastic's own recovery of the same kill (part 5), --rounds runs")
    ap.add_argument("--side", choices=("both", "ray", "inplace"), default="both",
                    help="which kill -9 comparison to run: on Ray, on one host in place, or both")
    ap.add_argument("--collective", choices=("horovod", "torch"), default="horovod",
                    help="the workers' collective in the kill -9 rounds (parts 2-4) [default: horovod]")
    ap.add_argument("--lost-node", action="store_true",
                    help="only part 6: a lost Ray node, with and without --survive (results/bench_lost_node.json)")
    ap.add_argument("--out", type=Path, default=None,
                    help="[default: results/bench_failure_resize.json; with --side inplace "
                         "results/bench_failure_resize_inplace.json; _torch before .json with --collective torch, "
                         "_rank0 with --kill-rank 0; "
                         "with --lost-node results/bench_lost_node.json]")
    a = ap.parse_args()
    if a.lost_node and (a.side == "inplace" or a.horovod_elastic):
        ap.exit(2, "bench_failure_resize.py: --lost-node is a Ray part: not with --side inplace or --horovod-elastic\n")
    if a.copy_steps < 1 or a.copy_rounds < 0:
        ap.exit(2, "bench_failure_resize.py: --copy-steps must be at least 1, --copy-rounds at least 0\n")
    if a.rounds < 1 or a.kill_at < 1 or a.steps <= a.kill_at:
        ap.exit(2, "bench_failure_resize.py: --rounds and --kill-at must be at least 1, --steps above --kill-at\n")
    if a.out is None:
        torch = ("_torch" if a.collective == "torch" else "") + ("_rank0" if a.kill_rank == 0 else "")
        a.out = ROOT / "results" / ("bench_survive_copy.json" if a.copy_only else "bench_lost_node.json" if a.lost_node else f"bench_failure_resize_inplace{torch}.json"
                                    if a.side == "inplace" else f"bench_failure_resize{torch}.json")
    load0 = os.getloadavg()[0]
    if a.lost_node:
        write_results(a.out, {"lost_node": lost_node_side(a)}, load0)
        return
    cost = copy_cost(a.copy_rounds or 2 * a.rounds, a.copy_steps)
    print(f"copy: {cost['copy_ms']:.2f} ms of a {cost['step_ms_without']:.1f} ms step "
          f"({cost['overhead_pct']:+.1f}% measured; paired rounds {cost['paired_overhead_pct']:+.1f}%), "
          f"{cost['memory_bytes_two_copies'] / MB:.1f} MB kept")
    if a.copy_only:
        write_results(a.out, {"copy_cost": cost}, load0)
        return

    out: dict = {"copy_cost": cost, "collective": a.collective, "killed_rank": a.kill_rank}
    if a.side in ("both", "inplace"):
        out["inplace"] = kill_rounds(None, a)
    if a.side in ("both", "ray"):
        out.update(ray_side(a))
    if a.horovod_elastic:
        runs = []
        for _ in range(a.rounds):
            runs.append(horovod_elastic_kill(a, Path(tempfile.gettempdir())))
            print(f"horovod elastic: kill -> next step {runs[-1]['kill_to_next_step_s']:.2f} s, back at 2 "
                  f"{runs[-1]['kill_to_back_at_2_s']:.2f} s after the kill; {runs[-1]['resizes']}")
        out["horovod_elastic"] = {"runs": runs, "medians": {k: statistics.median(r[k] for r in runs)
                                                            for k in ("kill_to_next_step_s", "kill_to_back_at_2_s")}}
    write_results(a.out, out, load0)


def kill_rounds(address: str | None, a: argparse.Namespace) -> dict:
    """Alternating rounds with and without ``--survive``: the runs and their medians."""
    runs = []
    for _ in range(a.rounds):
        for survive in (True, False):
            r = killed_run(address, survive, a.kill_at, a.survive_steps if address and survive else a.steps,
                           a.collective, a.kill_rank)
            runs.append(r)
            print(f"{'ray' if address else 'inplace'} {'survive' if survive else 'restart'}: kill -> next step "
                  f"{r['kill_to_next_step_s']:.2f} s, {r['steps_redone']} step(s) redone, path {r['path']}"
                  + (f"; joiner ready {r['joiner_ready_s']:.2f} s, back at 2 {r['kill_to_back_at_2_s']:.2f} s "
                     f"after the kill, the grow lost {r['grow_lost_s']:.2f} s" if "grow_lost_s" in r else ""))

    def med(survive: bool, key: str) -> float | None:
        got = [r[key] for r in runs if r["survive"] == survive and r.get(key) is not None]
        return statistics.median(got) if got else None

    medians = {name: {k: med(s, k) for k in ("kill_to_next_step_s", "steps_redone", "time_lost_s",
                                             "kill_to_back_at_size_s", "joiner_grow_lost_s")}
               for name, s in (("survive", True), ("restart", False))}
    if address:
        medians["grow_back"] = {k: med(True, k) for k in ("joiner_ready_s", "kill_to_back_at_2_s", "grow_lost_s")}
    return {"runs": runs, "medians": medians}


@contextmanager
def local_ray_cluster(head_cpus: int, nodes: int):
    """A local Ray cluster started here: a head of ``head_cpus`` CPUs and ``nodes`` one-CPU nodes, small
    object stores, its files in a folder of its own; at the end every process it started is gone."""
    import psutil
    from ray.cluster_utils import Cluster

    tmp = Path(tempfile.mkdtemp(prefix="bfr", dir="/tmp"))
    os.environ["RAY_TMPDIR"] = str(tmp)
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": head_cpus, "object_store_memory": 80 * MB,
                                                       "include_dashboard": False})
    try:
        for _ in range(nodes):
            c.add_node(num_cpus=1, object_store_memory=80 * MB)
        c.wait_for_nodes()
        yield c
    finally:
        started = psutil.Process().children(recursive=True)
        c.shutdown()
        _, alive = psutil.wait_procs(started, timeout=15)
        for p in alive:  # by pid: only what this cluster started
            p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def ray_side(a: argparse.Namespace) -> dict:
    """Part 2: the kill -9 rounds on a local Ray cluster of two one-CPU nodes started here."""
    with local_ray_cluster(1, 1) as c:
        return kill_rounds(c.address, a)


def _rank_node(run: Path, rank: int, timeout_s: float = 60.0) -> tuple[int, str]:
    """(pid, node id prefix) of ``rank`` in segment 0, from the backend's line in its log."""
    import re

    t0 = time.time()
    while time.time() - t0 < timeout_s:
        for f in (run / "logs").glob("segment-000-w*.log"):
            for r, pid, node in re.findall(r"rank (\d+): \w+ pid (\d+) node (\w+)", f.read_text()):
                if int(r) == rank:
                    return int(pid), node
        time.sleep(0.1)
    raise SystemExit(f"rank {rank}'s node is not named in {run / 'logs'}")


def _watch_loss(c, node_id: str, pid: int, t0: float, timeout_s: float = 90.0) -> tuple[threading.Thread, dict]:
    """A thread noting when the worker process ``pid`` is gone, and when Ray's GCS marks its actor and
    ``node_id`` dead (the cluster's actor and node tables, polled every 0.1 s), in seconds after ``t0``."""
    import psutil

    seen: dict = {"worker_gone_s": None, "gcs_actor_dead_s": None, "gcs_actor_death_cause": None,
                  "gcs_node_dead_s": None}

    def watch() -> None:
        while time.time() - t0 < timeout_s and None in (seen["gcs_node_dead_s"], seen["gcs_actor_dead_s"]):
            now = time.time()
            if seen["worker_gone_s"] is None and not psutil.pid_exists(pid):
                seen["worker_gone_s"] = now - t0
            try:
                rows = c.global_state.node_table()
                actors = c.global_state.actor_table(None).values()
            except Exception:  # noqa: BLE001 - the GCS busy: ask again
                rows, actors = [], []
            now = time.time()
            if seen["gcs_node_dead_s"] is None and any(r.get("NodeID") == node_id and not r.get("Alive")
                                                       for r in rows):
                seen["gcs_node_dead_s"] = now - t0
            dead = [x for x in actors if x.get("Pid") == pid and x.get("State") == "DEAD"]
            if seen["gcs_actor_dead_s"] is None and dead:  # Ray's word on it, or the controller's own kill
                seen["gcs_actor_dead_s"] = now - t0
                seen["gcs_actor_death_cause"] = " ".join(str(dead[0].get("DeathCause")).split())[:300]
            time.sleep(0.1)

    th = threading.Thread(target=watch, daemon=True)
    th.start()
    return th, seen


def _end_if_left(pid: int, before: float) -> None:
    """Kill ``pid`` if it is still the Ray worker that was running before ``before`` (not a reused pid)."""
    import psutil

    try:
        p = psutil.Process(pid)
        if p.create_time() < before and "ray" in " ".join(p.cmdline()):
            p.kill()
    except psutil.Error:
        pass


def lost_node_run(c, survive: bool, kill_at: int, steps: int) -> dict:
    """Part 6: one run whose rank 1's node is removed at step ``kill_at``; it runs to its end."""
    args = ["--backend", "ray", "--ray-address", c.address, "--gpus", "2", "--slots", "2", "--steps", str(steps),
            "--checkpoint-every", "10", "--survive" if survive else "--no-survive"]
    with tempfile.TemporaryDirectory(dir="/tmp") as d, TrainRun(args, Path(d) / "run") as run:
        run.wait_step(kill_at)
        pid, prefix = _rank_node(run.run, 1)
        victims = [n for n in c.worker_nodes if n.node_id.startswith(prefix)]
        if len(victims) != 1:
            raise SystemExit(f"rank 1's node {prefix} is not one of the cluster's worker nodes")
        at_step = run.step()
        t_remove = time.time()
        watcher, seen = _watch_loss(c, victims[0].node_id, pid, t_remove)
        c.remove_node(victims[0], allow_graceful=False)
        remove_call_s = time.time() - t_remove
        try:
            run.finish("the lost-node run")
        finally:
            watcher.join()
            _end_if_left(pid, t_remove)  # the removed node's worker, if it outlived its raylet
        (rs,) = run.events("restart")
        (rc,) = run.events("recovered")
        return {"survive": survive, "path": rs.get("path", "disk"), "removed_at_step": at_step,
                "rank": rs["rank"], "cause": rs["cause"], "remove_call_s": remove_call_s, **seen,
                "remove_to_restart_s": rs["time"] - t_remove, "remove_to_next_step_s": rc["time"] - t_remove,
                "restart_to_next_step_s": rc["time"] - rs["time"], "steps_redone": rs["steps_redone"],
                "new_world_size": rs["new_world_size"], "time_lost_s": rc["time_lost_s"]}


def lost_node_side(a: argparse.Namespace) -> dict:
    """Part 6: alternating rounds with and without ``--survive``; the runs and their medians."""
    runs = []
    with local_ray_cluster(0, 2) as c:
        for _ in range(a.rounds):
            for survive in (True, False):
                while len(c.worker_nodes) < 2:  # the node removed in the last run, back
                    c.add_node(num_cpus=1, object_store_memory=80 * MB)
                c.wait_for_nodes(timeout=120)
                try:
                    r = lost_node_run(c, survive, a.kill_at, a.steps)
                except SystemExit as e:  # a failed round is recorded, the others still run
                    runs.append({"survive": survive, "error": str(e)[-2000:]})
                    print(f"lost node, {'survive' if survive else 'restart'}: FAILED: {str(e)[-500:]}")
                    continue
                runs.append(r)
                print(f"lost node, {'survive' if survive else 'restart'}: removal -> restart event "
                      f"{r['remove_to_restart_s']:.2f} s, -> next step {r['remove_to_next_step_s']:.2f} s, "
                      f"{r['steps_redone']} step(s) redone, path {r['path']}; worker gone {r['worker_gone_s']} s, "
                      f"GCS actor dead {r['gcs_actor_dead_s']} s, node dead {r['gcs_node_dead_s']} s after the "
                      f"removal; cause: {r['cause']}")

    def med(survive: bool, key: str) -> float | None:
        got = [r[key] for r in runs if r["survive"] == survive and r.get(key) is not None]
        return statistics.median(got) if got else None

    keys = ("remove_to_restart_s", "remove_to_next_step_s", "restart_to_next_step_s", "steps_redone",
            "time_lost_s", "worker_gone_s", "gcs_actor_dead_s", "gcs_node_dead_s")
    return {"cluster": "a head of 0 CPUs (the controller's) and two one-CPU nodes; rank 1's node removed "
                       "(Cluster.remove_node, allow_graceful=False)",
            "runs": runs, "medians": {name: {k: med(s, k) for k in keys}
                                      for name, s in (("survive", True), ("restart", False))}}


if __name__ == "__main__":
    main()
