"""The controller under host discovery (a HostManager over fixed hosts), driven by the fake launcher
of test_controller_fake: the hosts a segment starts on, the size of the first launch, waiting below
the minimum and giving up, a live resize capped by the hosts; `status`'s line while waiting; a
failed worker's host left out for its cooldown and grown back onto after it (a fake clock); the
options that cannot go with a discovery script, and a resume's kept options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from elastic_ring.controller.api import RunSpec, RunState
from elastic_ring.controller.controller import Controller
from elastic_ring.controller.prepare_hosts import with_run_discovery
from elastic_ring.controller.requests import RunRequest, check
from elastic_ring import protocol
from elastic_ring.controller.segment import Segment
from elastic_ring.controller.status import RunStatus
from elastic_ring.errors import UserError
from elastic_ring.events import read_events
from elastic_ring.hosts.api import HostSet, WorkerBounds
from elastic_ring.hosts.discovery import FixedHosts, HostPoller
from elastic_ring.hosts.exclusion import CooldownRange, Exclusions
from elastic_ring.hosts.manager import HostManager
from tests.unit.test_controller_fake import FakeLauncher


def _controller(tmp_path: Path, hosts, lo=1, hi=None, workers=1, min_wait_s=None, total=30, fail_launches=(),
                clock=None, cooldown=None):
    spec = RunSpec(run_dir=tmp_path, workers=workers, schedule=(), slots=hi or 64, device="cpu", total_steps=total)
    spec.validate()
    disc = FixedHosts(HostSet(hosts))
    poller = HostPoller(disc, interval_s=0.01) if clock is None else HostPoller(disc, interval_s=0.01, clock=clock)
    manager = HostManager(poller, WorkerBounds(lo, hi), Exclusions(cooldown, clock=poller.clock), min_wait_s=min_wait_s)
    launcher = FakeLauncher(tmp_path, total, fail_launches)
    lines: list[str] = []
    ctl = Controller(spec, launcher=launcher, out=lines.append, poll_s=0.0, show_progress=False,
                     relaunch="sequential", hosts=manager)
    return ctl, launcher, lines


def _h(cmd_line: str) -> str:
    parts = cmd_line.split()
    return parts[parts.index("-H") + 1]


def test_the_first_launch_takes_the_usable_slots_and_says_which_hosts(tmp_path):
    ctl, launcher, _ = _controller(tmp_path, [("a", 1), ("b", 2)], hi=2, workers=1)
    summary = ctl.run(0, 1, 0)
    assert summary["state"] == "finished"
    (only,) = launcher.started
    assert only.world == 2 and _h(only.cmd_line) == "a:1,b:1"  # the first 2 slots, in order
    assert ctl.plan.world_after(0) == 2
    ev = read_events(tmp_path / "events.jsonl")
    (hc,) = [e for e in ev if e["kind"] == "hosts_changed"]
    assert (hc["diff"], hc["hosts"], hc["slots"], hc["target"]) == ("+a:1 +b:2", "a:1,b:2", 3, 2)
    assert not [e for e in ev if e["kind"] == "membership_change"]  # the start is no change of members


def test_below_the_minimum_it_waits_then_gives_up_without_a_launch(tmp_path):
    ctl, launcher, lines = _controller(tmp_path, [("a", 1)], lo=2, workers=2, min_wait_s=0.0)
    summary = ctl.run(0, 2, 0)
    assert summary["state"] == "stopped"
    assert ctl.state is RunState.STOPPED and not launcher.started
    assert any(ln.startswith("gave up waiting for hosts after 0 s (have 1, need 2); no checkpoint was written")
               for ln in lines), lines
    assert ctl._state_info["hosts"] == "waiting for hosts (have 1, need 2)"


def test_an_interrupt_while_waiting_stops_the_run(tmp_path):
    ctl, launcher, lines = _controller(tmp_path, [], lo=1)
    ctl._interrupts = 1
    ctl.run(0, 1, 0)
    assert ctl.state is RunState.STOPPED and not launcher.started
    assert any("interrupted while waiting for hosts (have 0, need 1)" in ln for ln in lines), lines


def test_a_live_resize_is_capped_by_the_discovered_slots_and_refused_outside_the_bounds(tmp_path):
    ctl, _, lines = _controller(tmp_path, [("a", 1), ("b", 1)], hi=3)
    ctl.hosts.manager.update()
    one, two = Segment(0, 1, 30), Segment(0, 2, 30)
    assert ctl.hosts.within(one, 3) == 2 and ctl.hosts.asked == 3  # capped now, 3 when a host appears
    assert "live resize to 3: 2 usable slot(s) discovered: to 2 now, to 3 when hosts appear" in lines
    assert ctl.hosts.within(two, 3) is None and ctl.hosts.asked == 3  # already at what the hosts allow
    assert ctl.hosts.within(two, 1) == 1 and ctl.hosts.asked == 1
    assert ctl.hosts.within(one, 4) is None and ctl.hosts.asked == 1  # above --max-workers: refused
    (err,) = [e for e in read_events(tmp_path / "events.jsonl") if e["kind"] == "error"]
    assert err["message"] == "live resize to 4 refused (--min-workers 1, --max-workers 3)"


def test_status_says_it_waits_for_hosts_while_live_only():
    kw = dict(run_dir=Path("r"), step=3, total_steps=10, world_size=1)
    waiting = "waiting for hosts (have 1, need 2)"
    assert RunStatus(phase=RunState.RESIZING, hosts=waiting, resize_from=2, resize_to=1, **kw).line() == waiting
    assert RunStatus(phase=RunState.RUNNING, hosts="hosts: a:1 (1 slot)", **kw).line() == "running"
    assert RunStatus(phase=RunState.FINISHED, hosts=waiting, **kw).line() == "finished"


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_a_failed_workers_host_is_left_out_and_the_restart_runs_on_the_others(tmp_path):
    clock = FakeClock()  # the manager's: never moves here, so the host stays out
    ctl, launcher, lines = _controller(tmp_path, [("a", 1), ("b", 1)], workers=2, fail_launches=(0,), clock=clock,
                                       cooldown=CooldownRange(3, 6))
    summary = ctl.run(0, 2, 0)
    assert summary["state"] == "finished"
    first, restart = launcher.started
    assert (first.world, _h(first.cmd_line)) == (2, "a:1,b:1")
    assert (restart.world, _h(restart.cmd_line)) == (1, "a:1")  # rank 1 ran on b: b is left out
    assert [e.host for e in ctl.hosts.manager.exclusions.excluded()] == ["b"]
    assert ctl.hosts.manager.exclusions.excluded()[0].until == 1003  # LOW after a first failure
    ev = read_events(tmp_path / "events.jsonl")
    (rs,) = [e for e in ev if e["kind"] == "restart"]
    assert rs["rank"] == 1 and rs["node"] == "b" and rs["path"] == "disk"
    notes = [e["message"] for e in ev if e["kind"] == "notice"]
    assert any(n.startswith("host b (rank 1) excluded until ") and n.endswith("after 1 failure (cooldown 3 s)")
               for n in notes), notes
    assert "host b excluded after a failure" in notes
    hc = [e for e in ev if e["kind"] == "hosts_changed"]
    assert [(e["diff"], e["hosts"], e["target"]) for e in hc] == [("+a:1 +b:1", "a:1,b:1", 2), ("-b:1", "a:1", 1)]
    mc = [e for e in ev if e["kind"] == "membership_change"]
    assert [(e["cause"], e["members_before"], e["members_after"]) for e in mc] == [("failure", 2, 2), ("hosts", 2, 1)]
    assert ctl._state_info["hosts"].startswith("hosts: a:1 (1 slot); excluded: b until ")


def test_after_its_cooldown_the_host_is_grown_back_onto_and_a_second_failure_doubles_it(tmp_path):
    clock = FakeClock()
    ctl, _, lines = _controller(tmp_path, [("a", 1), ("b", 1)], clock=clock, cooldown=CooldownRange(3, 5))
    watch = ctl.hosts
    two = Segment(0, 2, 30)
    watch.view(0)
    watch.place(two)
    assert watch.failed(two, 1).until == 1003 and watch.host_of(two, 0) == "a"
    one = Segment(1, 1, 30)
    view = watch.view(1)
    watch.place(one)
    assert view.target == 1 and watch.check(one, view) is None  # at 1 on a while b cools down
    clock.t = 1002.9
    assert watch.check(one, watch.view(1)) is None
    clock.t = 1003.0
    view = watch.view(1)
    assert view.target == 2 and watch.check(one, view) == 2  # grown back onto b
    ev = read_events(tmp_path / "events.jsonl")
    assert [e["diff"] for e in ev if e["kind"] == "hosts_changed"][-2:] == ["-b:1", "+b:1"]
    assert "host b back from its cooldown" in [e["message"] for e in ev if e["kind"] == "notice"]
    assert ctl._state_info["hosts"] == "hosts: a:1,b:1 (2 slots)"
    two = Segment(2, 2, 30)
    watch.place(two)
    assert watch.failed(two, 1).until == 1003 + 5  # 2 LOW = 6, capped at HIGH = 5
    assert watch.failed(two, 1).failures == 2  # (its other ranks failing with it: the same failure)
    assert watch.failed(Segment(2, 2, 30), 1).host == "b" and watch.failed(two, None) is None
    assert watch.failed(Segment(9, 1, 30), 0) is None  # a segment whose hosts are not known


def test_the_failed_ranks_host_is_its_process_record_s_launch_host(tmp_path):
    ctl, _, _ = _controller(tmp_path, [("a", 1), ("b", 1)])
    seg = Segment(0, 2, 30)
    ctl.hosts.view(0)
    ctl.hosts.place(seg)
    d = protocol.pid_dir(tmp_path)
    d.mkdir(parents=True)
    (d / "seg000-rank1.json").write_text(json.dumps({"rank": 1, "segment": 0, "pid": 1, "launch_host": "a"}))
    assert ctl.hosts.host_of(seg, 1, tmp_path) == "a" and ctl.hosts.host_of(seg, 1) == "b"
    (d / "seg000-rank1.json").write_text(json.dumps({"rank": 1, "segment": 0, "pid": 1, "launch_host": "z"}))
    assert ctl.hosts.host_of(seg, 1, tmp_path) == "b"  # not one of its hosts: by rank order


@pytest.mark.parametrize("kw, needle", [
    (dict(hosts="a:1"), "--host-discovery-script does not go with --hosts/--hostfile: the hosts come from the script"),
    (dict(hostfile="hf"), "--host-discovery-script does not go with --hosts/--hostfile"),
    (dict(slots=2), "--host-discovery-script does not go with --slots: the slots come from the script"),
    (dict(backend="ray"), "--host-discovery-script does not go with --backend ray: its nodes are Ray's"),
    (dict(discovery_interval=0.0), "--discovery-interval must be > 0 seconds, got 0"),
    (dict(min_wait=-1.0), "--min-wait must be >= 0 seconds, got -1"),
    (dict(cooldown_range="ten"), "--blacklist-cooldown-range: a cooldown range is LOW:HIGH in seconds, got 'ten'"),
    (dict(cooldown_range="9:3"), "--blacklist-cooldown-range: the cooldown range needs 0 < LOW <= HIGH, got 9:3"),
])
def test_what_cannot_go_with_a_discovery_script(kw, needle):
    with pytest.raises(UserError) as e:
        check(RunRequest(host_discovery_script="discover.sh", **kw))
    assert str(e.value).startswith(needle), str(e.value)


@pytest.mark.parametrize("option, flag, value", [
    ("min_workers", "--min-workers", 2), ("max_workers", "--max-workers", 2),
    ("discovery_interval", "--discovery-interval", 2), ("min_wait", "--min-wait", 2),
    ("cooldown_range", "--blacklist-cooldown-range", "3:6")])
def test_the_discovery_options_go_with_a_script(option, flag, value):
    with pytest.raises(UserError, match=f"{flag} goes with --host-discovery-script"):
        check(RunRequest(**{option: value}))
    check(RunRequest(host_discovery_script="discover.sh", **{option: value}))  # (with one: fine)


def test_a_torchrun_form_script_refuses_discovery(tmp_path):
    script = tmp_path / "t.py"
    script.write_text("import torch.distributed as dist\ndist.init_process_group('gloo')\n")
    with pytest.raises(UserError, match="--host-discovery-script does not apply: .* its workers run on this host"):
        check(RunRequest(script=str(script), host_discovery_script="discover.sh"))


def test_a_resume_takes_the_discovery_options_its_run_kept_unless_other_hosts_are_chosen(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"host_discovery": {
        "script": "/x/discover.sh", "interval": 0.5, "min_workers": 2, "max_workers": None, "min_wait": None,
        "cooldown_range": "3:6"}}))
    got = with_run_discovery(RunRequest(resume_dir=str(tmp_path), max_workers=4))
    assert (got.host_discovery_script, got.discovery_interval, got.min_workers, got.max_workers,
            got.cooldown_range) == ("/x/discover.sh", 0.5, 2, 4, "3:6")
    for chosen in (dict(hosts="a:1"), dict(slots=2), dict(backend="ray"), dict(host_discovery_script="/y.sh")):
        req = RunRequest(resume_dir=str(tmp_path), **chosen)
        assert with_run_discovery(req) is req
