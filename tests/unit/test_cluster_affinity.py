"""CPU affinity follows each cluster job's slots (issue 22, point 5): real processes, real
``sched_setaffinity``; the scheduler's start and resize paths call the same ``ProcessRunner`` code."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil
import pytest

from elastic_ring.cluster.api import ClusterConfig, JobRequest, JobRow, JobState
from elastic_ring.cluster.runner import ProcessRunner

needs_two_cores = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores in this process's affinity")

# a "controller" that starts one child "worker" and sleeps: both must carry the job's cores
TREE = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)']); time.sleep(30)"


def _row(jid: int) -> JobRow:
    """A job row as the store gives it (queued, never started)."""
    return JobRow(id=jid, name="j", request=JobRequest(name="j", kind="script", path="x.py", steps=10),
                  state=JobState.QUEUED, submitted=0.0)


@needs_two_cores
def test_two_jobs_side_by_side_get_disjoint_cores_that_follow_a_resize(tmp_path, monkeypatch):
    runner = ProcessRunner(tmp_path, ClusterConfig(hosts=(("localhost", 2),), device="cpu"))
    monkeypatch.setattr(runner, "command", lambda job, slots, workers, resume: ([sys.executable, "-c", TREE],
                                                                                 dict(os.environ)))
    jobs = [_row(1), _row(2)]
    try:
        runner.start(jobs[0], [0], 1, False)
        runner.start(jobs[1], [1], 1, False)
        trees = []
        deadline = time.time() + 20
        for j in jobs:
            root = psutil.Process(runner._procs[j["id"]].pid)
            while not root.children() and time.time() < deadline:
                time.sleep(0.05)
            trees.append([root] + root.children(recursive=True))
        a = {c for p in trees[0] for c in p.cpu_affinity()}
        b = {c for p in trees[1] for c in p.cpu_affinity()}
        assert len(trees[0]) == 2 and len(trees[1]) == 2  # controller and worker of each job
        assert a == runner.cores([0]) and b == runner.cores([1]) and not (a & b)
        # job 2 stops, job 1 grows onto both slots: its whole tree moves
        assert runner.pin(jobs[0], [0, 1])
        assert all(set(p.cpu_affinity()) == runner.cores([0, 1]) for p in trees[0])
        assert len(runner.cores([0, 1])) == 2
    finally:
        for p in runner._procs.values():
            os.killpg(p.pid, 9)
            p.wait()


def test_jobs_rate_is_work_over_time_of_the_current_size(tmp_path):
    """`jobs` shows images/s as the images of the current launch's windows over their seconds:
    a fast short window and a slow long one give ~the slow rate, not the last or the median."""
    import json

    from elastic_ring.cluster.runner import run_dir

    runner = ProcessRunner(tmp_path, ClusterConfig(hosts=(("localhost", 2),), device="cpu"))
    rd = run_dir(tmp_path, 5)
    rd.mkdir(parents=True)
    ev = [{"kind": "launch", "world_size": 1},
          {"kind": "throughput", "world_size": 1, "images_per_s": 6400.0, "steps_per_s": 200.0, "steps": 100,
           "seconds": 0.5, "step": 100},
          {"kind": "throughput", "world_size": 1, "images_per_s": 640.0, "steps_per_s": 20.0, "steps": 200,
           "seconds": 10.0, "step": 300},
          {"kind": "launch", "world_size": 2},
          {"kind": "throughput", "world_size": 2, "images_per_s": 1000.0, "steps_per_s": 15.6, "steps": 156,
           "seconds": 10.0, "step": 456}]
    (rd / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in ev[:3]))
    obs = runner.observe(_row(5))
    assert obs.images_per_s == pytest.approx((6400 * 0.5 + 640 * 10) / 10.5)
    with open(rd / "events.jsonl", "a") as fh:
        fh.write("".join(json.dumps(e) + "\n" for e in ev[3:]))
    assert runner.observe(_row(5)).images_per_s == pytest.approx(1000.0)  # new size, new sums
