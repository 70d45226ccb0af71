"""`elastic-ring export`: a folder or an existing file as --out, and corrupt checkpoints, each one
line (exit 2) with nothing overwritten; a corrupt newest checkpoint falls back to an older one
that verifies, with a warning naming both."""

from __future__ import annotations

import pytest
import torch

from elastic_ring.ckpt import CheckpointStore
from tests.conftest import one_line_error, run_inproc


def _run(tmp_path, keep=2):
    run = tmp_path / "run"
    store = CheckpointStore(run / "checkpoints", keep=keep)
    for step in (10, 20):
        store.save({"step": step, "world_size": 1, "model": {"w": torch.full((3,), float(step))}})
    return run, store


def _corrupt(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x55
    path.write_bytes(bytes(data))


def test_export_writes_the_newest_model(capsys, tmp_path):
    run, _ = _run(tmp_path)
    out = tmp_path / "sub" / "model.pt"
    r = run_inproc(capsys, "export", str(run), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "the model of step 20" in r.stdout
    assert torch.equal(torch.load(out, weights_only=True)["w"], torch.full((3,), 20.0))
    assert [p.name for p in out.parent.iterdir()] == ["model.pt"]  # no temporary file left


def test_export_to_a_folder_is_one_line(capsys, tmp_path):
    run, _ = _run(tmp_path)
    r = run_inproc(capsys, "export", str(run), "--out", str(tmp_path))
    one_line_error(r, f"--out {tmp_path} is a folder", "model.pt")


def test_export_keeps_an_existing_file_unless_forced(capsys, tmp_path):
    run, _ = _run(tmp_path)
    out = tmp_path / "model.pt"
    out.write_bytes(b"precious")
    r = run_inproc(capsys, "export", str(run), "--out", str(out))
    one_line_error(r, f"{out} already exists", "--force")
    assert out.read_bytes() == b"precious"
    r = run_inproc(capsys, "export", str(run), "--out", str(out), "--force")
    assert r.returncode == 0, r.stderr
    assert torch.load(out, weights_only=True)["w"][0] == 20.0


def test_export_an_unwritable_out_is_one_line(capsys, tmp_path):
    run, _ = _run(tmp_path)
    (tmp_path / "file").write_text("x")
    r = run_inproc(capsys, "export", str(run), "--out", str(tmp_path / "file" / "model.pt"))
    one_line_error(r, "cannot write")


def test_a_corrupt_newest_checkpoint_falls_back_to_the_older_one_and_says_so(capsys, tmp_path):
    run, store = _run(tmp_path)
    newest, older = store.candidates()
    _corrupt(newest)
    out = tmp_path / "model.pt"
    r = run_inproc(capsys, "export", str(run), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "warning:" in r.stderr and newest.name in r.stderr and f"older checkpoint {older}" in r.stderr
    assert "the model of step 10" in r.stdout


def test_an_older_checkpoint_outside_the_index_is_used(capsys, tmp_path):
    """keep=1: the index names one file; an older file still in the folder (kept by hand, or left
    by a run with a larger --keep) is tried too, not "start a new run"."""
    run, store = _run(tmp_path, keep=1)
    older = run / "checkpoints" / "ckpt-00000005.pt"
    CheckpointStore(tmp_path / "elsewhere").save({"step": 5, "world_size": 1, "model": {"w": torch.zeros(3)}})
    (tmp_path / "elsewhere" / "ckpt-00000005.pt").rename(older)
    _corrupt(store.candidates()[0])
    r = run_inproc(capsys, "export", str(run), "--out", str(tmp_path / "m.pt"))
    assert r.returncode == 0, r.stderr
    assert f"older checkpoint {older}" in r.stderr and "step 5" in r.stdout


@pytest.mark.parametrize("keep", [1, 2])
def test_no_checkpoint_loads_is_one_line_naming_each(capsys, tmp_path, keep):
    run, store = _run(tmp_path, keep=keep)
    for p in store.candidates():
        _corrupt(p)
    out = tmp_path / "model.pt"
    r = run_inproc(capsys, "export", str(run), "--out", str(out))
    one_line_error(r, "no checkpoint in", "loads", "SHA-256", "--checkpoint FILE")
    assert "start a new run" not in r.stderr
    for p in store.candidates():
        assert p.name in r.stderr
    assert not out.exists()
