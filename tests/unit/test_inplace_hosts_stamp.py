"""Rank 0 of a Horovod Elastic ring re-forms for the controller's action once the driver has
reported a host change at least as new as the action's host list (``ElasticRing.takes``); the
driver stamps that report with the whole second it saw the change. The controller stamped its
host list (``hosts_written``) after writing it: on a loaded machine that stamp came later than the
driver's sight of the file by more than the rest of that second, the report looked older than the
list, rank 0 never took the action and the run hung at that stop (issue 45: seen in a fresh-clone
CI run and reproduced here, the driver at x.998 s, the stamp at x+1.002 s)."""

from __future__ import annotations

import time

from elastic_ring.controller.api import Resize, RunSpec
from elastic_ring.controller.backends import elastic
from elastic_ring.controller.backends.api import SegmentLaunch
from elastic_ring.seam import Action
from elastic_ring.worker.ring import ElasticRing


class Launcher:
    def start(self, cmd, env, log):
        return object()


def test_the_driver_s_report_of_a_host_list_is_never_older_than_its_stamp(tmp_path, monkeypatch):
    spec = RunSpec(run_dir=tmp_path, workers=2, schedule=(Resize(5, 1),), slots=2, device="cpu", total_steps=10)
    b = elastic.ElasticBackend(spec, launcher=Launcher())
    b.start(SegmentLaunch(2, 0, 5, ""), tmp_path / "log")
    clock = [100.998]
    monkeypatch.setattr(elastic.time, "time", lambda: clock[0])
    real, seen = elastic.write_hosts, []

    def written_and_seen(*args, **kwargs):
        changed = real(*args, **kwargs)
        seen.append(int(clock[0]))  # the driver reads the file at once: its report says second 100
        clock[0] = 101.002  # and the controller goes on a moment later
        return changed

    monkeypatch.setattr(elastic, "write_hosts", written_and_seen)
    b.report_ahead(SegmentLaunch(1, 1, 10, ""))
    monkeypatch.undo()
    act = Action.from_json({"action": "resize", "to": 1, "segment": 1, "stop_at": 10,
                            "hosts_written": b.hosts_written})
    rank0 = ElasticRing()
    assert not rank0.takes(act)  # no report yet
    rank0.on_hosts_updated(seen[0], None)
    assert rank0.takes(act) and b.hosts_written <= time.time()
