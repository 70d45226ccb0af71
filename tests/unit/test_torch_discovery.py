"""`--host-discovery-script` with `--collective torch` (issue 45): the relaunch modes launch the
torch.distributed workers by horovodrun over the hosts the controller hands the backend
(``use_hosts``), with the store served on the address those hosts reach; in place it stays refused
in one line."""

from __future__ import annotations

import types

import pytest

from elastic_ring.controller.backends import LaunchOptions, Relaunch, make_launch
from elastic_ring.controller.backends.api import SegmentLaunch
from elastic_ring.controller.backends.local import LocalBackend
from elastic_ring.controller.backends.torch_hosts import TorchHostsBackend
from elastic_ring.controller.requests import RunRequest, check
from elastic_ring.errors import UserError
from elastic_ring.worker.ring import STORE_ENV


def _spec(tmp_path):  # a discovery run's spec: no --hosts, its slots the most discovery may give
    return types.SimpleNamespace(run_dir=tmp_path, script=None, script_args=(), extra_env={}, device="cpu",
                                 slots=64, hosts=None, hostfile=None, network_interface=None, cwd="")


def test_a_relaunched_torch_job_follows_the_hosts_it_is_handed(tmp_path):
    started = []

    class Launcher:
        def start(self, cmd, env, log_path):
            started.append((cmd, env))
            return object()

    backend, resize = make_launch(LaunchOptions(relaunch="overlap", collective="torch", discovered=True),
                                  _spec(tmp_path), launcher=Launcher())
    assert isinstance(backend, TorchHostsBackend) and resize == Relaunch("overlap")
    ports = iter(range(6000, 6010))
    backend.serve = lambda host: (f"store@{host}", next(ports))
    for seg, (hosts, world) in enumerate([("localhost:1", 1), ("localhost:1,127.0.0.1:1", 2),
                                          ("localhost:2,127.0.0.1:1", 2)]):
        backend.use_hosts(hosts)
        backend.start(SegmentLaunch(world, seg, 10 * (seg + 1), "me"), tmp_path / f"{seg}.log")
    hs = [cmd[cmd.index("-H") + 1] for cmd, _ in started]
    assert hs == ["localhost:1", "localhost:1,127.0.0.1:1", "localhost:2"]  # the first slots taken
    assert [(cmd[cmd.index("-np") + 1], env[STORE_ENV]) for cmd, env in started] == [
        ("1", "127.0.0.1:6000"), ("2", "127.0.0.1:6001"), ("2", "127.0.0.1:6002")]


def test_without_discovery_one_host_stays_the_local_launcher(tmp_path):
    backend, _ = make_launch(LaunchOptions(relaunch="overlap", collective="torch"), _spec(tmp_path))
    assert isinstance(backend, LocalBackend)


def test_discovery_with_torch_is_refused_only_in_place():
    check(RunRequest(host_discovery_script="discover.sh", collective="torch"))  # relaunched: served
    check(RunRequest(host_discovery_script="discover.sh", collective="torch", relaunch="overlap"))
    with pytest.raises(UserError) as e:
        check(RunRequest(host_discovery_script="discover.sh", collective="torch", relaunch="inplace"))
    assert str(e.value) == ("--host-discovery-script does not go with --collective torch under --relaunch inplace: "
                            "its ring in place is launched on this host only; use another relaunch mode")



def test_a_resumed_torch_run_under_discovery_is_refused_in_place_where_its_collective_is_known():
    from elastic_ring.controller.prepare_hosts import host_manager

    with pytest.raises(UserError) as e:  # (a resume's request has no --collective: its run's is torch)
        host_manager(RunRequest(resume_dir="run", host_discovery_script="discover.sh", relaunch="inplace"),
                     print, collective="torch")
    assert str(e.value).startswith("--host-discovery-script does not go with --collective torch under --relaunch")
