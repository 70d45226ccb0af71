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


WAITS = """
import horovod.torch as hvd
import torch
from horovod.torch import mpi_lib_v2

import elastic_ring.worker as elastic

job = elastic.init()
model = torch.nn.Linear(2, 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
job.register(model=model, optimizer=opt)
for _ in job.steps():
    opt.zero_grad()
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
asleep = getattr(mpi_lib_v2.horovod_torch_wait_and_clear, "_elastic_ring", False)
print(f"rank {job.rank} waits {'asleep when crowded' if asleep else 'as horovod'}", flush=True)
"""
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


THREADS = """
import torch
import elastic_ring.worker as elastic

job = elastic.init()
print(f"rank {job.rank} threads {torch.get_num_threads()}", flush=True)
if job.size > 1:  # on Horovod: how the worker waits for a collective (hvd_patches.wait_asleep)
    from horovod.torch import mpi_lib_v2

    asleep = getattr(mpi_lib_v2.horovod_torch_wait_and_clear, "_elastic_ring", False)
    print(f"rank {job.rank} waits {'asleep when crowded' if asleep else 'as horovod'}", flush=True)
"""
STEPS = """
import elastic_ring.worker as elastic

job = elastic.init()
for step in job.steps():
    print(f"step {step}", flush=True)
"""


def _plain(cmd: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """``cmd`` as a user runs it, without the tool: none of its variables, no OMP_NUM_THREADS."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("ELASTIC_RING_") and k != "OMP_NUM_THREADS"}
    e["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{e.get('PATH', '')}"
    e["PYTHONPATH"] = os.pathsep.join([str(ROOT), e.get("PYTHONPATH", "")])
    return subprocess.run(cmd, cwd=tmp_path, env={**e, **env}, capture_output=True, text=True, timeout=300)


def test_outside_the_tool_the_library_sets_the_threads_as_the_tool_does(tmp_path):
    script = tmp_path / "threads.py"
    script.write_text(THREADS)
    cores = len(os.sched_getaffinity(0))
    # plain horovodrun, 2 processes on this host: its cores shared by the 2 (horovodrun sets no thread count)
    p = _plain([str(Path(sys.executable).parent / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo",
                sys.executable, str(script)], tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    each = max(1, cores // 2)
    out = p.stdout + p.stderr  # horovodrun prefixes each rank's lines
    assert f"rank 0 threads {each}" in out and f"rank 1 threads {each}" in out, out
    assert "rank 0 waits asleep when crowded" in out and "rank 1 waits asleep when crowded" in out, out
    said = [ln for ln in out.splitlines() if "CPU thread(s) per worker" in ln]
    assert len(said) == 1 and said[0].endswith(
        f"elastic-ring: {each} CPU thread(s) per worker: this host's {cores} core(s) shared by its 2 worker(s) "
        f"(as under elastic-ring train; OMP_NUM_THREADS sets another)"), said
    # plain python: ELASTIC_RING_CPU_THREADS applies as under the tool; the user's OMP_NUM_THREADS stands
    p = _plain([sys.executable, str(script)], tmp_path, ELASTIC_RING_CPU_THREADS="3")
    assert p.returncode == 0 and p.stdout == "rank 0 threads 3\n", p.stderr
    assert p.stderr.strip() == ("elastic-ring: 3 CPU thread(s) per worker: ELASTIC_RING_CPU_THREADS=3 (as under "
                                "elastic-ring train; OMP_NUM_THREADS sets another)")
    p = _plain([sys.executable, str(script)], tmp_path, OMP_NUM_THREADS="1")
    assert p.returncode == 0 and p.stdout == "rank 0 threads 1\n" and p.stderr == "", p.stderr


def test_a_cpu_worker_under_the_tool_waits_for_horovod_asleep_unless_told_to_spin(tmp_path):
    script = tmp_path / "waits.py"
    script.write_text(WAITS)
    for wait, said in (("", "asleep when crowded"), ("spin", "as horovod")):
        run = tmp_path / f"run-{wait or 'default'}"
        p = run_cli("train", "--script", str(script), "--steps", "1", "--gpus", "2", "--run-dir", str(run),
                    timeout=300, env={"ELASTIC_RING_HOROVOD_WAIT": wait})
        assert p.returncode == 0, p.stderr
        logs = "".join(f.read_text() for f in sorted((run / "logs").glob("segment-000-w*.log")))
        assert f"rank 0 waits {said}" in logs and f"rank 1 waits {said}" in logs, logs


def test_a_steps_loop_under_plain_python_without_its_length_is_one_line(tmp_path):
    script = tmp_path / "steps.py"
    script.write_text(STEPS)
    p = _plain([sys.executable, str(script)], tmp_path, OMP_NUM_THREADS="1")
    assert p.returncode == 1 and p.stdout == "", p.stdout
    (line,) = p.stderr.strip().splitlines()  # torch.distributed's hook may put "[rank0]: " before it
    assert line.endswith("elastic-ring: error: job.steps() outside elastic-ring needs the run's length: "
                         "set ELASTIC_RING_STEPS=N (or run it with `elastic-ring train --script`)"), p.stderr
    p = _plain([sys.executable, str(script)], tmp_path, OMP_NUM_THREADS="1", ELASTIC_RING_STEPS="2")
    assert p.returncode == 0 and p.stdout == "step 1\nstep 2\n", p.stderr
