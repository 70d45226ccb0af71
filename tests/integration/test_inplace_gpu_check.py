"""scripts/gpu_check.sh's CPU dry run (tiny sizes): every stage of the GPU check runs and writes
its report under the results folder a device tool collects ($OUT), so that the script is known to
work before a GPU runs it (the torch.distributed path's stage included; the resize stage with the
in-place mode only, to keep the suite short: the other modes have their own resize tests); and a real failure in a late stage, which leaves
the earlier sections, that run's events and the failing output there."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.integration


def _check(out, *args):
    env = dict(os.environ, OUT=str(out))
    return subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--device", "cpu", "--python",
                           sys.executable, *args], capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)


def test_gpu_check_dry_run_on_the_cpu(tmp_path):
    import torch

    p = _check(tmp_path, "--modes", "inplace")
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stderr.startswith("gpu_check: found: no kit | python ")  # the first line: what it found
    assert [f.name for f in tmp_path.iterdir()] == ["gpu_check_cpu.md"]  # under $OUT, nothing else
    text = (tmp_path / "gpu_check_cpu.md").read_text()
    assert p.stdout.strip() == text.strip()
    for section in ("## Horovod", "## Bare start", "## Steady state", "## The torch.distributed path",
                    "## Stop with checkpoint", "## Resize per relaunch"):
        assert section in text, section
    assert f"Measured with torch {torch.__version__}" in text and "Horovod 0.28.1" in text
    assert "Status: **finished**" in text and "All checks passed." in text
    for stage in ("setup", "bare", "throughput", "torch", "restart", "resize"):
        assert f"| {stage} | " in text, stage
    assert "ResNet-8, batch 8, synthetic CIFAR-shaped data augmented" in text and "images/s" in text
    assert "our launcher" in text
    # the torch path (gloo here, NCCL on GPUs) beside the Horovod figure
    assert "`elastic-ring train --collective torch` (gloo, DistributedDataParallel), ResNet-8" in text
    assert "x the Horovod path's" in text and "process group's rendezvous" in text
    assert "Telemetry in throughput events: 0/" not in text  # the controller adds telemetry
    rows = [line for line in text.splitlines() if line.startswith("| inplace |")]
    assert [r.split("|")[2].strip() for r in rows] == ["1 -> 2", "2 -> 1"]


def test_a_late_failure_keeps_the_earlier_sections_that_run_s_events_and_its_output(tmp_path):
    p = _check(tmp_path, "--stages", "setup restart", "--fail-at", "restart")
    assert p.returncode == 1, p.stderr[-3000:]
    files = sorted(f.name for f in tmp_path.iterdir())
    assert files == ["gpu_check_cpu.md", "gpu_check_cpu.restart.events.jsonl", "gpu_check_cpu.restart.output_tail.txt"]
    text = (tmp_path / "gpu_check_cpu.md").read_text()
    assert "## Horovod" in text and "Horovod 0.28.1 (NCCL built: no), imported" in text  # the stage before
    assert "**FAILED**: the resume exited 2" in text and "- FAILED: restart: the resume exited 2" in text
    assert "Status: **finished: 1 check(s) failed**" in text
    events = [json.loads(line) for line in (tmp_path / "gpu_check_cpu.restart.events.jsonl").read_text().splitlines()]
    assert any(e["kind"] == "first_step" for e in events)  # the stopped run's own events
    assert "--fail-here-on-purpose" in (tmp_path / "gpu_check_cpu.restart.output_tail.txt").read_text()
