"""scripts/gpu_check.sh's CPU dry run (tiny sizes): every step of the GPU check runs and writes its
report, so that the script is known to work before a GPU runs it (the resize step with the in-place
mode only, to keep the suite short; the other modes have their own resize tests)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.integration


def test_gpu_check_dry_run_on_the_cpu(tmp_path):
    out = tmp_path / "gpu.md"
    p = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--device", "cpu", "--python",
                        sys.executable, "--out", str(out), "--modes", "inplace"], capture_output=True,
                       text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    text = out.read_text()
    for section in ("## Bare start", "## Steady state", "## Stop with checkpoint", "## Resize per relaunch"):
        assert section in text, section
    assert "ResNet-8, batch 8, synthetic CIFAR-shaped data augmented" in text and "images/s" in text
    assert "our launcher" in text and "All checks passed." in text
    assert "Telemetry in throughput events: 0/" not in text  # the controller adds telemetry
    rows = [line for line in text.splitlines() if line.startswith("| inplace |")]
    assert [r.split("|")[2].strip() for r in rows] == ["1 -> 2", "2 -> 1"]
