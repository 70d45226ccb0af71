"""A hung worker under `elastic-ring cluster`: a job started by the scheduler has its rank 1
SIGSTOPped; the job's controller (the stall watchdog) kills and restarts it from its newest
checkpoint, blames rank 1, and the job finishes by itself: the scheduler records it finished."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from elastic_ring import protocol
from elastic_ring.events.api import read_events
from tests.conftest import ROOT, wait_for

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "elastic_ring.cli.main"]
PACED = str(ROOT / "tests" / "integration" / "scripts" / "paced.py")
STEPS = 60  # 20 to 40 steps after the restart (at >= 50 ms each): the end is the job's own, well after it


def _cli(*args) -> str:
    r = subprocess.run([*CLI, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _step(rd: Path) -> int:
    return int((protocol.read_json(protocol.control_dir(rd) / protocol.PROGRESS_FILE) or {}).get("step", 0))


def _rank1_of_newest_segment(rd: Path) -> dict | None:
    recs = [r for r in protocol.read_pid_records(rd) if r.get("rank") == 1]
    return max(recs, key=lambda r: r["segment"]) if recs else None


def test_a_stopped_rank_of_a_cluster_job_is_restarted_and_the_job_finishes(tmp_path):
    d, log = tmp_path / "cl", tmp_path / "scheduler.log"
    sched = subprocess.Popen([*CLI, "cluster", "up", "--dir", str(d), "--slots", "2", "--quiet", "--poll", "0.3"],
                             cwd=ROOT, stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)
    victim = 0
    try:
        wait_for(lambda: (d / "cluster.db").exists(), 60, "the cluster database")
        _cli("submit", PACED, "--name", "hung", "--steps", str(STEPS), "--min-workers", "2", "--max-workers", "2",
             "--checkpoint-every", "10", "--dir", str(d))
        rd = d / "jobs" / "1"
        wait_for(lambda: _step(rd) >= 25, 180, "the job at step 25")
        rec = _rank1_of_newest_segment(rd)
        assert rec is not None
        victim = int(rec["pid"])
        step_at_stop = _step(rd)
        os.kill(victim, signal.SIGSTOP)
        t_stop = time.time()

        def done():
            (job,) = json.loads(_cli("jobs", "--dir", str(d), "--json"))
            return job if job["state"] in ("finished", "failed", "cancelled") else None

        job = wait_for(done, 240, "the job's end")
        job_log = (d / "logs" / "job-1.log").read_text()[-3000:]
        assert job["state"] == "finished", job_log
        (st,) = read_events(rd / "events.jsonl", kind="stalled")
        assert st["ranks"] == [1] and "stopped" in st["why"], st
        assert st["time"] - t_stop < 15, st  # a stopped worker: 5 s without a step (Gloo alone: ~40 s)
        (r,) = read_events(rd / "events.jsonl", kind="restart")
        assert r["rank"] == 1 and "stall" in r["cause"] and not r["gave_up"], r
        assert r["from_step"] % 10 == 0 and r["from_step"] >= 20 and r["new_world_size"] == 2, r
        # the steps lost are counted to the last step the heartbeats showed (progress.json lags)
        assert r["failed_at_step"] == st["last_step"] >= step_at_stop, (r, st, step_at_stop)
        assert r["steps_redone"] == st["last_step"] - r["from_step"]
        (fin,) = read_events(rd / "events.jsonl", kind="finished")
        assert fin["step"] == STEPS
        assert json.loads((rd / "summary.json").read_text())["state"] == "finished"
        kinds = [k for k in _cluster_events(d)]
        assert "finished" in kinds and "failed" not in kinds and "paused" not in kinds, kinds
    finally:
        if victim and protocol.pid_alive(victim):
            os.kill(victim, signal.SIGKILL)
        if sched.poll() is None:
            subprocess.run([*CLI, "cluster", "down", "--dir", str(d), "--timeout", "60"], cwd=ROOT,
                           capture_output=True, timeout=120)
            try:
                sched.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(sched.pid, signal.SIGKILL)


def _cluster_events(d: Path) -> list[str]:
    import sqlite3

    db = sqlite3.connect(str(d / "cluster.db"))
    try:
        return [k for (k,) in db.execute("SELECT kind FROM events WHERE job_id = 1 ORDER BY id")]
    finally:
        db.close()
