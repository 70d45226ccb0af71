"""check_horovod_serves: a Horovod that cannot run the workers is one line before anything starts
(issue 47: `pip install .` built Horovod without PyTorch or Gloo, and train restarted three times)."""

from __future__ import annotations

import importlib.util
import sysconfig
import types

import pytest

from elastic_ring.controller import hvdrun
from elastic_ring.errors import UserError


def _fake_horovod(monkeypatch, tmp_path, with_torch_ext: bool):
    pkg = tmp_path / "horovod"
    (pkg / "torch").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    if with_torch_ext:
        (pkg / "torch" / ("mpi_lib_v2" + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))).write_text("")
    fake = types.ModuleType("horovod")
    fake.__file__ = str(pkg / "__init__.py")
    fake.__version__ = "0.28.1"
    monkeypatch.setitem(__import__("sys").modules, "horovod", fake)


def test_not_installed(monkeypatch):
    monkeypatch.delitem(__import__("sys").modules, "horovod", raising=False)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "horovod" else real(name, *a))
    with pytest.raises(UserError, match="Horovod is not installed: install it with scripts/setup.sh"):
        hvdrun.check_horovod_serves("cpu")


def test_no_pytorch_extension(monkeypatch, tmp_path):
    _fake_horovod(monkeypatch, tmp_path, with_torch_ext=False)
    with pytest.raises(UserError, match=r"has no PyTorch extension \(mpi_lib_v2.* missing") as e:
        hvdrun.check_horovod_serves("cpu", gloo_check=lambda verbose: True)
    assert "\n" not in str(e.value) and "--collective torch" in str(e.value)


def test_no_gloo_on_cpu_but_fine_on_gpu(monkeypatch, tmp_path):
    _fake_horovod(monkeypatch, tmp_path, with_torch_ext=True)
    asked = []

    def no_gloo(verbose):
        asked.append(verbose)
        return False

    with pytest.raises(UserError, match="was built without Gloo, which CPU workers need"):
        hvdrun.check_horovod_serves("cpu", gloo_check=no_gloo)
    hvdrun.check_horovod_serves("cuda", gloo_check=no_gloo)  # NCCL is checked elsewhere; Gloo not needed
    assert asked == [False]
    hvdrun.check_horovod_serves("cpu", gloo_check=lambda verbose: True)


def test_the_installed_horovod_serves():
    pytest.importorskip("horovod.torch")
    hvdrun.check_horovod_serves("cpu")  # the project's build: PyTorch and Gloo


def test_without_horovod_the_collective_is_torch_and_said(monkeypatch, tmp_path):
    """A new run with no --collective where Horovod is not installed takes torch.distributed, said
    in one line; an explicit --collective horovod is the one-line 'not installed' error instead."""
    from elastic_ring.controller import runs
    from elastic_ring.controller.requests import RunRequest

    monkeypatch.setattr(hvdrun, "horovod_installed", lambda: False)
    seen = {}

    def fake_prepare(req, echo, rd):
        seen["collective"] = req.collective
        return "prepared"

    monkeypatch.setattr(runs, "_prepare", fake_prepare)
    said = []
    assert runs.prepare(RunRequest(run_dir=str(tmp_path / "r"), steps=4), said.append) == "prepared"
    assert seen["collective"] == "torch"
    assert said == ["elastic-ring: Horovod is not installed: the workers use --collective torch "
                    "(torch.distributed); the [horovod] extra adds Horovod (docs/install.md)"]
    monkeypatch.setattr(hvdrun, "horovod_installed", lambda: True)
    said.clear()
    runs.prepare(RunRequest(run_dir=str(tmp_path / "r2"), steps=4), said.append)
    assert seen["collective"] is None and said == []
