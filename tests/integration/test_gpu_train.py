"""`elastic-ring train` on one CUDA GPU (marked `gpu`: skipped where CUDA is absent; the CPU runs
of the same path are test_train_resize.py). A stop with checkpoint and a resume on the GPU: the
CUDA RNG state of the rank's own device is saved and restored, the NVML telemetry lists the GPU,
and the batches are made on the device."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from elastic_ring.events import read_events
from tests.conftest import ROOT, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.gpu]

TINY = ["--dataset", "synthetic", "--set", "synthetic_size=256", "--depth", "8", "--set", "width=8",
        "--batch-size", "32", "--set", "throughput_window=5", "--set", "augment=true", "--device", "cuda"]


def test_train_stop_and_resume_on_one_gpu(tmp_path):
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "elastic_ring.cli.main", "train", "--gpus", "1", "--steps", "3000", *TINY,
           "--run-dir", str(run)]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONUNBUFFERED="1"))
    t0 = time.time()
    while not read_events(run / "events.jsonl", kind="throughput") and time.time() - t0 < 240 and p.poll() is None:
        time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=240)
    assert p.returncode == 130, err[-2000:]
    assert "usable by CUDA" in err and "GPU worker(s) (NCCL + gloo)" in err
    tel = [e.get("telemetry") or {} for e in read_events(run / "events.jsonl", kind="throughput")]
    assert any(t.get("gpus") for t in tel), "no GPU in the telemetry"
    ck = torch.load(sorted((run / "checkpoints").glob("ckpt-*.pt"))[-1], map_location="cpu", weights_only=False)
    assert isinstance(ck["rng"]["cuda"], torch.Tensor)  # one state: the rank's own device
    r = run_cli("train", "--resume", str(run), timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert len(read_events(run / "events.jsonl", kind="first_step")) >= 2
