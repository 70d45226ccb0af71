"""`--host-discovery-script` with `--collective torch` (issue 45): the relaunch modes launch the
torch.distributed workers by horovodrun over the hosts the controller hands the backend
(``use_hosts``), with the store served on the address those hosts reach; in place the ring
follows this host's slots only (another machine is one line)."""

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


def test_discovery_with_torch_is_served_relaunched_and_in_place():
    check(RunRequest(host_discovery_script="discover.sh", collective="torch"))  # relaunched: over the hosts
    check(RunRequest(host_discovery_script="discover.sh", collective="torch", relaunch="overlap"))
    check(RunRequest(host_discovery_script="discover.sh", collective="torch", relaunch="inplace"))  # this host


def _script(tmp_path, answer: str) -> str:
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\nprintf '{answer}'\n")
    script.chmod(0o755)
    return str(script)


def test_a_torch_ring_in_place_takes_this_hosts_slots_and_refuses_another_machine(tmp_path):
    from elastic_ring.controller.prepare_hosts import host_manager
    from elastic_ring.hosts.discovery import ThisHostOnly

    req = RunRequest(host_discovery_script=_script(tmp_path, "localhost:2\n"), relaunch="inplace")
    m = host_manager(req, print, collective="torch")
    assert not m.over_hosts and isinstance(m.poller.discovery, ThisHostOnly)
    assert m.view().usable.arg() == "localhost:2"
    other = RunRequest(host_discovery_script=_script(tmp_path, "node7:2\n"), relaunch="inplace")
    assert host_manager(other, print).over_hosts  # Horovod's ring in place runs over another machine
    with pytest.raises(UserError) as e:  # torch's is launched on this host only
        host_manager(other, print, collective="torch")
    assert str(e.value).startswith("--relaunch inplace runs on this host only: discovery script discover.sh lists node7")
