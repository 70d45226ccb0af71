"""Survivors go on after a failure (``--survive``), without processes: the agreement on the step
every survivor holds, the copy kept in memory, the Ray backend's side (the survivors' records read,
the ring going on without the failed member, the rollback step in its action) and the worker's
side (its record, the controller's word, the copy the next restore loads), with fakes."""

from __future__ import annotations

import json
import os
import time

import pytest

from elastic_ring import protocol
from elastic_ring.controller.api import RunSpec
from elastic_ring.controller.backends.api import Backend, SegmentLaunch
from elastic_ring.controller.backends.ray import make_ray_backend
from elastic_ring.controller.backends.ray_group import RayGroup
from elastic_ring.controller.backends.ray_members import Member
from elastic_ring.controller.backends.ray_ring import RingFormer
from elastic_ring.controller.membership import StateSource
from elastic_ring.worker import session, survive
from elastic_ring.seam import action_file
from elastic_ring.seam import common_step, survivor_file
from elastic_ring.worker.survive import MemoryCopy


@pytest.mark.parametrize("held, step", [
    ([[4, 5]], 5),  # one survivor: its newest step
    ([[4, 5], [4, 5]], 5),
    ([[5, 6], [4, 5]], 5),  # one applied step 6, the other did not: the older step, redone by both
    ([[5, 6], [4, 5], [5, 6]], 5),
    ([[3, 4], [5, 6]], None),  # no step in common: the disk checkpoint
    ([], None),  # no survivor
    ([[4, 5], []], None),
])
def test_the_survivors_agree_on_the_newest_step_they_all_hold(held, step):
    assert common_step(held) == step


def test_the_memory_copy_keeps_the_last_two_completed_steps():
    taken, given = [], []
    copy = MemoryCopy(lambda s, into: taken.append(s) or given.append(into) or {"step": s})
    for s in (0, 1, 1, 2, 3):
        copy.keep(s)
    assert copy.held() == [2, 3] and taken == [0, 1, 2, 3]  # a step kept again is not copied again
    assert copy.copies[3] == {"step": 3}
    assert given == [None, None, {"step": 0}, {"step": 1}]  # the oldest copy let go, its tensors reused


class _Nodes:
    def __init__(self, gone=()):
        self.gone = set(gone)

    def node_alive(self, node_id):
        return True

    def process_gone(self, info):
        return info["pid"] in self.gone


class _Server:
    def stop(self):
        pass


def _backend(tmp_path, survive_on=True, gone=()):
    """A Ray backend of two members whose rank 1 was killed (the group has named it), over a fake
    cluster view and ring former; ``ended``: the actors it ended."""
    spec = RunSpec(run_dir=tmp_path, workers=2, schedule=(), slots=2, device="cpu", total_steps=20)
    b = make_ray_backend(spec, warm_spares=0, survive=survive_on)
    b.rings = RingFormer(serve=lambda slots: (_Server(), 4000), ip=lambda: "10.0.0.9")
    b.cluster.process_gone = _Nodes(gone).process_gone
    members = [Member(f"w{r + 1}", f"actor{r}", {"node_id": f"node{r}" * 4, "ip": "10.0.0.1", "iface": "lo",
                                                 "pid": 100 + r, "host": "h"}, rank=r, ref=object())
               for r in range(2)]
    ended = []
    g = RayGroup(_Nodes(gone), tmp_path, ended.append, members, t_start=time.time() - 5)
    g._failed_seen.append((members[1], None, time.time() - 1))
    members[1].ref = None
    g.failure = protocol.Failure(1, "ActorDiedError", "worker rank 1 on Ray node node1 failed", node="node1")
    g.rc = 1
    b.group, b.launch = g, SegmentLaunch(2, 0, 20, "me")
    protocol.control_dir(tmp_path).mkdir(parents=True, exist_ok=True)
    return b, g, members, ended


def _say_held(tmp_path, member, pid, held, segment=0):
    protocol.write_json_atomic(survivor_file(tmp_path, member), {"member": member, "pid": pid, "held": held,
                                                                 "time": time.time(), "segment": segment})


def test_the_backend_takes_a_failure_as_a_shrink_when_the_survivors_hold_a_common_step(tmp_path):
    b, g, (m0, m1), ended = _backend(tmp_path)
    _say_held(tmp_path, "w1", 100, [6, 7])
    s = b.survivors(wait_s=2.0)
    assert s is not None and (s.step, s.world, s.failure.rank, s.failure.node) == (7, 1, 1, "node1")
    assert g.members == [m0] and g.rc is None and g.failure is None and ended == ["actor1"]
    assert not g.failing
    assert not survivor_file(tmp_path, "w1").exists()  # read once
    # the in-place resize that follows: the survivors' ring, rolled back to the step they hold
    b.resize_in_place(0, SegmentLaunch(1, 1, 20, "me"), time.time(), StateSource.MEMORY)
    act = protocol.read_json(action_file(tmp_path, 0))
    assert act["rollback_to"] == 7 and act["to"] == 1 and set(act["members"]) == {"w1"}
    assert act["members"]["w1"]["HOROVOD_RANK"] == "0" and act["members"]["w1"]["HOROVOD_SIZE"] == "1"


@pytest.mark.parametrize("case", ["off", "silent", "gone", "no rank", "stale record", "other segment"])
def test_the_backend_falls_back_to_the_checkpoint(tmp_path, case):
    b, g, (m0, m1), ended = _backend(tmp_path, survive_on=case != "off", gone={100} if case == "gone" else ())
    if case == "no rank":
        g.failure = protocol.Failure(None, "PeerLost", "no rank")
    if case not in ("silent", "stale record", "other segment"):
        _say_held(tmp_path, "w1", 100, [6, 7])
    if case == "other segment":  # it failed while the ring was re-formed for the next one
        _say_held(tmp_path, "w1", 100, [6, 7], segment=1)
    if case == "stale record":  # another process's (an earlier ring's) record
        _say_held(tmp_path, "w1", 999, [6, 7])
    assert b.survivors(wait_s=0.3) is None
    assert g.rc == 1 and g.members == [m0, m1] and not ended  # untouched: the restart ends them
    said = {"off": None, "silent": "1 worker(s) neither said", "gone": "rank(s) [0] died too",
            "no rank": "the failure names no rank", "stale record": "1 worker(s) neither said",
            "other segment": "a survivor spoke of another segment"}[case]
    assert b.refused == said if said is None else b.refused.startswith(said), b.refused


def test_a_survivor_says_what_it_holds_and_goes_on_as_the_controller_says(tmp_path, monkeypatch):
    """The worker's side: a peer's loss (not its own error) writes its record, waits for the word
    naming the new ring and the step, re-forms its ring, and leaves that step's copy to the next
    restore; a word without this member retires it (the ring's ``reform`` raises)."""
    class HorovodInternalError(RuntimeError):
        pass

    import torch

    from elastic_ring.worker.ring import Ring as RealRing

    class Ring:
        in_place, connected, reformed, threads = True, True, None, None
        keep_threads = RealRing.keep_threads
        dropped: list = []  # whether its word was written when it dropped its links, at each drop

        def drop_links(self):
            self.dropped.append(survivor_file(tmp_path, "w1").exists())
            return 0

        def reform(self, action):
            self.reformed = action
            torch.set_num_threads(threads_before + 1)  # a smaller ring's share of the host's cores

    class Start:
        def restart(self, t0):
            self.t0 = t0

        def mark(self, name):
            self.mark_ = name

    class Job:
        run_dir, rank, ring = tmp_path, 0, Ring()
        state = type("State", (), {"model": None})()
        seg = type("Seg", (), {"number": 3, "step": 8})()
        progress = type("P", (), {"start": Start()})()

    monkeypatch.setenv("ELASTIC_RING_MEMBER", "w1")
    monkeypatch.setattr(survive, "WAIT_S", 0.3)
    job = Job()
    session.reset()
    survive.reset()
    session.started(job)
    threads_before = torch.get_num_threads()
    try:
        survive._P.copy = MemoryCopy(lambda s, into: {"step": s})
        for s in (6, 7, 8):
            survive._P.copy.keep(s)
        assert survive.survived(ValueError("its own bug")) is None  # not a peer's loss
        assert job.ring.dropped == []  # (its own error: its peers are not lost to it)
        assert survive.survived(HorovodInternalError("gloo: connection closed")) is None  # no word in time
        assert job.ring.dropped == [False]  # its links dropped at a peer's loss, before it wrote its word
        rec = protocol.read_json(survivor_file(tmp_path, "w1"))
        assert rec["held"] == [7, 8] and rec["segment"] == 3 and rec["rank"] == 0
        assert sorted(rec["digests"]) == ["7", "8"] and rec["digests"]["7"] != rec["digests"]["8"]  # each copy's
        protocol.write_json_atomic(action_file(tmp_path, 3), {
            "action": "resize", "to": 1, "segment": 4, "stop_at": 20, "rollback_to": 7, "members": {"w1": {}}})
        ring, segment, stop_at, start = survive.survived(HorovodInternalError("gloo: connection closed"))
        assert ring is job.ring and (segment, stop_at) == (4, 20) and ring.reformed.rollback_to == 7
        # the survivor keeps its intra-op threads (not the smaller ring's share), and says so to its job
        assert torch.get_num_threads() == threads_before and ring.threads == threads_before
        assert survive.take_rollback() == {"step": 7} and survive.take_rollback() is None
        assert survive._P.copy.held() == []  # the steps after the rollback are copied again
    finally:
        torch.set_num_threads(threads_before)
        session.reset()
        survive.reset()


def test_survive_goes_with_the_ray_backend_or_inplace(capsys, tmp_path):
    from tests.conftest import run_inproc

    p = run_inproc(capsys, "train", "--gpus", "1", "--steps", "4", "--survive", "--relaunch", "overlap",
                   "--run-dir", str(tmp_path / "r"))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "--survive goes with --backend ray or --relaunch inplace" in p.stderr


class _Ring:
    """A fake Ray ring for the controller: segment 0 (2 workers) fails after step 5 with rank 1
    dead; its survivor holds step 4; the in-place resize to the survivors' segment finishes the run."""

    pid = 4242

    def __init__(self, run_dir, total):
        from elastic_ring.events import EventLog

        self.run_dir, self.total = run_dir, total
        self.log = EventLog(run_dir / protocol.WORKER_EVENTS)
        self.segment, self.world, self.start, self.polls, self.rc = 0, 2, 0, 0, None

    def poll(self):
        from elastic_ring.events import FirstStep, SegmentEnd

        if self.rc is not None:
            return self.rc
        self.polls += 1
        if self.polls == 1:
            self.log.write(FirstStep(segment=self.segment, world_size=self.world, step=self.start + 1,
                                     since_launch_s=0.5, lr=0.1 * self.world))
        elif self.segment == 0 and self.polls == 2:
            protocol.write_json_atomic(protocol.control_dir(self.run_dir) / protocol.PROGRESS_FILE,
                                       {"step": 5, "time": time.time()})
            self.rc = 1
        elif self.segment > 0 and self.polls == 2:
            self.log.write(SegmentEnd(segment=self.segment, world_size=self.world, step=self.total,
                                      reason="finished", lr=0.1, stop_decided_at=time.time()))
        elif self.segment > 0:
            self.rc = 0
        return self.rc

    def kill(self):
        self.rc = -9 if self.rc is None else self.rc


class _Backend(Backend):
    name = "fake-ray"

    def __init__(self, run_dir, total):
        self.run_dir, self.total, self.ring, self.resized = run_dir, total, None, []

    def start(self, launch, log_path):
        from elastic_ring.controller.backends.api import Started

        self.ring = _Ring(self.run_dir, self.total)
        return Started(self.ring, ["fake"])

    def survivors(self):
        from elastic_ring.controller.backends.api import Survival

        self.ring.rc = None  # the ring goes on without rank 1
        return Survival(4, 1, protocol.Failure(1, "ActorDiedError", "worker rank 1 on Ray node n1 failed",
                                               node="n1 (10.0.0.2)"))

    def resize_in_place(self, paused_segment, launch, t_launch, source):
        self.resized.append((paused_segment, launch.world, launch.segment, launch.stop_at, source))
        r = self.ring
        r.segment, r.world, r.start, r.polls = launch.segment, launch.world, 4, 0

    def report_ahead(self, launch):
        pass

    def retract_ahead(self, segment):
        return True

    def ask_exit(self, paused_segment, t):
        pass

    def usable_slots(self, want):
        return want

    def first_failed_rank(self, log_path):
        return None

    def failure_detail(self):
        return None

    def close(self):
        pass


@pytest.mark.parametrize("max_restarts", [3, 0])
def test_the_controller_takes_a_failure_with_survivors_as_a_shrink(tmp_path, max_restarts):
    """No restart from the checkpoint: a ``restart`` event with path "memory" (the dead rank and node,
    the step rolled back to, the steps redone, the survivors' count), an in-place resize of the
    paused segment to the survivors' size from that step, a ``failure`` entry in the plan and a
    ``recovered`` event; the failure still counts toward ``--max-restarts``."""
    from elastic_ring.controller.backends.resize import InPlace
    from elastic_ring.controller.controller import Controller
    from elastic_ring.errors import WorkerFailedError
    from elastic_ring.events import read_events

    total = 10
    spec = RunSpec(run_dir=tmp_path, workers=2, schedule=(), slots=2, device="cpu", total_steps=total)
    b = _Backend(tmp_path, total)
    ctl = Controller(spec, out=lambda s: None, poll_s=0.0, show_progress=False, backend=b, resize=InPlace(b),
                     max_restarts=max_restarts)
    if max_restarts == 0:
        with pytest.raises(WorkerFailedError, match="rank 1"):
            ctl.run(0, 2, 0)
    else:
        ctl.run(0, 2, 0)
    (r,) = read_events(tmp_path / "events.jsonl", kind="restart")
    assert (r["path"], r["rank"], r["node"], r["from_step"], r["failed_at_step"], r["steps_redone"]) == \
        ("memory", 1, "n1 (10.0.0.2)", 4, 5, 1), r
    if max_restarts == 0:
        assert r["gave_up"] and not b.resized
        return
    assert r["new_world_size"] == 1 and not r["gave_up"]
    assert b.resized == [(0, 1, 1, total, StateSource.MEMORY)]  # segment 0's survivors go on as segment 1, from memory
    (rec,) = read_events(tmp_path / "events.jsonl", kind="recovered")
    assert rec["path"] == "memory" and rec["from_step"] == 4 and rec["world_size"] == 1
    assert [4, 1, "failure"] in json.loads((tmp_path / protocol.PLAN_FILE).read_text())["changes"]


def test_a_restart_says_why_the_survivors_did_not_go_on_from_memory(tmp_path):
    """Under --survive, when the backend's survivors cannot go on, the restart from the checkpoint
    that follows says why (``memory_refused``), in its event and in its line."""
    from elastic_ring.controller.backends.resize import InPlace
    from elastic_ring.controller.controller import Controller
    from elastic_ring.errors import WorkerFailedError
    from elastic_ring.events import read_events

    class Refusing(_Backend):
        refused = None

        def survivors(self):
            self.refused = "the survivors hold no step in common (they hold [3, 4]; [5, 6])"
            return None

    spec = RunSpec(run_dir=tmp_path, workers=2, schedule=(), slots=2, device="cpu", total_steps=10)
    b, said = Refusing(tmp_path, 10), []
    with pytest.raises(WorkerFailedError):  # (the fake ring fails the same way again: given up)
        Controller(spec, out=said.append, poll_s=0.0, show_progress=False, backend=b, resize=InPlace(b),
                   max_restarts=1).run(0, 2, 0)
    first = read_events(tmp_path / "events.jsonl", kind="restart")[0]
    assert first["path"] == "disk" and first["memory_refused"] == b.refused
    assert any(line.endswith(f"not from memory: {b.refused}") for line in said), said


@pytest.mark.parametrize("total, joins", [(10, True), (5, False)])
def test_a_new_worker_takes_the_dead_ones_place_after_the_survivors_next_step(tmp_path, total, joins):
    """A backend that starts a new worker on a grow (``rejoins``: Horovod Elastic's host discovery
    gives the slot back): the plan grows back to the size it had, after the survivors' first step
    at the size left (a ``joiner`` entry), unless no step is left for it."""
    from elastic_ring.controller.backends.resize import InPlace
    from elastic_ring.controller.controller import Controller

    spec = RunSpec(run_dir=tmp_path, workers=2, schedule=(), slots=2, device="cpu", total_steps=total)
    b = _Backend(tmp_path, total)
    b.rejoins = True
    said = []
    Controller(spec, out=said.append, poll_s=0.0, show_progress=False, backend=b, resize=InPlace(b)).run(0, 2, 0)
    changes = json.loads((tmp_path / protocol.PLAN_FILE).read_text())["changes"]
    assert changes == ([[4, 1, "failure"], [5, 2, "joiner"]] if joins else [[4, 1, "failure"]])
    assert b.resized[0] == (0, 1, 1, 5 if joins else total, StateSource.MEMORY)  # it stops for the joiner
    assert any("join after step 5" in line for line in said) == joins


@pytest.mark.parametrize("t_failure", [90.0, None])
def test_the_joiners_first_step_says_the_time_from_the_failure_and_the_broadcast(tmp_path, t_failure):
    """The first step back at the size after a joiner's grow: ``since_failure_s`` (the failure seen to
    the job back at its size) and ``joiner`` "broadcast"; neither for any other resize."""
    from elastic_ring.controller.meter import Meter, PendingResize
    from elastic_ring.events import EventLog, FirstStep, read_events
    from elastic_ring.worker.lr import RULES

    m = Meter(EventLog(tmp_path / "events.jsonl"), RULES["linear"])
    m.pending = PendingResize(1, 2, step=4, t_request=100.0, lr_last=0.1, segment=1, t_failure=t_failure)
    m.relaunched(2, t_launch=100.5)
    m.first_step(2, FirstStep(segment=2, world_size=2, step=5, since_launch_s=3.0, lr=0.2, time=103.5),
                 t_launch=100.5, prelaunched=False)
    (ev,) = read_events(tmp_path / "events.jsonl", kind="first_step_after_resize")
    assert (ev["since_failure_s"], ev["joiner"]) == ((13.5, "broadcast") if t_failure else (None, None))


# ---------------------------------------------------------------------- --relaunch inplace (Horovod Elastic)
class _Horovodrun:
    """horovodrun's handle: running until killed."""

    pid = 4343

    def __init__(self):
        self.rc = None

    def poll(self):
        return self.rc

    def kill(self):
        self.rc = -9


def _elastic(tmp_path, pids, world=2, device="cpu", hosts=None):
    """An Elastic backend with --survive, its horovodrun (a fake) running segment 0 at ``world`` workers
    whose ranks' processes are ``pids`` (on CPUs rank r on slot host ``hosts[r]``, by default slot r)."""
    from elastic_ring.controller import hvdrun
    from elastic_ring.controller.backends.elastic import ElasticBackend

    spec = RunSpec(run_dir=tmp_path, workers=world, schedule=(), slots=world, device=device, total_steps=20)
    launched = []

    class Launcher:
        def start(self, cmd, env, log_path):
            launched.append(env)
            return _Horovodrun()

    b = ElasticBackend(spec, launcher=Launcher(), survive=True)
    started = b.start(SegmentLaunch(world, 0, 20, "me"), tmp_path / "seg.log")
    assert launched[0][survive.SURVIVE_ENV] == "1"
    assert launched[0].get(protocol.SLOT_HOSTS_ENV) == ("1" if device == "cpu" else None)
    hosts = hosts or [hvdrun.slot_host(r) for r in range(world)]
    for r, pid in enumerate(pids):
        protocol.write_json_atomic(protocol.pid_dir(tmp_path) / f"seg000-rank{r}.json",
                                   {"rank": r, "pid": pid, "segment": 0,
                                    "launch_host": hosts[r] if device == "cpu" else "localhost"})
    return b, started.handle


def _hosts_file(tmp_path) -> list[str]:
    from elastic_ring.controller.backends.elastic import discovery_files

    return discovery_files(tmp_path)[1].read_text().splitlines()


def _said(tmp_path, rank, pid, held, segment=0):
    protocol.write_json_atomic(survivor_file(tmp_path, str(rank)), {
        "member": str(rank), "rank": rank, "pid": pid, "held": held, "time": time.time(), "segment": segment})


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_inplace_a_worker_lost_is_seen_and_the_survivors_go_on_from_the_step_they_hold(tmp_path, device):
    """horovodrun stays up (its driver keeps the host); the handle reports the failure once a
    survivor has spoken; rank 1's process is gone: rank 0 goes on alone from step 7, the resize
    that follows writes the host list (on CPUs rank 0's slot host; on GPUs ``localhost:1``) and
    the rollback step, and the job is watched again."""
    import os

    from elastic_ring.controller import hvdrun

    b, h = _elastic(tmp_path, [os.getpid(), 999_999_999], device=device)
    assert _hosts_file(tmp_path) == ([f"{hvdrun.slot_host(0)}:1", f"{hvdrun.slot_host(1)}:1"] if device == "cpu"
                                     else ["localhost:2"])
    assert h.poll() is None
    _said(tmp_path, 0, os.getpid(), [6, 7])
    assert h.poll() == 1
    s = b.survivors(wait_s=2.0)
    assert s is not None and (s.step, s.world, s.failure.rank, s.failure.type) == (7, 1, 1, "Killed")
    assert h.poll() is None and h.inner.rc is None  # the job goes on
    b.resize_in_place(0, SegmentLaunch(1, 1, 20, "me"), time.time(), StateSource.MEMORY)
    act = protocol.read_json(action_file(tmp_path, 0))
    assert act["rollback_to"] == 7 and act["to"] == 1 and act["segment"] == 1
    assert _hosts_file(tmp_path) == ([f"{hvdrun.slot_host(0)}:1"] if device == "cpu" else ["localhost:1"])


def test_inplace_on_cpus_rank_0_lost_the_survivor_keeps_its_slot_host_and_the_joiner_gets_a_new_one(tmp_path):
    """Each worker slot a host of its own: rank 0 (on slot host 1 here: Horovod orders the hosts)
    dies; rank 1 goes on alone from step 7 on its own slot host, the dead one's host is dropped,
    and the grow back adds a slot host no worker held (never the dead one's)."""
    import os

    from elastic_ring.controller import hvdrun

    b, h = _elastic(tmp_path, [999_999_999, os.getpid()], hosts=[hvdrun.slot_host(1), hvdrun.slot_host(0)])
    _said(tmp_path, 1, os.getpid(), [6, 7])
    s = b.survivors(wait_s=2.0)
    assert s is not None and (s.step, s.world, s.failure.rank) == (7, 1, 0)
    b.resize_in_place(0, SegmentLaunch(1, 1, 20, "me"), time.time(), StateSource.MEMORY)
    assert protocol.read_json(action_file(tmp_path, 0))["rollback_to"] == 7
    assert _hosts_file(tmp_path) == [f"{hvdrun.slot_host(0)}:1"]
    protocol.write_json_atomic(protocol.pid_dir(tmp_path) / "seg001-rank0.json",  # the survivor, now rank 0
                               {"rank": 0, "pid": os.getpid(), "segment": 1, "launch_host": hvdrun.slot_host(0)})
    b.resize_in_place(1, SegmentLaunch(2, 2, 20, "me"), time.time(), StateSource.PEER)
    assert _hosts_file(tmp_path) == [f"{hvdrun.slot_host(0)}:1", f"{hvdrun.slot_host(2)}:1"]


def test_inplace_on_cpus_a_scheduled_shrink_keeps_the_lowest_ranks_slot_hosts(tmp_path):
    """As Horovod on ``localhost:K`` ends the highest ranks at a shrink, the slot hosts kept are
    ranks 0..K-1's (from their pid records), whatever order the hosts were listed in."""
    import os

    from elastic_ring.controller import hvdrun

    me = os.getpid()
    b, _ = _elastic(tmp_path, [me, me, me], world=3,
                    hosts=[hvdrun.slot_host(2), hvdrun.slot_host(0), hvdrun.slot_host(1)])
    b.resize_in_place(0, SegmentLaunch(2, 1, 20, "me"), time.time(), StateSource.MEMORY)
    assert sorted(_hosts_file(tmp_path)) == [f"{hvdrun.slot_host(0)}:1", f"{hvdrun.slot_host(2)}:1"]


@pytest.mark.parametrize("case", ["rank 0 lost on GPUs", "silent", "no common step", "off"])
def test_inplace_the_restart_from_the_checkpoint_when_the_survivors_cannot_go_on(tmp_path, case):
    """A lost rank below a survivor's on ``localhost:K`` (a GPU run: its slot would leave a hole),
    a survivor that never speaks, no step in common: the job is ended (the controller restarts it
    from the checkpoint)."""
    import os

    alive, dead = os.getpid(), 999_999_999
    pids = {"rank 0 lost on GPUs": [dead, alive], "off": [alive, dead]}.get(case, [alive, alive, dead])
    b, h = _elastic(tmp_path, pids, world=len(pids), device="cuda" if "GPUs" in case else "cpu")
    if case == "off":
        b.survive = False
    if case == "rank 0 lost on GPUs":
        _said(tmp_path, 1, alive, [6, 7])
    elif case == "silent":  # rank 1 is alive and never says
        _said(tmp_path, 0, alive, [6, 7])
    else:
        _said(tmp_path, 0, alive, [3, 4])
        _said(tmp_path, 1, alive, [5, 6])
    assert b.survivors(wait_s=0.3) is None
    if case != "off":
        assert h.inner.rc == -9  # ended
    # what the restart's memory_refused says
    assert b.refused == {"rank 0 lost on GPUs": "rank(s) [0] below a survivor's are gone (one host's slots, a GPU run)",
                         "silent": "1 worker(s) neither said which steps they hold nor were gone within the wait",
                         "no common step": "the survivors hold no step in common (they hold [3, 4]; [5, 6])",
                         "off": None}[case]


def test_slot_hosts_are_this_machine_for_horovodrun(monkeypatch):
    """horovodrun resolves a slot host to this machine (no ssh, not a remote host); other names as before."""
    from horovod.runner.util import network

    from elastic_ring import hvd_patches
    from elastic_ring.controller import hvdrun

    monkeypatch.setattr(network, "resolve_host_address", network.resolve_host_address)
    hvd_patches.apply("slot_hosts")
    hvd_patches.apply("slot_hosts")  # once
    assert network.resolve_host_address(hvdrun.slot_host(3)) == "127.0.0.1"
    assert network.resolve_host_address("localhost") == "127.0.0.1"
    assert network.resolve_host_address("no-such-host.invalid") is None
    assert network.filter_local_addresses([hvdrun.slot_host(0), hvdrun.slot_host(7), "no-such-host.invalid"]) == \
        ["no-such-host.invalid"]
    assert hvdrun.is_slot_host(hvdrun.slot_host(12)) and not hvdrun.is_slot_host("elastic-ring.invalid")


def test_inplace_the_driver_keeps_a_host_whose_worker_failed(monkeypatch):
    """Under --survive horovodrun's driver blacklists no host (on one host that would end the job)
    and reads the host list again before it assigns the next ring's ranks."""
    from horovod.runner.elastic import driver
    from horovod.runner.elastic.discovery import HostManager

    from elastic_ring import hvd_patches

    monkeypatch.setattr(HostManager, "blacklist", HostManager.blacklist)
    monkeypatch.setattr(driver.ElasticDriver, "resume", driver.ElasticDriver.resume)
    hvd_patches.apply("resume", "blacklist")
    hvd_patches.apply("resume", "blacklist")  # once
    assert HostManager.blacklist(object(), "localhost") is None
    seen = []

    class Hosts:
        def update_available_hosts(self):
            seen.append("read")

    class Driver:
        _wait_hosts_cond = __import__("threading").Condition()
        _host_manager = Hosts()
        _min_num_proc = 1

        def _activate_workers(self, n):
            seen.append(("activate", n))

    driver.ElasticDriver.resume(Driver())
    assert seen == ["read", ("activate", 1)]


def test_inplace_the_driver_hands_the_next_slot_to_the_warm_joiner(tmp_path, monkeypatch):
    """Under --survive the driver's worker factory keeps one spare (the workers' command with a
    placeholder rank, segment -1 and a go file); when the driver starts a worker for a slot and the
    spare waits, the slot's Horovod environment goes into the spare's go file and the driver waits
    for the spare's exit as for its own worker's; with no spare up, the cold worker as before."""
    import threading

    from horovod.runner import gloo_run

    from elastic_ring import hvd_patches
    from elastic_ring.controller import hvdrun

    run_dir = tmp_path / "run"
    (run_dir / "control").mkdir(parents=True)
    cold_calls, started = [], []

    def make(exec_command, run_command, env, event):
        return lambda slot_info, events: cold_calls.append(slot_info.rank) or (0, 1.0)

    class Proc:  # the spare's process: it exits 0 once it has read its go
        pid, rc = 777, None

        def poll(self):
            if self.rc is None and spare.go.exists():
                self.rc = 0
            return self.rc

    def popen(argv, env):
        started.append((argv, env))
        return Proc()

    monkeypatch.setattr(gloo_run, "_create_elastic_worker_fn", make)
    monkeypatch.setattr(hvdrun, "_SPARES", [])
    monkeypatch.setattr("subprocess.Popen", popen)
    hvd_patches.apply("warm_joiner")
    hvd_patches.apply("warm_joiner")  # once
    run_command = (f"HOROVOD_GLOO_RENDEZVOUS_ADDR=127.0.0.1 HOROVOD_GLOO_RENDEZVOUS_PORT=4242 HOROVOD_ELASTIC=1 "
                   f"python -m elastic_ring.worker.run --run-dir {run_dir} --segment 3 --stop-at 9 --inplace "
                   f"-- elastic_ring.train.worker --x 1")
    shutdown = threading.Event()
    old = run_dir / "control" / "progress.json"  # a resumed run's, older than this job: not its ring
    old.write_text("{}")
    os.utime(old, (1.0, 1.0))
    create = gloo_run._create_elastic_worker_fn(None, run_command, {"PATH": "/bin"}, shutdown)
    (spare,) = hvdrun._SPARES
    slot = type("Slot", (), {"hostname": "localhost", "rank": 1, "size": 2, "local_rank": 1, "local_size": 2,
                             "cross_rank": 0, "cross_size": 1})()
    threading.Event().wait(0.5)
    assert spare.proc is None and not started
    assert create(slot, []) == (0, 1.0) and cold_calls == [1]  # the ring does not train yet: no spare, a cold one
    (run_dir / "control" / "progress.json").write_text("{}")  # this job's ring trains
    for _ in range(200):
        if spare.proc is not None:
            break
        threading.Event().wait(0.01)
    (argv, env), = started
    assert argv[argv.index("--segment") + 1] == "-1" and argv[argv.index("--go-file") + 1] == str(spare.go)
    assert argv.index("--go-file") < argv.index("--") and argv[-3:] == ["elastic_ring.train.worker", "--x", "1"]
    assert env["HOROVOD_GLOO_RENDEZVOUS_PORT"] == "4242" and env["HOROVOD_RANK"] == "1" and env["PATH"] == "/bin"
    spare.go.with_name(spare.go.name + ".waiting").write_text("{}")  # imports and build done
    rc, _ = create(slot, [])
    go = protocol.read_json(spare.go)
    assert rc == 0 and cold_calls == [1]  # the slot went to the spare
    assert go["env"]["HOROVOD_RANK"] == "1" and go["env"]["HOROVOD_LOCAL_SIZE"] == "2" and go["pid_segment"] == 3
    # the join made the next spare pending (its thread would start it once the ring trains again);
    # a grow's first start that comes before that starts it itself and waits for it, instead of
    # starting cold (issue 45's race: a shrink and a grow a step after a join)
    def spare_builds():
        for _ in range(500):
            if len(started) == 2:  # (started after its old go and waiting files were removed)
                spare.go.with_name(spare.go.name + ".waiting").write_text("{}")
                return
            threading.Event().wait(0.01)

    builder = threading.Thread(target=spare_builds, daemon=True)
    builder.start()
    rc, _ = create(slot, [])
    builder.join(5)
    assert rc == 0 and cold_calls == [1] and len(started) == 2  # the second spare took it, none cold
    shutdown.set()


class _Stalls(Backend):
    """A backend that can end single ranks (``--survive``)."""

    name = "fake"

    def __init__(self, ok=True):
        self.ok, self.ended = ok, []

    def end_ranks(self, ranks):
        self.ended.append(ranks)
        return self.ok

    def report_ahead(self, launch):
        pass

    def retract_ahead(self, segment):
        return True


@pytest.mark.parametrize("ranks, ok, ends", [((1,), True, True), ((), True, False), ((0, 1), True, False),
                                             ((1,), False, False)])
def test_a_stall_ends_only_the_stalled_ranks_where_the_others_can_go_on(tmp_path, ranks, ok, ends):
    """The watchdog named some ranks, not all, and the backend ended them: the others lose a peer and
    go on from memory (the controller's survivors path); otherwise the whole job is ended as before."""
    from elastic_ring.controller.backends.resize import InPlace
    from elastic_ring.controller.controller import Controller
    from elastic_ring.controller.segment import Segment
    from elastic_ring.controller.watchdog import Stall

    spec = RunSpec(run_dir=tmp_path, workers=2, schedule=(), slots=2, device="cpu", total_steps=10)
    b = _Stalls(ok)
    ctl = Controller(spec, out=lambda s: None, poll_s=0.0, show_progress=False, backend=b, resize=InPlace(b))
    seg = Segment(0, 2, 10)
    seg.stall = Stall(0, 5, 3.0, 2.0, ranks, "process stopped or gone (1:T)")
    assert bool(ctl.stalls.end_alone(seg)) is ends
    assert b.ended == ([list(ranks)] if ranks and len(ranks) < 2 else [])


def test_the_ray_backend_ends_a_stalled_rank_alone(tmp_path):
    b, g, (m0, m1), ended = _backend(tmp_path)
    g._failed_seen, g.failure, g.rc, m1.ref = [], None, None, object()  # both running
    assert b.end_ranks([1]) and ended == ["actor1"]
    b.survive = False
    assert not b.end_ranks([1])


def test_a_survivor_whose_copy_differs_from_the_others_is_broken_the_disk_checkpoint_then():
    """The fingerprint of a copy covers what every data-parallel rank holds alike (the parameters and
    the optimizer's momentum, not BatchNorm's running statistics, each rank's own): equal copies
    agree on the newest common step; a copy whose weights or momentum differ makes the survivors
    fall back to the disk (no step), as do copies of another step number."""
    import torch

    from elastic_ring.seam import agreed_step
    from elastic_ring.worker.survive import state_digest

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(8, 4)).sum().backward()
    opt.step()
    params = {k for k, _ in model.named_parameters()}

    def copy(step, bump_buffer=0.0, bump_weight=0.0, bump_momentum=0.0):
        from elastic_ring.ckpt import snapshot

        snap = snapshot({"step": step, "model": model.state_dict(), "optimizer": opt.state_dict()})
        snap["model"]["1.running_mean"] += bump_buffer
        snap["model"]["0.weight"][0, 0] += bump_weight
        snap["optimizer"]["state"][0]["momentum_buffer"][0, 0] += bump_momentum
        return state_digest(snap, params)

    def rec(held, **digests):
        return {"held": held, "digests": {str(s): d for s, d in digests.items()}}

    same = copy(5)
    assert copy(5, bump_buffer=1.0) == same  # each rank's own BatchNorm statistics: no matter
    assert copy(6) != same and copy(5, bump_weight=1e-6) != same and copy(5, bump_momentum=1e-6) != same
    assert agreed_step([{"held": [4, 5], "digests": {"4": copy(4), "5": same}},
                        {"held": [5, 6], "digests": {"5": copy(5, bump_buffer=2.0), "6": copy(6)}}]) == 5
    assert agreed_step([{"held": [4, 5], "digests": {"5": same}},
                        {"held": [4, 5], "digests": {"5": copy(5, bump_weight=1e-3)}}]) is None
    assert agreed_step([{"held": [5]}, {"held": [4, 5]}]) == 5  # (no fingerprints: a Horovod Elastic commit)


def test_inplace_survivors_with_differing_copies_are_ended_the_restart_from_the_checkpoint(tmp_path):
    import os

    b, h = _elastic(tmp_path, [os.getpid(), os.getpid(), 999_999_999], world=3)
    protocol.write_json_atomic(survivor_file(tmp_path, "0"), {
        "member": "0", "rank": 0, "pid": os.getpid(), "held": [6, 7], "time": time.time(), "segment": 0,
        "digests": {"6": "a", "7": "b"}})
    protocol.write_json_atomic(survivor_file(tmp_path, "1"), {
        "member": "1", "rank": 1, "pid": os.getpid(), "held": [6, 7], "time": time.time(), "segment": 0,
        "digests": {"6": "a", "7": "c"}})
    assert b.survivors(wait_s=1.0) is None and h.inner.rc == -9
    assert b.refused == "the survivors' copies of step 7 differ (one's state is not the others')"


def test_a_failure_with_survivors_never_reports_a_step_below_the_one_they_hold(tmp_path):
    """The progress file (written at most twice a second) lags behind the step the survivors all
    hold in memory: the restart's ``failed_at_step`` is at least that step (it said 177 below
    ``from_step`` 180), and no step is counted as redone."""
    from elastic_ring.controller.backends.resize import InPlace
    from elastic_ring.controller.controller import Controller
    from elastic_ring.events import read_events

    class Lagging(_Backend):
        def start(self, launch, log_path):
            started = super().start(launch, log_path)
            poll = self.ring.poll

            def lagging():
                rc = poll()
                if self.ring.segment == 0 and self.ring.rc == 1:  # the survivors hold step 4; progress says 3
                    protocol.write_json_atomic(protocol.control_dir(self.run_dir) / protocol.PROGRESS_FILE,
                                               {"step": 3, "time": time.time()})
                return rc
            self.ring.poll = lagging
            return started

    spec = RunSpec(run_dir=tmp_path, workers=2, schedule=(), slots=2, device="cpu", total_steps=10)
    b = Lagging(tmp_path, 10)
    Controller(spec, out=lambda s: None, poll_s=0.0, show_progress=False, backend=b, resize=InPlace(b)).run(0, 2, 0)
    (r,) = read_events(tmp_path / "events.jsonl", kind="restart")
    assert (r["from_step"], r["failed_at_step"], r["steps_redone"]) == (4, 4, 0), r
