"""The group interface's typed state and its re-form from a state source, without processes: a
backend's ``monitor`` (:class:`~elastic_ring.controller.backends.api.GroupStatus`), the state the
controller's watch settles on, and a re-form handed the change's
:class:`~elastic_ring.controller.membership.StateSource` (served, or refused in one line)."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest

from elastic_ring.controller.api import Resize, RunSpec
from elastic_ring.controller.backends import InPlace, Relaunch
from elastic_ring.controller.backends.api import Backend, GroupState, GroupStatus, SegmentLaunch, serve_source
from elastic_ring.controller.backends.elastic import ElasticBackend
from elastic_ring.controller.controller import Controller
from elastic_ring.controller.membership import StateSource
from elastic_ring.controller.segment import Segment


def _spec(tmp_path) -> RunSpec:
    return RunSpec(run_dir=tmp_path, workers=2, schedule=(Resize(5, 1),), slots=2, device="cpu", total_steps=10)


class _Handle:
    pid = 1

    def __init__(self, rc: int | None) -> None:
        self.rc = rc

    def poll(self) -> int | None:
        return self.rc

    def kill(self) -> None:
        pass


class _Ring(Backend):
    """A backend whose workers stay: what it was asked to re-form, and from which source."""

    name = "fake-ring"

    def __init__(self) -> None:
        self.reformed: list[tuple[int, int, StateSource]] = []
        self.started: list[SegmentLaunch] = []

    def start(self, launch, log_path):
        from elastic_ring.controller.backends.api import Started

        self.started.append(launch)
        return Started(_Handle(None), ["fake"])

    def resize_in_place(self, paused_segment, launch, t_launch, source):
        serve_source(self.name, source)
        self.reformed.append((paused_segment, launch.world, source))

    def retract_ahead(self, segment):
        return True

    def close(self):
        pass


def test_a_backends_monitor_turns_its_handles_exit_status_into_a_typed_state():
    b = _Ring()
    assert b.monitor(_Handle(None)) == GroupStatus(GroupState.RUNNING)
    assert b.monitor(_Handle(0)) == GroupStatus(GroupState.SUCCEEDED, 0)
    failed = b.monitor(_Handle(-9))
    assert failed == GroupStatus(GroupState.FAILED, -9) and failed.failed
    assert GroupStatus(GroupState.STALLED, 1).failed
    assert not any(GroupStatus(s).failed for s in (GroupState.RUNNING, GroupState.WAITING, GroupState.SUCCEEDED))


def test_the_watch_settles_on_a_failure_for_an_exit_before_the_segments_end_and_a_stall_for_a_hang():
    ok = GroupStatus(GroupState.SUCCEEDED, 0)
    assert ok.settled(ended=False, hung=False) == GroupStatus(GroupState.FAILED, 0)  # exited before its end
    assert ok.settled(ended=True, hung=False) == ok
    waiting = GroupStatus(GroupState.WAITING)
    assert waiting.settled(ended=True, hung=False) == waiting and waiting.settled(ended=False, hung=True) == waiting
    failed = GroupStatus(GroupState.FAILED, 1)
    assert failed.settled(ended=True, hung=False) == failed
    assert failed.settled(ended=True, hung=True) == GroupStatus(GroupState.STALLED, 1)
    assert ok.settled(ended=False, hung=True) == GroupStatus(GroupState.STALLED, 0)  # an exit 0 of a hung group
    assert ok.settled(ended=True, hung=True) == ok  # a clean end after all is no stall


def test_the_next_segment_begins_from_the_changes_state_source(tmp_path):
    """From the checkpoint a new group is started; from memory or a peer the paused group is
    re-formed in place, handed that source: the loop asks the source, not the backend."""
    from elastic_ring.controller.api import RunState

    for source in (StateSource.MEMORY, StateSource.PEER, StateSource.CHECKPOINT):
        b = _Ring()
        ctl = Controller(_spec(tmp_path), backend=b, resize=InPlace(b), out=lambda s: None, show_progress=False)
        ctl.state = RunState.RESIZING
        if source is not StateSource.CHECKPOINT:
            ctl._elastic = Segment(0, 2, 5, handle=SimpleNamespace(pid=os.getpid()), log=tmp_path / "seg.log")
        seg = ctl._begin(5, 1, 1, source)
        if source is StateSource.CHECKPOINT:
            assert b.reformed == [] and [(s.world, s.segment) for s in b.started] == [(1, 1)]
        else:
            assert b.reformed == [(0, 1, source)] and b.started == []
        assert seg.index == 1 and seg.world == 1


def test_a_reform_from_a_source_the_backend_cannot_serve_is_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError) as e:
        serve_source("ray", StateSource.CHECKPOINT)
    assert str(e.value) == "the ray backend cannot re-form from checkpoint: it re-forms from memory or peer"
    serve_source("ray", StateSource.MEMORY)
    serve_source("ray", StateSource.PEER)

    class Launcher:
        def start(self, cmd, env, log):
            return _Handle(None)

    b = ElasticBackend(_spec(tmp_path), launcher=Launcher())
    b.start(SegmentLaunch(2, 0, 5, ""), tmp_path / "log")
    with pytest.raises(ValueError, match="^the elastic backend cannot re-form from checkpoint") as e:
        InPlace(b).reform(0, SegmentLaunch(1, 1, 10, ""), time.time(), StateSource.CHECKPOINT)
    assert "\n" not in str(e.value)
    InPlace(b).reform(0, SegmentLaunch(1, 1, 10, ""), time.time(), StateSource.MEMORY)  # a shrink: served
    with pytest.raises(RuntimeError, match="no worker waits paused to go on from memory"):
        Relaunch("overlap").reform(0, SegmentLaunch(1, 1, 10, ""), time.time(), StateSource.MEMORY)
