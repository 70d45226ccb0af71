"""Fixed hosts get what discovered hosts have (docs/hosts.md): with `--hosts localhost:1,127.0.0.1:1`
(the two-host tests' way of having two hosts on one machine) and no discovery script, the list is
watched as a discovery whose answer never changes: a failed worker's host is left out for its
cooldown and grown back onto, `elastic-ring drain` and a worker's SIGTERM shrink off a host with
nothing redone, and
`--relaunch inplace` runs over the hosts (a drain there leaves the survivor in its process).

Real horovodrun (gloo) runs of the tiny built-in ResNet; the helpers are test_discovery's and
two_hosts'."""

from __future__ import annotations

import pytest

from tests.conftest import run_cli, wait_for
from tests.integration.test_discovery import TINY, _events, _history, _start, _trace
from tests.integration.test_discovery_hosts_inplace import _alive, _by_host, _in_place, _started
from tests.integration.two_hosts import (drain_127_then_shrunk, kill_127_then_grown_back, sigterm_127_then_shrunk,
                                         status_lines, stop_once_grown)

pytestmark = pytest.mark.integration

BOTH, ONE = "localhost:1,127.0.0.1:1", "localhost:1"


def _hosts_of(launch: dict) -> str:
    return launch["command"][launch["command"].index("-H") + 1]


def test_a_failed_fixed_host_is_left_out_for_its_cooldown_then_grown_back_onto(tmp_path):
    steps = 700  # the grow back lands at most ~1.5 s of 1-worker steps after the relaunch (2 s cooldown);
    # the run is stopped (Ctrl-C) once the grown ring has done a step
    run = tmp_path / "cool"
    proc = _start(["--gpus", "2", "--steps", str(steps), *TINY, "--hosts", BOTH, "--blacklist-cooldown-range", "2:4",
                   "--run-dir", str(run)])
    victim, out, err, end = kill_127_then_grown_back(proc, run)  # status names 127.0.0.1 excluded meanwhile
    assert f"elastic-ring: hosts {BOTH}, fixed: a host whose worker fails is left out for 2-4 s" in err
    launches = _events(run, "launch")
    assert [(e["world_size"], _hosts_of(e)) for e in launches] == [(2, BOTH), (1, ONE), (2, BOTH)]
    (restart,) = _events(run, "restart")
    assert restart["rank"] == victim["rank"] and restart["node"] == "127.0.0.1" and not restart["gave_up"]
    changes = _events(run, "membership_change")
    assert [(c["cause"], c["members_before"], c["members_after"]) for c in changes] == [
        ("failure", 2, 2), ("hosts", 2, 1), ("hosts", 1, 2)]
    hc = _events(run, "hosts_changed")
    assert [(h["diff"], h["hosts"], h["target"]) for h in hc] == [
        ("+localhost:1 +127.0.0.1:1", BOTH, 2), ("-127.0.0.1:1", ONE, 1), ("+127.0.0.1:1", BOTH, 2)]
    assert hc[2]["time"] - hc[1]["time"] >= 1.5  # back after its 2 s cooldown, not before
    notes = [n["message"] for n in _events(run, "notice")]
    assert any(n.startswith(f"host 127.0.0.1 (rank {victim['rank']}) excluded until ")
               and n.endswith("after 1 failure (cooldown 2 s)") for n in notes), notes
    assert "host 127.0.0.1 back from its cooldown" in notes
    trained, redone = _history(run)
    assert sorted(trained) == list(range(1, end + 1))
    assert all(restart["from_step"] < s <= restart["failed_at_step"] + 1 for s in redone), (redone, restart)
    grow = changes[2]["step"]
    assert launches[2]["start_step"] == grow + 1 and 0 < grow < end <= steps
    assert {trained[s] for s in range(grow + 1, end + 1)} == {16}
    assert {trained[s] for s in range(restart["from_step"] + 1, grow + 1)} == {8}
    assert "Traceback" not in err


def test_drain_of_a_fixed_host_shrinks_off_it_with_nothing_redone(tmp_path):
    steps = 500  # the shrink lands by step ~80 at load 15; stopped (Ctrl-C) once the shrunk ring did a step
    run = tmp_path / "drain"
    proc = _start(["--gpus", "2", "--steps", str(steps), *TINY, "--hosts", BOTH, "--run-dir", str(run)])

    def drained_line():
        line = wait_for(lambda: next((ln for ln in status_lines(run) if ln.startswith("hosts:")), None), 30,
                        "status's hosts line")
        assert line == "hosts: localhost:1 (1 slot); drained: 127.0.0.1", line  # out for the rest of the run

    out, err, end = drain_127_then_shrunk(proc, run, then=drained_line)
    launches = _events(run, "launch")
    assert [(e["world_size"], _hosts_of(e)) for e in launches] == [(2, BOTH), (1, ONE)]
    (change,) = _events(run, "membership_change")
    assert (change["cause"], change["members_before"], change["members_after"], change["state_source"]) == (
        "drained", 2, 1, "checkpoint")
    assert launches[1]["start_step"] == change["step"] + 1 and not _events(run, "restart")
    trained = _trace(run)  # (a step a rank traced twice is an assertion there: nothing redone)
    assert sorted(trained) == list(range(1, end + 1))
    assert {trained[s] for s in range(1, change["step"] + 1)} == {16}
    assert change["step"] < end <= steps and {trained[s] for s in range(change["step"] + 1, end + 1)} == {8}
    notes = [n["message"] for n in _events(run, "notice")]
    assert f"drained 127.0.0.1 (elastic-ring drain) at step {change['step']}: 2 -> 1 workers, no step redone" \
        in notes, notes
    assert "Traceback" not in err


def test_in_place_over_fixed_hosts_a_drain_leaves_the_survivor_in_its_process(tmp_path):
    steps = 400
    run = tmp_path / "inplace"
    proc = _start(["--gpus", "2", "--steps", str(steps), *TINY, "--hosts", BOTH, "--relaunch", "inplace",
                   "--run-dir", str(run)])
    try:
        wait_for(lambda: [t for t in _events(run, "throughput") if t["world_size"] == 2], 120, "a window at 2")
        wait_for(lambda: len(_by_host(run)) == 2, 30, "both workers' records")
        pids = _by_host(run)
        assert set(pids) == {"localhost", "127.0.0.1"}, pids  # one worker on each host, by its name
        before = _started(run)
        r = run_cli("drain", str(run), "127.0.0.1", "--deadline", "60")
        assert r.returncode == 0, r.stderr
        wait_for(lambda: _events(run, "membership_change"), 120, "the shrink")
        assert _alive(pids["localhost"]) and _started(run) == before  # no worker started for it
        out, err, end = stop_once_grown(proc, run, world=1, launches=2)  # Ctrl-C once the shrunk ring stepped
    finally:
        if proc.poll() is None:
            proc.kill()
    changes = _events(run, "membership_change")
    assert [(c["cause"], c["members_before"], c["members_after"], c["state_source"]) for c in changes] == [
        ("drained", 2, 1, "memory")]
    _in_place(run, err, changes, end, [2, 1])  # one horovodrun, nothing redone, no checkpoint read back
    assert not _alive(pids["127.0.0.1"])  # the driver ended the worker on the drained host
    assert [(h["hosts"], h["target"]) for h in _events(run, "hosts_changed")] == [(BOTH, 2), (ONE, 1)]


def test_a_sigterm_to_a_worker_on_a_fixed_host_is_a_preempted_shrink(tmp_path):
    steps = 500  # the shrink lands by step ~60 at load 15; stopped (Ctrl-C) once the shrunk ring did a step
    run = tmp_path / "preempt"
    proc = _start(["--gpus", "2", "--steps", str(steps), *TINY, "--hosts", BOTH, "--run-dir", str(run)])
    victim, out, err, end = sigterm_127_then_shrunk(proc, run)  # how Kubernetes and spot reclaims preempt
    (notice,) = _events(run, "preempt_notice")
    assert (notice["rank"], notice["segment"], notice["pid"]) == (victim["rank"], 0, victim["pid"])
    assert [(e["world_size"], _hosts_of(e)) for e in _events(run, "launch")] == [(2, BOTH), (1, ONE)]
    (change,) = _events(run, "membership_change")
    assert (change["cause"], change["members_before"], change["members_after"]) == ("preempted", 2, 1)
    assert not _events(run, "restart") and sorted(_trace(run)) == list(range(1, end + 1))  # nothing redone
    assert change["step"] < end <= steps
    assert "preempted 127.0.0.1: 2 -> 1 workers at the next agreed step" in err and "Traceback" not in err
