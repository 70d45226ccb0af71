"""Leaving with notice in place on one host (docs/hosts.md): under `--relaunch inplace` (one Horovod
Elastic job, each worker slot a host name of its own on CPUs) a SIGTERM to one worker makes the
ring shrink in the same processes with that worker leaving, whatever its rank: nothing redone,
nothing read back from disk, no restart, cause `preempted`.

Real horovodrun (gloo) runs of the tiny built-in ResNet of tests/integration/test_notice.py."""

from __future__ import annotations

import json
import os
import signal

import pytest

from elastic_ring import protocol
from tests.integration.test_notice import TINY, _events, _start, _trained_once
from tests.conftest import run_cli, wait_for
from tests.integration.two_hosts import stop_once_grown

pytestmark = pytest.mark.integration


def _record(run, rank: int) -> dict:
    rec = protocol.read_json(protocol.pid_dir(run) / f"seg000-rank{rank}.json")
    assert rec and rec.get("launch_host"), rec
    return rec


def _sigterm_after_a_window(run, args: list[str], world: int, victim: int, stop: bool = True):
    """``train ARGS --run-dir RUN`` started; once a throughput window at ``world`` workers, a
    SIGTERM to rank ``victim``'s worker (how Kubernetes and spot reclaims preempt); with ``stop``
    the run stopped (Ctrl-C) once the shrunk ring has done a step (:func:`.two_hosts.stop_once_grown`),
    else its end: (the process, the worker's process record, stdout, stderr, the last step trained
    with ``stop``)."""
    proc = _start([*args, "--run-dir", str(run)])
    try:
        wait_for(lambda: [t for t in _events(run, "throughput") if t["world_size"] == world], 120,
                 f"a window at {world} workers")
        rec = _record(run, victim)
        os.kill(int(rec["pid"]), signal.SIGTERM)
        if stop:
            out, err, end = stop_once_grown(proc, run, world=world - 1, launches=2)
        else:
            (out, err), end = proc.communicate(timeout=240), None
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc, rec, out, err, end


@pytest.mark.parametrize("world,victim", [(2, 1), (3, 1), (2, 0)])
def test_a_sigterm_to_one_worker_shrinks_the_ring_in_place_without_it(tmp_path, world, victim):
    steps = 250  # the shrink lands by step ~35 at load 11-15, ~50 at load 6 (later where steps are faster); a tail
    run = tmp_path / "r"
    proc, rec, out, err, end = _sigterm_after_a_window(run, ["--gpus", str(world), "--slots", str(world), "--steps",
                                                             str(steps), *TINY, "--relaunch", "inplace"], world, victim)
    (notice,) = _events(run, "preempt_notice")
    assert (notice["pid"], notice["host"]) == (int(rec["pid"]), rec["launch_host"])
    (change,) = _events(run, "membership_change")
    assert (change["cause"], change["members_before"], change["members_after"], change["state_source"]) == (
        "preempted", world, world - 1, "memory")  # in place: nothing read back
    launches = _events(run, "launch")  # the same horovodrun: one process tree, resized in place
    assert [(e["world_size"], e["start_step"]) for e in launches] == [(world, 1), (world - 1, change["step"] + 1)]
    assert len({tuple(e["command"]) for e in launches}) == 1
    assert [e["returncode"] for e in _events(run, "workers_exited")] == [0]
    (ov,) = _events(run, "resize_overhead")
    assert ov["checkpoint_s"] == 0  # no checkpoint written for it
    assert not _events(run, "restart")  # not a failure: --max-restarts untouched
    assert json.loads((run / "summary.json").read_text()).get("restarts", []) in ([], 0)
    trained = _trained_once(run)
    assert sorted(trained) == list(range(1, end + 1))  # every step trained once
    per = 8  # the batch per worker (TINY)
    assert {trained[s] for s in range(1, change["step"] + 1)} == {per * world}
    assert change["step"] < end <= steps and {trained[s] for s in range(change["step"] + 1, end + 1)} == {
        per * (world - 1)}
    notes = [n["message"] for n in _events(run, "notice")]
    assert (f"drained {rec['launch_host']} (SIGTERM to pid {rec['pid']}) at step {change['step']}: {world} -> "
            f"{world - 1} workers, no step redone") in notes, notes
    assert f"preempted {rec['launch_host']}: {world} -> {world - 1} workers at the next agreed step" in err
    assert "Traceback" not in err
    with pytest.raises(ProcessLookupError):
        os.kill(int(rec["pid"]), 0)  # the worker that got the notice exited after the shrink


def test_a_sigterm_where_the_worker_cannot_leave_in_place_relaunches_from_the_agreed_checkpoint(tmp_path):
    """`--no-survive`: the slots are one `localhost:2`, where Horovod's driver would end rank 1, not
    rank 0: the job stops with a checkpoint at the agreed step and goes on without rank 0's worker,
    relaunched from it: still `preempted`, not a failure, nothing redone."""
    steps = 300
    run = tmp_path / "r"
    proc, rec, out, err, end = _sigterm_after_a_window(run, ["--gpus", "2", "--slots", "2", "--steps", str(steps),
                                                             *TINY, "--relaunch", "inplace", "--no-survive",
                                                             "--max-restarts", "0"], 2, 0)
    (notice,) = _events(run, "preempt_notice")
    assert notice["pid"] == int(rec["pid"])
    (change,) = _events(run, "membership_change")
    assert (change["cause"], change["members_before"], change["members_after"], change["state_source"]) == (
        "preempted", 2, 1, "checkpoint")
    launches = _events(run, "launch")  # a new horovodrun at one worker fewer, from the agreed step
    assert [(e["world_size"], e["start_step"]) for e in launches] == [(2, 1), (1, change["step"] + 1)]
    assert change["step"] in [c["step"] for c in _events(run, "checkpoint_written") if c["world_size"] == 2]
    assert not _events(run, "restart")  # not a failure: --max-restarts 0 untouched
    assert json.loads((run / "summary.json").read_text()).get("restarts", []) in ([], 0)
    trained = _trained_once(run)
    assert sorted(trained) == list(range(1, end + 1))  # every step trained once: 0 redone
    assert {trained[s] for s in range(1, change["step"] + 1)} == {8 * 2}
    assert change["step"] < end <= steps and {trained[s] for s in range(change["step"] + 1, end + 1)} == {8}
    notes = [n["message"] for n in _events(run, "notice")]
    assert f"drained localhost (SIGTERM to pid {rec['pid']}) at step {change['step']}: 2 -> 1 workers, " \
           "no step redone" in notes, notes
    assert "Traceback" not in err
    with pytest.raises(ProcessLookupError):
        os.kill(int(rec["pid"]), 0)  # the worker that got the notice left at the checkpoint


def test_a_sigterm_to_the_last_worker_stops_with_the_agreed_checkpoint_and_resume_goes_on(tmp_path):
    """One worker in place: no one goes on without it; the job stops with a checkpoint at the agreed
    step (not a failure: the state says why), and `--resume` trains the rest, nothing redone."""
    steps = 500  # the controller acts on a notice 1.1-2.6 s after it at load 11-15: 200 steps once ended first
    run = tmp_path / "r"
    args = ["--gpus", "1", "--slots", "1", "--steps", str(steps), *TINY, "--relaunch", "inplace", "--no-survive"]
    proc, rec, out, err, _ = _sigterm_after_a_window(run, args, 1, 0, stop=False)
    assert proc.returncode == 130, err  # stopped, as an interrupted run: --resume goes on
    (req,) = _events(run, "resize_requested")
    assert (req["source"], req["from_workers"], req["to_workers"]) == ("preempted", 1, 0)
    (ck,) = _events(run, "checkpoint_written")  # the agreed step's
    assert not _events(run, "restart") and not _events(run, "membership_change")
    state = protocol.read_json(run / protocol.CONTROLLER_FILE)
    assert state["state"] == "stopped" and state["step"] == ck["step"], state
    assert state["stopped"] == f"preempted: the last worker left with notice: localhost (SIGTERM to pid {rec['pid']})"
    assert f"checkpoint at step {ck['step']} kept; continue with: elastic-ring train --resume {run}" in err
    assert "Traceback" not in err
    shown = run_cli("status", str(run), timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert (f"stopped (preempted: the last worker left with notice: localhost (SIGTERM to pid {rec['pid']}); "
            f"continue from the checkpoint at step {ck['step']}") in shown.stdout, shown.stdout
    resumed = _start(["--resume", str(run)])
    out, err = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, err
    assert [e["start_step"] for e in _events(run, "launch")] == [1, ck["step"] + 1]
    trained = _trained_once(run)
    assert sorted(trained) == list(range(1, steps + 1))  # 0 redone
