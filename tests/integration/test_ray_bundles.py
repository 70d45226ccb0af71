"""A Ray job's bundles on a real local Ray (a head of two CPUs, :mod:`.ray_cluster`), as `cluster up
--ray` runs its jobs (``--warm-spares 0``): a shrink 2 -> 1 in place gives the leaver's CPU back to
Ray at once (``ray.available_resources()`` shows it free while the job trains on), and the grow
1 -> 2 that follows takes it again with a cold joiner in a placement group of its own."""

from __future__ import annotations

import time

import pytest

from elastic_ring.events import read_events
from tests.integration.ray_cluster import local_cluster
from tests.integration.test_ray import PACED, _start, _wait_step

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.integration, pytest.mark.ray]


def _free_cpus(want: float, timeout: float = 20.0) -> float:
    """Ray's free CPUs, looked at until they are ``want`` (or ``timeout`` passed): what they are."""
    t_end = time.time() + timeout
    while True:
        got = ray.available_resources().get("CPU", 0.0)
        if got == want or time.time() > t_end:
            return got
        time.sleep(0.2)


def test_a_shrink_gives_its_bundle_back_and_a_grow_takes_it_again(tmp_path, tmp_path_factory):
    shrink, grow, steps = 15, 45, 55
    with local_cluster(tmp_path_factory, 2) as c:
        run = tmp_path / "run"
        proc = _start(["--backend", "ray", "--ray-address", c.address, "--warm-spares", "0", "--script", PACED,
                       "--steps", str(steps), "--gpus", "2", "--slots", "2", "--schedule", f"{shrink}:1,{grow}:2",
                       "--run-dir", str(run), "--", "--step-s", "0.15"])
        ray.init(address=c.address, log_to_driver=False)
        try:
            _wait_step(run, 3)
            assert _free_cpus(0.0) == 0.0  # both workers' bundles held
            _wait_step(run, shrink + 2)
            assert _free_cpus(1.0) == 1.0  # the leaver's bundle is back with Ray while the job trains on at 1
            assert proc.poll() is None
            _wait_step(run, grow + 2)
            assert _free_cpus(0.0) == 0.0  # the grow's joiner holds it again
            out, err = proc.communicate(timeout=240)
        finally:
            ray.shutdown()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, err
    rel = read_events(run / "events.jsonl", kind="relaunched")
    assert [(r["from_workers"], r["to_workers"]) for r in rel] == [(2, 1), (1, 2)]
    assert not read_events(run / "events.jsonl", kind="restart")  # in place, no restart
    joined = next((run / "logs").glob("segment-002-w2.log")).read_text()
    assert "(cold)" in joined  # --warm-spares 0: a new actor, in its own group
