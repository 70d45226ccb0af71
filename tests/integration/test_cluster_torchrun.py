"""A script of torchrun's contract submitted unchanged to a real `cluster up` (2 slots): it starts
at 2 workers, a second job's arrival makes the scheduler shrink it live to 1 (every worker stopped
and started again, as torchrun does), it grows back to 2 when that job ends, resumes from its own
snapshot each time and finishes with every step trained; the scheduler's jobs list shows it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from elastic_ring.cluster.store import Store
from tests.conftest import ROOT, run_cli, wait_for

pytestmark = pytest.mark.integration

SCRIPT = ROOT / "tests" / "integration" / "scripts" / "torchrun_contract.py"
PACED = ROOT / "tests" / "integration" / "scripts" / "paced.py"
STEPS, EVERY = 100, 5  # long enough after the shrink for the newcomer to start and end under load (60 once was not)


def _log(out: Path) -> list[dict]:
    try:
        return [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines() if x.endswith("}")]
    except FileNotFoundError:
        return []


def _jobs(d: Path) -> dict:
    store = Store(d)
    try:
        return {j.name: j for j in store.jobs()}
    finally:
        store.close()


def test_a_torchrun_script_submitted_unchanged_is_shrunk_for_a_newcomer_and_grown_back(tmp_path):
    d, out, log = tmp_path / "cl", tmp_path / "out", tmp_path / "scheduler.log"
    sched = subprocess.Popen([sys.executable, "-m", "elastic_ring.cli.main", "cluster", "up", "--dir", str(d),
                              "--slots", "2", "--policy", "precompute", "--quiet", "--poll", "0.3"], cwd=ROOT,
                             stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: (d / "cluster.db").exists(), 60, "the cluster database")
        r = run_cli("submit", str(SCRIPT), "--name", "t", "--max-workers", "2", "--dir", str(d), "--",
                    "--out", str(out), "--steps", str(STEPS), "--every", str(EVERY), "--step-s", "0.15", timeout=60)
        assert r.returncode == 0, r.stderr
        wait_for(lambda: sum(1 for x in _log(out) if x["kind"] == "step" and x["world"] == 2) >= 8, 120,
                 "the torchrun job training at 2 workers")
        r = run_cli("submit", str(PACED), "--name", "b", "--steps", "4", "--max-workers", "1", "--dir", str(d),
                    timeout=60)
        assert r.returncode == 0, r.stderr
        jobs = wait_for(lambda: (lambda js: js if len(js) == 2 and all(j.state.terminal for j in js.values())
                                 else None)(_jobs(d)), 300, "both jobs to end")
        assert {n: j.state.value for n, j in jobs.items()} == {"t": "finished", "b": "finished"}, \
            log.read_text()[-3000:]
        r = run_cli("jobs", "--dir", str(d), timeout=60)
        assert r.returncode == 0 and "t" in r.stdout, r.stderr
    finally:
        if sched.poll() is None:
            run_cli("cluster", "down", "--dir", str(d), "--timeout", "60", timeout=120)
            try:
                sched.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(sched.pid, signal.SIGKILL)
    recs = _log(out)
    starts = [x for x in recs if x["kind"] == "start"]
    assert [s["world"] for s in starts][:2] == [2, 1], starts  # shrunk live for the newcomer ...
    assert starts[-1]["world"] == 2 and len(starts) >= 3, starts  # ... and grown back when it ended
    assert all(s["resumed_from"] > 0 and s["resumed_from"] % EVERY == 0 for s in starts[1:])  # its own snapshot
    trained = [x["step"] for x in recs if x["kind"] == "step"]
    assert sorted(set(trained)) == list(range(1, STEPS + 1))  # every step trained
    assert len(trained) - STEPS <= EVERY * (len(starts) - 1)  # only those since a snapshot trained again
    rd = d / "jobs" / str(jobs["t"].id)
    assert "form torchrun" in (d / "logs" / f"job-{jobs['t'].id}.log").read_text()
    assert json.loads((rd / "summary.json").read_text())["state"] == "finished"
