"""The refuse-first table (:mod:`elastic_ring.controller.refusals`): every rule of it is refused, with
its one message, by each entry point it names: `train`'s check of a request (``requests.check``), a
script of torchrun's contract (``requests.check_torchrun_options``, and through ``check``) and such a
script submitted to the cluster (``cluster.client.script_form``). A rule added to the table without an
example here fails :func:`test_every_rule_is_refused_by_each_entry_point_it_names`."""

from __future__ import annotations

import pytest

from elastic_ring.cluster.api import ClusterConfig, ClusterError
from elastic_ring.cluster.client import script_form
from elastic_ring.controller.refusals import RULES, SUBMIT, TORCHRUN, TRAIN, SubmitOptions
from elastic_ring.controller.requests import RunRequest, check, check_torchrun_options
from elastic_ring.controller.script_check import read_script
from elastic_ring.errors import UserError
from tests.conftest import ROOT

TORCHRUN_SCRIPT = ROOT / "tests" / "integration" / "scripts" / "torchrun_contract.py"
LIBRARY = str(ROOT / "tests" / "integration" / "scripts" / "paced.py")
DISC = "discover.sh"

# the options that show each rule (a new rule: add one here)
AT_TRAIN = [
    dict(resume_dir="r", config_path="c.yaml"),
    dict(lr_scaling="cubic"),
    dict(resume_dir="r", lr_scaling="linear"),
    dict(lr_scaling="auto"),
    dict(resume_dir="r", steps=0),
    dict(script_args=("stray",)),
    dict(script="/nonexistent/train.py"),
    dict(script=LIBRARY, depth=20),
    dict(stop_grace=5.0),
    dict(script=LIBRARY, global_batch=16),
    dict(script=LIBRARY, lr_scaling="constant-batch"),
    dict(script=LIBRARY, lr_scaling="constant-batch", global_batch=0),
    dict(resize_at=5),
    dict(resize_at=5, resize_to=2, schedule="10:1"),
    dict(hosts="a:1", hostfile="hosts.txt"),
    dict(worker_range=(1, 2), max_workers=2),
    dict(worker_range=(1, 2), workers=2),
    dict(worker_range=(1, 2), resume_dir="r"),
    dict(min_wait=3.0),
    dict(hosts="a:1,b:1", min_workers=2, workers=2),
    dict(hosts="a:1,b:1", max_workers=2, resume_dir="r"),
    dict(host_discovery_script=DISC, hostfile="hosts.txt"),
    dict(host_discovery_script=DISC, backend="ray"),
    dict(host_discovery_script=DISC, slots=2),
    dict(host_discovery_script=DISC, discovery_interval=0.0),
    dict(host_discovery_script=DISC, min_wait=-1.0),
    dict(host_discovery_script=DISC, cooldown_range="soon"),
    dict(backend="mpi"),
    dict(relaunch="never"),
    dict(relaunch="inplace", hosts="a:1", collective="torch"),
    dict(backend="ray", hosts="a:1"),
    dict(backend="ray", relaunch="sequential"),
    dict(ray_address="auto"),
    dict(survive=True),
    dict(backend="ray", warm_spares=-1),
    dict(backend="ray", placement="ODD"),
]
AT_TORCHRUN = [  # with script=TORCHRUN_SCRIPT
    dict(steps=10),
    dict(resize_at=5, resize_to=2),
    dict(keep=2),
    dict(lr_scaling="linear"),
    dict(relaunch="overlap"),
    dict(survive=True, backend="ray"),
    dict(backend="ray"),
    dict(hosts="localhost:2"),
    dict(host_discovery_script=DISC),
    dict(stall_timeout=5.0),
    dict(stop_grace=-1.0),
]
AT_SUBMIT = [
    dict(steps=10),
    dict(checkpoint_every=5),
    dict(target_loss=0.5),
    dict(cluster=ClusterConfig(hosts=(), ray="")),
    dict(cluster=ClusterConfig(hosts=(("a", 1), ("b", 1)))),
]


def _refused(call) -> str:
    with pytest.raises((UserError, ClusterError)) as e:
        call()
    return str(e.value)


def _where(name: str) -> str:
    line = read_script(TORCHRUN_SCRIPT).pg_init_line
    return f"{name} follows torchrun's contract (init_process_group at line {line})"


def _refusals():
    """(entry point, the options, the message) for each example, from the entry point itself."""
    shape = read_script(TORCHRUN_SCRIPT)
    for kw in AT_TRAIN:
        req = RunRequest(**kw)
        yield TRAIN, req, "", _refused(lambda: check(req))
    for kw in AT_TORCHRUN:
        req = RunRequest(script=str(TORCHRUN_SCRIPT), **kw)
        direct = _refused(lambda: check_torchrun_options(req, shape))
        assert _refused(lambda: check(req)) == direct  # train's check reaches it with the same line
        yield TORCHRUN, req, _where(str(TORCHRUN_SCRIPT)), direct
    for kw in AT_SUBMIT:
        o = SubmitOptions(**kw)
        msg = _refused(lambda: script_form(TORCHRUN_SCRIPT, o.steps, o.checkpoint_every, o.target_loss, o.cluster))
        yield SUBMIT, o, _where(TORCHRUN_SCRIPT.name), msg


def test_every_rule_is_refused_by_each_entry_point_it_names():
    refused = set()
    for at, o, where, msg in _refusals():
        hits = [i for i, r in enumerate(RULES) if at in r.at and r.bad(o) and r.says(o, where) == msg]
        assert hits, (at, o, msg)  # the entry point's line is a rule's of the table
        refused.add((hits[0], at))
    missing = [(r.line if isinstance(r.line, str) else r.line.__name__, at) for i, r in enumerate(RULES) for at in r.at
               if (i, at) not in refused]
    assert not missing, missing


def test_a_rule_shared_by_two_entry_points_says_the_same_at_both():
    shared = [r for r in RULES if TORCHRUN in r.at and SUBMIT in r.at]
    assert shared  # --steps: train's torchrun check and the cluster's submit refuse it alike
    req = RunRequest(script=str(TORCHRUN_SCRIPT), steps=10)
    train_line = _refused(lambda: check(req))
    submit_line = _refused(lambda: script_form(TORCHRUN_SCRIPT, 10, None, None, None))
    assert train_line.startswith("--steps does not apply: ") and submit_line.startswith("--steps does not apply: ")
    assert train_line.split(": ", 2)[2] == submit_line.split(": ", 2)[2]  # the same why


def test_a_rule_is_not_refused_where_it_does_not_apply():
    # --target-loss is the cluster's: a torchrun script submitted without it is taken
    assert script_form(TORCHRUN_SCRIPT, None, None, None, None) == "torchrun"
    # --stall-timeout is refused for a torchrun-form script only: a library script's check passes it
    check(RunRequest(script=LIBRARY, stall_timeout=5.0))
