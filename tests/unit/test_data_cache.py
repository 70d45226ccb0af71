"""The digits' tensors kept in the machine's cache: a run's controller fills its run folder by a
file copy, without importing torch, and the copy is the same bytes as a fresh materialisation."""

from __future__ import annotations

import subprocess
import sys

from elastic_ring.config.api import load_config
from elastic_ring.controller.rundir import ensure_dataset_cache
from elastic_ring.data.check import DIGITS_FILES, machine_cache_root
from tests.conftest import ROOT


def test_second_run_copies_the_digits_without_torch_and_the_same_bytes(tmp_path, monkeypatch):
    monkeypatch.setenv("ELASTIC_RING_CACHE", str(tmp_path / "machine"))
    cfg = load_config(None, ["dataset=digits"])
    first = tmp_path / "run1"
    first.mkdir()
    ensure_dataset_cache(first, cfg)  # materialised (torch), then kept for the machine
    kept = list((machine_cache_root() / "datasets").glob("digits-*"))
    assert len(kept) == 1 and sorted(f.name for f in kept[0].iterdir()) == sorted(DIGITS_FILES)
    second = tmp_path / "run2"
    second.mkdir()
    code = ("import sys; from elastic_ring.config.api import load_config; "
            "from elastic_ring.controller.rundir import ensure_dataset_cache; from pathlib import Path; "
            f"ensure_dataset_cache(Path({str(second)!r}), load_config(None, ['dataset=digits'])); "
            "print('torch' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env={**__import__("os").environ, "ELASTIC_RING_CACHE": str(tmp_path / "machine")})
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "False"  # the copy needed no torch
    for f in DIGITS_FILES:
        assert (second / "cache" / f).read_bytes() == (first / "cache" / f).read_bytes()


def test_an_unwritable_machine_cache_only_costs_time(tmp_path, monkeypatch):
    blocker = tmp_path / "machine"
    blocker.write_text("a file where the cache folder would be")
    monkeypatch.setenv("ELASTIC_RING_CACHE", str(blocker))
    run = tmp_path / "run"
    run.mkdir()
    ensure_dataset_cache(run, load_config(None, ["dataset=digits"]))
    assert sorted(f.name for f in (run / "cache").iterdir()) == sorted(DIGITS_FILES)
