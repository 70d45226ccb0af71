"""`elastic-ring train` inside a (fake) Slurm allocation: Slurm's variables set as a job's would
be, naming `localhost` and `127.0.0.1` as the nodes (the two-host tests' way of having two hosts on
one machine); real horovodrun runs of a tiny ResNet."""

from __future__ import annotations

import json

import pytest

from elastic_ring.events import read_events
from tests.conftest import one_line_error, run_cli

pytestmark = pytest.mark.integration

TINY = ["--dataset", "synthetic", "--set", "synthetic_size=40", "--set", "synthetic_side=16", "--depth", "8",
        "--set", "width=4", "--batch-size", "8", "--device", "cpu"]  # no --slots: the allocation gives them


def _slurm(nodes: str, tasks: str) -> dict[str, str]:
    return {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": nodes, "SLURM_TASKS_PER_NODE": tasks}


def test_two_node_allocation_becomes_the_hosts(tmp_path):
    run = tmp_path / "slurm2"
    p = run_cli("train", "--gpus", "2", "--steps", "4", *TINY, "--run-dir", str(run), timeout=300,
                env=_slurm("localhost,127.0.0.1", "1(x2)"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert ("elastic-ring: Slurm job 4242: 2 nodes (localhost,127.0.0.1), 2 slots from SLURM_TASKS_PER_NODE: "
            "--hosts localhost:1,127.0.0.1:1") in p.stderr
    info = json.loads((run / "run.json").read_text())
    assert info["hosts"] == "localhost:1,127.0.0.1:1" and info["slots"] == 2
    (launch,) = read_events(run / "events.jsonl", kind="launch")
    assert launch["command"][launch["command"].index("-H") + 1] == "localhost:1,127.0.0.1:1"
    assert read_events(run / "events.jsonl", kind="finished")[-1]["step"] == 4


def test_one_node_allocation_is_this_host_as_without_slurm(tmp_path):
    """One node that is this host, one task (``sbatch -N1 -c16``): the run takes this host's slots as
    without Slurm (not 1 slot for the one task), and says so."""
    run = tmp_path / "slurm1"
    p = run_cli("train", "--gpus", "2", "--steps", "2", *TINY, "--run-dir", str(run), timeout=300,
                env=_slurm("localhost", "1"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Slurm job 4242: 1 node (localhost), 1 slot from SLURM_TASKS_PER_NODE: this host (--slots" in p.stderr
    info = json.loads((run / "run.json").read_text())
    assert info["hosts"] is None and info["slots"] >= 2
    (launch,) = read_events(run / "events.jsonl", kind="launch")
    assert launch["world_size"] == 2


def test_a_node_list_that_does_not_parse_is_one_line(tmp_path):
    r = run_cli("train", "--gpus", "1", "--steps", "2", *TINY, "--run-dir", str(tmp_path / "bad"),
                env=_slurm("node[01-", "1"), timeout=120)
    one_line_error(r, "inside a Slurm allocation", "SLURM_JOB_NODELIST='node[01-'", "give --hosts")
    assert not (tmp_path / "bad").exists()
