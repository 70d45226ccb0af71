"""elastic_ring.extras: which pip extra a command or a missing module needs, said in one line by the
CLI (the real installs without the extras: tests/integration/test_install_extras.py)."""

from __future__ import annotations

import tomllib

import pytest

from elastic_ring import extras
from tests.conftest import ROOT, one_line_error


def test_every_module_s_extra_is_one_of_pyproject_s_and_lists_it():
    """Each module's extra exists in pyproject.toml and installs a distribution of that module;
    [all] asks for every extra."""
    from packaging.requirements import Requirement

    opt = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for module, extra in extras.EXTRA_OF.items():
        names = [Requirement(r).name.lower().replace("_", "-") for r in opt[extra]]
        assert module.replace("_", "-") in names, (module, extra, names)
    for command, (extra, modules) in extras.COMMAND_NEEDS.items():  # the command's extra installs them
        names = [Requirement(r).name.lower().replace("_", "-") for r in opt[extra]]
        assert all(m.replace("_", "-") in names for m in modules), (command, extra, names)
    (everything,) = opt["all"]
    assert Requirement(everything).name == "elastic-ring"
    assert Requirement(everything).extras == set(extras.EXTRA_OF.values())


def test_a_missing_module_of_an_extra_becomes_its_line_and_others_stay_errors():
    e = extras.from_import_error("elastic-ring train", ModuleNotFoundError("No module named 'ray.util'",
                                                                            name="ray.util"))
    assert isinstance(e, extras.MissingExtra) and e.exit_code == 2
    assert str(e) == ("elastic-ring train needs the [ray] extra (ray is not installed): "
                      "pip install 'elastic-ring[ray]'")
    assert extras.from_import_error("x", ModuleNotFoundError("No module named 'yaml'", name="yaml")) is None
    assert extras.from_import_error("x", ImportError("cannot import name 'a' from 'numba'", name="numba")) is None


def test_require_names_the_first_missing_module(monkeypatch):
    monkeypatch.setattr(extras, "installed", lambda m: m != "uvicorn")
    extras.require("x", "starlette")
    with pytest.raises(extras.MissingExtra, match=r"^x needs the \[cluster\] extra \(uvicorn is not installed\)"):
        extras.require("x", "starlette", "uvicorn", "prometheus_client")


def test_installed_finds_what_imports():
    assert extras.installed("json") and not extras.installed("no_such_module_here_47")


@pytest.mark.parametrize("args, module, extra", [
    (["simulate"], "numba", "sim"),
    (["cluster", "up"], "starlette", "cluster"),
    (["cluster", "web"], "numba", "cluster"),  # numba is also [sim]'s: the command's extra is named
    (["ps", "--help"], "mpi4py", "ps"),
    (["report", "."], "matplotlib", "report"),
])
def test_the_cli_says_the_command_s_extra_in_one_line(cli_inproc, monkeypatch, args, module, extra):
    monkeypatch.setattr(extras, "installed", lambda m: m != module)
    r = cli_inproc(*args)
    one_line_error(r, f"elastic-ring {args[0]} needs the [{extra}] extra ({module} is not installed)",
                   f"pip install 'elastic-ring[{extra}]'")


def test_a_lazy_import_of_an_extra_s_module_is_the_same_line(cli_inproc, monkeypatch):
    """An option's import met while the command runs (here the runs listing, made to import Ray)."""
    import elastic_ring.cli.runs as runs_cli

    def boom(*a, **k):
        raise ModuleNotFoundError("No module named 'ray'", name="ray")

    monkeypatch.setattr(runs_cli.runs, "callback", boom)
    r = cli_inproc("runs")
    one_line_error(r, "elastic-ring runs needs the [ray] extra", "pip install 'elastic-ring[ray]'")


def test_a_command_without_needs_is_not_asked(cli_inproc, monkeypatch):
    asked = []
    monkeypatch.setattr(extras, "installed", lambda m: asked.append(m) or False)
    r = cli_inproc("runs", "--help")
    assert r.returncode == 0 and asked == []
