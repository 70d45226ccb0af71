"""The base install, for real: the package built as a wheel and installed into a fresh virtual
environment that sees only the base dependencies, with none of the extras (pyproject.toml).

Nothing is downloaded: the fresh environment reads the base dependencies (torch included) from this
environment's site-packages through a folder of links to exactly those distributions (the wheel's
own ``Requires-Dist`` without extras, and theirs), named by a ``.pth`` file; pip installs the wheel
with ``--no-index``, so it finds every base requirement there or fails. Horovod, Ray, matplotlib,
numba, mpi4py, starlette and the rest of the extras are then not importable, and:
``elastic-ring --help`` works; ``train --collective torch`` with a resize 1 -> 2 finishes; ``train``
without ``--collective`` says in one line that torch was taken; each command whose extra is missing
says in one line which extra to install (exit 2).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from email.parser import Parser
from importlib.metadata import distributions
from pathlib import Path

import pytest

from elastic_ring.events import read_events
from tests.conftest import ROOT, one_line_error, shared_dir

pytestmark = pytest.mark.integration

TINY = ["--dataset", "synthetic", "--set", "synthetic_size=40", "--set", "synthetic_side=16", "--depth", "8",
        "--set", "width=4", "--batch-size", "8", "--slots", "2"]
EXTRA_MODULES = ["horovod", "ray", "matplotlib", "numba", "mpi4py", "starlette", "uvicorn",
                 "prometheus_client", "tensorboard"]


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _wheel_requires(whl: Path) -> list[str]:
    with zipfile.ZipFile(whl) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        return Parser().parsestr(z.read(meta).decode()).get_all("Requires-Dist") or []


def _base_closure(requires: list[str]) -> dict:
    """The installed distributions the base needs: ``requires`` (no extra asked) and their own
    requirements, each with the extras asked of it."""
    from packaging.requirements import Requirement

    installed = {_canon(d.metadata["Name"]): d for d in distributions()}
    todo = [(Requirement(r), {""}) for r in requires]
    found: dict[str, tuple] = {}
    while todo:
        req, asked = todo.pop()
        if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in asked):
            continue
        name = _canon(req.name)
        if name not in installed:
            pytest.fail(f"the base requirement {req} is not installed here (scripts/setup.sh installs it)")
        extras = set(req.extras)
        if name in found and extras <= found[name][1]:
            continue
        dist = installed[name]
        found[name] = (dist, extras | found.get(name, (dist, set()))[1])
        todo += [(Requirement(r), extras | {""}) for r in dist.requires or []]
    return {n: d for n, (d, _) in found.items()}


def _link_base(dists: dict, dest: Path) -> None:
    """Links in ``dest`` to the files of ``dists`` in this site-packages: a top-level entry where
    only those distributions own it, else its entries one level down (a shared namespace folder)."""
    site = Path(sysconfig.get_paths()["purelib"])
    owners: dict[tuple, set] = {}
    for d in distributions():
        name = _canon(d.metadata["Name"])
        for f in d.files or []:
            parts = Path(f).parts
            if parts and parts[0] != "..":
                for k in (parts[:1], parts[:2]):
                    owners.setdefault(k, set()).add(name)
    names = set(dists)
    for d in dists.values():
        for f in d.files or []:
            parts = Path(f).parts
            if not parts or parts[0] == "..":  # scripts (bin/): the base needs none of its dependencies'
                continue
            key = parts[:1] if owners[parts[:1]] <= names else parts[:2]
            assert owners[key] <= names, f"{key} is shared with a distribution outside the base"
            link = dest.joinpath(*key)
            if not os.path.lexists(link):
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(site.joinpath(*key))


@pytest.fixture
def base_venv(tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed and only the base dependencies importable: made once
    per session (:func:`tests.conftest.shared_dir`), where a module-scoped fixture was made again
    each time a pytest-xdist worker came back to this module after tests of others (three times,
    6-9 s each, in a whole-suite run), and read only by the tests."""
    return shared_dir(tmp_path_factory, "install-base-venv", _make_base_venv) / "venv"


def _make_base_venv(tmp: Path) -> None:
    src = tmp / "src"  # built from a copy: the build's folders stay out of the checkout
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "elastic_ring", src / "elastic_ring",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "--no-index", str(src), "-w", str(tmp / "dist")],
                           capture_output=True, text=True, timeout=300)
    if built.returncode != 0:
        pytest.skip(f"pip wheel cannot build the package here: {built.stderr.strip().splitlines()[-1:]}")
    whl = next((tmp / "dist").glob("elastic_ring-*.whl"))
    _link_base(_base_closure(_wheel_requires(whl)), tmp / "base")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    purelib = subprocess.run([str(venv / "bin" / "python"), "-c",
                              "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "elastic-ring-base.pth").write_text(str(tmp / "base") + "\n")
    # with its dependencies, from no index: every base requirement must be found among the links
    inst = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                           "-q", "--no-index", "--no-compile", str(whl)],
                          capture_output=True, text=True, timeout=300, env=_env(venv))
    assert inst.returncode == 0, inst.stderr


def _env(venv: Path) -> dict[str, str]:
    """The fresh venv's environment: no PYTHONPATH (nothing of the checkout), its bin first."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    here = str(Path(sys.executable).parent)
    path = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != here]
    env["PATH"] = os.pathsep.join([str(venv / "bin"), *path])
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _run(venv: Path, cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / "elastic-ring"), *args], cwd=cwd, env=_env(venv),
                          capture_output=True, text=True, timeout=timeout)


def test_the_base_install_has_no_extra_and_its_cli_starts(base_venv, tmp_path):
    py = str(base_venv / "bin" / "python")
    probe = ("import importlib.util as u, sys, elastic_ring.cli.main; print(elastic_ring.__file__); "
             f"print([m for m in {EXTRA_MODULES!r} if u.find_spec(m)]); "
             "print([m for m in ('torch', 'numpy', 'scipy', 'sklearn', 'pydantic') if m in sys.modules])")
    r = subprocess.run([py, "-c", probe], cwd=tmp_path, env=_env(base_venv), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    where, extras, heavy = r.stdout.splitlines()
    assert Path(where).is_relative_to(base_venv), where  # the installed package, not the checkout
    assert extras == "[]"  # no extra's module is importable
    assert heavy == "[]"  # the CLI's import pulls in none of the heavy packages
    h = _run(base_venv, tmp_path, "--help", timeout=60)
    assert h.returncode == 0 and h.stderr == "", h.stderr
    for cmd in ("train", "cluster", "simulate", "ps", "report", "export"):
        assert re.search(rf"^\s+{cmd}\s", h.stdout, re.M), h.stdout


@pytest.mark.parametrize("args, extra", [
    (["cluster", "up"], "cluster"),
    (["simulate"], "sim"),
    (["ps", "--help"], "ps"),
    (["report", "."], "report"),
    (["experiment", "resize", "--help"], "report"),
    (["train", "--backend", "ray", "--steps", "2", *TINY], "ray"),
])
def test_a_command_without_its_extra_names_it_in_one_line(base_venv, tmp_path, args, extra):
    r = _run(base_venv, tmp_path, *args, timeout=120)
    one_line_error(r, f"needs the [{extra}] extra", f"pip install 'elastic-ring[{extra}]'")
    assert not any(tmp_path.iterdir())  # nothing started, nothing written


def test_collective_horovod_without_horovod_is_one_line(base_venv, tmp_path):
    r = _run(base_venv, tmp_path, "train", "--collective", "horovod", "--steps", "2", *TINY, timeout=120)
    one_line_error(r, "--collective horovod: Horovod is not installed", "--collective torch")


def test_train_with_torch_resizes_and_without_collective_says_torch(base_venv, tmp_path):
    run = tmp_path / "run"
    r = _run(base_venv, tmp_path, "train", "--collective", "torch", "--gpus", "1", "--resize-at", "3", "--to", "2",
             "--steps", "6", *TINY, "--run-dir", str(run))
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "state: finished" in out and "Horovod is not installed" not in out, out
    rel = read_events(run / "events.jsonl", kind="relaunched")
    assert [(e["from_workers"], e["to_workers"], e["step"]) for e in rel] == [(1, 2, 3)]
    # no --collective: torch, said in one line
    r = _run(base_venv, tmp_path, "train", "--gpus", "1", "--steps", "2", *TINY, "--run-dir", str(tmp_path / "r2"))
    assert r.returncode == 0, r.stdout + r.stderr
    said = [ln for ln in r.stderr.splitlines() if "Horovod is not installed" in ln]
    assert said == ["elastic-ring: Horovod is not installed: the workers use --collective torch "
                    "(torch.distributed); the [horovod] extra adds Horovod (docs/install.md)"], r.stderr
