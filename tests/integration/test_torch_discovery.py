"""`train --host-discovery-script --collective torch`: a torch.distributed job relaunched over the
hosts a script lists (docs/hosts.md), as the Horovod one (tests/integration/test_discovery.py, whose
helpers it uses: a script catting a file the test rewrites, hosts `localhost` and `127.0.0.1`).
Real horovodrun launches of torch.distributed workers (gloo) of a tiny ResNet."""

from __future__ import annotations

import pytest

from elastic_ring import protocol
from tests.conftest import one_line_error, run_cli, wait_for
from tests.integration.test_discovery import TINY, _discovery, _events, _history, _start, _trace, list_hosts
from tests.integration.test_notice import _shrunk_off_127
from tests.integration.two_hosts import (drain_127_then_shrunk, kill_127_then_grown_back, sigterm_127_then_shrunk,
                                         stop_once_grown)

pytestmark = pytest.mark.integration


def test_a_torch_job_grows_onto_a_discovered_host_and_shrinks_off_it(tmp_path):
    steps = 800  # the shrink comes by step ~200; stopped (Ctrl-C) once the shrunk ring did a step
    script, listed, _ = _discovery(tmp_path, "localhost:1\n")
    run = tmp_path / "run"
    proc = _start(["--steps", str(steps), *TINY, "--collective", "torch", "--host-discovery-script", str(script),
                   "--discovery-interval", "0.3", "--min-workers", "1", "--max-workers", "2", "--run-dir", str(run)])
    try:
        wait_for(lambda: _events(run, "throughput"), 120, "a window at 1 worker")
        list_hosts(listed, "localhost:1\n127.0.0.1:1\n")  # a host appears
        wait_for(lambda: [t for t in _events(run, "throughput") if t["world_size"] == 2], 120,
                 "a window at 2 workers")
        assert "hosts: localhost:1,127.0.0.1:1 (2 slots)" in run_cli("status", str(run)).stdout.splitlines()
        list_hosts(listed, "localhost:1\n")  # and is dropped
        wait_for(lambda: len(_events(run, "launch")) >= 3, 120, "the shrink")
        out, err, end = stop_once_grown(proc, run, world=1, launches=3)
    finally:
        if proc.poll() is None:
            proc.kill()
    # horovodrun launched each segment on the hosts discovered, its workers a torch.distributed group
    launches = _events(run, "launch")
    assert [(e["world_size"], e["command"][e["command"].index("-H") + 1]) for e in launches] == [
        (1, "localhost:1"), (2, "localhost:1,127.0.0.1:1"), (1, "localhost:1")]
    assert all("elastic_ring.controller.hvdrun" in e["command"] for e in launches)
    assert protocol.read_run_json(run)["worker"]["collective"] == "torch"
    changes = _events(run, "membership_change")
    assert [(c["cause"], c["members_before"], c["members_after"], c["state_source"]) for c in changes] == [
        ("hosts", 1, 2, "checkpoint"), ("hosts", 2, 1, "checkpoint")]
    assert [e["start_step"] for e in launches[1:]] == [c["step"] + 1 for c in changes]
    trained = _trace(run)  # (asserts no step was trained twice by a rank)
    assert sorted(trained) == list(range(1, end + 1))  # every step once
    grow, shrink = changes[0]["step"], changes[1]["step"]
    assert 0 < grow < shrink < end <= steps
    assert {trained[s] for s in range(grow + 1, shrink + 1)} == {16} and trained[1] == trained[end] == 8
    assert "Traceback" not in err


def _two_host_run(tmp_path, name: str, steps: int):
    script, _, _ = _discovery(tmp_path, "localhost:1\n127.0.0.1:1\n")
    run = tmp_path / name
    proc = _start(["--steps", str(steps), *TINY, "--collective", "torch", "--host-discovery-script", str(script),
                   "--discovery-interval", "0.3", "--run-dir", str(run)])
    wait_for(lambda: [t for t in _events(run, "throughput") if t["world_size"] == 2], 120, "a window at 2 workers")
    return run, proc


def test_a_torch_job_drained_off_a_host_redoes_nothing(tmp_path):
    steps = 400  # the shrink lands by step ~65 at load 29; stopped (Ctrl-C) once the shrunk ring did a step
    run, proc = _two_host_run(tmp_path, "drain", steps)
    out, err, end = drain_127_then_shrunk(proc, run)
    _shrunk_off_127(run, end, "drained", "elastic-ring drain")  # 2 -> 1 at the agreed step, every step once
    assert "Traceback" not in err


def test_a_sigterm_to_one_torch_worker_is_a_preempted_shrink(tmp_path):
    steps = 400  # the shrink lands by step ~65 at load 29; stopped (Ctrl-C) once the shrunk ring did a step
    run, proc = _two_host_run(tmp_path, "preempt", steps)
    victim, out, err, end = sigterm_127_then_shrunk(proc, run)
    (notice,) = _events(run, "preempt_notice")
    assert (notice["rank"], notice["segment"], notice["pid"]) == (victim["rank"], 0, victim["pid"])
    _shrunk_off_127(run, end, "preempted", f"SIGTERM to rank {victim['rank']}")  # not a failure, nothing redone


def test_a_torch_workers_failed_host_cools_down_and_is_grown_back_onto(tmp_path):
    steps = 800  # the grow back lands ~2 s after the kill: by step ~270 at load 7 (torch steps at 1 worker: ~5 ms);
    # the run is stopped (Ctrl-C) once the grown ring has done a step
    script, _, _ = _discovery(tmp_path, "localhost:1\n127.0.0.1:1\n")
    run = tmp_path / "cool"
    proc = _start(["--steps", str(steps), *TINY, "--collective", "torch", "--host-discovery-script", str(script),
                   "--discovery-interval", "0.3", "--blacklist-cooldown-range", "2:4", "--run-dir", str(run)])
    _, out, err, end = kill_127_then_grown_back(proc, run, excluded_line=False)  # the worker on 127.0.0.1 dies
    both, one = "localhost:1,127.0.0.1:1", "localhost:1"
    launches = _events(run, "launch")
    assert [(e["world_size"], e["command"][e["command"].index("-H") + 1]) for e in launches] == [
        (2, both), (1, one), (2, both)]
    (restart,) = _events(run, "restart")
    assert restart["node"] == "127.0.0.1" and not restart["gave_up"]
    hc = _events(run, "hosts_changed")
    assert [(h["diff"], h["target"]) for h in hc] == [
        ("+localhost:1 +127.0.0.1:1", 2), ("-127.0.0.1:1", 1), ("+127.0.0.1:1", 2)]
    assert hc[2]["time"] - hc[1]["time"] >= 1.5  # back after its 2 s cooldown
    trained, redone = _history(run)  # every step trained; only the failure's lost steps twice
    assert sorted(trained) == list(range(1, end + 1))
    assert all(restart["from_step"] < s <= restart["failed_at_step"] + 1 for s in redone), (redone, restart)
    assert launches[2]["start_step"] <= end <= steps  # the grown ring trained before the stop
    assert "Traceback" not in err


def test_a_torch_ring_in_place_refuses_another_machine_in_one_line(tmp_path, cli_inproc):
    script, _, _ = _discovery(tmp_path, "node7:2\n")  # (this host's slots in place: test_discovery_inplace.py)
    r = cli_inproc("train", "--steps", "2", *TINY, "--collective", "torch", "--relaunch", "inplace",
                   "--host-discovery-script", str(script), "--run-dir", str(tmp_path / "r"))
    one_line_error(r, "--relaunch inplace runs on this host only: discovery script")
