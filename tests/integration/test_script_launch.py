"""A user's script where the user is: its workers run in the folder `elastic-ring train` was run
in (its relative paths, the script's own path too), also at a resume from another folder; and the
worker library outside the tool (plain ``python``): its CPU threads and a `job.steps()` loop
without a length."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from elastic_ring.events import read_events
from tests.conftest import ROOT, run_cli

pytestmark = pytest.mark.integration

SCRIPTS = ROOT / "tests" / "integration" / "scripts"


def test_a_script_s_relative_paths_are_the_user_s_across_a_resize_and_a_resume(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.txt").write_text("\n".join(str(i / 10) for i in range(24)))
    work = tmp_path / "work"
    work.mkdir()
    script = os.path.relpath(SCRIPTS / "relative_paths.py", work)  # relative to the user's folder
    in_checkout = [p for p in (ROOT / "logs", ROOT.parent / "data") if p.exists()]
    p = run_cli("train", "--script", script, "--steps", "6", "--gpus", "1", "--resize-at", "3", "--to", "2",
                "--slots", "2", "--run-dir", "run", cwd=work, timeout=300)
    assert p.returncode == 0, p.stderr
    run = work / "run"  # the relative --run-dir, in the user's folder too
    assert [e["world_size"] for e in read_events(run / "events.jsonl") if e["kind"] == "launch"] == [1, 2]
    lines = {r: (work / "logs" / f"rank{r}.txt").read_text().splitlines() for r in (0, 1)}
    assert lines[0] == [f"cwd={work} values=24 size=1", f"cwd={work} values=24 size=2"], lines
    assert lines[1] == [f"cwd={work} values=24 size=2"], lines
    assert not (run / "logs" / "rank0.txt").exists()  # the run's own files stay in the run folder
    assert [p for p in (ROOT / "logs", ROOT.parent / "data") if p.exists()] == in_checkout

    # a resume from another folder runs where the run started (the folder recorded in run.json)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    p = run_cli("train", "--resume", str(run), "--steps", "8", cwd=elsewhere, timeout=300)
    assert p.returncode == 0, p.stderr
    assert (work / "logs" / "rank0.txt").read_text().splitlines()[-1] == f"cwd={work} values=24 size=2"
    assert not (elsewhere / "logs").exists()


DDP_STEPS = """
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import elastic_ring.worker as elastic

job = elastic.init()
torch.manual_seed(0)
model = torch.nn.Linear(2, 1)
net = DistributedDataParallel(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
job.register(model=model, optimizer=opt)
job.restore()
for _ in job.steps():
    loss = net(torch.ones(4, 2)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"world {dist.get_world_size()} backend {dist.get_backend()}")
"""


def test_a_torch_distributed_script_without_collective_runs_on_torch(tmp_path):
    script = tmp_path / "ddp_steps.py"
    script.write_text(DDP_STEPS)
    run = tmp_path / "run"
    p = run_cli("train", "--script", str(script), "--steps", "3", "--gpus", "1", "--slots", "1",
                "--run-dir", str(run), timeout=300)
    assert p.returncode == 0, p.stderr
    assert f"elastic-ring: {script} uses torch.distributed (line 3) and not Horovod: --collective torch" \
        in p.stderr.splitlines()
    assert json.loads((run / "run.json").read_text())["worker"]["collective"] == "torch"
    assert "world 1 backend gloo" in (run / "logs" / "segment-000-w1.log").read_text()
