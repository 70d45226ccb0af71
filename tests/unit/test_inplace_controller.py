"""The controller's pieces of `--relaunch inplace`, without processes."""

from __future__ import annotations

import pytest

from elastic_ring.controller.api import Resize, RunSpec
from elastic_ring.controller.backends.api import Backend
from elastic_ring.controller.backends.elastic import discovery_files, elastic_horovodrun_command, write_hosts
from elastic_ring.controller.controller import Controller
from elastic_ring.controller.membership import StateSource
from elastic_ring.errors import UserError


def _spec(tmp_path, **kw) -> RunSpec:
    return RunSpec(run_dir=tmp_path, workers=1, schedule=(Resize(5, 2),), slots=2, device="cpu",
                   total_steps=10, **kw)


def test_elastic_command_and_discovery_script(tmp_path):
    cmd = elastic_horovodrun_command(_spec(tmp_path), 1, 0, 5, owner="o")
    script, hosts = discovery_files(tmp_path)
    for a, b in (("-np", "1"), ("--min-np", "1"), ("--max-np", "2"), ("--host-discovery-script", str(script)),
                 ("--network-interface", "lo")):
        assert cmd[cmd.index(a) + 1] == b
    assert "--inplace" in cmd and cmd[-1] == "elastic_ring.train.worker"
    assert hosts.read_text() == "localhost:1\n" and "cat" in script.read_text()


def test_write_hosts_reports_whether_the_count_changed(tmp_path):
    assert write_hosts(tmp_path, 2) is True
    assert write_hosts(tmp_path, 2) is False  # Horovod's driver would see no change: no notification
    assert write_hosts(tmp_path, 1) is True
    assert discovery_files(tmp_path)[1].read_text() == "localhost:1\n"


def test_inplace_over_several_hosts_is_refused_with_torch_only(tmp_path):
    from elastic_ring.controller.requests import RunRequest, check

    check(RunRequest(relaunch="inplace", hosts="a:1,b:1"))  # over them (prepare_hosts.host_manager)
    with pytest.raises(UserError, match="one host"):
        check(RunRequest(relaunch="inplace", hosts="a:1,b:1", collective="torch"))


def test_one_factory_gives_each_mode_its_backend_and_resize_strategy(tmp_path):
    from elastic_ring.controller.backends import InPlace, LaunchOptions, Relaunch, make_launch

    spec = _spec(tmp_path)
    for mode, overlaps, prelaunches in (("sequential", False, False), ("overlap", True, False),
                                        ("prelaunch", True, True)):
        backend, resize = make_launch(LaunchOptions(mode), spec)
        assert backend.name == "horovodrun" and resize == Relaunch(mode) and not resize.keeps_workers
        assert (resize.overlaps_exit, resize.prelaunches) == (overlaps, prelaunches)
        assert resize.withdraw_ahead(3)  # nothing is ever written ahead
    backend, resize = make_launch(LaunchOptions("inplace"), spec)
    assert backend.name == "elastic" and isinstance(resize, InPlace) and resize.ring is backend
    backend, resize = make_launch(LaunchOptions("overlap", backend="ray"), spec)  # Ray resizes in place
    assert backend.name == "ray" and isinstance(resize, InPlace) and resize.ring is backend
    assert resize.keeps_workers and resize.overlaps_exit and not resize.prelaunches


def test_a_resize_in_place_prints_the_log_its_workers_write(tmp_path):
    """The workers of an in-place resize go on in the first segment's processes: the line printed
    for the new segment names that segment's log, the one that is written."""
    import os
    from types import SimpleNamespace

    from elastic_ring.controller.api import RunState
    from elastic_ring.controller.segment import Segment, segment_log

    from elastic_ring.controller.backends import InPlace

    class KeepsWorkers(Backend):
        name = "fake-elastic"

        def resize_in_place(self, paused_segment, launch, t_launch, source):
            self.resized = (paused_segment, launch.world, source)

        def retract_ahead(self, segment):
            return True

        def close(self):
            pass

    backend = KeepsWorkers()
    lines: list[str] = []
    ctl = Controller(_spec(tmp_path), backend=backend, resize=InPlace(backend), out=lines.append,
                     show_progress=False)
    first = segment_log(tmp_path, 0, 1)
    ctl._elastic = Segment(0, 1, 5, handle=SimpleNamespace(pid=os.getpid()), log=first)
    ctl.state = RunState.RESIZING
    seg = ctl._begin(5, 2, 1, StateSource.PEER)
    assert backend.resized == (0, 2, StateSource.PEER) and seg.log == first
    assert lines == [f"segment 1: 2 worker(s) from step 6 to 10 (log: {first})"], lines


def test_the_elastic_backend_writes_a_scheduled_action_ahead_and_rank_0_or_the_controller_wins(tmp_path):
    import json

    from elastic_ring.controller.backends.api import SegmentLaunch
    from elastic_ring.controller.backends.elastic import ElasticBackend
    from elastic_ring.seam import action_file, take_ahead_action

    class Launcher:
        def start(self, cmd, env, log):
            return object()

    b = ElasticBackend(_spec(tmp_path), launcher=Launcher())
    b.start(SegmentLaunch(2, 0, 10, ""), tmp_path / "log")
    nxt = SegmentLaunch(1, 1, 30, "")
    b.report_ahead(nxt)
    act = json.loads(action_file(tmp_path, 0).read_text())
    assert (act["to"], act["segment"], act["stop_at"], act["at_step"]) == (1, 1, 30, 10)
    assert discovery_files(tmp_path)[1].read_text() == "localhost:1\n"
    assert b.retract_ahead(5)  # another segment's: nothing to withdraw
    assert take_ahead_action(tmp_path, 0)  # rank 0 first
    assert not b.retract_ahead(0) and not b.retract_ahead(0)  # too late, and stays taken
    b.resize_in_place(0, nxt, 1.0, StateSource.MEMORY)  # the workers are on their way: no new action
    assert not action_file(tmp_path, 0).exists()
    later = SegmentLaunch(2, 2, 40, "")
    b.report_ahead(later)
    assert b.retract_ahead(1) and not take_ahead_action(tmp_path, 1)  # the controller first
    b.resize_in_place(1, SegmentLaunch(2, 2, 35, ""), 2.0, StateSource.PEER)  # its own word instead, without at_step
    act = json.loads(action_file(tmp_path, 1).read_text())
    assert "at_step" not in act and act["stop_at"] == 35


def test_workers_that_ran_on_through_a_ring_written_ahead_are_followed_in_place(tmp_path):
    """An in-place segment whose workers exited (status 0) after a scheduled stop: when rank 0 took
    the next ring written ahead, they ran that segment too (a short last one can end before the
    controller sees the stop), so the controller follows them in place (None) instead of taking
    it as a plain exit and relaunching that segment on a new worker; when the ring was not taken
    (withdrawn now), the exit is the exit (succeeded, 0)."""
    from types import SimpleNamespace

    from elastic_ring.controller.backends import InPlace
    from elastic_ring.controller.segment import Segment
    from elastic_ring.events.api import SegmentEnd

    class Ring(Backend):
        name = "fake-ring"
        taken = True

        def retract_ahead(self, segment):
            return not self.taken

        def close(self):
            pass

    from elastic_ring.controller.backends.api import GroupState, GroupStatus

    for taken, want in ((True, GroupStatus(GroupState.WAITING)), (False, GroupStatus(GroupState.SUCCEEDED, 0))):
        backend = Ring()
        backend.taken = taken
        ctl = Controller(_spec(tmp_path), backend=backend, resize=InPlace(backend), out=lambda s: None,
                         show_progress=False)
        ctl.diagnosis.check_stall = lambda seg: False
        seg = Segment(0, 2, 5, handle=SimpleNamespace(pid=1, poll=lambda: 0, kill=lambda: None))
        seg.end = SegmentEnd(segment=0, world_size=2, step=5, reason="scheduled", lr=0.1, stop_decided_at=1.0)
        assert ctl._watch(seg) == want, taken
