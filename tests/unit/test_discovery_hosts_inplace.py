"""In place over discovered hosts (docs/hosts.md): the first answer of `--relaunch inplace`'s
discovery decides between the ring over the hosts as listed and this host only; over hosts the
Horovod Elastic backend tells its driver the hosts the controller placed (no slot hosts, no ring
written ahead), a drain request and a worker's notice drain a host (not a slot), and `elastic-ring
drain` accepts such a run. Fakes for the launcher and the ring; real discovery scripts."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from elastic_ring import protocol
from elastic_ring.controller.api import RunSpec
from elastic_ring.controller.backends.api import Backend, SegmentLaunch
from elastic_ring.controller.drains import Drains
from elastic_ring.controller.membership import StateSource
from elastic_ring.controller.segment import Segment
from elastic_ring.events import EventLog, read_events
from elastic_ring.events.api import PreemptNotice
from elastic_ring.hosts.api import HostSet
from elastic_ring.hosts.discovery import ThisHostOnly, several_hosts
from elastic_ring.seam import action_file
from tests.unit.elastic_fakes import Launcher, listed_hosts as _listed


def test_several_hosts_are_more_than_one_name_or_another_machine():
    assert not several_hosts(None) and not several_hosts(HostSet())  # no answer yet: this host
    assert not several_hosts(HostSet([("localhost", 4)]))
    assert several_hosts(HostSet([("localhost", 1), ("127.0.0.1", 1)]))  # two names: two hosts, as horovodrun's
    assert several_hosts(HostSet([("10.9.9.9", 2)]))


def _script(tmp_path: Path, hosts: str) -> tuple[Path, Path]:
    listed = tmp_path / "hosts.txt"
    listed.write_text(hosts)
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {listed}\n")
    script.chmod(0o755)
    return script, listed


@pytest.mark.parametrize("first,over", [("localhost:1\n127.0.0.1:1\n", True), ("localhost:1\n10.9.9.9:1\n", True),
                                        ("localhost:2\n", False)])
def test_in_place_discovery_runs_over_the_hosts_listed_first_or_on_this_host(tmp_path, first, over):
    from elastic_ring.controller.prepare_hosts import host_manager
    from elastic_ring.controller.requests import RunRequest

    script, listed = _script(tmp_path, first)
    hosts = host_manager(RunRequest(host_discovery_script=str(script), relaunch="inplace"), lambda line: None)
    assert hosts.over_hosts is over
    assert isinstance(hosts.poller.discovery, ThisHostOnly) is not over
    if over:  # as listed, by name
        assert hosts.poller.hosts.arg() == ",".join(first.split())
    else:  # this host only: another machine later is left out (this machine's slots taken), in one line
        listed.write_text("localhost:3\n10.9.9.9:1\n")
        got = hosts.poller.discovery.find()
        assert got.hosts == HostSet([("localhost", 3)]) and "10.9.9.9, another machine: not used" in got.note
    # (relaunched over hosts, the decision is not made: no over_hosts)
    plain = host_manager(RunRequest(host_discovery_script=str(script)), lambda line: None)
    assert plain.over_hosts is False and not isinstance(plain.poller.discovery, ThisHostOnly)


def _backend(tmp_path: Path, survive: bool = True):
    from elastic_ring.controller.backends.elastic import ElasticBackend

    spec = RunSpec(run_dir=tmp_path, workers=2, schedule=(), slots=4, device="cpu", total_steps=20)
    launched: list[tuple[list[str], dict]] = []

    return ElasticBackend(spec, launcher=Launcher(launched), survive=survive), launched


def test_over_hosts_the_driver_is_told_the_placed_hosts_by_name(tmp_path):
    b, launched = _backend(tmp_path)
    b.run_over_hosts()
    assert b.over_hosts and not b.slot_hosts  # no slot hosts: a host's workers leave with it
    b.use_hosts("localhost:1,127.0.0.1:1")
    b.start(SegmentLaunch(2, 0, 20, "me"), tmp_path / "seg.log")
    assert _listed(tmp_path) == "localhost:1\n127.0.0.1:1\n"
    cmd, env = launched[0]
    assert cmd[cmd.index("--network-interface") + 1] == "lo"  # every host is this machine
    assert protocol.SLOT_HOSTS_ENV not in env
    b.report_ahead(SegmentLaunch(1, 1, 20, "me"))  # a schedule's ring is not written ahead over hosts
    assert _listed(tmp_path) == "localhost:1\n127.0.0.1:1\n"
    assert not list(protocol.control_dir(tmp_path).glob("inplace-*.json"))
    b.use_hosts("127.0.0.1:1")  # localhost leaves (a drain, a dropped host): the ring re-forms without it
    b.resize_in_place(0, SegmentLaunch(1, 1, 20, "me"), time.time(), StateSource.MEMORY)
    assert _listed(tmp_path) == "127.0.0.1:1\n"
    assert b.leave("127.0.0.1") is False  # a notice drains the host instead (controller.drains)


def test_over_another_machine_horovod_finds_the_interface_and_one_host_stays_as_before(tmp_path):
    b, launched = _backend(tmp_path / "a")
    b.run_over_hosts()
    b.use_hosts("localhost:1,10.9.9.9:2")
    b.start(SegmentLaunch(3, 0, 20, "me"), tmp_path / "seg.log")
    assert _listed(tmp_path / "a") == "localhost:1\n10.9.9.9:2\n" and "--network-interface" not in launched[0][0]
    one, launched = _backend(tmp_path / "b")  # this host only: its slot hosts, as before
    one.use_hosts("localhost:2")
    one.start(SegmentLaunch(2, 0, 20, "me"), tmp_path / "seg.log")
    assert _listed(tmp_path / "b") == "slot0.elastic-ring.invalid:1\nslot1.elastic-ring.invalid:1\n"


class _OverHosts(Backend):
    name = "fake-over-hosts"
    over_hosts = True

    def __init__(self) -> None:
        self.left: list[str] = []

    def leave(self, host: str) -> bool:
        self.left.append(host)
        return True


def _watch(tmp_path: Path):
    from elastic_ring.hosts.api import WorkerBounds
    from elastic_ring.hosts.discovery import FixedHosts, HostPoller
    from elastic_ring.hosts.manager import HostManager
    from elastic_ring.controller.controller import Controller
    from tests.unit.test_controller_drains import StoppingLauncher

    spec = RunSpec(run_dir=tmp_path, workers=2, schedule=(), slots=64, device="cpu", total_steps=30)
    spec.validate()
    manager = HostManager(HostPoller(FixedHosts(HostSet([("localhost", 1), ("127.0.0.1", 1)])), interval_s=0.01),
                          WorkerBounds(1, None))
    ctl = Controller(spec, launcher=StoppingLauncher(tmp_path, 30), out=lambda line: None, poll_s=0.0,
                     show_progress=False, relaunch="sequential", hosts=manager, asked_workers=2)
    return ctl.hosts


def test_over_hosts_a_drain_and_a_notice_drain_hosts_not_slots(tmp_path):
    watch, ring = _watch(tmp_path), _OverHosts()
    lines: list[str] = []
    d = Drains(watch, tmp_path, EventLog(tmp_path / "events.jsonl"), lines.append, time.monotonic, backend=ring)
    assert not d.by_slot
    seg = Segment(index=1, world=2, start_step=1, stop_at=100)
    watch.view(1)
    watch.place(seg)
    protocol.control_dir(tmp_path).mkdir(parents=True, exist_ok=True)
    (protocol.control_dir(tmp_path) / "drain-x.json").write_text(
        json.dumps({"host": "localhost", "deadline": 60, "time": time.time()}))
    protocol.write_json_atomic(protocol.control_dir(tmp_path) / protocol.PROGRESS_FILE, {"step": 3})
    # a worker started in segment 0 (in place it outlives it), now rank 0 after a re-form: its host by name
    d.heard(PreemptNotice(rank=0, segment=0, pid=77, host="127.0.0.1"))
    d.take(seg)
    assert set(d.pending) == {"localhost"} and not read_events(tmp_path / "events.jsonl", kind="error")
    assert "localhost" in watch.manager.drained and "localhost" not in watch.manager.view().usable
    protocol.write_json_atomic(protocol.control_dir(tmp_path) / protocol.PROGRESS_FILE, {"step": 4})
    d.take(seg)  # a step since the notice: it drains the worker's host, no slot leaves
    assert set(d.pending) == {"localhost", "127.0.0.1"} and ring.left == []
    assert "draining 127.0.0.1 (SIGTERM to rank 0): the job shrinks off it at the next agreed step " \
           "(deadline 30 s)" in lines, lines
    d.failed()  # the segment failed first: the notice's drain is withdrawn, the asked one stays
    assert watch.manager.drained == ("localhost",)


def test_drain_of_an_in_place_run_over_two_hosts_is_asked(tmp_path, capsys):
    from elastic_ring.controller.lock import RunLock
    from tests.conftest import run_inproc

    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"workers": 2, "schedule": [], "slots": 2, "total_steps": 60,
                                              "script": None, "relaunch": "inplace",
                                              "host_discovery": {"script": "d.sh", "min_workers": 1}}))
    (run / "controller.json").write_text(json.dumps(
        {"state": "running", "phase": "running", "world_size": 2, "pid": 1, "time": 1.0,
         "usable_hosts": {"localhost": 1, "127.0.0.1": 1}, "draining": []}))
    lock = RunLock(run)
    lock.acquire()
    try:
        r = run_inproc(capsys, "drain", str(run), "127.0.0.1")
        assert r.returncode == 0, r.stderr
        (asked,) = run.glob("control/drain-*.json")
        assert json.loads(asked.read_text())["host"] == "127.0.0.1"
    finally:
        lock.release()


def _failed_ring(tmp_path: Path, hosts: str, pids: list[int], on: list[str], survivors: list[int]):
    """A ring over discovered hosts (``hosts``) whose rank r ran as ``pids[r]`` on ``on[r]``;
    ``survivors`` said they hold steps 6 and 7 (a peer's loss)."""
    from elastic_ring.seam import survivor_file

    b, _ = _backend(tmp_path)  # (--survive)
    b.run_over_hosts()
    b.use_hosts(hosts)
    job = b.start(SegmentLaunch(len(pids), 0, 20, "me"), tmp_path / "seg.log").handle
    for r, (pid, host) in enumerate(zip(pids, on)):
        protocol.write_json_atomic(protocol.pid_dir(tmp_path) / f"seg000-rank{r}.json",
                                   {"rank": r, "pid": pid, "segment": 0, "launch_host": host})
    for r in survivors:
        protocol.write_json_atomic(survivor_file(tmp_path, str(r)), {
            "member": str(r), "rank": r, "pid": pids[r], "held": [6, 7], "time": time.time(), "segment": 0})
    ended = []
    job.inner.kill = lambda: ended.append(True)
    job.inner.poll = lambda: -9 if ended else None
    return b, job, ended


@pytest.mark.parametrize("dead", [0, 1])
def test_over_hosts_a_failed_hosts_survivors_go_on_on_their_own_hosts_rank_0s_death_too(tmp_path, dead):
    """The failed worker's host leaves with it (the controller excludes it: Survival.lost, the
    failure's node); the survivor goes on from step 7 on its own host, whatever its rank (the
    driver renumbers by host), and the ring re-forms on it: the driver is told that host only."""
    import os

    gone = 999_999_999
    pids = [gone, os.getpid()] if dead == 0 else [os.getpid(), gone]
    on = ["127.0.0.1", "localhost"] if dead == 0 else ["localhost", "127.0.0.1"]
    b, job, ended = _failed_ring(tmp_path, "localhost:1,127.0.0.1:1", pids, on, [1 - dead])
    assert job.poll() == 1  # a survivor spoke
    s = b.survivors(wait_s=2.0)
    assert s is not None and not ended, b.refused
    assert (s.step, s.world, s.hosts, s.lost, s.failure.rank, s.failure.node) == (
        7, 1, "localhost:1", ("127.0.0.1",), dead, "127.0.0.1")
    assert b.rejoins is False  # no joiner planned: discovery grows back onto the host after its cooldown
    b.use_hosts(s.hosts)  # (the controller places the survivors' hosts as they are)
    b.resize_in_place(0, SegmentLaunch(1, 1, 20, "me"), time.time(), StateSource.MEMORY)
    assert _listed(tmp_path) == "localhost:1\n"
    assert protocol.read_json(action_file(tmp_path, 0))["rollback_to"] == 7


def test_over_hosts_a_survivor_on_the_failed_host_makes_it_a_restart(tmp_path):
    """localhost:2 lost its rank 1 while its rank 0 survives: the host is left out with every
    worker on it, so the survivors cannot go on in place: the job is ended (the restart from the
    checkpoint, on the other hosts)."""
    import os

    me = os.getpid()
    b, job, ended = _failed_ring(tmp_path, "localhost:2,127.0.0.1:1", [me, 999_999_999, os.getppid()],
                                 ["localhost", "localhost", "127.0.0.1"], [0, 2])
    assert b.survivors(wait_s=2.0) is None and ended
    assert b.refused == "a survivor shares host localhost with the failed worker (the host is left out)"


def test_the_survivors_segment_runs_on_their_hosts_as_they_are_then_on_the_usable_slots(tmp_path):
    """After a failure in place over hosts (Recovery._failed: HostWatch.keep), the next segment's
    size and hosts are the survivors' (here b alone, though a and b are usable: a's worker failed on
    another run's clock); the segment after is placed on the usable slots again."""
    from tests.unit.test_controller_hosts import _controller

    ctl, _, _ = _controller(tmp_path, [("a", 1), ("b", 1)], workers=2)
    watch = ctl.hosts
    watch.keep("b:1")
    assert watch.world(20, 1, 1) == 1  # not the 2 the usable slots allow: no plan change for it
    assert ctl.plan.world_after(20) == ctl.plan.world_after(0)
    assert watch.place(Segment(1, 1, 30)).arg() == "b:1" and watch.hosts_of[1].arg() == "b:1"
    assert watch.kept is None and watch.place(Segment(2, 2, 30)).arg() == "a:1,b:1"


def test_hvdrun_watches_the_controller_named_in_its_command_only_when_it_is_its_parent():
    import os

    from elastic_ring.controller.hvdrun import controller_pid, watch_controller

    parent = os.getppid()
    assert controller_pid(["-np", "2", "python", "-m", "w", "--controller-pid", str(parent), "--", "s"]) == parent
    assert controller_pid(["--controller-pid", str(os.getpid())]) is None  # not its parent: started otherwise
    assert controller_pid(["-np", "2", "python", "x.py"]) is None and controller_pid(["--controller-pid", "x"]) is None
    ended = []
    t = watch_controller(parent + 1, poll_s=0.01, end=lambda: ended.append(True))  # "its parent is gone"
    t.join(timeout=5)
    assert ended == [True]
