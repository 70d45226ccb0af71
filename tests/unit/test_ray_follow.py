"""The Ray backend follows its cluster, without Ray (fake cluster view, pool and group): a node Ray
drains is shrunk off (its members leave first, whatever their rank), a node that joins is grown
onto (warm spares waited for, capped at ``--slots``, not under `elastic-ring cluster`); and a worker
actor's process counts as gone only once every thread of it has ended (the survivors' wait starts
then)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import elastic_ring.controller.backends.ray as rb
from elastic_ring.controller.api import RunSpec
from elastic_ring.controller.backends.api import SegmentLaunch
from elastic_ring.controller.backends.ray_cluster import RayCluster
from elastic_ring.controller.backends.ray_group import RayGroup
from elastic_ring.controller.backends.ray_members import Member
from elastic_ring.controller.backends.ray_ring import RingFormer
from elastic_ring.controller.membership import Cause


class _Cluster:
    def __init__(self, nodes):
        self.nodes, self.drain, self.free = set(nodes), {}, 0

    def draining(self):
        return dict(self.drain)

    def alive_nodes(self):
        return [{"NodeID": n} for n in sorted(self.nodes - set(self.drain))]

    def free_slots(self, total=False):
        return self.free


class _Pool:
    def __init__(self):
        self.up, self.warm, self.ended_on, self.ended = 0, 0, [], []

    def ready(self):
        return self.up

    def waiting(self):
        return self.warm

    def end_on(self, nodes):
        self.ended_on.append(set(nodes))
        return 0

    def end(self, actor):
        self.ended.append(actor)

    def recycle(self, m, launch, world):
        raise AssertionError("a leaver on a draining node is never a spare")

    def top_up(self, launch):
        pass


class _Nodes:
    def node_alive(self, node_id):
        return True

    def process_gone(self, info):
        return False


def _backend(tmp_path, monkeypatch, slots=3, follow=True):
    monkeypatch.setattr(rb, "LOOK_EVERY_S", 0.0)
    spec = RunSpec(run_dir=tmp_path, workers=2, schedule=(), slots=slots, device="cpu", total_steps=50)
    cluster, pool = _Cluster({"A" * 12, "B" * 12}), _Pool()
    rings = RingFormer(serve=lambda slots: (SimpleNamespace(stop=lambda: None), 4000), ip=lambda: "10.0.0.9")
    b = rb.RayBackend(spec, cluster, pool, rings, follow=follow)
    # rank 0 on node B, rank 1 on node A
    members = [Member(f"w{r + 1}", f"actor{r}", {"node_id": n * 12, "ip": "10.0.0.1", "iface": "lo", "pid": 100 + r,
                                                 "host": "h"}, rank=r, ref=object()) for r, n in enumerate("BA")]
    b.group = RayGroup(_Nodes(), tmp_path, lambda actor: None, list(members), t_start=0.0)
    b.launch = SegmentLaunch(2, 1, 50, "me")
    return b, cluster, pool, members


def test_a_draining_node_is_shrunk_off_its_members_leave_first_and_are_not_kept_as_spares(tmp_path, monkeypatch):
    b, cluster, pool, (m0, m1) = _backend(tmp_path, monkeypatch)
    assert b.cluster_change(2) is None  # the first look: the nodes as they are
    cluster.drain = {"B" * 12: 0.0}
    cause, target, line = b.cluster_change(2)
    assert (cause, target) == (Cause.DRAINED, 1) and "BBBBBBBBBBBB is draining" in line and "rank(s) 0" in line, line
    assert pool.ended_on[-1] == {"B" * 12}  # its spares ended: Ray lets an idle drained node go
    (tmp_path / "control").mkdir()
    members, leave, joiners = b._ring_now(1, SegmentLaunch(1, 2, 50, "me"), 0.0)
    assert members == [m1] and leave == [m0] and joiners == []  # rank 0 leaves: it is on the draining node
    b.group.left.append(m0)
    b._after_poll(b.group)
    assert pool.ended == ["actor0"]  # ended, not recycled
    cluster.drain = {"A" * 12: 0.0, "B" * 12: 0.0}  # every member on a draining node: nowhere to go yet
    b.group.members = [m1]
    assert b.cluster_change(1) is None


def test_a_node_that_joins_is_grown_onto_warm_up_to_the_slots(tmp_path, monkeypatch):
    b, cluster, pool, _ = _backend(tmp_path, monkeypatch, slots=3)
    assert b.cluster_change(2) is None
    cluster.free = 1
    assert b.cluster_change(2) is None  # free room alone is not a join: the job keeps its size
    cluster.free = 0
    cluster.nodes.add("C" * 12)
    assert b.cluster_change(2) is None  # no room seen yet (the spare placed there is not up): not lost
    pool.up = 1  # a spare started on it and still imports: the grow waits for it
    assert b.cluster_change(2) is None
    pool.warm = 1
    cluster.free = 5
    cause, target, line = b.cluster_change(2)
    assert (cause, target) == (Cause.HOSTS, 3) and "a Ray node joined: 2 -> 3" in line  # capped at --slots 3
    assert b.cluster_change(2) is None  # once


def test_under_the_scheduler_a_join_is_not_followed_but_a_drain_is(tmp_path, monkeypatch):
    b, cluster, pool, _ = _backend(tmp_path, monkeypatch, follow=False)
    assert b.cluster_change(2) is None
    cluster.nodes.add("C" * 12)
    pool.up = pool.warm = 1
    assert b.cluster_change(2) is None
    cluster.drain = {"A" * 12: 0.0}
    assert b.cluster_change(2)[:2] == (Cause.DRAINED, 1)


def test_the_scheduler_starts_ray_jobs_that_do_not_follow_the_nodes_themselves():
    from elastic_ring import env

    assert env.ray_follow({}) and not env.ray_follow({env.RAY_FOLLOW: "0"})


@pytest.mark.parametrize("status, threads, gone", [("zombie", 2, False), ("zombie", 1, True), ("sleeping", 5, False),
                                                    (None, 0, True)])
def test_a_worker_process_is_gone_once_every_thread_of_it_has_ended(monkeypatch, status, threads, gone):
    """Its main thread a zombie while another thread still runs: the process is exiting, its
    sockets still open (its peers cannot know yet): not gone. Every thread ended, or reaped: gone."""
    import socket

    import psutil

    class Proc:
        def __init__(self, pid):
            if status is None:
                raise psutil.NoSuchProcess(pid)

        def status(self):
            return status

        def num_threads(self):
            return threads

    monkeypatch.setattr(psutil, "Process", Proc)
    c = RayCluster(None)
    assert c.process_gone({"host": socket.gethostname(), "pid": 7}) is gone
    assert c.process_gone({"host": "another-host", "pid": 7}) is False
