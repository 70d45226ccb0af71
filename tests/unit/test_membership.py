"""One membership change: the decision (``controller.membership.decide``) and the record the
controller writes for each resize and restart it goes on with (a fake launcher, no processes)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from elastic_ring.controller.api import Resize, RunSpec
from elastic_ring.controller.controller import Controller
from elastic_ring.controller.membership import Cause, MembershipChange, StateSource, decide
from elastic_ring.controller.summary import render, summarize
from elastic_ring.events import read_events

from tests.unit.test_cluster_web import cluster  # noqa: F401 - a fixture
from tests.unit.test_controller_fake import FakeLauncher, _controller


@pytest.mark.parametrize("cause, before, after, in_place, source", [
    (Cause.SCHEDULE, 1, 2, False, StateSource.CHECKPOINT),  # new workers load the checkpoint
    (Cause.LIVE, 4, 2, False, StateSource.CHECKPOINT),
    (Cause.SCHEDULE, 1, 2, True, StateSource.PEER),  # in place: the new ranks by broadcast
    (Cause.LIVE, 4, 2, True, StateSource.MEMORY),  # in place: the ones that stay hold it
    (Cause.JOINER, 2, 3, True, StateSource.PEER),
    (Cause.INTERRUPT, 2, 0, True, StateSource.CHECKPOINT),
])
def test_a_resize_goes_on_from_the_copy_its_way_keeps(cause, before, after, in_place, source):
    c = decide(cause, 10, before, after, in_place=in_place, time=5.0)
    assert c == MembershipChange(cause, 10, before, after, source, 5.0)


def test_a_failure_goes_on_from_memory_when_survivors_agree_else_from_the_checkpoint():
    s = SimpleNamespace(step=7, world=3, joiners=0)
    mem = decide(Cause.FAILURE, 4, 4, 4, in_place=True, survivors=s)
    assert (mem.step, mem.members_after, mem.state_source, mem.survivors) == (7, 3, StateSource.MEMORY, s)
    spare = decide(Cause.FAILURE, 4, 4, 4, in_place=True, survivors=SimpleNamespace(step=7, world=4, joiners=1))
    assert (spare.step, spare.members_after, spare.state_source) == (7, 4, StateSource.PEER)  # a spare by broadcast
    assert decide(Cause.STALL, 4, 4, 4, in_place=True, survivors=s).cause is Cause.STALL
    disk = decide(Cause.FAILURE, 4, 4, 4, in_place=True, usable=8)
    assert (disk.cause, disk.step, disk.members_after, disk.state_source) == (Cause.FAILURE, 4, 4,
                                                                             StateSource.CHECKPOINT)
    lost = decide(Cause.STALL, 4, 4, 4, in_place=False, usable=3)  # fewer slots answer: a lost host
    assert (lost.cause, lost.members_after, lost.state_source) == (Cause.LOST_HOST, 3, StateSource.CHECKPOINT)
    assert lost.describe() == "lost host at step 4: 4 -> 3 workers, from checkpoint"
    assert all(c.is_failure == (c in (Cause.FAILURE, Cause.STALL, Cause.LOST_HOST)) for c in Cause)


def _changes(tmp_path) -> list[tuple]:
    return [(e.cause, e.step, e.members_before, e.members_after, e.state_source, e.segment)
            for e in read_events(tmp_path / "events.jsonl", kind="membership_change")]


def test_each_resize_and_restart_is_one_membership_change_event(tmp_path):
    ctl, _ = _controller(tmp_path, (Resize(10, 2), Resize(20, 1)), fail_launches=(1,))
    ctl.run(0, 1, 0)
    assert _changes(tmp_path) == [("schedule", 10, 1, 2, "checkpoint", 0), ("failure", 10, 2, 2, "checkpoint", 1),
                                  ("schedule", 20, 2, 1, "checkpoint", 2)]


def test_a_restart_on_fewer_hosts_is_a_lost_host_change(tmp_path):
    spec = RunSpec(run_dir=tmp_path, workers=2, schedule=(), slots=2, device="cpu", total_steps=30,
                   hosts="localhost:1,gone:1")
    ctl = Controller(spec, launcher=FakeLauncher(tmp_path, 30, fail_launches=(0,)), out=lambda s: None, poll_s=0.0,
                     show_progress=False, relaunch="sequential",
                     host_probe=lambda hosts: [h for h in hosts if h[0] != "gone"])
    ctl.run(0, 2, 0)
    assert _changes(tmp_path) == [("lost_host", 0, 2, 1, "checkpoint", 0)]


def test_one_lifecycle_vocabulary_every_state_is_reached_and_old_folders_read_as_before():
    """One ``RunState`` (what the controller is in and writes, what `status` and the web page say):
    its table reaches every state but the reader's ``crashed`` from ``starting``; a state is live
    exactly while the run is not over; a ``controller.json`` of an older elastic-ring (its own
    states, with or without the user's word in a ``phase`` key) reads as the state it meant."""
    from elastic_ring.controller.api import LAUNCHING, TERMINAL, TRANSITIONS, RunState

    reached, todo = {RunState.STARTING}, [RunState.STARTING]
    while todo:
        for nxt in TRANSITIONS[todo.pop()]:
            if nxt not in reached:
                reached.add(nxt)
                todo.append(nxt)
    assert reached == set(RunState) - {RunState.CRASHED}
    for state in RunState:
        assert state.live == (state not in TERMINAL and state is not RunState.CRASHED), state
        assert (not TRANSITIONS[state]) == (not state.live), state  # only a live state moves on
    assert all(s.live for s in LAUNCHING) and RunState.RUNNING not in LAUNCHING
    old = {"pending": "starting", "launching": "starting", "running": "running", "stopping": "stopping",
           "restarting": "restarting", "succeeded": "finished", "failed": "failed", "interrupted": "stopped"}
    assert {w: RunState.of_record({"state": w}).value for w in old} == old
    assert RunState.of_record({"state": "launching", "phase": "resizing"}) is RunState.RESIZING
    assert RunState.of_record({"state": "stopping", "phase": "resizing"}) is RunState.RESIZING
    assert RunState.of_record({"state": "running", "phase": "restarting"}) is RunState.RESTARTING
    assert RunState.read("bogus") is None and RunState.of_record({}) is None


def test_the_summary_and_the_web_page_show_each_change_its_cause_and_state_source(cluster):  # noqa: F811
    from elastic_ring.cluster.web import ClusterView

    d, a, _ = cluster
    ev = d / "jobs" / str(a) / "events.jsonl"
    kept = ev.read_text().rsplit("\n", 1)[0] + "\n"  # without the partial last line
    change = {"kind": "membership_change", "time": 1030.0, "cause": "failure", "step": 32, "members_before": 2,
              "members_after": 1, "state_source": "memory", "segment": 1}
    newer = {**change, "cause": "preempt", "step": 38}  # a cause of a newer version: still shown
    ev.write_text(kept + json.dumps(change) + "\n" + json.dumps(newer) + "\n")
    ja = ClusterView(d, clock=lambda: 1060.0).state()["jobs"][0]
    assert [c["what"] for c in ja["membership_changes"]] == ["failure at step 32: 2 -> 1 workers, from memory",
                                                             "preempt at step 38: 2 -> 1"]
    assert ja["last_change"] == "preempt at step 38: 2 -> 1" and ja["membership_changes"][0]["state_source"] == "memory"
    lines = render(summarize(read_events(ev, kind="membership_change")), 100).splitlines()
    assert "  failure at step 32: 2 -> 1 workers, from memory" in lines


def test_a_request_says_who_asked_it_live_or_the_cluster_policy(tmp_path):
    from elastic_ring.controller.requests import take_asked
    from elastic_ring.protocol import REQUEST_FILE

    path = tmp_path / "control" / REQUEST_FILE
    path.parent.mkdir()
    seen: set[str] = set()
    path.write_text(json.dumps({"to": 2, "time": 5.0, "id": "a", "source": "policy"}))
    assert take_asked(tmp_path, seen) == (2, 5.0, "policy") and not path.exists()
    path.write_text(json.dumps({"to": 3, "id": "b"}))  # written by a version before "source": `resize`'s
    assert take_asked(tmp_path, seen) == (3, None, "live")
    assert Cause("policy") is Cause.POLICY and not Cause.POLICY.is_failure
