"""`elastic-ring cluster up --hostfile` with real processes: `localhost` and `127.0.0.1` as two
hosts of one slot each; one tiny job gets both slots as a horovodrun -H list and finishes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "elastic_ring.cli.main"]


def _cli(*args):
    r = subprocess.run([*CLI, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_hostfile_two_local_hosts(tmp_path):
    d, hf, log = tmp_path / "cl", tmp_path / "hosts", tmp_path / "scheduler.log"
    hf.write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    sched = subprocess.Popen([*CLI, "cluster", "up", "--hostfile", str(hf), "--policy", "eight", "--network-interface",
                              "lo", "--dir", str(d), "--quiet", "--poll", "0.3"], cwd=ROOT, stdout=open(log, "wb"),
                             stderr=subprocess.STDOUT, start_new_session=True)
    try:
        t0 = time.time()
        while not (d / "cluster.db").exists():
            assert time.time() - t0 < 60 and sched.poll() is None, log.read_text()
            time.sleep(0.3)
        _cli("submit", str(ROOT / "examples" / "mlp_digits.py"), "--name", "h", "--steps", "20", "--dir", str(d),
             "--", "--hidden", "16")
        while True:
            (job,) = json.loads(_cli("jobs", "--dir", str(d), "--json"))
            if job["state"] in ("finished", "failed", "cancelled"):
                break
            assert time.time() - t0 < 300, log.read_text()[-2000:]
            time.sleep(1)
        rd = d / "jobs" / str(job["id"])
        assert job["state"] == "finished", (rd.parent.parent / "logs" / f"job-{job['id']}.log").read_text()[-3000:]
        launches = [json.loads(x) for x in (rd / "events.jsonl").read_text().splitlines() if '"kind":"launch"' in x]
        assert len(launches) == 1 and launches[0]["world_size"] == 2
        cmd = launches[0]["command"]
        assert cmd[cmd.index("-H") + 1] == "localhost:1,127.0.0.1:1"
        assert job["step"] == 20
    finally:
        if sched.poll() is None:
            subprocess.run([*CLI, "cluster", "down", "--dir", str(d), "--timeout", "60"], cwd=ROOT, capture_output=True,
                           timeout=120)
            try:
                sched.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(sched.pid, signal.SIGKILL)
