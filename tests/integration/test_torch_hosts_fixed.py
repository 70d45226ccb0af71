"""`train --collective torch --hosts A,B`: a torch.distributed job relaunched over a fixed list of
several hosts is watched as a discovery whose answer never changes, as the Horovod one
(tests/integration/test_hosts_fixed.py): a failed worker's host is left out for its cooldown while
the job trains on the other host, and grown back onto after it.

Hosts `localhost` and `127.0.0.1` (two names of this machine); real horovodrun launches of
torch.distributed workers (gloo) of a tiny ResNet; the helpers are test_discovery's and two_hosts'."""

from __future__ import annotations

import pytest

from elastic_ring import protocol
from tests.integration.test_discovery import TINY, _events, _history, _start
from tests.integration.two_hosts import kill_127_then_grown_back

pytestmark = pytest.mark.integration

BOTH, ONE = "localhost:1,127.0.0.1:1", "localhost:1"


def test_a_torch_job_over_fixed_hosts_leaves_a_failed_host_out_for_its_cooldown_then_grows_back(tmp_path):
    steps = 800  # the grow back lands ~2 s after the kill: by step ~270 at load 7 (torch steps at 1 worker: ~5 ms);
    # the run is stopped (Ctrl-C) once the grown ring has done a step
    run = tmp_path / "cool"
    proc = _start(["--gpus", "2", "--steps", str(steps), *TINY, "--collective", "torch", "--hosts", BOTH,
                   "--blacklist-cooldown-range", "2:4", "--run-dir", str(run)])
    victim, out, err, end = kill_127_then_grown_back(proc, run)  # status names 127.0.0.1 excluded meanwhile
    assert f"elastic-ring: hosts {BOTH}, fixed: a host whose worker fails is left out for 2-4 s" in err
    launches = _events(run, "launch")
    assert [(e["world_size"], e["command"][e["command"].index("-H") + 1]) for e in launches] == [
        (2, BOTH), (1, ONE), (2, BOTH)]
    assert protocol.read_run_json(run)["worker"]["collective"] == "torch"
    (restart,) = _events(run, "restart")
    assert restart["rank"] == victim["rank"] and restart["node"] == "127.0.0.1" and not restart["gave_up"]
    hc = _events(run, "hosts_changed")
    assert [(h["diff"], h["target"]) for h in hc] == [
        ("+localhost:1 +127.0.0.1:1", 2), ("-127.0.0.1:1", 1), ("+127.0.0.1:1", 2)]
    assert hc[2]["time"] - hc[1]["time"] >= 1.5  # back after its 2 s cooldown, not before
    trained, redone = _history(run)  # every step trained; only the failure's lost steps twice
    assert sorted(trained) == list(range(1, end + 1))
    assert all(restart["from_step"] < s <= restart["failed_at_step"] + 1 for s in redone), (redone, restart)
    assert launches[2]["start_step"] <= end <= steps  # the grown ring trained before the stop
    assert "Traceback" not in err
