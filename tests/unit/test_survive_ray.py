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
from elastic_ring.controller.membership import StateSource
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
    b._pgs = {0: "pg0", 1: "pg1"}
    refilled, up = [], []
    monkeypatch.setattr(b.pool, "refill", lambda bundle, strategy, launch: refilled.append((bundle, launch.world)))
    monkeypatch.setattr(b.pool, "ready", lambda: 0)
    monkeypatch.setattr(b.pool, "waiting", lambda: len(up))
    monkeypatch.setattr(b.pool, "top_up", lambda launch: None)
    _say_held(tmp_path, "w1", 100, [6, 7])
    s = b.survivors(wait_s=2.0)
    assert s is not None and s.world == 1 and s.joiners == 0
    b.resize_in_place(0, SegmentLaunch(1, 1, 20, "me"), time.time(), StateSource.MEMORY)
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


def test_the_controller_grows_the_survivors_back_when_a_warm_worker_is_up(tmp_path):
    """After the survivors' shrink, the backend says a warm worker waits for a failed one's place:
    the controller asks the grow back as a live resize (a ``resize_requested`` event of source
    ``joiner``, the segment's stop file), and the in-place resize that follows brings the ring back to
    2 workers at the step the survivors stopped at; the plan keeps the shrink and the grow (a
    ``joiner`` entry)."""
    from elastic_ring import protocol
    from elastic_ring.controller.api import RunSpec
    from elastic_ring.controller.backends.resize import InPlace
    from elastic_ring.controller.controller import Controller
    from elastic_ring.events import SegmentEnd, read_events
    from tests.unit.test_survive import _Backend, _Ring

    total = 10
    paused: list[float] = []  # when the survivors' stop for the grow was agreed

    class Ring(_Ring):
        def poll(self):
            if self.rc is None and self.segment == 1 and self.polls >= 1:  # the survivors' segment, stepping
                if self.polls == 1 and protocol.stop_file(self.run_dir, 1).exists():  # the controller's stop
                    self.polls = 2
                    time.sleep(0.05)  # a step trained while the stop is agreed
                    paused.append(time.time())
                    self.log.write(SegmentEnd(segment=1, world_size=1, step=7, reason="requested", lr=0.1,
                                              stop_decided_at=paused[0]))
                return None  # paused until the in-place resize
            return super().poll()

    class Backend(_Backend):
        asked = 0

        def start(self, launch, log_path):
            started = super().start(launch, log_path)
            self.ring.__class__ = Ring
            return started

        def heal_target(self):
            self.asked += 1
            return 2 if self.ring.segment == 1 and self.asked > 3 else None

    spec = RunSpec(run_dir=tmp_path, workers=2, schedule=(), slots=2, device="cpu", total_steps=total)
    b = Backend(tmp_path, total)
    ctl = Controller(spec, out=lambda s: None, poll_s=0.0, show_progress=False, backend=b, resize=InPlace(b))
    ctl.run(0, 2, 0)
    (req,) = [e for e in read_events(tmp_path / "events.jsonl", kind="resize_requested") if e["source"] == "joiner"]
    assert (req["from_workers"], req["to_workers"]) == (1, 2)
    # the shrink at the failure (from memory), then the grow back (by broadcast from a peer)
    assert b.resized == [(0, 1, 1, total, StateSource.MEMORY), (1, 2, 2, total, StateSource.PEER)]
    changes = json.loads((tmp_path / protocol.PLAN_FILE).read_text())["changes"]
    assert [4, 1, "failure"] in changes and [7, 2, "joiner"] in changes  # the grow back, named as such
    # its cost is measured from the survivors' pause, as a scheduled grow's: the steps they trained
    # while the stop was agreed are not lost; the first step at 2 says how long after the failure
    events = read_events(tmp_path / "events.jsonl")
    (back,) = [e for e in events if e["kind"] == "first_step_after_resize" and e["world_size"] == 2]
    (ov,) = [e for e in events if e["kind"] == "resize_overhead" and e["to_workers"] == 2]
    assert back["joiner"] == "broadcast" and back["since_failure_s"] > 0
    assert back["time"] - ov["steady_step_s"] - ov["total_lost_s"] == pytest.approx(paused[0], abs=1e-3)


@pytest.mark.parametrize("here", [True, False])
def test_a_survivor_silent_through_the_wait_is_asked_for_its_stacks_on_this_host_only(tmp_path, monkeypatch, here):
    """The survivor (rank 0) never says which steps it holds: the restart (refused as silent), and
    where its actor runs on this host, a line in its log and its stacks asked for (by pid) before
    the restart ends it; an actor on another host is never signalled (its pid is not this host's)."""
    import socket

    from elastic_ring.controller.backends import survival

    asked = []
    monkeypatch.setattr(survival, "dump_stacks", lambda pids, settle_s=0.3: asked.extend(pids) or list(pids))
    b, g, (m0, m1), ended = _backend(tmp_path)
    m0.info["host"] = socket.gethostname() if here else "another-host"
    assert b.survivors(wait_s=0.3) is None
    assert b.refused == "1 worker(s) neither said which steps they hold nor were gone within the wait"
    log = tmp_path / "logs" / "ray-w1.log"
    if here:
        assert asked == [100]
        assert "[controller] rank 0 said nothing within 0.3 s of the failure" in log.read_text()
    else:
        assert asked == [] and not log.exists()
