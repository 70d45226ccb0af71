"""scripts/gpu_check.sh without a GPU: it stops at once with one line and exit 2 (the full CPU dry
run is tests/integration/test_inplace_gpu_check.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import ROOT

SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), "--python", sys.executable, *args], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)


def test_without_a_gpu_it_fails_fast_with_one_line():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    p = _run()
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().count("\n") == 0 and "no CUDA GPU" in p.stderr and "--device cpu" in p.stderr


@pytest.mark.parametrize("args,msg", [(["--device", "tpu"], "must be cuda or cpu"),
                                      (["--frobnicate"], "unknown option")])
def test_bad_options_exit_2(args, msg):
    p = _run(*args)
    assert p.returncode == 2 and msg in p.stderr


def test_help_describes_every_step():
    p = _run("--help")
    assert p.returncode == 0
    for what in ("bare start", "ResNet-110", "NVML", "--resume", "inplace", "--device cpu", "--kit",
                 "two-rank allreduce", "augmented", "FAILS when it lists no GPU"):
        assert what in p.stdout, what


def test_a_kit_without_manifest_is_refused_in_one_line(tmp_path):
    p = _run("--device", "cpu", "--kit", str(tmp_path))
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().count("\n") == 0 and "holds no MANIFEST.json" in p.stderr


def test_the_runs_folder_is_removed_however_the_check_ends(tmp_path):
    """The check's runs live in one gpu-check-* folder under TMPDIR, removed when it ends (here:
    its Python part fails with status 3 after writing into it)."""
    import os

    seen = tmp_path / "seen"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/bash\nif [ "$1" = "-" ]; then echo "$GPU_CHECK_TMP" > {seen}; '
                    'touch "$GPU_CHECK_TMP/run.log"; exit 3; fi\nexec python3 "$@"\n')
    fake.chmod(0o755)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    p = subprocess.run(["bash", str(SCRIPT), "--python", str(fake), "--device", "cpu", "--out",
                        str(tmp_path / "r.md")], capture_output=True, text=True, timeout=60, cwd=ROOT,
                       env=dict(os.environ, TMPDIR=str(tmpdir)))
    assert p.returncode == 3, p.stderr
    used = seen.read_text().strip()
    assert used.startswith(str(tmpdir / "gpu-check-")), used
    assert list(tmpdir.iterdir()) == []  # removed, with what the run wrote into it
