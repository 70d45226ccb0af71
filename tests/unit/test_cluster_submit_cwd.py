"""A cluster job runs where it was submitted: the submitting shell's folder in the request (a store
of an older version without it reads back without it), the relative paths `submit` was given
taken from it, the runner's start in it (a stand-in python records where it ran; a job stored
without a folder runs in the scheduler's), and a job whose folder is gone at its start failed with
one line while the others go on (the scheduler with a fake runner)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

import elastic_ring
from elastic_ring.cluster.api import (ClusterConfig, ClusterError, JobRequest, JobRow, JobStartError, JobState,
                                      job_log)
from elastic_ring.cluster.client import submit
from elastic_ring.cluster.runner import ProcessRunner, failure_reason
from elastic_ring.cluster.scheduler import Scheduler
from elastic_ring.cluster.store import Store
from elastic_ring.sched import make_policy
from tests.unit.test_cluster_scheduler import FakeRunner, _run, _setup


def test_the_request_keeps_its_folder_through_the_store_and_an_older_row_reads_without_one(tmp_path):
    store = Store(tmp_path / "cl", create=True)
    a = store.submit(JobRequest(name="a", kind="script", path="/x/a.py", steps=5, cwd="/home/u/proj"))
    b = store.submit(JobRequest(name="b", kind="script", path="/x/b.py", steps=5))
    # a row as an older version wrote it: its request has no cwd key at all
    old = {k: v for k, v in JobRequest(name="c", kind="script", path="/x/c.py", steps=5).to_dict().items()
           if k != "cwd"}
    store.db.execute("INSERT INTO jobs(name, request, state, submitted) VALUES('c', ?, 'queued', 0)",
                     (json.dumps(old),))
    c = store.db.execute("SELECT id FROM jobs WHERE name='c'").fetchone()["id"]
    assert json.loads(store.db.execute("SELECT request FROM jobs WHERE id=?", (a,)).fetchone()["request"])[
        "cwd"] == "/home/u/proj"
    assert store.job(a).request.cwd == "/home/u/proj"
    assert store.job(b).request.cwd is None and store.job(c).request.cwd is None
    assert store.job(c).request == JobRequest(name="c", kind="script", path="/x/c.py", steps=5)
    with pytest.raises(ClusterError, match="must be absolute"):
        JobRequest(name="d", kind="script", path="/x/d.py", steps=5, cwd="proj")


def test_submit_records_its_folder_and_takes_relative_paths_from_it(tmp_path, monkeypatch):
    user = tmp_path / "user"
    (user / "src").mkdir(parents=True)
    (user / "src" / "train.py").write_text("print('hi')\n")
    (user / "prof.json").write_text("{}")
    Store(tmp_path / "cl", create=True).close()
    monkeypatch.chdir(user)
    job = submit("../cl", "src/train.py", steps=5, profile="prof.json", script_args=("--data", "../data"))
    req = Store(tmp_path / "cl").job(job.job_id).request
    assert req.cwd == str(user.resolve())
    assert req.path == str(user.resolve() / "src" / "train.py")
    assert req.profile == str(user.resolve() / "prof.json")
    assert req.args == ("--data", "../data")  # the script's own: meant from its folder, as given
    # a folder given (not this process's): the same paths taken from it
    monkeypatch.chdir(tmp_path)
    job = submit("../cl", "src/train.py", steps=5, cwd=user)
    req = Store(tmp_path / "cl").job(job.job_id).request
    assert (req.cwd, req.path) == (str(user.resolve()), str(user.resolve() / "src" / "train.py"))


@pytest.fixture
def fake_python(tmp_path, monkeypatch):
    """A stand-in for the controller's python: it writes where it ran and its PYTHONPATH."""
    out = tmp_path / "ran.txt"
    exe = tmp_path / "python"
    exe.write_text('#!/bin/sh\npwd -P > "$ER_TEST_RAN"\nprintf "%s\\n" "$PYTHONPATH" >> "$ER_TEST_RAN"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("ER_TEST_RAN", str(out))
    return exe, out


def _row(jid: int, cwd: str | None) -> JobRow:
    return JobRow(id=jid, name=f"j{jid}", state=JobState.QUEUED, submitted=0.0,
                  request=JobRequest(name=f"j{jid}", kind="script", path="/x/s.py", steps=5, cwd=cwd))


def test_the_runner_starts_a_job_in_its_folder_and_an_older_job_in_its_own(tmp_path, monkeypatch, fake_python):
    exe, out = fake_python
    user, sched_dir = tmp_path / "user", tmp_path / "sched"
    user.mkdir()
    sched_dir.mkdir()
    monkeypatch.chdir(sched_dir)
    monkeypatch.delenv("PYTHONPATH", raising=False)  # the runner must give the package's folder itself
    runner = ProcessRunner(tmp_path / "cl", ClusterConfig(hosts=(("localhost", 2),)), python=str(exe))
    for jid, cwd, where in ((1, str(user), user), (2, None, sched_dir)):
        runner.start(_row(jid, cwd), [0], 1, False)
        assert runner._procs[jid].wait(timeout=30) == 0
        ran, pythonpath = out.read_text().splitlines()[:2]
        assert ran == str(where.resolve())
        # the package is importable from the user's folder (a checkout's, or installed)
        pkg_root = str(Path(elastic_ring.__file__).resolve().parents[1])
        assert pkg_root in pythonpath.split(os.pathsep) or "site-packages" in pkg_root


def test_a_job_whose_folder_is_gone_fails_to_start_with_one_line(tmp_path, fake_python):
    exe, out = fake_python
    runner = ProcessRunner(tmp_path / "cl", ClusterConfig(hosts=(("localhost", 2),)), python=str(exe))
    gone = tmp_path / "gone"
    with pytest.raises(JobStartError) as e:
        runner.start(_row(1, str(gone)), [0], 1, False)
    msg = str(e.value)
    assert "\n" not in msg and f"submitted from {gone}, which is gone" in msg
    assert not out.exists() and 1 not in runner._procs  # nothing started
    log = job_log(runner.dir, 1)
    assert failure_reason(log, tmp_path / "none.jsonl") == msg  # the log's error line says it too
    assert "checkpoints" not in msg
    # a paused job's resume: the same line, saying where its checkpoints stay
    with pytest.raises(JobStartError, match=f"which is gone: .*; its checkpoints stay in {runner.dir}/jobs/2$"):
        runner.start(_row(2, str(gone)), [0], 1, True)


class _GoneRunner(FakeRunner):
    """A fake runner whose job ``gone`` cannot start: its folder is gone."""

    def __init__(self, gone: int):
        super().__init__()
        self.gone = gone

    def start(self, job, slots, workers, resume):
        if job["id"] == self.gone:
            raise JobStartError(f"job {job['id']} (a) was submitted from /nowhere, which is gone: "
                                f"its paths are relative to it")
        return super().start(job, slots, workers, resume)


def test_the_scheduler_fails_a_job_whose_folder_is_gone_and_goes_on(tmp_path):
    store, cfg, _, _ = _setup(tmp_path, slots=2, policy="eight")
    a = store.submit(JobRequest(name="a", kind="script", path="/x/a.py", steps=40, max_workers=2, cwd="/nowhere"))
    b = store.submit(JobRequest(name="b", kind="script", path="/x/b.py", steps=40, max_workers=2))
    runner = _GoneRunner(a)
    clock = iter(range(10 ** 6))
    sched = Scheduler(store, cfg, make_policy("eight"), runner, rate_for=lambda j: (lambda w: float(w)),
                      clock=lambda: float(next(clock)))
    sched.recover()
    _run(store, sched, runner, 2)
    ja, jb = store.job(a), store.job(b)
    assert ja.state == JobState.FAILED and ja.slots == () and ja.message.endswith("which is gone: its paths are "
                                                                                   "relative to it")
    assert jb.state == JobState.FINISHED and jb.step == 40
    assert [s[0] for s in runner.starts] == [b]  # a never started; b got the slots
    assert ("completion", a) in [(d["cause"], d["job_id"]) for d in store.decisions()]
    assert [e.kind for e in store.events(a)].count("failed") == 1
