"""The Ray backend's bundles, one placement group per worker, without Ray's processes (a fake
cluster view and actor pool): a shrink's leaver that is ended gives its group back to Ray at once
(another job of `elastic-ring cluster --ray` can use it), one recycled as a spare keeps it, a
grow's cold joiner gets a new group, or one line when Ray cannot place it in time."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import elastic_ring.controller.backends.ray as rb
from elastic_ring.controller.api import RunSpec
from elastic_ring.controller.backends.api import SegmentLaunch
from elastic_ring.controller.backends.ray import RayBackend
from elastic_ring.controller.backends.ray_group import RayGroup
from elastic_ring.controller.backends.ray_members import Member
from elastic_ring.controller.backends.ray_ring import RingFormer
from elastic_ring.errors import UserError


class _Cluster:
    def __init__(self, room: int) -> None:
        self.room, self.n, self.suspect_nodes = room, 0, set()

    def bundle(self):
        return {"CPU": 1.0}

    def place_one(self, timeout_s):
        if self.room <= 0:
            return None
        self.room -= 1
        self.n += 1
        return f"new{self.n}"


class _Pool:
    def __init__(self, keep: bool) -> None:
        self.keep, self.ended, self.recycled = keep, [], []

    def recycle(self, m, launch, world):
        if self.keep:
            self.recycled.append(m.name)
        return self.keep

    def end(self, actor):
        self.ended.append(actor)

    def end_spares(self):
        pass


def _backend(tmp_path, monkeypatch, keep=False, room=1):
    removed: list = []
    monkeypatch.setattr(rb, "remove_pg", removed.append)
    spec = RunSpec(run_dir=tmp_path, workers=3, schedule=(), slots=3, device="cpu", total_steps=20)
    b = RayBackend(spec, _Cluster(room), _Pool(keep), RingFormer(), follow=False)
    members = [Member(f"w{r + 1}", f"actor{r}", {"node_id": f"node{r}", "pid": 100 + r, "host": "h"}, rank=r,
                      ref=object(), bundle=r) for r in range(3)]
    b.group = RayGroup(SimpleNamespace(), tmp_path, lambda a: None, members)
    b.launch = SegmentLaunch(1, 2, 20, "me")
    b._pgs, b._next_bundle = {r: f"pg{r}" for r in range(3)}, 3
    return b, members, removed


def test_a_shrinks_ended_leaver_gives_its_placement_group_back(tmp_path, monkeypatch):
    b, (m0, m1, m2), removed = _backend(tmp_path, monkeypatch)
    b.group.members.remove(m2)
    b.group.left.append(m2)  # retired at the shrink 3 -> 2; no spare wanted (--warm-spares 0)
    b._after_poll(b.group)
    assert removed == ["pg2"] and sorted(b._pgs) == [0, 1]  # the others' bundles kept
    b._draining = {"node1"}  # a leaver on a draining node is ended, its group removed too
    b.group.members.remove(m1)
    b.group.left.append(m1)
    b._after_poll(b.group)
    assert removed == ["pg2", "pg1"] and b.pool.ended == ["actor1"] and list(b._pgs) == [0]
    b._drop_all()  # a restart or the end: every group goes
    assert removed == ["pg2", "pg1", "pg0"] and b._pgs == {}


def test_a_leaver_recycled_as_a_spare_keeps_its_bundle(tmp_path, monkeypatch):
    b, (m0, m1, m2), removed = _backend(tmp_path, monkeypatch, keep=True)
    b.group.members.remove(m2)
    b.group.left.append(m2)
    b._after_poll(b.group)
    assert b.pool.recycled == ["w3"] and removed == [] and sorted(b._pgs) == [0, 1, 2]


def test_a_cold_joiner_gets_a_placement_group_of_its_own_or_one_line(tmp_path, monkeypatch):
    b, members, removed = _backend(tmp_path, monkeypatch, room=1)
    strategy, bundle = b._new_bundle()
    assert bundle == 3 and b._pgs[3] == "new1" and strategy.placement_group == "new1"
    assert strategy.placement_group_bundle_index == 0
    b._free_bundle(3)  # it leaves at a later shrink
    assert removed == ["new1"] and 3 not in b._pgs
    with pytest.raises(UserError, match=r"no room for one more worker of \{'CPU': 1.0\} within \d+ s"):
        b._new_bundle()  # the cluster is full: one line, no group kept
    assert sorted(b._pgs) == [0, 1, 2]
