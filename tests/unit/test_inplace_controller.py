"""The controller's pieces of `--relaunch inplace`, without processes."""

from __future__ import annotations

import pytest

from elastic_ring.controller.api import Resize, RunSpec
from elastic_ring.controller.backends.elastic import discovery_files, elastic_horovodrun_command, write_hosts
from elastic_ring.controller.controller import Controller
from elastic_ring.errors import UserError


def _spec(tmp_path, **kw) -> RunSpec:
    return RunSpec(run_dir=tmp_path, workers=1, schedule=(Resize(5, 2),), slots=2, device="cpu",
                   total_steps=10, **kw)


def test_elastic_command_and_discovery_script(tmp_path):
    cmd = elastic_horovodrun_command(_spec(tmp_path), 1, 0, 5, owner="o")
    script, hosts = discovery_files(tmp_path)
    for a, b in (("-np", "1"), ("--min-np", "1"), ("--max-np", "2"), ("--host-discovery-script", str(script)),
                 ("--network-interface", "lo")):
        assert cmd[cmd.index(a) + 1] == b
    assert "--inplace" in cmd and cmd[-1] == "elastic_ring.train.worker"
    assert hosts.read_text() == "localhost:1\n" and "cat" in script.read_text()


def test_write_hosts_reports_whether_the_count_changed(tmp_path):
    assert write_hosts(tmp_path, 2) is True
    assert write_hosts(tmp_path, 2) is False  # Horovod's driver would see no change: no notification
    assert write_hosts(tmp_path, 1) is True
    assert discovery_files(tmp_path)[1].read_text() == "localhost:1\n"


def test_inplace_refuses_several_hosts(tmp_path):
    with pytest.raises(UserError, match="one host"):
        Controller(_spec(tmp_path, hosts="a:1,b:1"), relaunch="inplace")
