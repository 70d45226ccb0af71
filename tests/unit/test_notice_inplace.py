"""Leaving with notice in place on one host, without processes: a worker on a slot host of its own
takes its first SIGTERM as a notice unless the driver's list no longer names its slot (then it is the
driver ending it: it ends); the Horovod Elastic backend drops a leaving worker's slot host at the
next in-place resize, whatever its rank; controller.drains makes a notice's worker leave, or ends it
where the backend cannot take it out."""

from __future__ import annotations

import json
import os
import signal
import time

from elastic_ring import env, protocol
from elastic_ring.controller import hvdrun
from elastic_ring.controller.api import RunSpec
from elastic_ring.controller.backends.api import Backend, SegmentLaunch
from elastic_ring.controller.backends.elastic import ElasticBackend, discovery_files
from elastic_ring.controller.drains import Drains
from elastic_ring.controller.membership import Cause
from elastic_ring.controller.membership import StateSource
from elastic_ring.controller.segment import Segment
from elastic_ring.events import EventLog, read_events
from elastic_ring.events.api import PreemptNotice
from elastic_ring.worker import notice

S0, S1, S2 = (hvdrun.slot_host(i) for i in range(3))


def _in_place(monkeypatch, host: str) -> None:
    monkeypatch.setenv(env.INPLACE, "1")
    monkeypatch.setenv(env.SLOT_HOSTS, "1")
    monkeypatch.setenv("HOROVOD_HOSTNAME", host)
    monkeypatch.setenv("HOROVOD_RANK", "1")


def _listed(run_dir, *hosts: str) -> None:
    f = discovery_files(run_dir)[1]
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text("".join(f"{h}:1\n" for h in hosts))


def test_in_place_the_first_sigterm_is_a_notice_while_the_slot_is_listed(tmp_path, monkeypatch):
    (tmp_path / "run.json").write_text(json.dumps({"workers": 2}))  # no discovery
    _in_place(monkeypatch, S1)
    _listed(tmp_path, S0, S1)
    old = signal.getsignal(signal.SIGTERM)
    try:
        assert notice.install(tmp_path, 0)
        os.kill(os.getpid(), signal.SIGTERM)
        (ev,) = read_events(tmp_path / protocol.WORKER_EVENTS, kind="preempt_notice")
        assert (ev["pid"], ev["host"]) == (os.getpid(), S1)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGTERM, old)


def test_in_place_a_sigterm_after_a_shrink_dropped_the_slot_ends_the_worker(tmp_path, monkeypatch):
    (tmp_path / "run.json").write_text(json.dumps({"workers": 2}))
    _in_place(monkeypatch, S1)
    _listed(tmp_path, S0)  # the driver ends the worker whose slot went
    old = signal.getsignal(signal.SIGTERM)
    killed = []
    try:
        assert notice.install(tmp_path, 0)
        handler = signal.getsignal(signal.SIGTERM)
        monkeypatch.setattr(notice.os, "kill", lambda pid, sig: killed.append((pid, sig)))
        handler(signal.SIGTERM, None)
        assert killed == [(os.getpid(), signal.SIGTERM)]  # the default action again: it ends
        assert not read_events(tmp_path / protocol.WORKER_EVENTS, kind="preempt_notice")
    finally:
        signal.signal(signal.SIGTERM, old)


def test_in_place_on_localhost_k_nothing_is_installed_outside_horovodrun(tmp_path, monkeypatch):
    (tmp_path / "run.json").write_text(json.dumps({"workers": 2}))
    monkeypatch.setenv(env.INPLACE, "1")
    monkeypatch.delenv(env.SLOT_HOSTS, raising=False)
    for k in env.HOROVODRUN_RANK_KEYS:
        monkeypatch.delenv(k, raising=False)
    old = signal.getsignal(signal.SIGTERM)
    assert not notice.install(tmp_path, 0) and signal.getsignal(signal.SIGTERM) is old


def test_in_place_on_localhost_k_a_notice_unless_a_shrink_left_its_local_rank_out(tmp_path, monkeypatch):
    (tmp_path / "run.json").write_text(json.dumps({"workers": 2}))
    monkeypatch.setenv(env.INPLACE, "1")
    monkeypatch.delenv(env.SLOT_HOSTS, raising=False)
    monkeypatch.setenv("HOROVOD_HOSTNAME", "localhost")
    monkeypatch.setenv("HOROVOD_RANK", "1")
    monkeypatch.setenv("HOROVOD_LOCAL_RANK", "1")
    f = discovery_files(tmp_path)[1]
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text("localhost:2\n")
    assert notice.still_listed(tmp_path)
    f.write_text("localhost:1\n")  # a shrink to 1: the driver ends local rank 1
    assert not notice.still_listed(tmp_path)
    old = signal.getsignal(signal.SIGTERM)
    killed = []
    try:
        assert notice.install(tmp_path, 0)  # the controller relaunches without it (controller.drains)
        handler = signal.getsignal(signal.SIGTERM)
        monkeypatch.setattr(notice.os, "kill", lambda pid, sig: killed.append((pid, sig)))
        handler(signal.SIGTERM, None)
        assert killed == [(os.getpid(), signal.SIGTERM)]  # the driver's end, not a notice
        f.write_text("localhost:2\n")
        signal.signal(signal.SIGTERM, handler)
        handler(signal.SIGTERM, None)
        (ev,) = read_events(tmp_path / protocol.WORKER_EVENTS, kind="preempt_notice")
        assert (ev["pid"], ev["host"], ev["rank"]) == (os.getpid(), "localhost", 1)
    finally:
        signal.signal(signal.SIGTERM, old)


class _Horovodrun:
    pid = 1

    def poll(self):
        return None


class _Launcher:
    def start(self, cmd, env, log):
        return _Horovodrun()


def _backend(tmp_path, survive=True) -> ElasticBackend:
    spec = RunSpec(run_dir=tmp_path, workers=3, schedule=(), slots=3, device="cpu", total_steps=100)
    b = ElasticBackend(spec, launcher=_Launcher(), survive=survive)
    b.start(SegmentLaunch(3, 0, 100, ""), tmp_path / "log")
    return b


def _hosts(tmp_path) -> list[str]:
    return discovery_files(tmp_path)[1].read_text().split()


def test_the_elastic_backend_drops_the_leaving_slot_whatever_its_rank(tmp_path):
    b = _backend(tmp_path)
    assert _hosts(tmp_path) == [f"{S0}:1", f"{S1}:1", f"{S2}:1"]
    assert not b.leave("slot9.elastic-ring.invalid")  # not a running worker's
    assert b.leave(S0)  # rank 0: the others are numbered from 0 again
    b.resize_in_place(0, SegmentLaunch(2, 1, 100, ""), time.time(), StateSource.MEMORY)
    assert _hosts(tmp_path) == [f"{S1}:1", f"{S2}:1"]
    assert b.leave(S2)
    assert not b.leave(S1)  # the last worker cannot leave in place
    b.unleave()  # the segment failed first: withdrawn
    b.resize_in_place(1, SegmentLaunch(1, 2, 100, ""), time.time(), StateSource.MEMORY)
    assert _hosts(tmp_path) == [f"{S1}:1"]  # a plain shrink keeps the lowest ranks' slots


def test_without_a_host_per_slot_no_worker_can_be_chosen(tmp_path):
    assert not _backend(tmp_path, survive=False).leave("localhost")


class _Ring(Backend):
    name = "fake-ring"

    def __init__(self, can: bool) -> None:
        self.can, self.left = can, []

    def leave(self, host: str) -> bool:
        self.left.append(host)
        return self.can


def _drains(tmp_path, ring):
    lines: list[str] = []
    d = Drains(None, tmp_path, EventLog(tmp_path / "events.jsonl"), lines.append, time.monotonic, backend=ring)
    return d, lines


def _progress(tmp_path, step: int) -> None:
    protocol.control_dir(tmp_path).mkdir(parents=True, exist_ok=True)
    protocol.write_json_atomic(protocol.control_dir(tmp_path) / protocol.PROGRESS_FILE, {"step": step})


def test_drains_in_place_a_notice_of_any_segment_leaves_once_a_step_is_done(tmp_path):
    ring = _Ring(can=True)
    d, lines = _drains(tmp_path, ring)
    seg = Segment(index=2, world=3, start_step=1, stop_at=100)
    _progress(tmp_path, 10)
    d.heard(PreemptNotice(rank=1, segment=0, pid=4242, host=S1))  # its segment is the one it started in
    d.take(seg)
    assert not d.pending and not ring.left  # no step since: perhaps a failing job's teardown
    _progress(tmp_path, 11)
    d.take(seg)
    assert ring.left == [S1] and d.pending[S1].cause is Cause.PREEMPTED
    assert lines == [f"draining {S1} (SIGTERM to pid 4242): the ring shrinks in place without it at the next "
                     f"agreed step (deadline 30 s)"]


def test_drains_in_place_a_worker_that_cannot_leave_ends_as_before(tmp_path, monkeypatch):
    import elastic_ring.controller.drains as drains_mod

    killed = []
    monkeypatch.setattr(drains_mod.os, "kill", lambda pid, sig: killed.append((pid, sig)))
    d, lines = _drains(tmp_path, _Ring(can=False))
    seg = Segment(index=0, world=1, start_step=1, stop_at=100)
    _progress(tmp_path, 3)
    d.heard(PreemptNotice(rank=0, segment=0, pid=4242, host=""))  # no host named: nothing to stop it by
    d.take(seg)
    _progress(tmp_path, 4)
    d.take(seg)
    assert killed == [(4242, signal.SIGTERM)] and not d.pending
    assert "it cannot leave the ring in place" in lines[0], lines


def test_drains_in_place_a_worker_that_cannot_leave_relaunches_without_it(tmp_path, monkeypatch):
    import elastic_ring.controller.drains as drains_mod

    killed = []
    monkeypatch.setattr(drains_mod.os, "kill", lambda pid, sig: killed.append((pid, sig)))
    d, lines = _drains(tmp_path, _Ring(can=False))  # localhost:K: the driver cannot choose who leaves
    seg = Segment(index=0, world=2, start_step=1, stop_at=100)
    _progress(tmp_path, 3)
    d.heard(PreemptNotice(rank=0, segment=0, pid=4242, host="localhost"))
    d.take(seg)
    assert not d.pending and not d.relaunch  # no step since the notice yet
    _progress(tmp_path, 4)
    d.take(seg)
    assert not killed  # not ended: it trains to the agreed step, where the job stops with a checkpoint
    assert d.relaunch and d.pending["localhost"].cause is Cause.PREEMPTED
    assert lines == ["draining localhost (SIGTERM to pid 4242): the job stops with a checkpoint and goes on "
                     "without it at the next agreed step (deadline 30 s)"]
    d.failed()  # the segment failed first: withdrawn
    assert not d.relaunch
    lines.clear()
    last = Segment(index=1, world=1, start_step=4, stop_at=100)  # the last worker: the job stops there
    d.heard(PreemptNotice(rank=0, segment=1, pid=4343, host="localhost"))
    d.take(last)
    _progress(tmp_path, 5)
    d.take(last)
    assert not killed and d.relaunch
    assert lines == ["draining localhost (SIGTERM to pid 4343): the job stops with a checkpoint (the last "
                     "worker) at the next agreed step (deadline 30 s)"]


def test_drains_in_place_refuse_a_drain_request(tmp_path):
    d, _ = _drains(tmp_path, _Ring(can=True))
    (tmp_path / "control").mkdir(exist_ok=True)
    (tmp_path / "control" / "drain-x.json").write_text(json.dumps({"host": "localhost", "deadline": 5, "time": 1}))
    d.take(Segment(index=0, world=2, start_step=1, stop_at=100))
    (err,) = read_events(tmp_path / "events.jsonl", kind="error")
    assert err["message"] == "drain of localhost refused: the run runs in place on one host" and not d.pending


def test_in_place_discovery_is_one_host_its_aliases_summed_another_host_left_out_in_one_line():
    from elastic_ring.controller.requests import RunRequest, check
    from elastic_ring.hosts.api import HostSet
    from elastic_ring.hosts.discovery import FixedHosts, ThisHostOnly

    check(RunRequest(host_discovery_script="discover.sh", relaunch="inplace"))  # allowed: the start checks the hosts
    fixed = FixedHosts(HostSet([("localhost", 1), ("127.0.0.1", 2)]))
    only = ThisHostOnly(fixed, "discovery script d.sh")
    got = only.find()
    assert got.hosts == HostSet([("localhost", 3)]) and only.foreign is None
    assert got.note == ("discovery script d.sh lists localhost, 127.0.0.1: names of this machine, their slots this "
                        "host's (localhost:3): the ring is in place on this host only")
    assert only.find().note is None  # said once
    fixed.set(HostSet([("localhost", 1), ("10.9.9.9", 1)]))
    got = only.find()  # the other machine is left out, this machine's slots taken
    assert got.hosts == HostSet([("localhost", 1)]) and only.foreign == "10.9.9.9" and got.error is None
    assert got.note == ("discovery script d.sh lists 10.9.9.9, another machine: not used (this run's ring is in place "
                        "on this host only, its first answer listed this host alone; to train over several machines "
                        "in place, start with them listed, or use another --relaunch mode); using localhost:1")
    assert only.find().note is None  # said once, while it is listed


def test_drain_of_an_in_place_run_is_refused_in_one_line(tmp_path, capsys):
    from elastic_ring.controller.lock import RunLock
    from tests.conftest import one_line_error, run_inproc

    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"workers": 2, "schedule": [], "slots": 2, "total_steps": 60,
                                              "script": None, "relaunch": "inplace",
                                              "host_discovery": {"script": "d.sh", "min_workers": 1}}))
    (run / "controller.json").write_text(json.dumps(
        {"state": "running", "phase": "running", "world_size": 2, "pid": 1, "time": 1.0,
         "usable_hosts": {"localhost": 2}, "draining": []}))
    lock = RunLock(run)
    lock.acquire()
    try:
        one_line_error(run_inproc(capsys, "drain", str(run), "localhost"),
                       f"run {run} runs in place on one host (--relaunch inplace): there is no host to drain")
        assert not list(run.glob("control/drain-*.json"))
    finally:
        lock.release()
