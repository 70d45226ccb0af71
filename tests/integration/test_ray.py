"""`elastic-ring train --backend ray` on a real two-node Ray cluster started here
(``ray.cluster_utils.Cluster``: a head and a node of one CPU each, so that two workers sit on two
nodes), with real Horovod rings formed by the controller: grow and shrink with warm workers against
the horovodrun path's weights, and the same on torch.distributed (``--collective torch``); kill -9
of a worker actor, then a node removed, in one run; a node removed under ``--survive`` (the
survivor on the other node goes on from memory); a plain job following its cluster (grown onto a
node that joins, shrunk off it when Ray drains it); and `cluster up --ray` growing a job onto a
node that joins.

One test on one cluster: ``make test`` runs the tests two at a time (``-n 2 --dist worksteal``),
and pytest-xdist's work stealing may hand tests of one module to both workers, each of which would
then start a cluster of its own (13 s of CPU here, and the memory of four more Ray processes).
The phases run in an order that needs no node started for them alone (a node's start is ~10 s on
a loaded machine): the kill -9 phase ends with the head alone, which is where the following phase
starts (the node it adds joins while its job trains; Ray lets it go once drained), then the
`cluster up --ray` phase (the node it adds joins while its job runs), and last the phase of a node
removed under ``--survive``, on that node (no phase after it waits for Ray to find the node dead)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from elastic_ring.data import SampleStream
from elastic_ring.events import read_events
from tests.conftest import BIN, ROOT, run_cli, wait_for
from tests.integration.ray_cluster import NODE, local_cluster
from tests.integration.test_train_resize import RESIZE_1_2_1, _final_model, _trace, resize_1_2_1_auto

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.integration, pytest.mark.ray]

ENV = {"ELASTIC_RING_CPU_THREADS": "1"}  # the same intra-op threads on both paths: bitwise equal
PACED = str(ROOT / "tests" / "integration" / "scripts" / "paced.py")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One cluster for the module: a head and one node, one CPU each (:mod:`.ray_cluster`)."""
    with local_cluster(tmp_path_factory, 1, (1,)) as c:
        yield c


def _ray_args(c) -> list[str]:
    return ["--backend", "ray", "--ray-address", c.address]


def _start(args: list[str], out: Path | None = None) -> subprocess.Popen:
    """``elastic-ring train ARGS`` started; its output piped, or into the file ``out``."""
    e = dict(os.environ, PYTHONUNBUFFERED="1", **ENV)
    e["PATH"] = f"{BIN}{os.pathsep}{e.get('PATH', '')}"
    f = subprocess.PIPE if out is None else open(out, "w")
    try:
        return subprocess.Popen([sys.executable, "-m", "elastic_ring.cli.main", "train", *args], cwd=ROOT, env=e,
                                stdout=f, stderr=subprocess.STDOUT if out is not None else subprocess.PIPE, text=True)
    finally:
        if out is not None:
            f.close()


def _ring(run: Path, segment: int) -> list[tuple[int, int, str]]:
    """(rank, pid, node) of each worker of a segment, from the backend's line in its log."""
    text = next((run / "logs").glob(f"segment-{segment:03d}-w*.log")).read_text()
    return [(int(r), int(p), n) for r, p, n in re.findall(r"rank (\d+): \w+ pid (\d+) node (\w+)", text)]


def _wait_step(run: Path, step: int, timeout: float = 240) -> None:
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            if json.loads((run / "control" / "progress.json").read_text())["step"] >= step:
                return
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"step {step} not reached in {timeout} s")


def _workers(cluster, n: int) -> None:
    """Exactly ``n`` worker nodes besides the head (one CPU each), added or removed."""
    for x in list(cluster.worker_nodes)[n:]:
        cluster.remove_node(x, allow_graceful=True)
    for _ in range(n - len(cluster.worker_nodes)):
        cluster.add_node(num_cpus=1, **NODE)
    cluster.wait_for_nodes()


def _grow_shrink_warm_across_nodes_equals_horovodrun(tmp_path: Path, tmp_path_factory, cluster) -> None:
    """1 -> 2 -> 1 on Ray: at size 2 one worker per node; the survivor keeps its process, the
    joiner is a warm spare; every step and sample once, Eq. 7, and the final weights bitwise equal
    to the horovodrun (checkpoint and relaunch) path's."""
    args = RESIZE_1_2_1[1:]
    run = tmp_path / "ray"
    # the horovodrun reference runs beside the Ray run (both mostly wait on imports and starts).
    # Under `make test` (one intra-op thread per worker, as here) it is the session's shared run of
    # the same job (test_train_resize's and test_inplace's reference): made once, whichever needs it
    # first; else a run of its own (--relaunch prelaunch: its segments' processes start at once)
    shared = os.environ.get("ELASTIC_RING_CPU_THREADS") == "1"
    box: dict = {}

    def reference() -> None:
        try:
            if shared:
                box["ref"], box["p"] = resize_1_2_1_auto(tmp_path_factory)
            else:
                box["ref"] = tmp_path / "hvd"
                box["p"] = run_cli(*RESIZE_1_2_1, "--relaunch", "prelaunch", "--run-dir", str(box["ref"]),
                                   timeout=400, env=ENV)
        except BaseException as e:  # noqa: BLE001 - raised below, in the test's thread
            box["error"] = e

    t = threading.Thread(target=reference)
    t.start()
    try:
        p = run_cli("train", *_ray_args(cluster), *args, "--run-dir", str(run), timeout=300, env=ENV)
    finally:
        t.join(timeout=420)
    if "error" in box:
        raise box["error"]
    ref, hvd = box["ref"], box["p"]
    assert p.returncode == 0, p.stdout + p.stderr
    assert hvd.returncode == 0, hvd.stdout + hvd.stderr

    steps = _trace(run)
    assert sorted(steps) == list(range(1, 19))
    flat = [i for s in sorted(steps) for i in steps[s]]
    assert flat == SampleStream(40, seed=0).take(0, len(flat)).tolist()
    world = {s: len(v) // 8 for s, v in steps.items()}
    assert [world[s] for s in (1, 6, 7, 12, 13, 18)] == [1, 1, 2, 2, 1, 1]

    r0, r1, r2 = _ring(run, 0), _ring(run, 1), _ring(run, 2)
    assert len(r1) == 2 and len({n for _, _, n in r1}) == 2  # one worker per node
    assert r0[0][1] == r1[0][1] == r2[0][1]  # rank 0 is the same process throughout (warm)
    assert not read_events(run / "events.jsonl", kind="restart")
    rel = read_events(run / "events.jsonl", kind="relaunched")
    assert [(r["from_workers"], r["to_workers"]) for r in rel] == [(1, 2), (2, 1)]
    for t in read_events(run / "events.jsonl", kind="throughput"):  # Eq. 7 on the base LR, decays after 9, 14
        decays = sum(t["step"] > d for d in (9, 14))
        assert t["lr"] == pytest.approx(0.1 * 8 * t["world_size"] / 128 * 0.1 ** decays), t
    ov = read_events(run / "events.jsonl", kind="resize_overhead")
    assert len(ov) == 2 and all(o["checkpoint_s"] == 0 for o in ov)  # in place: no checkpoint
    # the shrink's ring was formed while segment 1 trained: rank 0 took its action at the pause
    assert (run / "control" / "inplace-1.taken.json").exists()

    a, b = _final_model(run), _final_model(ref)
    assert a["step"] == b["step"] == 18 and a["cursor"] == b["cursor"] and a["lr_last"] == b["lr_last"]
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k


def _grow_shrink_torch_equals_the_horovod_ray_run(tmp_path: Path, hvd_run: Path, cluster) -> None:
    """The same 1 -> 2 -> 1 with --collective torch: the controller serves a store per process group
    and names the ranks; the survivor keeps its actor process, the joiner is a warm spare; the final
    weights bitwise equal to the Horovod Ray run's (itself equal to the horovodrun path's)."""
    run = tmp_path / "ray-torch"
    p = run_cli("train", *_ray_args(cluster), *RESIZE_1_2_1[1:], "--collective", "torch", "--run-dir", str(run),
                timeout=300, env=ENV)
    assert p.returncode == 0, p.stdout + p.stderr
    steps = _trace(run)
    assert sorted(steps) == list(range(1, 19))
    assert [len(steps[s]) // 8 for s in (1, 6, 7, 12, 13, 18)] == [1, 1, 2, 2, 1, 1]
    r0, r1, r2 = _ring(run, 0), _ring(run, 1), _ring(run, 2)
    assert len(r1) == 2 and r0[0][1] == r1[0][1] == r2[0][1]  # rank 0 is the same process throughout
    assert not read_events(run / "events.jsonl", kind="restart")
    rel = read_events(run / "events.jsonl", kind="relaunched")
    assert [(r["from_workers"], r["to_workers"]) for r in rel] == [(1, 2), (2, 1)]
    for r, f in zip(rel, read_events(run / "events.jsonl", kind="first_step_after_resize")):
        assert f["lr"] == pytest.approx(r["to_workers"] / r["from_workers"] * r["lr_last"])
    a, b = _final_model(run), _final_model(hvd_run)
    assert a["step"] == b["step"] == 18 and a["cursor"] == b["cursor"] and a["lr_last"] == b["lr_last"]
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k


def _kill_9_then_node_removed_each_restarts_by_itself(tmp_path: Path, cluster) -> None:
    """One run of 2 workers, one per node, that loses a worker twice and finishes by itself:
    kill -9 of the rank-1 actor's process (the restart names rank 1 and its node, never rank 0,
    which only lost its peer; it restarts at 2 from a checkpoint); then the node holding the
    non-head worker is removed (its raylet and processes killed): it restarts from the newest
    checkpoint, redoing at most one checkpoint interval, at the size the cluster's free resources
    hold now (the head alone: 1)."""
    _workers(cluster, 1)
    run = tmp_path / "failures"
    steps, every = 36, 4
    proc = _start([*_ray_args(cluster), "--no-survive", "--script", PACED, "--steps", str(steps), "--gpus", "2",
                   "--slots", "2", "--checkpoint-every", str(every), "--run-dir", str(run), "--", "--step-s", "0.1"])
    try:
        _wait_step(run, 6)
        (_, pid1, node1), = [x for x in _ring(run, 0) if x[0] == 1]
        os.kill(pid1, signal.SIGKILL)  # the rank-1 actor's process
        wait_for(lambda: read_events(run / "events.jsonl", kind="recovered") or proc.poll() is not None, 240,
                 "the restart after the kill -9")
        (first,) = read_events(run / "events.jsonl", kind="restart")
        _wait_step(run, first["from_step"] + 6)
        head = cluster.head_node.node_id
        victim_id = next(n for _, _, n in _ring(run, 1) if not head.startswith(n))
        victim = next(n for n in cluster.worker_nodes if n.node_id.startswith(victim_id))
        cluster.remove_node(victim, allow_graceful=False)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    r1, r2 = read_events(run / "events.jsonl", kind="restart")
    assert r1["rank"] == 1 and r1["node"].startswith(node1[:12]) and not r1["gave_up"], r1
    assert "rank 1" in r1["cause"] and "Ray node" in r1["cause"]
    assert r1["new_world_size"] == 2 and r1["from_step"] % every == 0 and r1["from_step"] >= every
    assert r2["node"].startswith(victim_id[:12]) and not r2["gave_up"], r2
    assert r2["steps_redone"] <= every + 1, r2  # at most one checkpoint interval (+ the step in flight)
    assert r2["new_world_size"] == 1, r2  # the head alone is left
    assert json.loads((run / "summary.json").read_text())["step"] == steps


def _node_removed_the_survivor_on_the_other_node_goes_on(tmp_path: Path, cluster) -> None:
    """``--survive``, 2 workers, one per node: the node holding the non-head worker is removed (its
    raylet and processes killed); the rank on it is blamed with its node, and the survivor on the head
    goes on from the step it holds in memory (no restart from the checkpoint), alone, to the end."""
    _workers(cluster, 1)  # (the `cluster up` phase's node)
    run = tmp_path / "survive"
    steps = 20
    proc = _start([*_ray_args(cluster), "--survive", "--script", PACED, "--steps", str(steps), "--gpus", "2",
                   "--slots", "2", "--run-dir", str(run), "--", "--step-s", "0.2"])
    try:
        _wait_step(run, 3)
        head = cluster.head_node.node_id
        ring = _ring(run, 0)
        (victim_rank, _, victim_id), = [x for x in ring if not head.startswith(x[2])]
        (_, pid_head, _), = [x for x in ring if head.startswith(x[2])]
        victim = next(n for n in cluster.worker_nodes if n.node_id.startswith(victim_id))
        cluster.remove_node(victim, allow_graceful=False)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    (r,) = read_events(run / "events.jsonl", kind="restart")
    assert r["path"] == "memory" and r["rank"] == victim_rank and r["node"].startswith(victim_id[:12]), r
    assert r["new_world_size"] == 1 and not r["gave_up"] and r["steps_redone"] <= 1, r
    assert [p for _, p, _ in _ring(run, 1)] == [pid_head]  # the survivor on the head kept its process
    assert json.loads((run / "summary.json").read_text())["step"] == steps


def _drain(cluster, node) -> None:
    """Ray drains ``node`` as an autoscaler does on a preemption notice (``ray drain-node``, reason
    preemption, a deadline): nothing new is placed there, and Ray lets the node go once idle."""
    ray_cli = Path(sys.executable).parent / "ray"
    p = subprocess.run([str(ray_cli), "drain-node", "--address", cluster.address, "--node-id", node.node_id,
                        "--reason", "DRAIN_NODE_REASON_PREEMPTION", "--reason-message", "test preemption",
                        "--deadline-remaining-seconds", "120"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


def _a_plain_job_follows_its_cluster_a_node_joins_then_is_drained(tmp_path: Path, cluster) -> None:
    """A plain ``train --backend ray`` job (``--slots 2``) on the head alone: a node that joins while
    it trains is grown onto at the next step boundary (cause ``hosts``; its first worker keeps its
    process, the joiner is the spare actor that started on the new node), one worker per node; then
    Ray drains that node (a preemption notice): the job shrinks off it at the next step boundary, in
    place (cause ``drained``: no restart, no checkpoint read, 0 steps redone), and trains on on
    the head until Ctrl-C."""
    _workers(cluster, 0)
    run = tmp_path / "follow"
    # a step each 0.2 s: the job trains while it waits for Ray (a node's start, the drain), and no
    # assertion counts its steps (a faster pace only spent CPU on steps)
    proc = _start([*_ray_args(cluster), "--script", PACED, "--steps", "3000", "--workers", "1", "--slots", "2",
                   "--run-dir", str(run), "--", "--step-s", "0.2"])
    ev = run / "events.jsonl"
    try:
        _wait_step(run, 3)
        _workers(cluster, 1)  # a node joins
        (node,) = list(cluster.worker_nodes)
        wait_for(lambda: read_events(ev, kind="relaunched") or proc.poll() is not None, 180, "the grow onto the node")
        _drain(cluster, node)
        wait_for(lambda: len(read_events(ev, kind="relaunched")) >= 2 or proc.poll() is not None, 120,
                 "the shrink off the drained node")
        wait_for(lambda: any(e["segment"] == 2 for e in read_events(ev, kind="first_step_after_resize"))
                 or proc.poll() is not None, 60, "a step after the shrink")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    req = read_events(ev, kind="resize_requested")
    assert [(r["source"], r["from_workers"], r["to_workers"]) for r in req] == [("hosts", 1, 2), ("drained", 2, 1)]
    assert [c["cause"] for c in read_events(ev, kind="membership_change")][:2] == ["hosts", "drained"]
    assert not read_events(ev, kind="restart")
    rel = read_events(ev, kind="relaunched")
    assert [(r["from_workers"], r["to_workers"]) for r in rel[:2]] == [(1, 2), (2, 1)]
    r0, r1, r2 = _ring(run, 0), _ring(run, 1), _ring(run, 2)
    head = cluster.head_node.node_id
    assert len(r0) == 1 and head.startswith(r0[0][2])
    assert len(r1) == 2 and {n for _, _, n in r1} == {head[:12], node.node_id[:12]}  # one worker per node
    assert r0[0][1] in [p for _, p, _ in r1]  # the first worker kept its process (warm)
    assert [(p, n) for _, p, n in r2] == [(r0[0][1], head[:12])]  # the head's worker goes on, alone
    # 0 steps redone: the shrink's first step is the one after the last step at 2, in place
    (end1,) = [e for e in read_events(ev, kind="segment_end") if e["segment"] == 1]
    (first2,) = [e for e in read_events(ev, kind="first_step_after_resize") if e["segment"] == 2]
    assert end1["step"] == rel[1]["step"] and first2["step"] == end1["step"] + 1, (end1, rel[1], first2)
    ov = read_events(ev, kind="resize_overhead")
    assert len(ov) >= 2 and all(o["checkpoint_s"] == 0 for o in ov[:2])  # in place: no checkpoint


def _cluster_up_ray_grows_a_job_onto_a_node_that_joins(tmp_path: Path, cluster) -> None:
    """`cluster up --ray` on the head alone (1 CPU slot): a job that wants 2 workers is started on 1;
    a node added while the job runs (it joins while the job's first actor starts, the cheapest
    moment for the test) gives the scheduler a slot, which grows the job onto it by a live resize
    after steps at size 1 (one worker per node), and the job finishes at size 2."""
    import sqlite3

    _workers(cluster, 0)  # the head alone (the node the phase before drained is let go)
    d, log = tmp_path / "cl", tmp_path / "scheduler.log"
    steps = 100
    e = dict(os.environ, PYTHONUNBUFFERED="1", **ENV)
    e["PATH"] = f"{BIN}{os.pathsep}{e.get('PATH', '')}"
    with open(log, "w") as out:
        sched = subprocess.Popen([sys.executable, "-m", "elastic_ring.cli.main", "cluster", "up", "--ray", cluster.address,
                                  "--dir", str(d), "--quiet", "--poll", "0.3"], cwd=ROOT, env=e, stdout=out,
                                 stderr=subprocess.STDOUT)

    def events() -> list[tuple[str, dict]]:
        db = sqlite3.connect(str(d / "cluster.db"))
        try:
            return [(k, json.loads(x)) for k, x in db.execute("SELECT kind, data FROM events ORDER BY id")]
        finally:
            db.close()

    try:
        wait_for(lambda: (d / "cluster.db").exists() or sched.poll() is not None, 60, "the cluster database")
        p = run_cli("submit", PACED, "--steps", str(steps), "--max-workers", "2", "--dir", str(d), "--",
                    "--step-s", "0.05")
        assert p.returncode == 0, p.stderr
        run = d / "jobs" / "1"
        wait_for(lambda: any(k == "started" for k, _ in events()) or sched.poll() is not None, 60, "the start")
        assert sched.poll() is None, log.read_text()
        assert [(x["workers"], x["slots"]) for k, x in events() if k == "started"] == [(1, [0])]
        _workers(cluster, 1)  # a node joins while the job runs
        wait_for(lambda: any(k in ("finished", "failed") for k, _ in events()) or sched.poll() is not None, 180,
                 "the job's end")
        jobs = run_cli("jobs", "--dir", str(d))
        down = run_cli("cluster", "down", "--dir", str(d), timeout=60)
        sched.wait(timeout=60)
    finally:
        if sched.poll() is None:
            sched.kill()
            sched.wait()
    text = log.read_text()
    assert sched.returncode == 0 and down.returncode == 0, text[-3000:]
    ev = events()
    kinds = [k for k, _ in ev]
    assert "finished" in kinds and "failed" not in kinds, text[-3000:]
    assert ("resize_requested", {"frm": 1, "to": 2, "slots": [0, 1]}) in ev, ev
    assert ("resized", {"workers": 2, "slots": [0, 1]}) in ev, ev
    db = sqlite3.connect(str(d / "cluster.db"))
    try:
        causes = [c for (c,) in db.execute("SELECT cause FROM decisions ORDER BY id")]
        (t_resized,), = db.execute("SELECT time FROM events WHERE kind='resized'")
    finally:
        db.close()
    assert "capacity" in causes, causes  # the policy decided again when the node joined
    # the resize ended at the new ring's launch, while the job trained (not at its workers' exit)
    assert t_resized < read_events(run / "events.jsonl", kind="throughput")[-1]["time"]
    assert re.search(r"nodes: .*:1, .*:1 \(2 slot\(s\)\)", text), text[-3000:]
    assert re.search(r"Ray nodes: .*:1, .*:1 \(2 slot\(s\)\)", jobs.stdout), jobs.stdout
    rel = read_events(run / "events.jsonl", kind="relaunched")
    assert [(r["from_workers"], r["to_workers"]) for r in rel] == [(1, 2)]
    assert not read_events(run / "events.jsonl", kind="restart")
    r0, r1 = _ring(run, 0), _ring(run, 1)
    assert len(r0) == 1 and len(r1) == 2 and len({n for _, _, n in r1}) == 2  # one worker per node
    assert r0[0][1] == next(p for rk, p, _ in r1 if rk == 0)  # rank 0 kept its process (warm)
    assert 1 <= rel[0]["step"] < steps  # steps at size 1, then the rest at size 2
    assert 2 in {t["world_size"] for t in read_events(run / "events.jsonl", kind="throughput")}
    assert json.loads((run / "summary.json").read_text())["step"] == steps


def test_ray_on_a_real_two_node_cluster(tmp_path, tmp_path_factory, cluster):
    """The phases on one cluster, in this order (see the module's docstring)."""
    for d in ("grow", "fail", "lost", "follow", "up"):
        (tmp_path / d).mkdir()
    _grow_shrink_warm_across_nodes_equals_horovodrun(tmp_path / "grow", tmp_path_factory, cluster)
    _grow_shrink_torch_equals_the_horovod_ray_run(tmp_path / "grow", tmp_path / "grow" / "ray", cluster)
    _kill_9_then_node_removed_each_restarts_by_itself(tmp_path / "fail", cluster)
    _a_plain_job_follows_its_cluster_a_node_joins_then_is_drained(tmp_path / "follow", cluster)
    _cluster_up_ray_grows_a_job_onto_a_node_that_joins(tmp_path / "up", cluster)
    _node_removed_the_survivor_on_the_other_node_goes_on(tmp_path / "lost", cluster)
