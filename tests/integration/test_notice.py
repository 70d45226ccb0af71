"""Leaving with notice (docs/hosts.md): `elastic-ring drain RUN_DIR HOST` and a SIGTERM to one worker
shrink the job off a host at the next agreed step (nothing redone, no restart); a SIGTERM to the
controller with `--grace` checkpoints and stops, and Slurm's SIGUSR1 does so with the requeue status.

Real horovodrun runs of a tiny ResNet; `localhost` and `127.0.0.1` are the two hosts, listed by a
discovery script that cats a file (as tests/integration/test_discovery.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from elastic_ring import protocol
from elastic_ring.errors import EXIT_REQUEUE
from elastic_ring.events import read_events
from tests.conftest import BIN, ROOT, one_line_error, run_cli, wait_for
from tests.integration.two_hosts import sigterm_127_then_shrunk, stop_once_grown

pytestmark = pytest.mark.integration

TINY = ["--dataset", "synthetic", "--set", "synthetic_size=40", "--depth", "8", "--set", "width=4",
        "--batch-size", "8", "--device", "cpu", "--set", "trace_samples=true", "--set", "throughput_window=5"]
BOTH, ONE = "localhost:1,127.0.0.1:1", "localhost:1"


def _discovery(tmp_path: Path, hosts: str) -> Path:
    listed = tmp_path / "hosts.txt"
    listed.write_text(hosts)
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {listed}\n")
    script.chmod(0o755)
    return script


def _start(args: list[str], env: dict | None = None) -> subprocess.Popen:
    e = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.Popen([sys.executable, "-m", "elastic_ring.cli.main", "train", *args], cwd=ROOT, env=e,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _events(run: Path, kind: str) -> list[dict]:
    return read_events(run / "events.jsonl", kind=kind)


def _trained_once(run: Path) -> dict[int, int]:
    """step -> samples trained at it (all ranks); a step a rank traced twice is one redone: an assertion."""
    rows: dict[int, dict[int, int]] = {}
    for f in sorted((run / "trace").glob("seg*-rank*.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            assert r["rank"] not in rows.setdefault(r["step"], {}), f"step {r['step']} redone"
            rows[r["step"]][r["rank"]] = len(r["indices"])
    return {s: sum(v.values()) for s, v in rows.items()}


def _hosts_of(launch: dict) -> str:
    return launch["command"][launch["command"].index("-H") + 1]


def _two_host_run(tmp_path: Path, name: str, steps: int) -> tuple[Path, subprocess.Popen]:
    script = _discovery(tmp_path, "localhost:1\n127.0.0.1:1\n")
    run = tmp_path / name
    proc = _start(["--steps", str(steps), *TINY, "--host-discovery-script", str(script), "--discovery-interval",
                   "0.3", "--run-dir", str(run)])
    wait_for(lambda: [t for t in _events(run, "throughput") if t["world_size"] == 2], 120, "a window at 2 workers")
    return run, proc


def _shrunk_off_127(run: Path, last: int, cause: str, why: str) -> None:
    """The run went 2 -> 1 off 127.0.0.1 for ``cause``, nothing redone, no restart, up to the
    ``last`` step (the run's end: stopped once the shrunk ring did a step, :mod:`.two_hosts`)."""
    launches = _events(run, "launch")
    assert [(e["world_size"], _hosts_of(e)) for e in launches] == [(2, BOTH), (1, ONE)]
    (change,) = _events(run, "membership_change")
    assert (change["cause"], change["members_before"], change["members_after"], change["state_source"]) == (
        cause, 2, 1, "checkpoint")
    assert launches[1]["start_step"] == change["step"] + 1
    assert not _events(run, "restart")  # not a failure: --max-restarts untouched
    trained = _trained_once(run)
    assert sorted(trained) == list(range(1, last + 1))  # every step trained once
    assert {trained[s] for s in range(1, change["step"] + 1)} == {16}
    assert change["step"] < last and {trained[s] for s in range(change["step"] + 1, last + 1)} == {8}
    notes = [n["message"] for n in _events(run, "notice")]
    assert f"drained 127.0.0.1 ({why}) at step {change['step']}: 2 -> 1 workers, no step redone" in notes, notes


def test_drain_shrinks_off_the_host_with_nothing_redone_and_its_one_line_errors(tmp_path, capsys):
    steps = 600  # the shrink lands by step ~135 at load 15 (three drain commands first); stopped (Ctrl-C)
    # once the shrunk ring did a step
    run, proc = _two_host_run(tmp_path, "drain", steps)
    try:
        r = run_cli("drain", str(run), "10.9.9.9")  # not one of its hosts
        one_line_error(r, f"host 10.9.9.9 is not one of run {run}'s usable hosts (localhost, 127.0.0.1)")
        r = run_cli("drain", str(run), "127.0.0.1", "--deadline", "0")
        one_line_error(r, "--deadline must be > 0 s, got 0")
        r = run_cli("drain", str(run), "127.0.0.1", "--deadline", "60")
        assert r.returncode == 0 and "drain of 127.0.0.1 requested" in r.stdout, r.stderr
        wait_for(lambda: len(_events(run, "launch")) >= 2, 120, "the shrink")
        # out until discovery drops it and lists it again: still listed, so still out
        line = wait_for(lambda: next((ln for ln in run_cli("status", str(run)).stdout.splitlines()
                                      if ln.startswith("hosts:")), None), 30, "status's hosts line")
        assert line == "hosts: localhost:1 (1 slot); drained: 127.0.0.1", line
        r = run_cli("drain", str(run), "localhost")  # the last host: below --min-workers 1
        one_line_error(r, "draining localhost leaves 0 slots, below --min-workers 1")
        out, err, end = stop_once_grown(proc, run, world=1, launches=2)  # Ctrl-C once the shrunk ring stepped
    finally:
        if proc.poll() is None:
            proc.kill()
    _shrunk_off_127(run, end, "drained", "elastic-ring drain")
    assert "draining 127.0.0.1 (elastic-ring drain): the job shrinks off it at the next agreed step (deadline 60 s)" \
        in err and "Traceback" not in err
    state = "finished)" if end == steps else "stopped; continue from the checkpoint at step"  # unless it finished first
    one_line_error(run_cli("drain", str(run), "localhost"), f"run {run} is not running (state: {state}")
    one_line_error(run_cli("drain", str(tmp_path / "nowhere"), "localhost"), "is not an elastic-ring run folder")


def test_a_sigterm_to_one_worker_is_a_preempted_shrink(tmp_path):
    steps = 500  # the shrink lands by step ~55 at load 15; stopped (Ctrl-C) once the shrunk ring did a step
    run, proc = _two_host_run(tmp_path, "preempt", steps)
    victim, out, err, end = sigterm_127_then_shrunk(proc, run)  # how Kubernetes and spot reclaims preempt
    (notice,) = _events(run, "preempt_notice")
    assert (notice["rank"], notice["segment"], notice["pid"]) == (victim["rank"], 0, victim["pid"])
    _shrunk_off_127(run, end, "preempted", f"SIGTERM to rank {victim['rank']}")
    assert "preempted 127.0.0.1: 2 -> 1 workers at the next agreed step" in err and "Traceback" not in err
    with pytest.raises(ProcessLookupError):
        os.kill(int(victim["pid"]), 0)  # the worker exited after the shrink
    assert json.loads((run / "summary.json").read_text()).get("restarts", []) in ([], 0)


def _one_host_run(tmp_path: Path, name: str, extra: list[str], env: dict | None = None):
    run = tmp_path / name
    proc = _start(["--steps", "3000", *TINY, "--slots", "1", "--checkpoint-every", "20", "--run-dir", str(run),
                   *extra], env)
    wait_for(lambda: _events(run, "throughput"), 120, "a window")
    return run, proc


def _resumes(run: Path) -> None:
    ck = protocol.read_json(run / "checkpoints" / "latest.json")
    assert ck and ck["step"] > 0, ck
    r = run_cli("train", "--resume", str(run), "--steps", str(ck["step"] + 10), timeout=240)
    assert r.returncode == 0, r.stderr
    assert _events(run, "launch")[-1]["start_step"] == ck["step"] + 1
    assert _events(run, "finished")[-1]["step"] == ck["step"] + 10


def test_sigterm_to_the_controller_with_grace_checkpoints_and_resume_continues(tmp_path):
    run, proc = _one_host_run(tmp_path, "grace", ["--grace", "60"])
    try:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    (line,) = [ln for ln in err.splitlines() if ln.startswith("interrupted: ")]
    ck = protocol.read_json(run / "checkpoints" / "latest.json")["step"]
    assert line.startswith(f"interrupted: checkpoint at step {ck} kept (in ") and " s of the 60 s grace)" in line, line
    assert _events(run, "segment_end")[-1]["step"] == ck  # checkpointed where the workers stopped
    _resumes(run)


def test_slurm_sigusr1_checkpoints_or_kills_past_the_grace_and_exits_with_the_requeue_status(tmp_path):
    # a worker that cannot checkpoint within the grace (stopped): it is killed, the last periodic checkpoint stands
    run, proc = _one_host_run(tmp_path, "slurm", ["--grace", "1"], env={"SLURM_JOB_ID": "4242"})
    try:
        wait_for(lambda: (protocol.read_json(run / "checkpoints" / "latest.json") or {}).get("step"), 120,
                 "a periodic checkpoint")
        (worker,) = [protocol.read_json(f) for f in protocol.pid_dir(run).glob("seg000-rank0.json")]
        os.kill(int(worker["pid"]), signal.SIGSTOP)
        proc.send_signal(signal.SIGUSR1)  # #SBATCH --signal=USR1@90
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == EXIT_REQUEUE == 75, err
    ck = protocol.read_json(run / "checkpoints" / "latest.json")["step"]
    assert "the 1 s grace passed before the workers checkpointed: killing them" in err
    assert f"interrupted: the 1 s grace passed: workers killed; the last checkpoint at step {ck} kept" in err, err
    assert f"Slurm's signal: exit status {EXIT_REQUEUE} (requeue the job" in err and "Traceback" not in err
    _resumes(run)
