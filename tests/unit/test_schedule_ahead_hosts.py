"""In place over hosts (issue 45), a scheduled shrink is written ahead as a dropped host's is: once
the segment trains, the controller places the next ring's hosts and the Horovod Elastic backend
writes that host list and the action for the schedule's stop, which rank 0 takes there (before,
over hosts nothing was written ahead for a schedule: the controller wrote both only once it saw
the workers pause, and rank 0 waited for it and for the driver's notice). A grow, or a size the
discovered slots do not allow, is not written ahead. Fakes for the launcher; the hosts fixed."""

from __future__ import annotations

import time
from pathlib import Path

from elastic_ring import seam
from elastic_ring.controller.api import Resize, RunSpec
from elastic_ring.controller.backends import InPlace
from elastic_ring.controller.backends.api import SegmentLaunch
from elastic_ring.controller.backends.elastic import ElasticBackend
from elastic_ring.controller.controller import Controller
from elastic_ring.controller.segment import Segment
from elastic_ring.hosts.api import HostSet, WorkerBounds
from elastic_ring.hosts.discovery import FixedHosts, HostPoller
from elastic_ring.hosts.manager import HostManager
from tests.unit.elastic_fakes import Launcher, listed_hosts as _listed


def _running(tmp_path: Path, schedule: tuple[Resize, ...], world: int = 2, lo: int = 1):
    """A controller over the hosts a:1 and b:1 in place, its segment 0 at ``world`` running (the
    backend started on the hosts placed for it)."""
    spec = RunSpec(run_dir=tmp_path, workers=world, schedule=schedule, slots=2, device="cpu", total_steps=60)
    backend = ElasticBackend(spec, launcher=Launcher(), survive=True)
    backend.run_over_hosts()
    manager = HostManager(HostPoller(FixedHosts(HostSet([("a", 1), ("b", 1)])), interval_s=0.01),
                          WorkerBounds(lo, 2))
    ctl = Controller(spec, backend=backend, resize=InPlace(backend), hosts=manager, out=lambda line: None,
                     poll_s=0.0, show_progress=False)
    ctl.hosts.view(0)
    seg = Segment(0, world, ctl._next_stop(0))
    backend.use_hosts(ctl.hosts.place(seg).arg())
    backend.start(SegmentLaunch(world, 0, seg.stop_at, ctl.owner), tmp_path / "seg.log")
    return ctl, backend, seg



def test_a_scheduled_shrink_over_hosts_is_written_ahead_with_its_hosts_once_the_segment_trains(tmp_path):
    ctl, backend, seg = _running(tmp_path, (Resize(20, 1), Resize(40, 2)))
    assert seg.stop_at == 20 and _listed(tmp_path) == "a:1\nb:1\n"
    t = time.time()
    ctl._stepping(seg)  # the segment's first step: the schedule's shrink is prepared
    assert _listed(tmp_path) == "a:1\n"  # the driver sees the next ring's hosts while the workers train
    act = seam.read_action(tmp_path, 0)
    assert act.ahead and act.at_step == 20 and (act.world, act.segment, act.stop_at) == (1, 1, 40)
    assert act.hosts_written >= t
    assert seg.ahead_hosts == "a:1" and ctl.ahead.written is not None and ctl.ahead.written[0] == 0
    assert seam.take_ahead_action(tmp_path, 0)  # rank 0 at the scheduled stop
    assert not ctl._redirectable(0)  # the controller follows: the next segment runs on a:1 (Controller._resize)


def test_a_scheduled_grow_or_a_shrink_below_the_minimum_is_not_written_ahead_over_hosts(tmp_path):
    grow, _, seg = _running(tmp_path / "grow", (Resize(20, 2),), world=1)
    grow._stepping(seg)
    assert _listed(tmp_path / "grow") == "a:1\n" and seam.read_action(tmp_path / "grow", 0) is None
    assert seg.ahead_hosts is None
    low, _, seg = _running(tmp_path / "low", (Resize(20, 1),), lo=2)  # 1 is below --min-workers 2
    low._stepping(seg)
    assert _listed(tmp_path / "low") == "a:1\nb:1\n" and seam.read_action(tmp_path / "low", 0) is None
    assert seg.ahead_hosts is None
