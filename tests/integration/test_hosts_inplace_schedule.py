"""A `--schedule` over hosts in place (issue 45): with `--hosts localhost:1,127.0.0.1:1 --relaunch
inplace`, the scheduled shrink to one worker is written ahead as a dropped host's is (the next
ring's host list and its action for the schedule's step, once the segment trains) and rank 0 takes
it at that step (`inplace-0.taken.json`); the survivor goes on in its process on `localhost`, the
driver ends the worker on `127.0.0.1`, and the scheduled grow back onto it re-forms the ring in
place (its ring not written ahead: the controller's word at the pause). Every step trained once,
nothing read back from disk.

A real horovodrun (gloo) run of the tiny built-in ResNet; the helpers are the hosts tests'."""

from __future__ import annotations

import pytest

from elastic_ring import protocol
from tests.conftest import wait_for
from tests.integration.test_discovery import TINY, _events, _start
from tests.integration.test_discovery_hosts_inplace import _by_host, _in_place

pytestmark = pytest.mark.integration

BOTH, ONE = "localhost:1,127.0.0.1:1", "localhost:1"


def test_a_scheduled_shrink_over_hosts_in_place_is_taken_ahead_and_grown_back(tmp_path):
    steps, shrink, grow = 36, 12, 24
    run = tmp_path / "sched"
    proc = _start(["--gpus", "2", "--steps", str(steps), *TINY, "--hosts", BOTH, "--relaunch", "inplace",
                   "--schedule", f"{shrink}:1,{grow}:2", "--run-dir", str(run)])
    try:
        wait_for(lambda: len(_by_host(run)) == 2, 120, "both workers' records")
        pids = _by_host(run)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert set(pids) == {"localhost", "127.0.0.1"}, pids  # one worker on each host, by its name
    changes = _events(run, "membership_change")
    assert [(c["cause"], c["step"], c["members_before"], c["members_after"], c["state_source"])
            for c in changes] == [("schedule", shrink, 2, 1, "memory"), ("schedule", grow, 1, 2, "peer")]
    _in_place(run, err, changes, steps, [2, 1, 2])  # one horovodrun, nothing redone, no checkpoint read back
    control = run / "control"
    assert (control / "inplace-0.taken.json").exists()  # rank 0 took the shrink written ahead, at its step
    assert not (control / "inplace-1.taken.json").exists()  # the grow: the controller's word at the pause
    # localhost's worker went on in its process through both re-forms (its record after each)
    survivor = protocol.read_json(protocol.pid_dir(run) / f"reformed-{pids['localhost']}.json")
    assert (survivor["segment"], survivor["rank"], survivor["launch_host"]) == (2, 0, "localhost")
    assert not (protocol.pid_dir(run) / f"reformed-{pids['127.0.0.1']}.json").exists()  # ended, never re-formed
    assert "Traceback" not in err
