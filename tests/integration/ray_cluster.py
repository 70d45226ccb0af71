"""A real local Ray cluster for a test (``test_ray``, ``test_ray_bundles``), or one shared by the tests
that ask for the ``ray_one_node`` fixture in a row (:func:`shared_one_node`): Ray's files
(``RAY_TMPDIR``) under the tests' temporary folder, at its top (Ray's socket paths,
``<tmp>/ray/session_<date>_<pid>/sockets/raylet.N``, must stay under 107 characters), small object
stores, no dashboard, a node whose raylet died found dead in seconds (:data:`HEALTH`). At the end
every process it started (GCS, raylets, agents, actors) is stopped: Ray's shutdown, then a kill by
pid of any still up 15 s later (named on stderr), and checked gone; no other Ray on the machine is
touched."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator

import pytest

MB = 1024 * 1024
# the GCS's checks of each node: a node whose raylet was killed (``remove_node(allow_graceful=False)``)
# is found dead after 3 failed checks a second apart (``wait_for_nodes`` after such a removal: 16.6 s
# at load 26 under Ray's default checks, 2.7 s with these); a live but slow raylet still has Ray's
# timeout per check to answer
HEALTH = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 1000, "health_check_failure_threshold": 3}
# each node's processes less those the tests never use: the log monitor (it sends the workers' output to
# drivers started with log_to_driver=False) and, on the head, the autoscaler's monitor (a local cluster
# has nothing to scale; a drain is the GCS's): 0.8 s less CPU for a head and a node's start, and their
# polls while the cluster is up
NODE = {"object_store_memory": 80 * MB, "include_log_monitor": False}
# Ray starts its worker processes (the tests' actors) at nice 15 (its ``worker_niceness``): beside the
# suite's other tests at nice 0 and its unit lane at nice 10 (scripts/run_tests.py) an actor then gets
# a few percent of a core, and a survivor took more than the controller's wait to say which steps it
# holds (a CI run, 2026-12-07); beside three busy loops at nice 0 and one at nice 10 a run's actors did
# not reach their first step in 6 minutes. Here they run at the tests' own priority.
WORKER_NICENESS = 0
HEAD = {**NODE, "include_dashboard": False, "no_monitor": True,
        "_system_config": {**HEALTH, "worker_niceness": WORKER_NICENESS}}


@contextlib.contextmanager
def local_cluster(tmp_path_factory, head_cpus: int, node_cpus: tuple[int, ...] = ()) -> Iterator:
    """A head of ``head_cpus`` CPUs and one node per entry of ``node_cpus``; skips the test when
    the pytest temporary folder is too long for Ray's socket paths."""
    import psutil
    from ray.cluster_utils import Cluster

    tmp = tmp_path_factory.getbasetemp() / "ray"
    if len(str(tmp)) > 40:
        pytest.skip(f"the pytest temporary folder {tmp} is too long for Ray's socket paths: "
                    f"run with a short --basetemp")
    tmp.mkdir(exist_ok=True)
    old = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = str(tmp)
    c, still = None, []
    before = {p.pid for p in psutil.Process().children(recursive=True)}  # another test's, not this cluster's
    try:
        c = Cluster(initialize_head=True, head_node_args={"num_cpus": head_cpus, **HEAD})
        for n in node_cpus:
            c.add_node(num_cpus=n, **NODE)
        c.wait_for_nodes()
        yield c
    finally:
        # Ray's (the tests' own jobs have ended); a process up before the cluster is not its own
        started = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
        try:
            if c is not None:
                c.shutdown()
        finally:
            _, alive = psutil.wait_procs(started, timeout=15)
            names = []
            for p in alive:  # by pid: only the processes this cluster started
                try:
                    names.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
            _, still = psutil.wait_procs(alive, timeout=10)
            if names:  # (one, once, in a CI run at load: which, is not known yet)
                line = f"ray_cluster: killed {len(names)} process(es) still up 15 s after the shutdown: {names}"
                print(line, file=sys.stderr)
                with open(tmp_path_factory.getbasetemp() / "ray_cluster_killed.txt", "a") as f:
                    f.write(line + "\n")  # kept with the tests' files (a passing test's stderr is not shown)
            if old is None:
                os.environ.pop("RAY_TMPDIR", None)
            else:
                os.environ["RAY_TMPDIR"] = old
        assert not still, f"processes left after the cluster's shutdown and a kill: {[p.pid for p in still]}"


# the cluster of :func:`shared_one_node` while tests in a row use it: {"cm": its context, "cluster": it}
_SHARED: dict = {}
SHARED_CPUS = 5  # test_ray_survive's two workers and a spare, or a reference run's two beside them


def shared_one_node(tmp_path_factory):
    """One node of :data:`SHARED_CPUS` CPUs, started by the first test of a row of tests that use it
    (the ``ray_one_node`` fixture: ``test_ray_survive``, test_fsdp's Ray test) and kept for the next
    one; stopped as :func:`local_cluster` stops it by :func:`close_shared` once the next test does
    not use it (``tests/integration/conftest.py``), or at the session's end. A cluster's start and
    stop (about 3 s of CPU here) once for the row, not once for each module. The tests that use it
    leave nothing running on it (each waits for its runs' ends, or kills them)."""
    if "cluster" not in _SHARED:
        cm = local_cluster(tmp_path_factory, SHARED_CPUS)
        _SHARED["cluster"] = cm.__enter__()  # (a skip, a failed start: nothing kept)
        _SHARED["cm"] = cm
    return _SHARED["cluster"]


def close_shared() -> None:
    """The shared cluster stopped (its processes gone: :func:`local_cluster`'s check), if it is up."""
    cm = _SHARED.pop("cm", None)
    _SHARED.pop("cluster", None)
    if cm is not None:
        cm.__exit__(None, None, None)
