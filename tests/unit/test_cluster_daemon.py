"""The scheduler daemon and the client side of a cluster folder as code (elastic_ring.cluster.daemon,
elastic_ring.cluster.client), with a real store and a fake scheduler: no processes."""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

import pytest

from elastic_ring.cluster import client, daemon
from elastic_ring.cluster.api import ClusterConfig, ClusterError, JobRequest
from elastic_ring.cluster.store import Store
from elastic_ring.errors import UserError


def test_options_and_folder_are_checked_before_anything_is_written(tmp_path):
    for bad in (dict(slots=0), dict(slots=2, hostfile="h"), dict(poll=0.0)):
        kw = {"slots": None, "hostfile": None, "ray_address": None, "poll": 0.5, **bad}
        with pytest.raises(UserError):
            daemon.check_options(**kw)
    (tmp_path / "run.json").write_text("{}")
    with pytest.raises(UserError, match="training run's folder"):
        daemon.check_folder(tmp_path, new_slots=True)
    with pytest.raises(UserError, match="needs --slots"):
        daemon.check_folder(tmp_path / "new", new_slots=False)
    assert not (tmp_path / "new").exists()


def test_config_merges_the_options_with_the_folders_previous_one(tmp_path):
    store = Store(tmp_path, create=True)
    with pytest.raises(UserError, match="a new cluster needs"):
        daemon.merge_config(store, None, None, None, None, None, None, None, 0.5)
    cfg = daemon.merge_config(store, 3, None, None, "srtf", None, None, None, 0.5)
    assert cfg.hosts == (("localhost", 3),) and cfg.policy == "srtf" and cfg.device == "cpu"
    store.set_meta("config", cfg.to_dict())
    again = daemon.merge_config(store, None, None, None, None, None, "lo", None, 1.0)
    assert again.hosts == cfg.hosts and again.policy == "srtf" and again.network_interface == "lo"
    assert again.poll_s == 1.0
    assert "3 CPU worker slot(s) on localhost:3, policy srtf" in daemon.banner(again, tmp_path, None)


class _FakeScheduler:
    """Passes of a scheduler: an event at the first, the drain asked by a SIGTERM at the second;
    done once the store says down."""

    def __init__(self, store):
        self.store, self.passes, self.recovered = store, 0, False
        self.capacity = SimpleNamespace(nodes=())

    def recover(self):
        self.recovered = True

    def tick(self):
        self.passes += 1
        if self.passes == 1:
            self.store.event(1, "started", workers=1)
        if self.passes == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # only sets the loop's flag
        return not self.store.get_meta("down")


def test_the_loop_prints_events_and_drains_on_a_signal(tmp_path):
    store = Store(tmp_path, create=True)
    store.submit(JobRequest(name="j", kind="script", path="x.py", steps=10))
    sched, lines = _FakeScheduler(store), []
    old = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        daemon.loop(store, sched, 0.01, quiet=False, echo=lines.append)
    finally:
        signal.signal(signal.SIGTERM, old[0])
        signal.signal(signal.SIGINT, old[1])
    assert sched.recovered and store.get_meta("down") is True
    assert any(" job 1: started " in x for x in lines)
    assert any(x.startswith("id  name  state") for x in lines)
    assert "draining: running jobs checkpoint and stop" in lines
    assert lines[-1].startswith("cluster down: every job stopped at a checkpoint")


def test_client_submits_cancels_and_shows_jobs(tmp_path):
    store = Store(tmp_path, create=True)
    store.set_meta("config", ClusterConfig(hosts=(("localhost", 2),)).to_dict())
    script = tmp_path / "train_me.py"
    script.write_text("")
    with pytest.raises(ClusterError, match="more than the cluster's 2 slots"):
        client.submit(tmp_path, str(script), steps=10, max_workers=3)
    job = client.submit(tmp_path, str(script), steps=10, script_args=("--hidden", "8"))
    assert job.name == "train_me" and not job.scheduler_running
    table = client.jobs_view(tmp_path)
    assert "train_me" in table and "queued" in table
    # no scheduler runs (the cluster is down): a queued job has no process, it is cancelled at once
    assert client.cancel(tmp_path, "train_me") == f"job {job.job_id} (train_me): cancelled"
    row = store.find(str(job.job_id))
    assert row["cancel"] and row.state.value == "cancelled" and row.finished
    assert [e.kind for e in store.events(job.job_id)][-2:] == ["cancel_requested", "cancelled"]
    with pytest.raises(ClusterError, match="already cancelled"):
        client.cancel(tmp_path, "train_me")
    with pytest.raises(UserError, match="no scheduler runs"):
        daemon.drain(tmp_path)


def test_cancel_while_the_cluster_is_down_says_what_happens(tmp_path):
    """A paused job (stopped at a checkpoint by `cluster down`) is cancelled at once; a job the store
    still calls running (its scheduler gone) waits for `cluster up`, and the line says so; with a
    scheduler running, the request is left for it."""
    from elastic_ring.cluster.api import LOCK_FILE, JobState
    from elastic_ring.controller.lock import try_lock

    store = Store(tmp_path, create=True)
    store.set_meta("config", ClusterConfig(hosts=(("localhost", 2),)).to_dict())
    ids = [store.submit(JobRequest(name=n, kind="script", path="x.py", steps=10)) for n in ("p", "r", "q")]
    store.update(ids[0], state=JobState.PAUSED, message="down")
    store.update(ids[1], state=JobState.RUNNING)
    assert client.cancel(tmp_path, "p") == f"job {ids[0]} (p): cancelled"
    assert store.job(ids[0]).state is JobState.CANCELLED
    line = client.cancel(tmp_path, "r")
    assert line.startswith(f"job {ids[1]} (r): cancel requested; the cluster is down") and "cluster up" in line
    assert store.job(ids[1]).state is JobState.RUNNING and store.job(ids[1]).cancel
    fd = try_lock(tmp_path / LOCK_FILE)  # a scheduler holds the folder: it acts at its next pass
    try:
        assert client.cancel(tmp_path, "q") == f"job {ids[2]} (q): cancel requested"
        assert store.job(ids[2]).state is JobState.QUEUED and store.job(ids[2]).cancel
    finally:
        os.close(fd)
