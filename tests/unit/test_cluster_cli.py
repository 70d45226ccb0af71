"""`submit`, `jobs` and `cluster up` on cluster folders written by hand (no scheduler runs): a bad
submission refused as `train` would refuse it, a failed job's reason and log shown, the job's run
folder in `jobs --json`, and `cluster up` leaving nothing behind when it refuses."""

from __future__ import annotations

import json

import pytest

from elastic_ring.cluster.api import ClusterConfig, JobRequest, JobState, job_dir, job_log
from elastic_ring.cluster.runner import ProcessRunner, failure_reason
from elastic_ring.cluster.store import Store
from tests.conftest import ROOT, one_line_error, run_inproc

CPU_SMALL = str(ROOT / "configs" / "cpu_small.yaml")


@pytest.fixture
def cl(tmp_path):
    """A cluster folder of 2 slots whose scheduler is not running."""
    d = tmp_path / "cl"
    st = Store(d, create=True)
    st.set_meta("config", ClusterConfig(hosts=(("localhost", 2),)).to_dict())
    st.close()
    return d


def test_submit_checks_a_config_as_train_would(capsys, cl):
    r = run_inproc(capsys, "submit", CPU_SMALL, "--set", "bogus=1", "--dir", str(cl))
    one_line_error(r, "unknown key 'bogus'")
    r = run_inproc(capsys, "submit", CPU_SMALL, "--set", "depth=21", "--dir", str(cl))
    one_line_error(r, "depth")
    r = run_inproc(capsys, "submit", CPU_SMALL, "--checkpoint-every", "-1", "--dir", str(cl))
    one_line_error(r, "--checkpoint-every must be >= 0")
    assert Store(cl).jobs() == []  # nothing queued


def test_submit_to_a_folder_without_a_scheduler_queues_and_says_so(capsys, cl):
    r = run_inproc(capsys, "submit", CPU_SMALL, "--steps", "20", "--dir", str(cl))
    assert r.returncode == 0, r.stderr
    assert "job 1 (cpu_small) submitted" in r.stdout
    assert "no scheduler runs on" in r.stderr and "cluster up --dir" in r.stderr
    assert [j["state"] for j in Store(cl).jobs()] == [JobState.QUEUED]


def _jobs_by_hand(cl):
    st = Store(cl)
    a = st.submit(JobRequest(name="bad", kind="config", path=CPU_SMALL))
    b = st.submit(JobRequest(name="gone", kind="script", path="x.py", steps=10))
    c = st.submit(JobRequest(name="ok", kind="script", path="x.py", steps=10))
    st.update(a, state=JobState.FAILED, finished=st.clock(), message="unknown key 'bogus' (known: depth, ...)")
    st.update(b, state=JobState.CANCELLED, finished=st.clock(), message="cancel")
    st.db.execute("UPDATE jobs SET state='succeeded' WHERE id=?", (c,))  # a store of before the rename
    for jid in (a, b, c):
        job_dir(cl, jid).mkdir(parents=True)
        job_log(cl, jid).parent.mkdir(exist_ok=True)
        job_log(cl, jid).write_text("$ python -m elastic_ring.cli.main train ...\n")
    st.close()
    return a, b, c


def test_jobs_shows_a_failed_jobs_reason_and_log_and_one_word_per_state(capsys, cl):
    a, b, c = _jobs_by_hand(cl)
    r = run_inproc(capsys, "jobs", "--dir", str(cl))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert f"job {a} failed: unknown key 'bogus' (known: depth, ...) (log: {job_log(cl, a)})" in lines
    row = {ln.split()[0]: ln.split()[2:4] for ln in lines[1:4]}
    assert row[str(b)][0] == "cancelled" and "(cancel)" not in r.stdout  # not "cancelled (cancel)"
    assert row[str(c)][0] == "finished" and "succeeded" not in r.stdout  # the word of `status`


def test_jobs_json_gives_each_jobs_run_folder_and_log(capsys, cl):
    a, b, c = _jobs_by_hand(cl)
    queued = Store(cl).submit(JobRequest(name="new", kind="script", path="x.py", steps=10))
    r = run_inproc(capsys, "jobs", "--json", "--dir", str(cl))
    assert r.returncode == 0, r.stderr
    out = {j["id"]: j for j in json.loads(r.stdout)}
    for jid in (a, b, c):
        assert out[jid]["run_dir"] == str(job_dir(cl, jid).resolve())
        assert out[jid]["log"] == str(job_log(cl, jid).resolve())
    assert out[queued]["run_dir"] is None and out[queued]["log"] is None  # nothing there yet
    assert [out[j]["state"] for j in (a, b, c)] == ["failed", "cancelled", "finished"]


def test_cluster_up_on_a_new_folder_without_slots_leaves_nothing(capsys, tmp_path):
    d = tmp_path / "new"
    r = run_inproc(capsys, "cluster", "up", "--dir", str(d))
    one_line_error(r, "--slots")
    assert not d.exists()  # no cluster.db, no scheduler.lock
    r = run_inproc(capsys, "jobs", "--dir", str(d))
    one_line_error(r, "no cluster in")


@pytest.mark.parametrize("mark", ["run.json", "ps_config.json", "checkpoints"])
def test_cluster_up_refuses_a_run_folder(capsys, tmp_path, mark):
    run = tmp_path / "run"
    run.mkdir()
    if mark == "checkpoints":
        (run / mark).mkdir()
    else:
        (run / mark).write_text("{}")
    r = run_inproc(capsys, "cluster", "up", "--slots", "2", "--dir", str(run))
    one_line_error(r, "training run's folder", mark)
    assert sorted(p.name for p in run.iterdir()) == [mark]


def test_cluster_web_bind_out_of_range_names_bind(capsys, cl):
    r = run_inproc(capsys, "cluster", "web", "--bind", "99999", "--dir", str(cl))
    one_line_error(r, "--bind port must be 0..65535, got 99999")
    r = run_inproc(capsys, "cluster", "up", "--web", "99999", "--dir", str(cl))
    one_line_error(r, "--web port must be 0..65535")


def test_failure_reason_reads_the_error_line_then_the_error_event(tmp_path):
    log, events = tmp_path / "job-1.log", tmp_path / "events.jsonl"
    assert failure_reason(log, events) is None  # nothing written: nothing to say
    log.write_text("$ python -m elastic_ring.cli.main train --config c.yaml\n"
                   "elastic-ring: error: unknown key 'bogus' (known: depth, width)\n")
    assert failure_reason(log, events) == "unknown key 'bogus' (known: depth, width)"
    log.write_text("step 10/40 workers 2\n")
    events.write_text(json.dumps({"kind": "error", "message": "rank 1 failed: ZeroDivisionError"}) + "\n")
    assert failure_reason(log, events) == "rank 1 failed: ZeroDivisionError"
    log.write_text("elastic-ring train: error: No such option: --bogus (see --help)\n")
    assert failure_reason(log, events) == "No such option: --bogus (see --help)"


def test_the_runner_observes_why_a_dead_controller_ended(cl):
    st = Store(cl)
    jid = st.submit(JobRequest(name="bad", kind="config", path=CPU_SMALL))
    job = st.job(jid)
    job_log(cl, jid).parent.mkdir(parents=True)
    job_log(cl, jid).write_text("elastic-ring: error: unknown key 'bogus'\n")
    obs = ProcessRunner(cl, ClusterConfig(hosts=(("localhost", 2),))).observe(job)
    assert not obs.alive and obs.outcome is None and obs.error == "unknown key 'bogus'"


def test_jobs_and_the_page_say_what_a_running_jobs_run_is_doing(capsys, cl):
    """The scheduler says running; the run itself (its controller's state file, its lock held)
    says resizing: `jobs` and the page's state show both, and plain running once it steps."""
    from elastic_ring.cluster.web import ClusterView
    from elastic_ring.controller.lock import RunLock

    st = Store(cl)
    jid = st.submit(JobRequest(name="grows", kind="script", path="x.py", steps=10))
    st.update(jid, state=JobState.RUNNING, workers=1, slots=json.dumps([["localhost", 0], ["localhost", 1]]))
    st.close()
    run = job_dir(cl, jid)
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"workers": 1, "schedule": [], "slots": 2, "total_steps": 10,
                                              "script": "x.py"}))
    (run / "controller.json").write_text(json.dumps({"state": "stopping", "phase": "resizing", "world_size": 1,
                                                     "resize_from": 1, "pending_world": 2}))
    lock = RunLock(run)
    lock.acquire()
    try:
        r = run_inproc(capsys, "jobs", "--dir", str(cl))
        assert r.returncode == 0, r.stderr
        assert "running (resizing 1 -> 2)" in r.stdout, r.stdout
        (page_job,) = ClusterView(cl).state()["jobs"]
        assert page_job["state"] == "running" and page_job["run_state"] == "resizing 1 -> 2"
        (run / "controller.json").write_text(json.dumps({"state": "running", "phase": "running", "world_size": 2}))
        r = run_inproc(capsys, "jobs", "--dir", str(cl))
        assert "running (" not in r.stdout, r.stdout
        (page_job,) = ClusterView(cl).state()["jobs"]
        assert page_job["run_state"] is None
    finally:
        lock.release()


def test_a_run_of_no_known_length_is_observed_as_such(cl):
    """A torchrun-form script's run records no step limit (``protocol.NO_STEP_LIMIT``): the runner
    reports its length as unknown (0), so that the finished event, ``jobs`` and the scheduler's
    remaining work do not take the sentinel for a length (they once read 4611686018427387904)."""
    from elastic_ring import protocol

    st = Store(cl)
    jid = st.submit(JobRequest(name="t", kind="script", path="x.py", form="torchrun"))
    job = st.job(jid)
    run = job_dir(cl, jid)
    run.mkdir(parents=True)
    runner = ProcessRunner(cl, ClusterConfig(hosts=(("localhost", 2),)))
    (run / "run.json").write_text(json.dumps({"total_steps": protocol.NO_STEP_LIMIT}))
    assert runner.observe(job).total == 0
    (run / "run.json").write_text(json.dumps({"total_steps": 40}))
    assert runner.observe(job).total == 40
