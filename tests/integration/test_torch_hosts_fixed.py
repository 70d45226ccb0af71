"""`train --collective torch --hosts A,B`: a torch.distributed job relaunched over a fixed list of
several hosts is watched as a discovery whose answer never changes, as the Horovod one
(tests/integration/test_hosts_fixed.py): a failed worker's host is left out for its cooldown while
the job trains on the other host, and grown back onto after it.

Hosts `localhost` and `127.0.0.1` (two names of this machine); real horovodrun launches of
torch.distributed workers (gloo) of a tiny ResNet; the helpers are test_discovery's."""

from __future__ import annotations

import os
import signal

import pytest

from elastic_ring import protocol
from tests.conftest import run_cli, wait_for
from tests.integration.test_discovery import TINY, _events, _history, _start

pytestmark = pytest.mark.integration

BOTH, ONE = "localhost:1,127.0.0.1:1", "localhost:1"


def test_a_torch_job_over_fixed_hosts_leaves_a_failed_host_out_for_its_cooldown_then_grows_back(tmp_path):
    steps = 1000
    run = tmp_path / "cool"
    proc = _start(["--gpus", "2", "--steps", str(steps), *TINY, "--collective", "torch", "--hosts", BOTH,
                   "--blacklist-cooldown-range", "3:6", "--run-dir", str(run)])
    try:
        wait_for(lambda: _events(run, "throughput"), 120, "a window at 2 workers")
        recs = [protocol.read_json(f) for f in protocol.pid_dir(run).glob("seg000-rank*.json")]
        (victim,) = [r for r in recs if r and r.get("launch_host") == "127.0.0.1"]
        os.kill(int(victim["pid"]), signal.SIGKILL)  # the worker on 127.0.0.1 dies
        line = wait_for(lambda: next((ln for ln in run_cli("status", str(run)).stdout.splitlines()
                                      if "excluded: 127.0.0.1 until" in ln), None), 30, "status naming the host")
        assert line.startswith("hosts: localhost:1 (1 slot); excluded: 127.0.0.1 until "), line
        wait_for(lambda: len(_events(run, "launch")) >= 3, 120, "the grow back onto 127.0.0.1")
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert f"elastic-ring: hosts {BOTH}, fixed: a host whose worker fails is left out for 3-6 s" in err
    launches = _events(run, "launch")
    assert [(e["world_size"], e["command"][e["command"].index("-H") + 1]) for e in launches] == [
        (2, BOTH), (1, ONE), (2, BOTH)]
    assert protocol.read_run_json(run)["worker"]["collective"] == "torch"
    (restart,) = _events(run, "restart")
    assert restart["rank"] == victim["rank"] and restart["node"] == "127.0.0.1" and not restart["gave_up"]
    hc = _events(run, "hosts_changed")
    assert [(h["diff"], h["target"]) for h in hc] == [
        ("+localhost:1 +127.0.0.1:1", 2), ("-127.0.0.1:1", 1), ("+127.0.0.1:1", 2)]
    assert hc[2]["time"] - hc[1]["time"] >= 2.5  # back after its 3 s cooldown, not before
    trained, redone = _history(run)  # every step trained; only the failure's lost steps twice
    assert sorted(trained) == list(range(1, steps + 1))
    assert all(restart["from_step"] < s <= restart["failed_at_step"] + 1 for s in redone), (redone, restart)
    assert _events(run, "finished")[-1]["step"] == steps
    assert "Traceback" not in err
