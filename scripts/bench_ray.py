#!/usr/bin/env python
"""The Ray backend's warm resizes against our horovodrun paths, Horovod Elastic and Ray Train's own
elastic training: alternating rounds, side by side, on one Ray cluster started here.

Every harness trains the same model (CIFAR ResNet ``--depth``/``--width``, synthetic data, batch
``--batch-size`` per worker) for 3S steps, grows 1 -> 2 around step S and shrinks 2 -> 1 around step
2S (``--resize-steps`` S):

* ``ray``: ``elastic-ring train --backend ray --schedule S:2,2S:1`` (warm survivors, a warm spare
  actor joins; the cluster: a head and a node of one CPU each, ``ray.cluster_utils.Cluster``);
* ``ours:inplace``, ``ours:overlap``, ``ours:prelaunch`` (``--relaunch``): ``elastic-ring train``
  with horovodrun, the same schedule;
* ``horovod-elastic``: Horovod Elastic's own script (``launch/peer_elastic.py``): its discovery
  script reports one more slot after step S and one fewer after step 2S;
* ``ray-train``: Ray Train's elastic ``TorchTrainer`` (Ray Train V2, ``launch/peer_raytrain.py``,
  DDP, ``num_workers=(1, 2)``, a checkpoint every ``--ckpt-every`` steps). **Its monitor interval is
  set low for the measurement** (``elastic_resize_monitor_interval_s=--monitor-s``, default 1 s
  instead of 60 s; ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=--health-s``, default 0.5 s instead of 2 s;
  the tick of Ray Data's ``AutoscalingCoordinator``, where its elastic policy reads the nodes,
  ``--tick-s``, default 1 s instead of 20 s: with 20 s a joining node was not seen before the run
  ended). The loop is held while the joining node starts; the held time is taken out of the time
  lost and the wall time.
  Ray Train cannot be told to resize: the grow is capacity appearing (an actor that held the second
  node's CPU is ended after step S: the monitor then restarts the group at 2 from the newest
  checkpoint); the shrink is a node lost (the second node is removed after step 2S at size 2: a
  failure, restarted at 1 from the newest checkpoint);
* ``ray:node-kill``: ``elastic-ring train --backend ray`` at 2 workers (one per node,
  ``--checkpoint-every --ckpt-every``), the second node removed after step S: the restart at 1.

Time lost per resize: for ours the controller's ``resize_overhead.total_lost_s`` (first step at the
new size - the stop decided after the last step at the old size - one steady step at the new size);
for Horovod Elastic and Ray Train the same from rank 0's step records (first step at the new size -
the last step whose work is kept - one steady step), so Ray Train's includes the steps it redoes
from its checkpoint. Node-kill recovery: node removed -> first step done again, against a bare start
(command start -> first step) of the same job. Whole-run wall time: the command's start to its exit
(the cluster is up before). The harnesses alternate within a round (reversed every other round);
medians and ratios against Horovod Elastic; the load average before every run is recorded.

    .venv/bin/python scripts/bench_ray.py --repeats 3
    .venv/bin/python scripts/bench_ray.py --repeats 1 --round-offset 1 --out results/bench_ray_part2.json
    .venv/bin/python scripts/bench_ray.py --merge results/bench_ray_part*.json --out results/bench_ray.json

``ray-train`` needs ``ray[train]`` (``pip install -e .[bench]``); without it that harness is left out
with a message.
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
from bench_peers import (BenchError, _env, _losses, _read, _run, _run_driven, _train_cmd,  # noqa: E402
                         _wait_step, resize_hvd_elastic, resize_ours)

ROOT = Path(__file__).resolve().parents[1]
HARNESSES = ("ray", "ours:inplace", "ours:overlap", "ours:prelaunch", "horovod-elastic", "ray-train",
             "ray:node-kill")
MB = 1024 * 1024


# ---------------------------------------------------------------------------- cluster
class Bench:
    """The Ray cluster of the run: a head and a second node of one CPU each."""

    def __init__(self, tmp: Path) -> None:
        import ray
        from ray.cluster_utils import Cluster

        os.environ["RAY_TMPDIR"] = str(tmp / "r")
        self.c = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "object_store_memory": 80 * MB, "include_dashboard": False})
        self.node2 = self.c.add_node(num_cpus=1, object_store_memory=80 * MB)
        self.c.wait_for_nodes()
        ray.init(address=self.c.address, log_to_driver=False)  # to see which nodes are alive
        self.address = self.c.address

    def node2_id(self) -> str:
        return self.node2.node_id

    def remove_node2(self) -> float:
        t = time.time()
        self.c.remove_node(self.node2, allow_graceful=False)
        return t

    def ensure_node2(self) -> None:
        import ray

        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        if self.node2 not in self.c.worker_nodes or self.node2.node_id not in alive:
            self.node2 = self.c.add_node(num_cpus=1, object_store_memory=80 * MB)
            self.c.wait_for_nodes()

    def drop_node2(self) -> None:
        """Ray Train then starts at 1 (it counts the nodes' total resources, not the free ones:
        capacity held by another actor would make it wait for a group of 2 that cannot start)."""
        import ray

        alive = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        if self.node2 in self.c.worker_nodes and self.node2.node_id in alive:
            self.c.remove_node(self.node2, allow_graceful=True)

    def add_node2(self) -> float:
        t = time.time()
        self.node2 = self.c.add_node(num_cpus=1, object_store_memory=80 * MB)
        return t

    def shutdown(self) -> None:
        import ray

        ray.shutdown()
        self.c.shutdown()


# ---------------------------------------------------------------------------- harnesses
def _ray_timeline(evs: list[dict]) -> list[dict]:
    """Per in-place resize: where the time went (seconds from the stop decided after the last
    step at the old size): the workers' reset starting, Horovod's re-init, the sync from rank 0,
    the first step at the new size; and the controller's view (relaunched)."""
    ends = {e["segment"]: e for e in evs if e["kind"] == "segment_end"}
    rel = {e["segment"]: e for e in evs if e["kind"] == "relaunched"}
    out = []
    for f in (e for e in evs if e["kind"] == "first_step" and e.get("segment", 0) > 0):
        end = ends.get(f["segment"] - 1)
        if end is None:
            continue
        t0 = float(end["stop_decided_at"])
        reset = f["time"] - f["since_launch_s"]
        ph = f.get("phases") or {}
        out.append({"from": end["world_size"], "to": f["world_size"],
                    "to_reset_s": round(reset - t0, 4),
                    "controller_s": round(rel[f["segment"]]["time"] - t0, 4) if f["segment"] in rel else None,
                    "hvd_reinit_s": ph.get("hvd_reinit"), "sync_s": ph.get("restore_broadcast"),
                    "first_step_s": round(f["since_launch_s"] - sum(ph.values()), 4)})
    return out


def resize_ray(a, b: Bench, tmp: Path) -> dict:
    s = a.resize_steps
    run = tmp / f"ray-{time.time_ns()}"
    extra = ["--schedule", f"{s}:2,{2 * s}:1", "--backend", "ray", "--ray-address", b.address]
    t0 = time.perf_counter()
    _run(_train_cmd(a, run, 3 * s, 1, extra), _env(), 1800, "elastic-ring train --backend ray")
    wall = time.perf_counter() - t0
    evs = _read(run / "events.jsonl")
    ov = [e for e in evs if e["kind"] == "resize_overhead"]
    shutil.rmtree(run, ignore_errors=True)
    return {"wall_s": wall, "timeline": _ray_timeline(evs),
            "resizes": [{"from": e["from_workers"], "to": e["to_workers"], "lost_s": e["total_lost_s"],
                         "redone_steps": 0} for e in ov]}


def _progress(run: Path) -> int:
    try:
        return int(json.loads((run / "control" / "progress.json").read_text())["step"])
    except (OSError, ValueError, KeyError):
        return 0


def node_kill_ray(a, b: Bench, tmp: Path) -> dict:
    """2 workers on two nodes; the second node removed after step S; restart at 1."""
    s = a.resize_steps
    run = tmp / f"ray-kill-{time.time_ns()}"
    extra = ["--backend", "ray", "--ray-address", b.address, "--checkpoint-every", str(a.ckpt_every)]

    def drive(proc: subprocess.Popen) -> float:
        while _progress(run) < s:
            if proc.poll() is not None:
                raise BenchError(f"node-kill run exited (status {proc.returncode}) before step {s}")
            time.sleep(0.05)
        return b.remove_node2()

    t0, wall, t_kill = _run_driven(_train_cmd(a, run, 3 * s, 2, extra), _env(), tmp / "node-kill.log",
                                   "node-kill run", drive)
    evs = _read(run / "events.jsonl")
    shutil.rmtree(run, ignore_errors=True)
    firsts = [e for e in evs if e["kind"] == "first_step"]
    (restart,) = [e for e in evs if e["kind"] == "restart"]
    after = [e for e in firsts if e["segment"] > restart["segment"]]
    rec = [e for e in evs if e["kind"] == "recovered"]
    return {"wall_s": wall, "resizes": [],
            "recovery": {"kill_to_first_step_s": after[0]["time"] - t_kill,
                         "bare_start_s": firsts[0]["time"] - t0, "steps_redone": restart["steps_redone"],
                         "new_world": restart["new_world_size"],
                         "time_lost_s": rec[0]["time_lost_s"] if rec else None}}


def ray_train(a, b: Bench, tmp: Path) -> dict:
    s = a.resize_steps
    d = tmp / f"ray-train-{time.time_ns()}"
    d.mkdir()
    out = d / "steps.jsonl"
    hold = d / "hold"
    cmd = [sys.executable, "-u", str(ROOT / "launch" / "peer_raytrain.py"), "--address", b.address,
           "--storage", str(d / "storage"), "--depth", str(a.depth), "--width", str(a.width),
           "--batch-size", str(a.batch_size), "--steps", str(3 * s), "--out", str(out),
           "--monitor-s", str(a.monitor_s), "--tick-s", str(a.tick_s), "--ckpt-every", str(a.ckpt_every),
           "--threads", "1", "--hold-file", str(hold)]
    env = _env(RAY_TRAIN_V2_ENABLED="1", RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=str(a.health_s))
    t_start = time.time()

    def drive(proc: subprocess.Popen) -> tuple[float, float]:
        try:
            _wait_step(out, lambda r: r["step"] >= s, proc, 300, "ray train")
            hold.touch()  # the loop waits while the node starts (else the run may end first)
            b.add_node2()  # capacity appears: a node joins, the monitor grows the group
            b.c.wait_for_nodes()
            t_free = time.time()
            hold.unlink()
            _wait_step(out, lambda r: r["step"] >= 2 * s and r["world"] == 2, proc, 300, "ray train")
        except BenchError as e:
            seen = out.read_text()[-400:] if out.exists() else "no step records"
            raise BenchError(f"{e} after {time.time() - t_start:.1f} s; {seen}\n{(d / 'log').read_text()[-3000:]}") from None
        return t_free, b.remove_node2()  # a node lost: the group restarts at 1

    t0, wall, (t_free, t_kill) = _run_driven(cmd, env, d / "log", "ray train", drive, tail=3000)
    recs = _read(out)
    steps = [r for r in recs if r["kind"] == "step"]
    first2 = next(r for r in steps if r["world"] == 2)
    after = next(r for r in steps if r["time"] > t_kill and r["world"] == 1)
    holds = [(r["start"], r["time"]) for r in recs if r["kind"] == "hold"]
    resizes = _losses(recs)
    for z in resizes:  # the loop held while the node started: not the resize's time
        z["lost_s"] = max(0.0, z["lost_s"] - sum(max(0.0, min(e, z["t_new"]) - max(b0, z["t_kept"]))
                                                  for b0, e in holds))
    held = sum(e - b0 for b0, e in holds)
    cfg = next((r for r in recs if r["kind"] == "config"), {})
    res = {"wall_s": wall - held, "held_s": held, "coordinator_tick_s": cfg.get("coordinator_tick_s"),
           "resizes": resizes,
           "grow": {"node_added_to_first_step_at_2_s": first2["time"] - t_free},
           "recovery": {"kill_to_first_step_s": after["time"] - t_kill, "bare_start_s": steps[0]["time"] - t0,
                        "steps_redone": max(r["step"] for r in steps if r["time"] < t_kill) - (after["step"] - 1),
                        "new_world": 1, "time_lost_s": None}}
    shutil.rmtree(d, ignore_errors=True)
    return res


def _one(a, h: str, b: Bench | None, tmp: Path) -> dict:
    if h in ("ray", "ray-train", "ray:node-kill"):
        assert b is not None
        if h == "ray":
            return resize_ray(a, b, tmp)
        return ray_train(a, b, tmp) if h == "ray-train" else node_kill_ray(a, b, tmp)
    if h == "horovod-elastic":
        return resize_hvd_elastic(a, True, tmp)
    return resize_ours(a, h.split(":", 1)[1], tmp)


# ---------------------------------------------------------------------------- summary
def _med(v: list) -> float:
    v = [x for x in v if x is not None]
    return statistics.median(v) if v else float("nan")


def summarise(res: dict[str, dict], harnesses: list[str]) -> tuple[list[dict], dict]:
    ref = res.get("horovod-elastic", {})
    rows = []
    for h in harnesses:
        r = res[h]
        row = {"harness": h, **r, "grow_lost_median_s": _med(r["grow_lost_s"]),
               "shrink_lost_median_s": _med(r["shrink_lost_s"]), "wall_median_s": _med(r["wall_s"])}
        for k in ("grow_lost", "shrink_lost", "wall"):
            base = _med(ref.get(f"{k}_s", []))
            row[f"{k}_vs_hvd_elastic"] = row[f"{k}_median_s"] / base if base and base == base else float("nan")
        if r.get("recovery"):
            row["kill_to_first_step_median_s"] = _med([x["kill_to_first_step_s"] for x in r["recovery"]])
            row["bare_start_median_s"] = _med([x["bare_start_s"] for x in r["recovery"]])
            row["recovery_vs_bare_start"] = row["kill_to_first_step_median_s"] / row["bare_start_median_s"]
        rows.append(row)
    by = {r["harness"]: r for r in rows}
    targets = {}
    if "ray" in by and "horovod-elastic" in by:
        ray, he = by["ray"], by["horovod-elastic"]
        targets["grow_le_half_hvd_elastic"] = ray["grow_lost_median_s"] <= 0.5 * he["grow_lost_median_s"]
        targets["shrink_le_hvd_elastic"] = ray["shrink_lost_median_s"] <= he["shrink_lost_median_s"]
    if "ray" in by and "ray-train" in by:
        targets["grow_below_ray_train"] = by["ray"]["grow_lost_median_s"] < by["ray-train"]["grow_lost_median_s"]
        targets["shrink_below_ray_train"] = by["ray"]["shrink_lost_median_s"] < by["ray-train"]["shrink_lost_median_s"]
    walls = {h: by[h]["wall_median_s"] for h in by if h != "ray:node-kill" and by[h]["wall_s"]}
    if "ray" in walls and len(walls) > 1:
        targets["wall_fastest"] = min(walls, key=walls.get) == "ray"
    return rows, targets


def report(out: dict) -> None:
    c = out["config"]
    s = c["resize_steps"]
    print(f"\ngrow 1->2 at step {s}, shrink 2->1 at step {2 * s}, {3 * s} steps; medians of "
          f"{out['rounds']} alternating round(s); ratios against Horovod Elastic")
    print(f"{'harness':>16} {'grow lost s':>11} {'/hvd-el':>7} {'shrink lost s':>13} {'/hvd-el':>7} "
          f"{'run wall s':>10} {'/hvd-el':>7}")
    for row in out["rows"]:
        if row["harness"] == "ray:node-kill":
            continue
        print(f"{row['harness']:>16} {row['grow_lost_median_s']:>11.2f} {row['grow_lost_vs_hvd_elastic']:>7.2f} "
              f"{row['shrink_lost_median_s']:>13.2f} {row['shrink_lost_vs_hvd_elastic']:>7.2f} "
              f"{row['wall_median_s']:>10.1f} {row['wall_vs_hvd_elastic']:>7.2f}")
    rec = [r for r in out["rows"] if "kill_to_first_step_median_s" in r]
    if rec:
        print(f"\nnode removed mid-run -> first step again, against a bare start (command -> first step)")
        for r in rec:
            print(f"{r['harness']:>16} {r['kill_to_first_step_median_s']:>8.2f} s  bare start "
                  f"{r['bare_start_median_s']:>6.2f} s  ratio {r['recovery_vs_bare_start']:.2f}")
    print(f"\ntargets: {out['targets']}")
    print(f"load average per run: {[round(x, 1) for x in out['loadavg_per_run']]} ({out['cpu_count']} cores)")


def _empty() -> dict:
    return {"grow_lost_s": [], "shrink_lost_s": [], "wall_s": [], "loadavg": []}


def merge(paths: list[Path]) -> dict:
    parts = [json.loads(p.read_text()) for p in paths]
    harnesses: list[str] = []
    res: dict[str, dict] = {}
    for part in parts:
        for row in part["rows"]:
            h = row["harness"]
            if h not in res:
                harnesses.append(h)
                res[h] = _empty()
            for k, v in row.items():
                if isinstance(v, list):
                    res[h].setdefault(k, []).extend(v)
    rows, targets = summarise(res, harnesses)
    return {"config": parts[0]["config"], "merged_from": [p.name for p in paths],
            "rounds": sum(p["rounds"] for p in parts), "cpu_count": parts[0]["cpu_count"],
            "loadavg_per_run": [x for p in parts for x in p["loadavg_per_run"]],
            "loadavg_before": [p["loadavg_before"] for p in parts], "time": time.time(),
            "rows": rows, "targets": targets, "note": parts[0].get("note")}


def run_rounds(a, harnesses: list[str], on_round=lambda res, loads, n: None) -> tuple[dict[str, dict], list[float]]:
    res = {h: _empty() for h in harnesses}
    loads: list[float] = []
    with tempfile.TemporaryDirectory(prefix="br") as d:
        tmp = Path(d)
        b = Bench(tmp) if any(h.startswith("ray") for h in harnesses) else None
        try:
            for i in range(a.repeats):
                k = i + a.round_offset
                order = list(harnesses) if k % 2 == 0 else list(reversed(harnesses))
                for h in order:
                    if b is not None and h in ("ray", "ray:node-kill"):
                        b.ensure_node2()  # before the load is read: a node start is not the run's
                    elif b is not None and h == "ray-train":
                        b.drop_node2()
                    load = os.getloadavg()[0]
                    try:
                        r = _one(a, h, b, tmp)
                    except (BenchError, subprocess.TimeoutExpired, StopIteration, ValueError) as e:
                        res[h].setdefault("errors", []).append(str(e)[-1500:])
                        print(f"round {k + 1} {h}: FAILED: {str(e).splitlines()[0] if str(e) else type(e).__name__}",
                              file=sys.stderr, flush=True)
                        continue
                    loads.append(load)
                    res[h]["loadavg"].append(load)
                    res[h]["wall_s"].append(r["wall_s"])
                    for key in ("timeline", "recovery", "grow"):
                        if r.get(key):
                            res[h].setdefault(key, []).append(r[key])
                    for z in r["resizes"]:
                        res[h]["grow_lost_s" if z["to"] > z["from"] else "shrink_lost_s"].append(z["lost_s"])
                        res[h].setdefault("redone_steps", []).append(z.get("redone_steps", 0))
                    print(f"round {k + 1} {h}: " + ", ".join(
                        f"{z['from']}->{z['to']} {z['lost_s']:.2f}s" for z in r["resizes"])
                        + (f" recovery {r['recovery']['kill_to_first_step_s']:.2f}s (bare start "
                           f"{r['recovery']['bare_start_s']:.2f}s)" if r.get("recovery") else "")
                        + f", wall {r['wall_s']:.1f}s (load before {load:.1f})", flush=True)
                on_round(res, loads, i + 1)  # the file holds every finished round (a time limit may cut the run)
        finally:
            if b is not None:
                b.shutdown()
    return res, loads


def _has_ray_train() -> bool:
    try:
        import pandas  # noqa: F401
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="alternating rounds (>= 1)")
    ap.add_argument("--round-offset", type=int, default=0, help="first round's number (order alternates with it)")
    ap.add_argument("--resize-steps", type=int, default=30, help="S: grow at S, shrink at 2S, 3S steps")
    ap.add_argument("--harnesses", nargs="*", default=list(HARNESSES), choices=HARNESSES)
    ap.add_argument("--depth", type=int, default=20)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=32, help="per worker")
    ap.add_argument("--ckpt-every", type=int, default=5, help="Ray Train's and the node-kill run's checkpoints")
    ap.add_argument("--monitor-s", type=float, default=1.0, help="Ray Train's elastic_resize_monitor_interval_s")
    ap.add_argument("--health-s", type=float, default=0.5, help="RAY_TRAIN_HEALTH_CHECK_INTERVAL_S")
    ap.add_argument("--tick-s", type=float, default=1.0,
                    help="the tick of Ray Data's AutoscalingCoordinator, where Ray Train sees the nodes (Ray: 20 s)")
    ap.add_argument("--merge", type=Path, nargs="*", help="combine these results files (no runs)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_ray.json")
    a = ap.parse_args(argv)
    a.device = "cpu"
    if a.merge:
        missing = [str(p) for p in a.merge if not p.is_file()]
        if missing:
            print(f"bench_ray: no such results file: {', '.join(missing)}", file=sys.stderr)
            return 2
        out = merge(a.merge)
    else:
        if a.repeats < 1 or a.resize_steps < 10 or a.ckpt_every < 1:
            print("bench_ray: need --repeats >= 1, --resize-steps >= 10, --ckpt-every >= 1", file=sys.stderr)
            return 2
        harnesses = list(a.harnesses)
        if "ray-train" in harnesses and not _has_ray_train():
            print("bench_ray: ray-train left out: ray[train] is not installed (pip install -e .[bench])",
                  file=sys.stderr)
            harnesses.remove("ray-train")
        load0 = os.getloadavg()

        def result(res: dict, loads: list[float], rounds: int) -> dict:
            rows, targets = summarise(res, harnesses)
            return {"config": {k: (str(v.name) if isinstance(v, Path) else v) for k, v in vars(a).items()
                               if k != "merge"},
                    "rounds": rounds, "cpu_count": os.cpu_count(), "loadavg_before": load0,
                    "loadavg_after": os.getloadavg(), "loadavg_per_run": loads, "time": time.time(),
                    "rows": rows, "targets": targets,
                    "note": "2-core machine shared with other jobs; ray-train's resize monitor set to "
                            f"{a.monitor_s} s (default 60 s), its health check to {a.health_s} s (default 2 s)"}

        def save(res: dict, loads: list[float], rounds: int) -> None:
            a.out.parent.mkdir(parents=True, exist_ok=True)
            a.out.write_text(json.dumps(result(res, loads, rounds), indent=2))

        res, loads = run_rounds(a, harnesses, save)
        out = result(res, loads, a.repeats)
    report(out)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=2))
    print(f"written {a.out.relative_to(ROOT) if a.out.is_relative_to(ROOT) else a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
