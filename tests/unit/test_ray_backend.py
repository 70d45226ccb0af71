"""The Ray backend's parts without a cluster: its bad input (one line, exit 2), the ring former
(members on Horovod hosts, their environments), the rendezvous question an elastic-mode worker
asks, the group's judge (with a fake cluster view), the ring written ahead and the restart size."""

from __future__ import annotations

import pytest

from elastic_ring.controller.api import RunSpec
from elastic_ring.controller.backends.ray import make_ray_backend
from elastic_ring.controller.backends.ray_actors import ActorPool
from elastic_ring.controller.backends.ray_group import RayGroup
from elastic_ring.controller.backends.ray_members import Ahead, Member, Spare
from elastic_ring.controller.backends.ray_ring import RingFormer, assign_ranks
from elastic_ring.controller.backends.ray_worker import rendezvous_handler
from elastic_ring.errors import UserError
from tests.conftest import run_inproc


@pytest.mark.parametrize("args, msg", [
    (["--backend", "ray", "--hosts", "a:1,b:1"], "drop --hosts/--hostfile"),
    (["--backend", "ray", "--relaunch", "overlap"], "drop --relaunch overlap"),
    (["--ray-address", "1.2.3.4:6379"], "go with --backend ray"),
    (["--backend", "ray", "--warm-spares", "-1"], "--warm-spares must be >= 0"),
])
def test_bad_ray_options_one_line_exit_2(capsys, tmp_path, args, msg):
    p = run_inproc(capsys, "train", "--gpus", "1", "--steps", "4", "--run-dir", str(tmp_path / "r"), *args)
    assert p.returncode == 2 and msg in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_the_request_check_refuses_a_bad_placement_for_every_caller():
    from elastic_ring.controller.requests import RunRequest, check

    with pytest.raises(UserError, match="PACK, SPREAD"):
        check(RunRequest(backend="ray", placement="STRICT"))


def test_the_pool_keeps_the_spares_wanted(tmp_path):
    spec = RunSpec(run_dir=tmp_path, workers=1, schedule=(), slots=2, device="cpu", total_steps=4)
    assert ActorPool(spec).wanted(1) == 1 and ActorPool(spec, warm_spares=3).wanted(2) == 3


def _member(name, node, pid=1):
    return Member(name, None, {"node_id": node, "ip": "10.0.0.1", "iface": "lo", "pid": pid, "host": "h"})


def test_the_ring_former_places_members_one_horovod_host_per_node_and_serves_one_rendezvous_per_ring():
    """Members -> ranks and environments, without Ray: the members of a node are one Horovod host
    (ranks in the order the nodes first appear), each member's environment names its ring's
    rendezvous and its own slot; the older rendezvous stop once the newest ring is in use."""
    members = [_member("w1", "A"), _member("w2", "B"), _member("w3", "A")]
    assigned = assign_ranks(members)
    assert [(m.name, m.rank) for m, _ in assigned] == [("w1", 0), ("w3", 1), ("w2", 2)]

    class Server:
        stopped = False

        def stop(self):
            self.stopped = True

    served = []
    rings = RingFormer(serve=lambda slots: (served.append(Server()) or served[-1], 4000 + len(served)),
                       ip=lambda: "10.0.0.9")
    envs = rings.form(members)
    assert envs["w3"]["HOROVOD_RANK"] == "1" and envs["w3"]["HOROVOD_SIZE"] == "3"
    assert envs["w3"]["HOROVOD_LOCAL_RANK"] == "1" and envs["w2"]["HOROVOD_LOCAL_SIZE"] == "1"
    assert envs["w2"]["HOROVOD_GLOO_RENDEZVOUS_ADDR"] == "10.0.0.9" and envs["w2"]["HOROVOD_GLOO_RENDEZVOUS_PORT"] == "4001"
    assert envs["w1"]["ELASTIC_RING_MEMBER"] == "w1" and envs["w1"]["HOROVOD_GLOO_IFACE"] == "lo"
    rings.form(members[:2])
    rings.in_use()
    assert served[0].stopped and not served[1].stopped and rings.servers == [served[1]]


def test_rendezvous_answers_rank_and_size_from_the_slot_plan():
    from horovod.runner.common.util.hosts import HostInfo, get_host_assignments

    slots = get_host_assignments([HostInfo("nodeA", 1), HostInfo("nodeB", 2)], 3)
    h = rendezvous_handler({(s.hostname, s.local_rank): s for s in slots})
    ask = lambda key: h._get_value(object.__new__(h), "rank_and_size", key)  # noqa: E731
    assert ask("nodeA:0").decode().split(",")[:2] == ["0", "3"]
    assert ask("nodeB:1").decode().split(",")[:4] == ["2", "3", "1", "2"]
    assert ask("nodeC:0") is None


class _Died(Exception):
    pass


_Died.__name__ = "ActorDiedError"


class _Nodes:
    """A fake cluster view: every node alive, the processes ``gone_pids`` gone."""

    def __init__(self, gone_pids=()):
        self.gone_pids = gone_pids

    def node_alive(self, node_id):
        return True

    def process_gone(self, info):
        return info["pid"] in self.gone_pids


def _group(tmp_path, gone_pids=()):
    """A two-member RayGroup over a fake cluster view (no Ray: the judge only reads crash records
    and asks the view)."""
    members = [Member(f"w{r + 1}", None, {"node_id": f"node{r}" * 4, "ip": "10.0.0.1", "pid": 100 + r,
                                          "host": "h"}, rank=r, ref=object()) for r in range(2)]
    g = RayGroup(_Nodes(gone_pids), tmp_path, lambda actor: None, members, t_start=0.0)
    return g, members


def _peer_loss_record(tmp_path, rank, pid):
    from elastic_ring import protocol

    try:
        raise RuntimeError("Gloo: Connection reset by peer")
    except RuntimeError as e:
        protocol.write_error_record(tmp_path, e, rank, step=13)
    rec = protocol.read_json(protocol.error_file(tmp_path, rank))
    rec["pid"], rec["host"] = pid, "h"
    protocol.write_json_atomic(protocol.error_file(tmp_path, rank), rec)


def test_judge_blames_the_killed_actor_not_the_survivor_that_lost_its_peer(tmp_path):
    """kill -9 of rank 1: rank 0 (a peer-loss record) is reported dead first; rank 1's death shows
    later (or only as its process gone): rank 1 is the cause, never rank 0."""
    import time as _t

    _peer_loss_record(tmp_path, 0, 100)
    g, (m0, m1) = _group(tmp_path)
    g._failed_seen.append((m0, _Died(), _t.time() - 1.0))
    m0.ref = None
    assert g._judge() is None  # rank 1 not known dead yet: wait for it
    g._failed_seen.append((m1, _Died(), _t.time()))
    m1.ref = None
    assert g._judge() == 1 and g.failure.rank == 1 and "rank 1" in g.failure.message, g.failure

    g, (m0, m1) = _group(tmp_path)  # both reported in one poll, the survivor listed first
    for m in (m0, m1):
        g._failed_seen.append((m, _Died(), _t.time()))
        m.ref = None
    assert g._judge() is None  # (a settle of 0.5 s: a lost node shows a little later)
    g._failed_seen[0] = (m0, g._failed_seen[0][1], _t.time() - 1.0)
    assert g._judge() == 1 and g.failure.rank == 1, g.failure

    g, (m0, m1) = _group(tmp_path, gone_pids={101})  # both reported just now, rank 1's process gone here:
    for m in (m0, m1):  # no settle (nothing more can show of a process that is gone)
        g._failed_seen.append((m, _Died(), _t.time()))
        m.ref = None
    assert g._judge() == 1 and g.failure.rank == 1, g.failure

    g, (m0, m1) = _group(tmp_path, gone_pids={101})  # Ray slow to report: its process is gone here
    g._failed_seen.append((m0, _Died(), _t.time() - 1.0))
    m0.ref = None
    assert g._judge() == 1 and g.failure.rank == 1, g.failure

    g, (m0, m1) = _group(tmp_path)  # both processes seen gone by the poll, Ray reporting neither
    for m in (m0, m1):
        g._failed_seen.append((m, None, _t.time() - 1.0))
        m.ref = None
    assert g._judge() == 1 and g.failure.rank == 1 and "process is gone" in g.failure.message, g.failure

    g, (m0, m1) = _group(tmp_path)  # never reported at all: after the grace, still not rank 0
    g._failed_seen.append((m0, _Died(), _t.time() - 60.0))
    m0.ref = None
    assert g._judge() == 1 and g.failure.rank == 1, g.failure


def test_judge_blames_an_own_error_and_never_a_peer_loss_only(tmp_path):
    import time as _t

    from elastic_ring import protocol

    g, (m0, m1) = _group(tmp_path)
    try:
        raise ValueError("bad batch")
    except ValueError as e:
        protocol.write_error_record(tmp_path, e, 1, step=13)
    rec = protocol.read_json(protocol.error_file(tmp_path, 1))
    rec["pid"], rec["host"] = 101, "h"
    protocol.write_json_atomic(protocol.error_file(tmp_path, 1), rec)
    _peer_loss_record(tmp_path, 0, 100)
    for m in (m0, m1):
        g._failed_seen.append((m, _Died(), _t.time()))
        m.ref = None
    assert g._judge() == 1 and g.failure.rank == 1

    (tmp_path / "logs" / "error-rank1.json").unlink()
    _peer_loss_record(tmp_path, 1, 101)  # both only lost a peer: no rank
    g, (m0, m1) = _group(tmp_path)
    for m in (m0, m1):
        g._failed_seen.append((m, _Died(), _t.time() - 10))
        m.ref = None
    assert g._judge() == 1 and g.failure.rank is None and g.failure.type == "PeerLost"


class _Server:
    stopped = False

    def stop(self):
        self.stopped = True


def _ahead_backend(tmp_path):
    from elastic_ring import protocol
    from elastic_ring.controller.backends.api import SegmentLaunch
    from elastic_ring.seam import action_file

    spec = RunSpec(run_dir=tmp_path, workers=1, schedule=(), slots=2, device="cpu", total_steps=20)
    b = make_ray_backend(spec)
    srv = _Server()
    spare = Spare("w9", object(), None, None, tmp_path / "go")
    b._ahead = Ahead(3, SegmentLaunch(2, 4, 20, "me"), [], [], [], [spare], srv)
    b.rings.servers = [srv]
    protocol.control_dir(tmp_path).mkdir(parents=True, exist_ok=True)
    protocol.write_json_atomic(action_file(tmp_path, 3), {"action": "resize", "at_step": 10})
    return b, srv, spare


def test_a_ring_written_ahead_is_taken_or_withdrawn_never_both(tmp_path):
    """The action written ahead for a scheduled resize: rank 0 takes it by renaming the file, the
    controller withdraws it the same way; whichever renames first wins, and the other knows."""
    from elastic_ring.seam import take_ahead_action

    b, srv, spare = _ahead_backend(tmp_path)
    assert b.retract_ahead(2)  # another segment's: nothing to withdraw
    assert take_ahead_action(tmp_path, 3)  # rank 0 first
    assert not b.retract_ahead(3) and b._ahead is not None and not srv.stopped  # too late: it goes ahead
    assert not b.retract_ahead(3)  # and stays taken

    b, srv, spare = _ahead_backend(tmp_path / "2")
    assert b.retract_ahead(3)  # the controller first (a live request came)
    assert not take_ahead_action(tmp_path / "2", 3)  # rank 0 then waits for the controller's word
    assert b._ahead is None and srv.stopped and b.rings.servers == [] and b.pool.spares == [spare]  # spare kept


def test_restart_size_is_what_the_free_resources_place_now(tmp_path, monkeypatch):
    """``usable_slots`` at a restart: the run's own holdings released first, the free count (not the
    nodes' totals), then that size placed; a size that does not place within its try (a node lost
    before Ray marks it dead) steps down to one fewer; the placed group is kept for ``start``."""
    import sys
    import types

    import elastic_ring.controller.backends.ray as rb

    removed = []
    pgmod = types.ModuleType("ray.util.placement_group")
    pgmod.remove_placement_group = removed.append
    monkeypatch.setitem(sys.modules, "ray.util.placement_group", pgmod)
    monkeypatch.setattr(rb, "_FREE_WAIT_S", 0.0)
    spec = RunSpec(run_dir=tmp_path, workers=2, schedule=(), slots=2, device="cpu", total_steps=4)
    b = make_ray_backend(spec)
    calls: list[str] = []
    tried: list[int] = []
    monkeypatch.setattr(b, "_connect", lambda: None)
    monkeypatch.setattr(b, "_drop_all", lambda: calls.append("drop"))
    free = {"now": 2, "total": 2}
    monkeypatch.setattr(b.cluster, "free_slots", lambda total=False: free["total" if total else "now"])
    placeable = {"n": 1}

    def placed(n, timeout_s):
        tried.append(n)
        calls.append(f"place {n}")
        return [f"pg{n}.{i}" for i in range(n)] if n <= placeable["n"] else None

    monkeypatch.setattr(b.cluster, "place", placed)
    assert b.usable_slots(2) == 1 and tried == [2, 1] and calls[0] == "drop"  # released before counted
    assert b.cluster.reserved == (["pg1.0"], 1)
    tried.clear()
    free["now"] = 1  # another user's actor holds a CPU: the totals are not free
    assert b.usable_slots(4) == 1 and tried == [1]  # never above the free count, nor --slots
    assert removed == ["pg1.0"]  # the first reservation, not taken by a start, is given back
    tried.clear()
    placeable["n"] = 0
    assert b.usable_slots(2) == 0 and b.cluster.reserved is None and removed == ["pg1.0", "pg1.0"]  # none kept


def test_between_two_polls_the_backend_recycles_leavers_and_leaves_a_lost_node_out(tmp_path):
    """The group only reports (members that left the ring, the node of a lost member); the backend,
    given a fake cluster view and a fake pool, acts on it: a leaver goes back to the pool (as a spare
    for the running segment's size), a lost node is left out of later placements, and a ring ahead
    that waited for its spares is formed at the next poll, not after a failure."""
    from types import SimpleNamespace

    from elastic_ring.controller.backends.api import SegmentLaunch
    from elastic_ring.controller.backends.ray import RayBackend, _RingHandle

    class Pool:
        def __init__(self):
            self.recycled = []

        def recycle(self, m, launch, world):
            self.recycled.append((m.name, launch.segment, world))

    spec = RunSpec(run_dir=tmp_path, workers=2, schedule=(), slots=3, device="cpu", total_steps=20)
    cluster = SimpleNamespace(suspect_nodes=set())
    b = RayBackend(spec, cluster, Pool(), RingFormer())
    g, (m0, m1) = _group(tmp_path)
    b.group, b.launch = g, SegmentLaunch(2, 1, 10, "me")
    g.left.append(m1)
    g.lost_node = "nodeX"
    b._after_poll(g)
    assert b.pool.recycled == [("w2", 1, 2)] and g.left == [] and cluster.suspect_nodes == {"nodeX"}

    asked = []
    b.report_ahead = asked.append
    nxt = SegmentLaunch(3, 2, 20, "me")
    b._want_ahead = (1, nxt)
    b._form_wanted_ahead(g)
    assert asked == [nxt]
    g._failed_seen.append((m0, None, 0.0))  # a member failed: no ring is formed ahead any more
    b._form_wanted_ahead(g)
    assert asked == [nxt]
    assert _RingHandle(b, g).pid == g.pid
