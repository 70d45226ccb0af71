"""`cluster up --hostfile`: a job's slots become a horovodrun -H list of its hosts."""

from __future__ import annotations

import pytest

from elastic_ring.cluster.api import ClusterConfig, JobRequest, JobRow, JobState
from elastic_ring.cluster.runner import ProcessRunner
from elastic_ring.cluster.scheduler import Scheduler
from elastic_ring.cluster.daemon import hostfile_slots as _parse_hostfile
from elastic_ring.sched.registry import make_policy


def _job(jid=1, max_workers=0):
    return JobRow(id=jid, name="j", request=JobRequest(name="j", kind="script", path="x.py", steps=10,
                                                       max_workers=max_workers), state=JobState.QUEUED, submitted=0.0)


def _arg(cmd, flag):
    return cmd[cmd.index(flag) + 1]


@pytest.mark.parametrize("slots, hosts", [([0, 1], "localhost:1,127.0.0.1:1"), ([1], "127.0.0.1:1"),
                                          ([0], "localhost:1")])
def test_two_hosts_of_one_slot(tmp_path, slots, hosts):
    cfg = ClusterConfig(hosts=(("localhost", 1), ("127.0.0.1", 1)), network_interface="lo")
    cmd, env = ProcessRunner(tmp_path, cfg).command(_job(), slots, len(slots), resume=False)
    assert _arg(cmd, "--hosts") == hosts
    assert _arg(cmd, "--workers") == _arg(cmd, "--slots") == str(len(slots))  # no live resize across hosts
    assert _arg(cmd, "--network-interface") == "lo"


def test_slots_spanning_a_host_boundary(tmp_path):
    cfg = ClusterConfig(hosts=(("a", 2), ("b", 2), ("c", 4)))
    r = ProcessRunner(tmp_path, cfg)
    assert _arg(r.command(_job(), [1, 2, 3], 3, False)[0], "--hosts") == "a:1,b:2"
    assert _arg(r.command(_job(), [4, 5, 6, 7], 4, True)[0], "--hosts") == "c:4"
    assert "--resume" in r.command(_job(), [4], 1, True)[0]


def test_hostfile_parsing_and_no_live_resize(tmp_path):
    hf = tmp_path / "hosts"
    hf.write_text("# two local 'hosts'\nlocalhost slots=1\n127.0.0.1 slots=1\n")
    hosts = _parse_hostfile(str(hf))
    assert hosts == (("localhost", 1), ("127.0.0.1", 1))
    cfg = ClusterConfig(hosts=hosts)
    assert cfg.slots == 2 and cfg.multi_host
    assert Scheduler(None, cfg, make_policy("eight"), None, rate_for=lambda j: (lambda w: w)).live_resize is False
