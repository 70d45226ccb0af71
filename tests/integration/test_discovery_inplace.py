"""Host discovery in place on one host (docs/hosts.md): with `--relaunch inplace` and a discovery
script that lists only this host, a change of its slots grows or shrinks the ring in the same
processes (one horovodrun, nothing redone, nothing read back); with `--collective torch` the
torch.distributed ring does the same in its processes. A script that lists several hosts
at the start runs the ring over them (tests/integration/test_discovery_hosts_inplace.py; that
choice: tests/unit/test_discovery_hosts_inplace.py).

Real horovodrun (gloo) runs of the tiny built-in ResNet, the script catting a file the test rewrites
(as tests/integration/test_discovery.py)."""

from __future__ import annotations

import pytest

from tests.conftest import wait_for
from tests.integration.test_discovery import TINY, _discovery, _events, _start, _trace, list_hosts
from tests.integration.two_hosts import stop_once_grown

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("collective", ["horovod", "torch"])
def test_one_host_slots_discovered_grow_and_shrink_the_ring_in_place(tmp_path, collective):
    steps = 600  # the grow waits for its worker's start (forked by the zygote: by step ~60 at load 5 or 15),
    # the shrink ~50 steps later (by step ~110); stopped (Ctrl-C) once the shrunk ring did a step
    script, listed, _ = _discovery(tmp_path, "localhost:1\n")
    run = tmp_path / "run"
    proc = _start(["--steps", str(steps), *TINY, "--relaunch", "inplace", "--host-discovery-script", str(script),
                   "--discovery-interval", "0.3", "--min-workers", "1", "--max-workers", "2", "--run-dir", str(run),
                   "--collective", collective])
    try:
        wait_for(lambda: _events(run, "throughput"), 120, "a window at 1 worker")
        list_hosts(listed, "localhost:2\n")  # a slot appears on this host
        wait_for(lambda: [t for t in _events(run, "throughput") if t["world_size"] == 2], 120,
                 "a window at 2 workers")
        list_hosts(listed, "localhost:1\n")  # and goes
        wait_for(lambda: len(_events(run, "membership_change")) >= 2, 120, "the shrink")
        out, err, end = stop_once_grown(proc, run, world=1, launches=3)
    finally:
        if proc.poll() is None:
            proc.kill()
    launches = _events(run, "launch")  # one horovodrun (or the torch workers kept), the ring re-formed in place
    assert [e["world_size"] for e in launches] == [1, 2, 1]
    if collective == "horovod":
        assert len({tuple(e["command"]) for e in launches}) == 1 and "--inplace" in launches[0]["command"]
    else:  # torch.distributed's ring in place on this host: its processes kept, the group re-formed
        assert "kept across resizes (the group re-formed in place)" in err
    assert [e["returncode"] for e in _events(run, "workers_exited")] == [0]
    changes = _events(run, "membership_change")
    assert [(c["cause"], c["members_before"], c["members_after"], c["state_source"]) for c in changes] == [
        ("hosts", 1, 2, "peer"), ("hosts", 2, 1, "memory")]  # nothing read back from disk
    assert [e["start_step"] for e in launches[1:]] == [c["step"] + 1 for c in changes]
    assert not _events(run, "restart")
    assert [(h["hosts"], h["target"]) for h in _events(run, "hosts_changed")] == [
        ("localhost:1", 1), ("localhost:2", 2), ("localhost:1", 1)]
    trained = _trace(run)
    assert sorted(trained) == list(range(1, end + 1))  # every step once
    grow, shrink = changes[0]["step"], changes[1]["step"]
    assert 0 < grow < shrink < end <= steps
    assert {trained[s] for s in range(grow + 1, shrink + 1)} == {16} and trained[1] == trained[end] == 8
    assert all(o["checkpoint_s"] == 0 for o in _events(run, "resize_overhead"))  # no checkpoint for either
    assert "Traceback" not in err


def test_a_sigterm_to_one_worker_under_one_host_discovery_leaves_in_place_and_stays_out(tmp_path):
    import os
    import signal

    from elastic_ring import protocol

    steps = 600  # stopped (Ctrl-C) once the shrunk ring did a step
    script, listed, _ = _discovery(tmp_path, "localhost:2\n")
    run = tmp_path / "run"
    proc = _start(["--steps", str(steps), *TINY, "--relaunch", "inplace", "--host-discovery-script", str(script),
                   "--discovery-interval", "0.3", "--run-dir", str(run)])
    try:
        wait_for(lambda: [t for t in _events(run, "throughput") if t["world_size"] == 2], 120, "a window at 2")
        rec = protocol.read_json(protocol.pid_dir(run) / "seg000-rank1.json")
        os.kill(int(rec["pid"]), signal.SIGTERM)
        out, err, end = stop_once_grown(proc, run, world=1, launches=2)
    finally:
        if proc.poll() is None:
            proc.kill()
    changes = _events(run, "membership_change")  # its slot stays out while the script still lists 2
    assert [(c["cause"], c["members_before"], c["members_after"], c["state_source"]) for c in changes] == [
        ("preempted", 2, 1, "memory")]
    assert [e["world_size"] for e in _events(run, "launch")] == [2, 1] and not _events(run, "restart")
    trained = _trace(run)
    assert sorted(trained) == list(range(1, end + 1)) and changes[0]["step"] < end <= steps
    assert f"drained {rec['launch_host']} (SIGTERM to pid {rec['pid']}) at step {changes[0]['step']}: 2 -> 1 " \
           f"workers, no step redone" in err and "Traceback" not in err
