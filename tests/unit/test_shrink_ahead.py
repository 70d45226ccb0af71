"""A shrink asked in place off a dropped or drained host is written ahead as a scheduled shrink's
is (issue 45): the Horovod Elastic backend writes the next ring's host list and its action for the
segment's next stop (``seam.AT_NEXT_STOP``), rank 0 takes it at whichever step that stop lands,
and the controller withdraws it where rank 0 did not. Fakes for the launcher and the ring."""

from __future__ import annotations

import time
from pathlib import Path

from elastic_ring import seam
from elastic_ring.controller.api import RunSpec
from elastic_ring.controller.backends.api import SegmentLaunch
from elastic_ring.controller.membership import StateSource
from tests.unit.elastic_fakes import Launcher, listed_hosts as _listed


def _over_hosts(tmp_path: Path):
    from elastic_ring.controller.backends.elastic import ElasticBackend

    spec = RunSpec(run_dir=tmp_path, workers=2, schedule=(), slots=4, device="cpu", total_steps=50)

    b = ElasticBackend(spec, launcher=Launcher(), survive=True)
    b.run_over_hosts()
    b.use_hosts("localhost:1,127.0.0.1:1")
    b.start(SegmentLaunch(2, 0, 50, "me"), tmp_path / "seg.log")
    return b



def test_a_dropped_hosts_shrink_is_written_ahead_for_the_next_stop_and_taken_by_rank_0(tmp_path):
    b = _over_hosts(tmp_path)
    nxt = SegmentLaunch(1, 1, 50, "me")
    assert not b.shrink_ahead(SegmentLaunch(3, 1, 50, "me"), "localhost:1,127.0.0.1:2")  # a grow: not ahead
    assert not b.shrink_ahead(nxt, "localhost:1,127.0.0.1:1")  # hosts of another size than the ring's
    assert _listed(tmp_path) == "localhost:1\n127.0.0.1:1\n" and not seam.read_action(tmp_path, 0)
    t = time.time()
    assert b.shrink_ahead(nxt, "localhost:1")
    assert _listed(tmp_path) == "localhost:1\n"  # the driver sees the new list while the workers train
    act = seam.read_action(tmp_path, 0)
    assert act.ahead and act.at_step == seam.AT_NEXT_STOP and (act.world, act.segment, act.stop_at) == (1, 1, 50)
    assert act.hosts_written >= t and b.hosts_written == act.hosts_written
    assert seam.take_ahead_action(tmp_path, 0)  # rank 0, at the stop the workers agreed on
    assert not b.retract_ahead(0)  # taken: the controller follows
    b.use_hosts("localhost:1")
    b.resize_in_place(0, nxt, time.time(), StateSource.MEMORY)  # the same ring: accepted, nothing written again
    assert not seam.action_file(tmp_path, 0).exists() and _listed(tmp_path) == "localhost:1\n"


def test_a_shrink_written_ahead_that_rank_0_did_not_take_is_withdrawn_and_written_at_the_pause(tmp_path):
    b = _over_hosts(tmp_path)
    assert b.shrink_ahead(SegmentLaunch(1, 1, 50, "me"), "127.0.0.1:1")
    assert not b.shrink_ahead(SegmentLaunch(1, 1, 50, "me"), "127.0.0.1:1")  # one ahead at a time
    assert b.retract_ahead(0) and not seam.take_ahead_action(tmp_path, 0)  # withdrawn first: rank 0 cannot
    b.use_hosts("127.0.0.1:1")
    b.resize_in_place(0, SegmentLaunch(1, 1, 50, "me"), time.time(), StateSource.MEMORY)
    act = seam.read_action(tmp_path, 0)
    assert not act.ahead and act.world == 1 and _listed(tmp_path) == "127.0.0.1:1\n"


def _rank0(hosts_updated_at: float | None):
    from elastic_ring.worker.ring import ElasticRing

    ring = ElasticRing.__new__(ElasticRing)  # (no Horovod: take_ahead reads files and the driver's notice)
    ring.rank, ring.hosts_updated_at = 0, hosts_updated_at
    return ring


def test_rank_0_takes_an_action_for_the_next_stop_at_any_stop_once_the_driver_has_told_it(tmp_path):
    launch = SegmentLaunch(1, 1, 50, "me")
    t = time.time()
    seam.write_resize_action(tmp_path, 0, launch, t, at_step=seam.AT_NEXT_STOP, hosts_written=t)
    assert _rank0(None).take_ahead(tmp_path, 0, 17, scheduled=False) is None  # the driver has not reported it
    assert seam.action_file(tmp_path, 0).exists()
    got = _rank0(t).take_ahead(tmp_path, 0, 17, scheduled=False)  # an asked stop, at whatever step
    assert got is not None and got.world == 1 and not seam.action_file(tmp_path, 0).exists()
    # one written ahead for a scheduled stop's step is still taken only there
    seam.write_resize_action(tmp_path, 1, launch, t, at_step=30, hosts_written=t)
    assert _rank0(t).take_ahead(tmp_path, 1, 17, scheduled=False) is None
    assert _rank0(t).take_ahead(tmp_path, 1, 30, scheduled=True) is not None
