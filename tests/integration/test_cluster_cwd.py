"""A cluster job runs where it was submitted, not in the scheduler's folder: a script with a
relative data path and a relative log folder, submitted with a relative path from a user's folder
to a real `cluster up` started in the checkout, reads its data and writes its logs there (nothing
in the checkout); a job whose folder was removed before its start fails with one line, and the
other job runs."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import pytest

from elastic_ring.cluster.api import ClusterConfig
from elastic_ring.cluster.store import Store
from tests.conftest import ROOT, run_cli, wait_for

pytestmark = pytest.mark.integration

SCRIPT = ROOT / "tests" / "integration" / "scripts" / "relative_paths.py"


def _states(d):
    store = Store(d)
    try:
        return {j.name: j for j in store.jobs()}
    finally:
        store.close()


def test_a_submitted_script_s_relative_paths_are_the_submitting_shell_s(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.txt").write_text("\n".join(str(i / 10) for i in range(12)))
    work, gone, d = tmp_path / "work", tmp_path / "gone", tmp_path / "cl"
    work.mkdir()
    gone.mkdir()
    st = Store(d, create=True)  # the cluster's folder, its scheduler not up yet: both jobs wait queued
    st.set_meta("config", ClusterConfig(hosts=(("localhost", 1),), policy="eight").to_dict())
    st.close()
    in_checkout = [p for p in (ROOT / "logs", ROOT.parent / "data") if p.exists()]
    for name, where in (("gone", gone), ("here", work)):  # relative script, data, log folder and --dir
        r = run_cli("submit", os.path.relpath(SCRIPT, where), "--name", name, "--steps", "3", "--max-workers",
                    "1", "--dir", "../cl", "--", "--train-dir", "../data", "--log-dir", "logs", cwd=where,
                    timeout=120)
        assert r.returncode == 0, r.stderr
    shutil.rmtree(gone)
    log = tmp_path / "scheduler.log"
    sched = subprocess.Popen([sys.executable, "-m", "elastic_ring.cli.main", "cluster", "up", "--dir", str(d),
                              "--quiet", "--poll", "0.3"], cwd=ROOT, stdout=open(log, "wb"),
                             stderr=subprocess.STDOUT, start_new_session=True)
    try:
        jobs = wait_for(lambda: (lambda js: js if all(j.state.terminal for j in js.values()) else None)(_states(d)),
                        150, "both jobs to end")
        assert jobs["gone"].state.value == "failed", log.read_text()[-2000:]
        assert jobs["here"].state.value == "finished", (d / "logs" / f"job-{jobs['here'].id}.log").read_text()[-3000:]
        # the job's own files in the folder it was submitted from; nothing in the scheduler's folder
        assert (work / "logs" / "rank0.txt").read_text().splitlines() == [f"cwd={work} values=12 size=1"]
        assert [p for p in (ROOT / "logs", ROOT.parent / "data") if p.exists()] == in_checkout
        # the gone folder: one line, in `jobs` too; the scheduler went on (it ran the other job)
        msg = jobs["gone"].message
        assert "\n" not in msg and f"submitted from {gone}, which is gone" in msg, msg
        r = run_cli("jobs", "--dir", str(d), timeout=60)
        assert f"job {jobs['gone'].id} failed: {msg}" in r.stdout, r.stdout
        assert sched.poll() is None, log.read_text()[-2000:]
    finally:
        if sched.poll() is None:
            run_cli("cluster", "down", "--dir", str(d), "--timeout", "60", timeout=120)
            try:
                sched.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(sched.pid, signal.SIGKILL)
