"""`CheckpointStore.latest_step`: the step `--resume` starts from, checked (magic, checksum) but not
loaded, so the controller needs no torch for it; the same choice, warning and error as
`load_latest`, which the workers use."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from elastic_ring.ckpt import CheckpointStore
from elastic_ring.errors import CheckpointError


def _corrupt(path) -> None:
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))


def test_the_step_load_latest_would_load_the_same_warning_and_the_same_error(tmp_path):
    store = CheckpointStore(tmp_path, keep=3)
    assert store.latest_step() is None
    for step in (10, 20, 30):
        store.save({"step": step, "w": torch.arange(4) * step})
    assert store.latest_step() == store.load_latest()["step"] == 30
    _corrupt(store.latest_path())
    warned: list[str] = []
    assert store.latest_step(warn=warned.append) == 20
    loaded: list[str] = []
    assert store.load_latest(warn=loaded.append)["step"] == 20
    assert warned == loaded and "SHA-256 mismatch" in warned[0] and "resuming from the previous checkpoint" in warned[0]
    for p in store.candidates()[1:]:
        _corrupt(p)
    with pytest.raises(CheckpointError) as step_err:
        store.latest_step()
    with pytest.raises(CheckpointError) as load_err:
        store.load_latest()
    assert str(step_err.value) == str(load_err.value)
    assert str(step_err.value).endswith("(no older checkpoint loads: start a new run)")


def test_it_imports_no_torch(tmp_path):
    CheckpointStore(tmp_path).save({"step": 7, "w": torch.zeros(2)})
    code = ("import sys; from elastic_ring.ckpt import CheckpointStore; "
            f"print(CheckpointStore({str(tmp_path)!r}).latest_step(), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["7", "False"]
