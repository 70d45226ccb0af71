"""Rank 0 of a Horovod Elastic ring takes a shrink written ahead for the next stop (a host dropped
or drained) without the driver's notice where this job's horovodrun reads the host list again when
the workers reset (issue 45: asked a few steps before the stop, it paused until the driver's next
poll had noticed the list and rank 0's next look, up to 0.06 s more than a scheduled shrink's, whose
list was written long before). Elsewhere, and for the controller's word at a pause, it still waits
for the notice. Files only; no Horovod."""

from __future__ import annotations

import time

import pytest

from elastic_ring import env as envvars
from elastic_ring import hvd_patches, seam
from elastic_ring.controller import hvdrun
from elastic_ring.controller.backends.api import SegmentLaunch
from elastic_ring.worker.ring import ElasticRing


def _rank0() -> ElasticRing:
    ring = ElasticRing.__new__(ElasticRing)  # (no Horovod: take_ahead reads files and the driver's notice)
    ring.rank, ring.hosts_updated_at = 0, None  # the driver has told it nothing yet
    return ring


@pytest.mark.parametrize("survive", [None, "1", envvars.SURVIVE_AUTO, "0"])
def test_rank_0_takes_a_shrink_written_ahead_before_the_notice_where_the_driver_reads_hosts_at_reset(
        tmp_path, monkeypatch, survive):
    if survive is None:
        monkeypatch.delenv(envvars.SURVIVE, raising=False)
    else:
        monkeypatch.setenv(envvars.SURVIVE, survive)
    reads_at_reset = "survive" in hvdrun.launcher_groups({} if survive is None else {envvars.SURVIVE: survive})
    assert "resume" in [p.name for p in hvd_patches.patches("survive")]  # (what re-reads the list at reset)
    t = time.time()
    seam.write_resize_action(tmp_path, 0, SegmentLaunch(1, 1, 50, "me"), t, at_step=seam.AT_NEXT_STOP,
                             hosts_written=t)
    got = _rank0().take_ahead(tmp_path, 0, 17, scheduled=False)  # the stop agreed, no notice yet
    assert (got is not None) == reads_at_reset == (survive in ("1", envvars.SURVIVE_AUTO))
    assert seam.action_file(tmp_path, 0).exists() != reads_at_reset
    # the controller's word at a pause (here a failure's survivors') still waits for the notice
    seam.write_resize_action(tmp_path, 1, SegmentLaunch(1, 2, 50, "me"), t, hosts_written=t, rollback_to=7)
    assert not _rank0().takes(seam.read_action(tmp_path, 1))
