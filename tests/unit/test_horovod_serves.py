"""check_horovod_serves: a Horovod that cannot run the workers is one line before anything starts
(issue 47: `pip install .` built Horovod without PyTorch or Gloo, and train restarted three times).
On Ray: --collective horovod without Horovod is the same line; a torch-collective actor imports no
Horovod; an actor whose imports fail on its node is one line."""

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


def test_ray_with_the_horovod_collective_without_horovod_is_one_line_before_ray_is_asked(monkeypatch, tmp_path):
    """``--backend ray --collective horovod`` where Horovod is not installed: the controller forms
    Horovod's rings, so it is the same one-line error as on horovodrun, before Ray is contacted and
    before the run folder is kept; ``--collective torch`` on Ray needs no Horovod."""
    pytest.importorskip("ray")
    from elastic_ring.controller import runs
    from elastic_ring.controller.backends import ray as ray_backend
    from elastic_ring.controller.requests import RunRequest

    monkeypatch.setattr(hvdrun, "horovod_installed", lambda: False)
    asked = []
    monkeypatch.setattr(ray_backend, "check_answers", lambda address: asked.append(address))
    with pytest.raises(UserError, match="^--collective horovod: Horovod is not installed: install it with") as e:
        runs._prepare(RunRequest(run_dir=str(tmp_path / "r"), steps=4, backend="ray", collective="horovod",
                                 ray_address="127.0.0.1:1"), print, None)
    assert "\n" not in str(e.value) and asked == []

    class Asked(Exception):
        pass

    def answers(address):
        raise Asked(address)

    monkeypatch.setattr(ray_backend, "check_answers", answers)
    with pytest.raises(Asked):  # past the check: the next thing is Ray's
        runs._prepare(RunRequest(run_dir=str(tmp_path / "r"), steps=4, backend="ray", collective="torch",
                                 ray_address="127.0.0.1:1"), print, None)


def test_a_ray_actor_of_the_torch_collective_imports_no_horovod(monkeypatch):
    """A Ray worker actor imports its collective's modules at its creation: ``horovod.torch`` for
    Horovod (where Horovod is not importable, the creation fails with the ImportError), and only
    torch and ``torch.distributed`` for ``--collective torch``, which then runs without Horovod."""
    import sys

    from elastic_ring.controller.backends.ray_worker import COLLECTIVE_MODULES, WorkerActor

    assert COLLECTIVE_MODULES["torch"] == ("torch", "torch.distributed")
    for name in [m for m in sys.modules if m == "horovod" or m.startswith("horovod.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "horovod", None)  # not importable here
    with pytest.raises(ImportError):
        WorkerActor(collective="horovod")
    actor = WorkerActor(collective="torch")
    assert actor.import_s >= 0 and "torch.distributed" in sys.modules


def test_a_ray_actor_whose_creation_raised_is_one_line(monkeypatch):
    """An actor whose creation raised on its node (its collective does not import there) stops the
    start with one line naming the error, not Ray's traceback; another actor error (a node lost
    while the actors start) is left to the failure handling as before."""
    ray = pytest.importorskip("ray")
    from elastic_ring.controller.backends.ray_actors import actor_infos

    class Actor:
        class info:
            @staticmethod
            def remote():
                return "ref"

    def failing(init_failed: bool):
        def get(refs, timeout=None):
            raise ray.exceptions.RayActorError(None, "The actor died because of an error raised in its creation task"
                                               "\nTraceback (most recent call last):\n  File \"x.py\"\n"
                                               "ImportError: no module named horovod\n", init_failed)
        return get

    monkeypatch.setattr(ray, "get", failing(True))
    with pytest.raises(UserError) as e:
        actor_infos([Actor()])
    assert str(e.value) == ("a Ray worker actor could not start: ImportError: no module named horovod (the package, "
                            "torch and the collective must import on every Ray node)")
    monkeypatch.setattr(ray, "get", failing(False))
    with pytest.raises(ray.exceptions.RayActorError):
        actor_infos([Actor()])
    monkeypatch.setattr(ray, "get", lambda refs, timeout=None: [{"pid": 1} for _ in refs])
    assert actor_infos([Actor(), Actor()]) == [{"pid": 1}, {"pid": 1}]
