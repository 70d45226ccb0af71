"""A fixed host list (``--hosts``, ``--hostfile``, Slurm's nodes) as a discovery whose answer never
changes (:func:`elastic_ring.controller.prepare_hosts.host_manager`): the controller's HostManager
over it, a failed host left out for its cooldown and back after it, in place over the hosts or on
this host only, the lists it does not watch, Slurm's nodelist going through it (fake variables), the
refusals lifted and kept, and what run.json keeps (a worker's SIGTERM a notice, a resume)."""

from __future__ import annotations

import json
import time

import pytest

from elastic_ring.controller.prepare_hosts import (fixed_hosts, fixed_kept, host_manager, with_run_discovery,
                                                   with_slurm_hosts)
from elastic_ring.controller.requests import RunRequest, check
from elastic_ring.errors import UserError
from elastic_ring.hosts.api import HostSet
from elastic_ring.hosts.discovery import FixedHosts, ThisHostOnly


def _manager(**kw):
    lines: list[str] = []
    return host_manager(RunRequest(**kw), lines.append), lines


def test_a_fixed_list_is_a_constant_discovery_with_a_cooldown_and_a_return():
    m, lines = _manager(hosts="localhost:1,127.0.0.1:2", cooldown_range="0.3:0.6")
    assert isinstance(m.poller.discovery, FixedHosts) and not m.over_hosts and lines == []
    assert m.poller.hosts == HostSet([("localhost", 1), ("127.0.0.1", 2)])  # asked once already
    assert (m.bounds.min, m.bounds.max) == (1, None)
    first = m.update(3)
    assert first.diff.line() == "+localhost:1 +127.0.0.1:2" and first.view.target == 3
    assert m.update(3) is None  # the answer never changes: no change without a failure
    ex = m.failed("127.0.0.1")
    assert ex.failures == 1 and 0.25 < ex.until - m.clock() <= 0.3
    gone = m.update(3)
    assert gone.diff.line() == "-127.0.0.1:2" and gone.view.target == 1 and gone.view.usable.arg() == "localhost:1"
    assert "host 127.0.0.1 excluded after a failure" in gone.notes
    time.sleep(0.35)
    back = m.update(3)
    assert back.diff.line() == "+127.0.0.1:2" and back.view.target == 3
    assert "host 127.0.0.1 back from its cooldown" in back.notes
    assert m.failed("127.0.0.1").until - m.clock() > 0.5  # the second failure: twice as long
    # drained: out for the rest of the run (the list never drops it, so never lists it "again")
    m.drain("localhost")
    m.update(3)
    time.sleep(0.65)
    view = m.update(3).view
    assert view.usable.arg() == "127.0.0.1:2" and view.drained == ("localhost",)


def test_in_place_over_the_listed_hosts_or_on_this_host_only():
    over, _ = _manager(hosts="localhost:1,127.0.0.1:1", relaunch="inplace")
    assert over.over_hosts and isinstance(over.poller.discovery, FixedHosts)
    one, _ = _manager(hosts="localhost:2", relaunch="inplace")  # one host: this host's slots, as discovery's
    assert not one.over_hosts and isinstance(one.poller.discovery, ThisHostOnly)
    assert one.view().usable.arg() == "localhost:2"
    other, _ = _manager(hosts="node7:4", relaunch="inplace")  # another machine: over it, by its name
    assert other.over_hosts and other.view().usable.arg() == "node7:4"


def test_the_lists_it_does_not_watch_and_the_cooldown_given_there(tmp_path):
    assert fixed_hosts(RunRequest()) is None  # no list: this host
    assert fixed_hosts(RunRequest(hosts="a:2")) is None  # one host relaunched: the only host is never left out
    assert fixed_hosts(RunRequest(hosts="a:1,b:1", slots=2)) is None  # the cluster's scheduler places its jobs
    # torch relaunched over several hosts is watched as under discovery; in place on one host it is its own launch
    assert fixed_hosts(RunRequest(hosts="a:1,b:1"), collective="torch") == HostSet([("a", 1), ("b", 1)])
    assert fixed_hosts(RunRequest(hosts="a:2", relaunch="inplace"), collective="torch") is None
    assert fixed_hosts(RunRequest(hosts="a:2", relaunch="inplace")) == HostSet([("a", 2)])
    hf = tmp_path / "hosts"
    hf.write_text("a slots=1\nb slots=2\n")
    assert fixed_hosts(RunRequest(hostfile=str(hf))) == HostSet([("a", 1), ("b", 2)])
    m, _ = _manager(hostfile=str(hf), worker_range=(2, 3))
    assert (m.bounds.min, m.bounds.max) == (2, 3)  # --workers MIN:MAX: never below MIN after a failure
    with pytest.raises(UserError) as e:
        host_manager(RunRequest(hosts="a:2", cooldown_range="1:2"), print)
    assert str(e.value).startswith("--blacklist-cooldown-range goes with --host-discovery-script or several hosts")


def test_slurms_nodelist_goes_through_the_fixed_list():
    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node[01-02]", "SLURM_TASKS_PER_NODE": "2(x2)"}
    lines: list[str] = []
    req = with_slurm_hosts(RunRequest(relaunch="inplace", cooldown_range="1:2"), lines.append, env)
    assert req.hosts == "node01:2,node02:2"  # in place over several nodes: no longer refused
    check(req)
    m = host_manager(req, lines.append)
    assert m.over_hosts and m.poller.hosts == HostSet([("node01", 2), ("node02", 2)])
    assert m.exclusions.cooldown.low == 1 and m.update(4).view.target == 4
    m.failed("node02")
    assert m.update(4).view.usable.arg() == "node01:2"
    relaunched = host_manager(with_slurm_hosts(RunRequest(), lines.append, env), lines.append)
    assert isinstance(relaunched.poller.discovery, FixedHosts) and not relaunched.over_hosts


def test_refusals_lifted_and_kept():
    check(RunRequest(hosts="a:1,b:1", relaunch="inplace"))
    check(RunRequest(hosts="a:1,b:1", cooldown_range="1:2"))
    for kw, needle in ((dict(cooldown_range="1:2"),
                        "--blacklist-cooldown-range goes with --host-discovery-script or --hosts/--hostfile"),
                       (dict(hosts="a:1,b:1", cooldown_range="5:1"), "--blacklist-cooldown-range: the cooldown range"),
                       (dict(min_workers=2), "--min-workers goes with --host-discovery-script or --hosts/--hostfile"),
                       (dict(hosts="a:1,b:1", relaunch="inplace", collective="torch"),
                        "--relaunch inplace runs on one host with --collective torch")):
        with pytest.raises(UserError) as e:
            check(RunRequest(**kw))
        assert str(e.value).startswith(needle), str(e.value)


def test_what_run_json_keeps_makes_a_sigterm_a_notice_and_a_resume_take_the_hosts_given(tmp_path):
    from elastic_ring.worker import notice

    req = RunRequest(hosts="a:1,b:1", cooldown_range="1:2")
    kept = fixed_kept(req)
    assert kept == {"script": None, "hosts": "a:1,b:1", "hostfile": None, "cooldown_range": "1:2"}
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"workers": 2, "host_discovery": kept}))
    assert notice.wanted(run)
    resumed = RunRequest(resume_dir=str(run))
    assert with_run_discovery(resumed) is resumed  # no script to take again: the hosts given to the resume


def test_a_resume_off_the_list_drops_what_the_start_kept_and_a_scripts_stays(tmp_path):
    from elastic_ring import protocol
    from elastic_ring.controller.runs import _keep_fixed

    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"workers": 2}))
    _keep_fixed(run, RunRequest(hosts="a:1,b:1"), object())  # watched: kept
    assert protocol.read_run_json(run)["host_discovery"]["hosts"] == "a:1,b:1"
    _keep_fixed(run, RunRequest(resume_dir=str(run)), None)  # resumed on this host: a SIGTERM ends a worker again
    assert protocol.read_run_json(run)["host_discovery"] is None
    script = {"script": "/d.sh", "interval": 1.0}
    (run / "run.json").write_text(json.dumps({"workers": 2, "host_discovery": script}))
    _keep_fixed(run, RunRequest(resume_dir=str(run), slots=2), None)
    assert protocol.read_run_json(run)["host_discovery"] == script
