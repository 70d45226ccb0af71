"""The Ray backend without a cluster: its bad input (one line, exit 2), its placement of members
on Horovod hosts, and the rendezvous question an elastic-mode worker asks."""

from __future__ import annotations

import pytest

from elastic_ring.controller.api import RunSpec
from elastic_ring.controller.backends.ray import RayBackend, _handler
from elastic_ring.errors import UserError
from tests.conftest import run_inproc


@pytest.mark.parametrize("args, msg", [
    (["--backend", "ray", "--hosts", "a:1,b:1"], "drop --hosts/--hostfile"),
    (["--backend", "ray", "--relaunch", "overlap"], "drop --relaunch overlap"),
    (["--ray-address", "1.2.3.4:6379"], "go with --backend ray"),
    (["--backend", "ray", "--warm-spares", "-1"], "--warm-spares must be >= 0"),
])
def test_bad_ray_options_one_line_exit_2(capsys, tmp_path, args, msg):
    p = run_inproc(capsys, "train", "--gpus", "1", "--steps", "4", "--run-dir", str(tmp_path / "r"), *args)
    assert p.returncode == 2 and msg in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_backend_refuses_bad_strategy_and_spares(tmp_path):
    spec = RunSpec(run_dir=tmp_path, workers=1, schedule=(), slots=2, device="cpu", total_steps=4)
    with pytest.raises(UserError, match="PACK, SPREAD"):
        RayBackend(spec, strategy="STRICT")
    with pytest.raises(UserError, match="warm-spares"):
        RayBackend(spec, warm_spares=-2)
    assert RayBackend(spec)._spares_wanted(1) == 1 and RayBackend(spec, warm_spares=3)._spares_wanted(2) == 3


def test_rendezvous_answers_rank_and_size_from_the_slot_plan():
    from horovod.runner.common.util.hosts import HostInfo, get_host_assignments

    slots = get_host_assignments([HostInfo("nodeA", 1), HostInfo("nodeB", 2)], 3)
    h = _handler({(s.hostname, s.local_rank): s for s in slots})
    ask = lambda key: h._get_value(object.__new__(h), "rank_and_size", key)  # noqa: E731
    assert ask("nodeA:0").decode().split(",")[:2] == ["0", "3"]
    assert ask("nodeB:1").decode().split(",")[:4] == ["2", "3", "1", "2"]
    assert ask("nodeC:0") is None
