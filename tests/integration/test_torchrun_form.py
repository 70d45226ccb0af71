"""A script of torchrun's contract only (tests/integration/scripts/torchrun_contract.py: its own
process group, its own snapshot every 5 steps, no elastic_ring, no horovod) run unchanged by
`elastic-ring train --script`: a kill -9 of one worker and two live resizes (2 -> 1 -> 2) each stop
every worker and start them again, and the script goes on from its own snapshot; the same script
under plain torchrun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from elastic_ring.events.api import read_events
from tests.conftest import BIN, ROOT, run_cli, tool

pytestmark = pytest.mark.integration

SCRIPT = ROOT / "tests" / "integration" / "scripts" / "torchrun_contract.py"
EVERY, STEPS, BATCH = 5, 50, 8


def _log(out: Path) -> list[dict]:
    try:
        lines = (out / "log.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(ln) for ln in lines if ln.endswith("}")]


def _wait(what, proc: subprocess.Popen, timeout: float = 120.0):
    t0 = time.time()
    while time.time() - t0 < timeout:
        got = what()
        if got:
            return got
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting: {what.__doc__}")


def _starts(log: list[dict]) -> list[dict]:
    return [r for r in log if r["kind"] == "start"]


def _steps_after(log: list[dict], n_start: int) -> list[dict]:
    """The steps logged after the ``n_start``-th start record (0-based)."""
    seen, out = -1, []
    for r in log:
        if r["kind"] == "start":
            seen += 1
        elif r["kind"] == "step" and seen == n_start:
            out.append(r)
    return out


def _resize(run: Path, to: int, proc: subprocess.Popen) -> None:
    """`elastic-ring resize RUN --to N`, asked again while the run is still busy with the last one."""
    def asked():
        """the resize accepted"""
        p = run_cli("resize", str(run), "--to", str(to), timeout=60)
        return p.returncode == 0
    _wait(asked, proc)


def _segments(log: list[dict]) -> list[tuple[dict, list[dict], list[int]]]:
    """Per start: the start record, the steps it trained, the snapshots it saved."""
    out, cur = [], None
    for r in log:
        if r["kind"] == "start":
            cur = (r, [], [])
            out.append(cur)
        elif r["kind"] == "step":
            cur[1].append(r)
        elif r["kind"] == "saved":
            cur[2].append(r["step"])
    return out


def test_torchrun_script_unchanged_kill_9_and_live_resizes_2_1_2_resume_from_its_snapshot(tmp_path):
    run, out = tmp_path / "run", tmp_path / "out"
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONUNBUFFERED": "1"}
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "elastic_ring.cli.main", "train", "--script", str(SCRIPT),
                             "--workers", "2", "--slots", "2", "--device", "cpu", "--stop-grace", "10",
                             "--run-dir", str(run), "--", "--out", str(out), "--steps", str(STEPS),
                             "--every", str(EVERY), "--step-s", "0.15"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        def trained(n_start: int, n: int):
            def f():
                """steps after a start"""
                return len(_starts(_log(out))) > n_start and len(_steps_after(_log(out), n_start)) >= n
            return f
        _wait(trained(0, 7), proc)
        os.kill(int((out / "pid-1").read_text()), signal.SIGKILL)  # a failure: all stopped, all started again
        _wait(trained(1, 3), proc)
        _resize(run, 1, proc)
        _wait(trained(2, 3), proc)
        _resize(run, 2, proc)
        stdout, stderr = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    took = time.time() - t0
    form = [ln for ln in stderr.splitlines() if "form torchrun" in ln]
    assert len(form) == 1 and "torchrun_contract.py" in form[0] and "--stop-grace 10 s" in form[0], stderr
    assert "resize 2 -> 1: every worker stopped and started again, the script resumed from its own snapshot" in stderr

    from elastic_ring.controller.status import read_status

    assert read_status(run).phase.value == "finished"
    log = _log(out)
    segs = _segments(log)
    starts = [s for s, _, _ in segs]
    assert [(s["world"], s["env"]["TORCHELASTIC_RESTART_COUNT"]) for s in starts] == [
        (2, "0"), (2, "1"), (1, "1"), (2, "1")]  # restarts counted as torchrun does: failures only
    for s in starts:  # torchrun's environment, as rank 0 got it
        e = s["env"]
        assert e["RANK"] == e["LOCAL_RANK"] == e["ROLE_RANK"] == e["GROUP_RANK"] == "0"
        assert e["WORLD_SIZE"] == e["LOCAL_WORLD_SIZE"] == e["ROLE_WORLD_SIZE"] == str(s["world"])
        assert e["MASTER_ADDR"] == "127.0.0.1" and e["MASTER_PORT"].isdigit()
        assert e["TORCHELASTIC_RUN_ID"] == run.name and e["TORCHELASTIC_MAX_RESTARTS"] == "3"
    redone, newest = [], 0
    for (_, before, saved), (start, after, _) in zip(segs, segs[1:]):
        newest = max([newest, *saved])
        assert newest and start["resumed_from"] == newest  # its own newest snapshot, after each restart
        assert after[0]["step"] == newest + 1  # ... and it goes on from there
        lost = before[-1]["step"] - newest  # the steps since the snapshot: trained again
        assert 0 <= lost <= EVERY
        redone.append(lost)
    trained_steps = [r["step"] for _, steps, _ in segs for r in steps]
    assert sorted(set(trained_steps)) == list(range(1, STEPS + 1))  # no step lost
    assert len(trained_steps) - STEPS == sum(redone)  # only those since a snapshot were trained twice
    for start, steps, _ in segs:  # the data of a step is the step's, at any size
        for r in steps:
            assert r["world"] == start["world"]
            assert r["samples"] == [(r["step"] * BATCH + i) % 96 for i in range(BATCH)]

    ev = read_events(run / "events.jsonl")
    assert [e["reason"] for e in ev if e["kind"] == "segment_end"] == ["requested", "requested", "finished"]
    (restart,) = [e for e in ev if e["kind"] == "restart"]
    assert restart["rank"] == 1 and not restart["gave_up"]
    overheads = [e for e in ev if e["kind"] == "resize_overhead"]
    assert [(o["from_workers"], o["to_workers"]) for o in overheads] == [(2, 1), (1, 2)]
    assert all(o["stop_latency_s"] < 10 for o in overheads)  # SIGTERM ends the script at once: no grace spent
    launched = [e for e in ev if e["kind"] == "launch"]
    assert len(launched) == 4 and all("--torchrun" in e["command"] for e in launched)
    print(f"torchrun form: {took:.1f} s; steps trained again after each restart (kill -9, 2->1, 1->2): {redone}; "
          + "; ".join(f"{o['from_workers']}->{o['to_workers']}: stop {o['stop_latency_s']:.2f} s, relaunch to "
                      f"first step {o['relaunch_to_first_step_s']:.2f} s, lost {o['total_lost_s']:.2f} s"
                      for o in overheads))


def test_the_same_script_under_plain_torchrun_saves_and_resumes_its_own_snapshot(tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("ELASTIC_RING_ZYGOTE", None)
    for steps in (12, 16):  # the second run resumes from the first's snapshot (step 10)
        p = subprocess.run([tool("torchrun"), "--standalone", "--nproc-per-node", "2", str(SCRIPT), "--out", str(out),
                            "--steps", str(steps), "--every", str(EVERY)], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=180)
        # torch's own abort at the interpreter's exit after the script's work (gloo threads torn down
        # late: "terminate called without an active exception", SIGABRT; the script calls
        # destroy_process_group() itself): seen in one fresh-clone CI run of this test at load, and
        # taken as test_torch_collective takes it, as an exit; the log below must still be whole
        torch_abort = p.returncode != 0 and "terminate called without an active exception" in p.stderr
        assert p.returncode == 0 or torch_abort, p.stdout + p.stderr[-3000:]
    segs = _segments(_log(out))
    assert [(s["resumed_from"], s["world"]) for s, _, _ in segs] == [(0, 2), (10, 2)]
    assert [r["step"] for r in segs[0][1]] == list(range(1, 13)) and segs[0][2] == [5, 10]
    assert [r["step"] for r in segs[1][1]] == list(range(11, 17)) and segs[1][2] == [15]
    e = segs[0][0]["env"]
    assert e["WORLD_SIZE"] == e["LOCAL_WORLD_SIZE"] == "2" and e["TORCHELASTIC_RESTART_COUNT"] == "0"
    for r in segs[0][1] + segs[1][1]:
        assert r["samples"] == [(r["step"] * BATCH + i) % 96 for i in range(BATCH)]
