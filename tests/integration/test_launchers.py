"""Foundation: real horovodrun (gloo, 2 CPU ranks) and real mpirun (3 ranks, mpi4py) jobs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, tool

pytestmark = pytest.mark.integration
SCRIPTS = Path(__file__).parent / "scripts"


def _results(d: Path, n: int) -> list[dict]:
    files = sorted(d.glob("rank*.json"))
    assert len(files) == n, f"expected {n} rank files, got {[f.name for f in files]}"
    return [json.loads(f.read_text()) for f in files]


def test_horovodrun_two_gloo_ranks_allreduce(tmp_path):
    cmd = [tool("horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo",
           sys.executable, str(SCRIPTS / "hvd_allreduce.py"), str(tmp_path)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    res = _results(tmp_path, 2)
    for r in res:
        assert r["size"] == 2 and r["gloo"]
        assert r["sum"] == [3.0, 10.0]          # (1 + 2), (0 + 10)
        assert r["avg"] == [0.5, 0.5, 0.5]       # mean of ranks 0 and 1
        assert r["bcast"] == [43.0]              # from rank 1
        assert r["gather"] == [0.0, 1.0]
    assert {r["rank"] for r in res} == {0, 1}


def test_horovod_check_build_lists_torch_and_gloo():
    p = subprocess.run([tool("horovodrun"), "--check-build"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0
    assert "[X] PyTorch" in p.stdout
    assert "[X] Gloo" in p.stdout


def test_mpirun_three_ranks_mpi4py(tmp_path):
    cmd = [tool("mpirun"), "--allow-run-as-root", "--oversubscribe", "-np", "3",
           sys.executable, str(SCRIPTS / "mpi_allreduce.py"), str(tmp_path)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    res = _results(tmp_path, 3)
    for r in res:
        assert r["size"] == 3
        assert r["sum"] == [6.0, 5.0]  # 1+2+3, 0+1+4
        assert r["max"] == 2
