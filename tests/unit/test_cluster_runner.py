"""The cluster's process runner against real processes: a job's controller is found by its run
folder when the scheduler that started it was killed before it stored the pid."""

from __future__ import annotations

import subprocess
import sys

import psutil

from elastic_ring.cluster.api import ClusterConfig, JobRequest, JobRow, JobState
from elastic_ring.cluster.runner import ProcessRunner, run_dir
from tests.conftest import wait_for

SLEEP = "import time; time.sleep(60)"


def _shown(p: subprocess.Popen) -> None:
    """Wait until the kernel shows ``p``'s command line. Popen returns when the exec has closed the
    parent's pipe, which comes before the new program's arguments are set up: until then
    /proc/PID/cmdline reads empty (seen right after Popen in 330 of 400 starts beside two busy
    loops on 2 cores). A controller found after a scheduler's restart is long past that point."""
    wait_for(lambda: psutil.Process(p.pid).cmdline(), 30, f"pid {p.pid}'s command line", poll=0.01)


def _row(jid: int) -> JobRow:
    """A job row as the store gives it (queued, never started)."""
    return JobRow(id=jid, name="j", request=JobRequest(name="j", kind="script", path="x.py", steps=10),
                  state=JobState.QUEUED, submitted=0.0)


def test_a_controller_without_a_stored_pid_is_found_by_its_run_folder(tmp_path):
    runner = ProcessRunner(tmp_path, ClusterConfig(hosts=(("localhost", 2),)))
    job = _row(3)
    rd = str(run_dir(runner.dir, 3))
    assert not runner.alive(job) and runner._pid(job) is None
    # the same arguments as a start's command line (python -m elastic_ring.cli.main train --run-dir D),
    # after a -c that only sleeps; another command naming the folder is not a controller
    other = subprocess.Popen([sys.executable, "-c", SLEEP, "tail", rd])
    ctl = subprocess.Popen([sys.executable, "-c", SLEEP, "-m", "elastic_ring.cli.main", "train", "--run-dir", rd])
    try:
        _shown(other)
        _shown(ctl)
        assert runner.alive(job) and runner._pid(job) == ctl.pid
        assert not runner.alive(_row(4))  # another job's folder
        ctl.kill()
        ctl.wait()
        assert not runner.alive(job) and runner._pid(job) is None
    finally:
        for p in (other, ctl):
            p.kill()
            p.wait()
