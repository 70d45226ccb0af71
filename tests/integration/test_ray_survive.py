"""`elastic-ring train --backend ray --survive` on a real local Ray cluster (one node of five CPUs,
started and stopped as ``test_ray``'s is, and shared with the tests in a row that use it: Ray's
files under the tests' short temporary folder, a small object store, only its own processes
stopped): kill -9 of rank 1's actor process; rank 0 keeps its process, rolls back to the last step
both completed (kept in memory) and goes on alone, without a restart from the checkpoint; a new
actor in the dead one's bundle joins once it is up, synced from rank 0 over the ring, and the job is
back at 2. Its final weights equal, bitwise, those of an uninterrupted run with a scheduled shrink 2
-> 1 at the step rank 0 rolled back to and a scheduled grow 1 -> 2 at the step the joiner came in.
With a warm spare (``--slots 3``) the spare takes the dead worker's place at that step, synced from
rank 0 over the ring: the final weights equal those of a run that never lost a worker. An epoch-loop
script (``job.epochs()``) killed inside an epoch goes on from memory the same way. The references
run on this machine's launcher (their workers forked from the zygote, where a Ray actor is a new
interpreter that imports torch): the Ray run equals, bitwise, a run of the other backend."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from elastic_ring import protocol
from elastic_ring.events import read_events
from tests.conftest import wait_for

ray = pytest.importorskip("ray")

from tests.integration.test_ray import PACED, _ray_args, _ring, _start, _wait_step  # noqa: E402
from tests.integration.test_train_resize import _final_model  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.ray]

STEPS = 14
# the pace of a run stopped by Ctrl-C once back at 2: it trains while it waits for the new actor's (or
# the spare's) start, and its reference trains the same steps again; no assertion counts them (a
# faster pace only spent CPU on more steps, in both runs)
PACE = 0.3


@pytest.fixture
def one_node(ray_one_node):
    """A Ray cluster of one node with five CPUs (two workers and a spare, and a reference run's two
    workers beside them), shared with the tests in a row that use it
    (:func:`.ray_cluster.shared_one_node`)."""
    return ray_one_node


PACED_TORCH = str(Path(PACED).with_name("paced_torch.py"))  # the same on torch.distributed (DDP)
COLLECTIVE = {"horovod": (), "torch": ("--collective", "torch")}


def _train(cluster, run, *extra: str, slots: int = 2, steps: int = STEPS, step_s: float = 0.2,
           collective: str = "horovod"):
    """The paced script, 2 workers, on the Ray ``cluster``; with ``cluster`` None on this machine's
    launcher instead: a test's reference run (its workers fork from the zygote; a Ray actor is a new
    interpreter). Its final weights equal the Ray run's bitwise where the training is the same
    (test_ray shows a Ray run and a horovodrun run of one job equal), so a test holds across the two."""
    script = PACED_TORCH if collective == "torch" else PACED
    ray = [] if cluster is None else [*_ray_args(cluster), "--slots", str(slots)]
    return _start([*ray, *COLLECTIVE[collective], *extra, "--script", script, "--steps", str(steps), "--gpus", "2",
                   "--run-dir", str(run), "--", "--step-s", str(step_s)])


def _kill_rank_1(run, proc, after_step: int, ready=lambda: True, wait: bool = True, rank: int = 1):
    """kill -9 of rank 1 (or ``rank``, of two) once ``after_step`` is done and ``ready()``; the run's
    end (with ``wait``); (the other rank's pid, the killed rank's node, the kill's time)."""
    try:
        _wait_step(run, after_step)
        t0 = time.time()
        while not ready() and time.time() - t0 < 120:
            time.sleep(0.1)
        (_, pid0, _), = [x for x in _ring(run, 0) if x[0] == 1 - rank]
        (_, pid1, node1), = [x for x in _ring(run, 0) if x[0] == rank]
        t_kill = time.time()
        os.kill(pid1, signal.SIGKILL)  # the rank's actor process
        if not wait:
            return pid0, node1, t_kill
        out, err = proc.communicate(timeout=240)
    finally:
        if wait and proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    return pid0, node1, t_kill


def _same_weights(a_run, b_run, steps: int = STEPS) -> None:
    a, b = _final_model(a_run), _final_model(b_run)
    assert a["step"] == b["step"] == steps and a["cursor"] == b["cursor"] and a["lr_last"] == b["lr_last"]
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k


def _stop_after_the_grow(run, proc, timeout: float = 240, segment: int = 2):
    """Ctrl-C (SIGINT to the controller) once the ring is back at 2 (from ``segment`` on) and did a
    step: the workers checkpoint at the next agreed step and the run ends interrupted (exit 130)."""
    try:
        wait_for(lambda: any(e["world_size"] == 2 for e in read_events(run / "events.jsonl", kind="first_step")
                             if e["segment"] >= segment) or proc.poll() is not None, timeout, "the grow back")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err


@pytest.mark.parametrize("collective", ["horovod", "torch"])
def test_kill_9_of_rank_1_the_survivor_goes_on_from_memory_and_a_new_actor_grows_it_back(tmp_path, one_node,
                                                                                         collective):
    """The run is long (its joiner's start may take half a minute on a loaded machine) and stopped by
    Ctrl-C once the ring is back at 2; the reference runs to that checkpoint's step without the pace
    (a sleep: the same steps, the same weights). On Horovod and on torch.distributed (gloo process
    groups over the stores the controller serves; the survivor's broken group destroyed, DDP
    rebuilt over the new one)."""
    killed = 1
    cluster = one_node
    run, ref = tmp_path / "survive", tmp_path / "shrink"
    proc = _train(cluster, run, "--survive", steps=2000, step_s=PACE, collective=collective)
    try:
        pid0, node1, t_kill = _kill_rank_1(run, proc, 4, wait=False)
        _stop_after_the_grow(run, proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    (r,) = read_events(run / "events.jsonl", kind="restart")
    assert r["path"] == "memory" and r["rank"] == killed and r["node"].startswith(node1[:12]), r
    assert r["new_world_size"] == 1 and not r["gave_up"] and r["steps_redone"] <= 1, r
    (rec,) = read_events(run / "events.jsonl", kind="recovered")
    assert rec["path"] == "memory" and rec["from_step"] == r["from_step"] and rec["world_size"] == 1, rec
    assert [(rk, p) for rk, p, _ in _ring(run, 1)] == [(0, pid0)]  # the survivor kept its process
    first = [e for e in read_events(run / "events.jsonl", kind="first_step") if e["segment"] == 1]
    print(f"kill -9 -> the survivor's next completed step: {first[0]['time'] - t_kill:.2f} s; "
          f"detected -> step {rec['detect_to_first_step_s']:.2f} s; rolled back to step {r['from_step']}")
    # the new actor in rank 1's bundle came up and joined at a step boundary: back at 2, no restart
    (req,) = [e for e in read_events(run / "events.jsonl", kind="resize_requested") if e["source"] == "joiner"]
    (grow,) = read_events(run / "events.jsonl", kind="relaunched")
    assert (req["from_workers"], req["to_workers"], grow["from_workers"], grow["to_workers"]) == (1, 2, 1, 2), grow
    ring = _ring(run, 2)
    assert len(ring) == 2 and (0, pid0) in [(rk, p) for rk, p, _ in ring]  # rank 0 kept its process
    (ov,) = read_events(run / "events.jsonl", kind="resize_overhead")
    print(f"kill -9 -> the joiner asked {req['time'] - t_kill:.2f} s; the grow back lost {ov['total_lost_s']:.2f} s "
          f"at step {grow['step']}")
    end = _final_model(run)["step"]
    assert end > grow["step"] and len(read_events(run / "events.jsonl", kind="restart")) == 1

    p = _train(None, ref, "--schedule", f"{r['from_step']}:1,{grow['step']}:2", steps=end, step_s=0.0,
               collective=collective)  # the reference, on this machine's launcher
    out, err = p.communicate(timeout=240)  # the same shrink and grow, scheduled
    assert p.returncode == 0, err
    assert not read_events(ref / "events.jsonl", kind="restart")
    _same_weights(run, ref, end)


@pytest.mark.parametrize("killed", [1, 0])
def test_kill_9_of_rank_1_a_warm_spare_takes_its_place_as_if_nothing_happened(tmp_path, one_node, killed):
    """The spare is warm at the kill (its worker waits for its go: imports and build done), so it
    takes the dead worker's place at once. The run is long and stopped by Ctrl-C once the spare did
    a step in the ring (a loaded machine may take long to start the spare); the reference runs to
    that checkpoint's step without the pace and never loses a worker. With rank 0 killed, rank 1
    goes on as rank 0 (it holds the copy rank 0 held) and sends the state to the spare."""
    cluster = one_node
    run, ref = tmp_path / "replace", tmp_path / "straight"
    go = protocol.control_dir(run) / "spare-w3.json"  # the spare's actor is the run's third
    proc = _train(cluster, run, "--survive", slots=3, steps=2000, step_s=PACE)
    try:
        wait_for(lambda: protocol.waiting_file(go).exists() or proc.poll() is not None, 240, "the warm spare")
        pid0, node1, t_kill = _kill_rank_1(run, proc, 4, wait=False, rank=killed)
        _stop_after_the_grow(run, proc, segment=1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    (r,) = read_events(run / "events.jsonl", kind="restart")
    assert r["path"] == "memory" and r["rank"] == killed and r["new_world_size"] == 2 and r["steps_redone"] <= 1, r
    ring = _ring(run, 1)
    assert len(ring) == 2 and (0, pid0) in [(rk, p) for rk, p, _ in ring]  # the survivor kept its process, as rank 0
    assert not read_events(run / "events.jsonl", kind="relaunched")  # no grow back: never below 2 but a moment
    (rec,) = read_events(run / "events.jsonl", kind="recovered")
    print(f"kill -9 -> the next completed step with the spare: {rec['time'] - t_kill:.2f} s")
    end = _final_model(run)["step"]
    p = _train(None, ref, steps=end, step_s=0.0)  # a run that never lost a worker, on this machine's launcher
    out, err = p.communicate(timeout=240)
    assert p.returncode == 0, err
    _same_weights(run, ref, end)


def test_a_horovod_elastic_script_on_ray_rolls_back_to_its_last_commit_in_memory(tmp_path, one_node):
    """A Horovod Elastic script (``@hvd.elastic.run``, ``state.commit()`` after every batch) on Ray:
    rank 1's actor process kills itself in the last step; rank 0 restores its last commit
    (Horovod's save, in memory), re-forms the ring alone and finishes, without a restart from the
    checkpoint; the final weights and momentum equal those of a scheduled shrink at that step,
    run beside it on the same cluster."""
    from tests.integration.test_inplace_survive import (HE_STEPS, _assert_same_final_state, _rows, _side_by_side,
                                                        hvd_elastic_script)

    dirs = _side_by_side(tmp_path, hvd_elastic_script(killed=1), {"fail": ["--survive"],
                                                 "none": ["--resize-at", str(HE_STEPS - 1), "--to", "1"]}, HE_STEPS,
                         start=lambda args: _start([*_ray_args(one_node), *args]))
    run = dirs["fail"] / "r"
    (r,) = read_events(run / "events.jsonl", kind="restart")
    assert (r["path"], r["rank"], r["from_step"], r["new_world_size"]) == ("memory", 1, HE_STEPS - 1, 1), r
    rows = _rows(dirs["fail"])
    assert [s for s, _, _ in rows] == [*range(1, HE_STEPS + 1), HE_STEPS] and len({p for _, p, _ in rows}) == 1
    a, b = _final_model(run), _final_model(dirs["none"] / "r")
    assert a["step"] == b["step"] == HE_STEPS
    _assert_same_final_state(a, b)


EPOCH_LOOP = str(Path(__file__).parent / "scripts" / "epoch_loop.py")


def test_an_epoch_loop_killed_inside_an_epoch_goes_on_from_memory_and_grows_back(tmp_path, one_node):
    """``job.epochs()`` over ``elastic.DistributedSampler`` (8 steps an epoch at 2 workers): rank 1
    kills itself (SIGKILL) at the start of step 5 of epoch 1; rank 0 keeps its process and rolls back
    to step 4 from memory (its position in the epoch), a new actor grows the ring back, and Ctrl-C
    ends the run in a later epoch. The final weights, momentum, data position and scheduler equal,
    bitwise, those of a run with that shrink and grow scheduled."""
    cluster = one_node
    run, ref = tmp_path / "survive", tmp_path / "shrink"

    def train(run_dir, *extra: str, step_s: float, kill: int = 0, ray: bool = True):
        out = tmp_path / f"rows-{run_dir.name}"
        out.mkdir()
        where = [*_ray_args(cluster), "--slots", "2"] if ray else []  # the reference: this machine's launcher
        return _start([*where, *extra, "--script", EPOCH_LOOP, "--gpus", "2", "--run-dir", str(run_dir), "--",
                       "--out", str(out), "--epochs", "500", "--step-s", str(step_s), "--kill-step", str(kill)])

    proc = train(run, "--survive", step_s=0.15, kill=5)
    try:
        _stop_after_the_grow(run, proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    (r,) = read_events(run / "events.jsonl", kind="restart")
    assert (r["path"], r["rank"], r["from_step"], r["new_world_size"], r["gave_up"]) == ("memory", 1, 4, 1, False), r
    assert r["steps_redone"] <= 1, r
    (grow,) = read_events(run / "events.jsonl", kind="relaunched")
    assert (grow["from_workers"], grow["to_workers"]) == (1, 2), grow
    rows = [tuple(map(int, ln.split())) for ln in (tmp_path / "rows-survive" / "rank0.txt").read_text().splitlines()]
    assert len({pid for _, pid, _, _ in rows}) == 1  # rank 0 kept its process throughout
    end = _final_model(run)["step"]
    assert rows[-1][3] > 1 and end > grow["step"]  # the run went on into a later epoch
    p = train(ref, "--schedule", f"{r['from_step']}:1,{grow['step']}:2", "--steps", str(end), step_s=0.0, ray=False)
    out, err = p.communicate(timeout=240)  # the same shrink and grow, scheduled
    assert p.returncode == 0, err
    assert not read_events(ref / "events.jsonl", kind="restart")
    a, b = _final_model(run), _final_model(ref)
    assert a["step"] == b["step"] == end and a["data_position"] == b["data_position"]
    assert a["schedulers"] == b["schedulers"] and a["lr_last"] == b["lr_last"]
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    ma = [s["momentum_buffer"] for s in a["optimizer"]["state"].values()]
    mb = [s["momentum_buffer"] for s in b["optimizer"]["state"].values()]
    assert ma and all(torch.equal(x, y) for x, y in zip(ma, mb))
