"""``--survive`` on the Ray backend beyond the shrink, without processes: a failed member's bundle
gets a warm worker that grows the ring back, a lost node is blamed as a whole, and ``--survive`` is
kept in run.json for a resume (fakes of the cluster view and the actor pool, as in
``test_survive``)."""

from __future__ import annotations

import json
import time

import pytest

from elastic_ring.controller.backends.api import SegmentLaunch
from elastic_ring.controller.backends.ray_members import Member
from tests.unit.test_survive import _backend, _say_held


def test_survive_is_kept_in_run_json_for_a_resume(tmp_path):
    """``--survive`` is kept in run.json (as the collective is): a ``--resume`` without it (as the
    cluster's stop and resume runs it) keeps the survivors going; given at a resume of a run
    started without it, it is kept from then on."""
    from elastic_ring.controller.lock import RunLock
    from elastic_ring.controller.runs import RunRequest, prepare

    script = tmp_path / "s.py"
    script.write_text("pass\n")

    def again(rd, **kw):
        run = prepare(RunRequest(resume_dir=str(rd), device="cpu", slots=2, backend="ray", **kw), echo=lambda s: None)
        RunLock(rd).release()
        return run.survive

    for on in (True, False):
        rd = tmp_path / f"run-{on}"
        run = prepare(RunRequest(script=str(script), steps=10, device="cpu", slots=2, backend="ray", survive=on,
                                 run_dir=str(rd)), echo=lambda s: None)
        RunLock(rd).release()
        assert run.survive is on and json.loads((rd / "run.json").read_text())["survive"] is on
        assert again(rd) is on
    rd = tmp_path / "run-False"
    assert again(rd, survive=True) and again(rd)  # given once at a resume: kept for the next


@pytest.mark.parametrize("spares", [None, 0])
def test_a_failed_members_bundle_gets_a_warm_worker_that_grows_the_ring_back(tmp_path, monkeypatch, spares):
    """The failed member's bundle of the placement group gets a new actor at the survivors' resize
    (with ``--warm-spares 0`` too: the bundle is the ring's already); once it waits for its go, the
    backend asks to grow back to the size the ring had."""
    b, g, (m0, m1), ended = _backend(tmp_path)
    m0.bundle, m1.bundle = 0, 1
    b.pool.warm_spares = spares
    b._pg = "pg"
    refilled, up = [], []
    monkeypatch.setattr(b.pool, "refill", lambda bundle, strategy, launch: refilled.append((bundle, launch.world)))
    monkeypatch.setattr(b.pool, "ready", lambda: 0)
    monkeypatch.setattr(b.pool, "waiting", lambda: len(up))
    monkeypatch.setattr(b.pool, "top_up", lambda launch: None)
    _say_held(tmp_path, "w1", 100, [6, 7])
    s = b.survivors(wait_s=2.0)
    assert s is not None and s.world == 1 and s.joiners == 0
    b.resize_in_place(0, SegmentLaunch(1, 1, 20, "me"), time.time())
    assert refilled == [(1, 1)]  # a new actor in rank 1's bundle
    assert b.heal_target() is None  # not up yet
    up.append("w3")
    assert b.heal_target() == 2
    b.launch = SegmentLaunch(2, 2, 20, "me")  # grown back: nothing more asked
    assert b.heal_target() is None and b._heal_to is None


def test_a_lost_node_is_blamed_as_a_whole_and_the_other_nodes_go_on(tmp_path):
    """Three members, two on a node that is lost: both are failed (named in the message), the one on
    the other node goes on from memory."""
    b, g, (m0, m1), ended = _backend(tmp_path)
    m2 = Member("w3", "actor2", {**m1.info, "pid": 102}, rank=2, ref=object())
    g.members.append(m2)
    g.lost_node = m1.info["node_id"]
    _say_held(tmp_path, "w1", 100, [6, 7])
    s = b.survivors(wait_s=1.0)
    assert s is not None and s.world == 1 and g.members == [m0] and sorted(ended) == ["actor1", "actor2"]
    assert "rank(s) 1, 2 on it lost" in s.failure.message and s.failure.rank == 1
