"""`train --collective torch --relaunch inplace --host-discovery-script`: a torch.distributed ring
kept in its processes follows the slots a script lists for this host (docs/hosts.md), as the
Horovod one (tests/integration/test_discovery_inplace.py, whose helpers it uses): a slot that
appears is grown onto in place (the joiner takes the state from a live rank), one that goes is
shrunk off in place (the survivor goes on from memory); nothing is read back from disk and every
step is trained once. Real local launches of torch.distributed workers (gloo) of a tiny ResNet."""

from __future__ import annotations

import pytest

from tests.conftest import one_line_error, wait_for
from tests.integration.test_discovery import TINY, _discovery, _events, _start, _trace, list_hosts

pytestmark = pytest.mark.integration


def test_a_torch_ring_in_place_grows_and_shrinks_with_the_slots_discovered_on_this_host(tmp_path):
    steps = 1500
    script, listed, _ = _discovery(tmp_path, "localhost:1\n")
    run = tmp_path / "run"
    proc = _start(["--steps", str(steps), *TINY, "--collective", "torch", "--relaunch", "inplace",
                   "--host-discovery-script", str(script), "--discovery-interval", "0.3",
                   "--min-workers", "1", "--max-workers", "2", "--run-dir", str(run)])
    try:
        wait_for(lambda: _events(run, "throughput"), 120, "a window at 1 worker")
        list_hosts(listed, "localhost:2\n")  # a slot appears on this host
        wait_for(lambda: [t for t in _events(run, "throughput") if t["world_size"] == 2], 120,
                 "a window at 2 workers")
        list_hosts(listed, "localhost:1\n")  # and goes
        wait_for(lambda: len(_events(run, "membership_change")) >= 2, 120, "the shrink")
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "kept across resizes (the group re-formed in place)" in out + err
    launches = _events(run, "launch")  # one set of processes, its group re-formed in place
    assert [e["world_size"] for e in launches] == [1, 2, 1]
    assert [e["returncode"] for e in _events(run, "workers_exited")] == [0]
    changes = _events(run, "membership_change")
    assert [(c["cause"], c["members_before"], c["members_after"], c["state_source"]) for c in changes] == [
        ("hosts", 1, 2, "peer"), ("hosts", 2, 1, "memory")]  # nothing read back from disk
    assert [e["start_step"] for e in launches[1:]] == [c["step"] + 1 for c in changes]
    assert not _events(run, "restart")
    assert [(h["hosts"], h["target"]) for h in _events(run, "hosts_changed")] == [
        ("localhost:1", 1), ("localhost:2", 2), ("localhost:1", 1)]
    trained = _trace(run)
    assert sorted(trained) == list(range(1, steps + 1))  # every step once
    grow, shrink = changes[0]["step"], changes[1]["step"]
    assert 0 < grow < shrink < steps
    assert {trained[s] for s in range(grow + 1, shrink + 1)} == {16} and trained[1] == trained[steps] == 8
    assert all(o["checkpoint_s"] == 0 for o in _events(run, "resize_overhead"))  # no checkpoint for either
    assert "Traceback" not in err


def test_a_torch_ring_in_place_refuses_another_machine_in_one_line(tmp_path, cli_inproc):
    script, _, _ = _discovery(tmp_path, "node7:2\n")
    r = cli_inproc("train", "--steps", "2", *TINY, "--collective", "torch", "--relaunch", "inplace",
                   "--host-discovery-script", str(script), "--run-dir", str(tmp_path / "r"))
    one_line_error(r, "--relaunch inplace runs on this host only: discovery script")
