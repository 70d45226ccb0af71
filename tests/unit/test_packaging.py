"""The package carries what it reads at run time, so that an installed wheel runs without a checkout:
every file under ``elastic_ring/`` that is not Python source is named by the package data of
``pyproject.toml``, and the processes the tool starts are modules of the package, not scripts of
the repository."""

from __future__ import annotations

import fnmatch
import tomllib

from tests.conftest import ROOT


def _package_data() -> dict[str, list[str]]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return meta["tool"]["setuptools"]["package-data"]


def test_every_data_file_of_the_package_is_package_data():
    globs = _package_data()
    pkg = ROOT / "elastic_ring"
    missing = []
    for f in pkg.rglob("*"):
        if not f.is_file() or f.suffix in (".py", ".pyc") or "__pycache__" in f.parts:
            continue
        rel = f.relative_to(ROOT)
        # a data file belongs to the nearest enclosing package whose globs match it
        ok = False
        for i in range(len(rel.parts) - 1, 0, -1):
            name = ".".join(rel.parts[:i])
            inside = "/".join(rel.parts[i:])
            if any(fnmatch.fnmatch(inside, g) for g in globs.get(name, [])):
                ok = True
                break
        if not ok:
            missing.append(str(rel))
    assert not missing, f"not in [tool.setuptools.package-data]: {missing}"


def test_the_processes_started_are_modules_of_the_package():
    from elastic_ring.controller.backends.api import worker_entry
    from elastic_ring.ps.runner import ENTRY

    assert worker_entry()[-2:] == ["-m", "elastic_ring.worker.run"]
    assert ENTRY == ["-m", "elastic_ring.ps.mpi_main"]


def test_the_readme_names_the_folder_make_demo_writes():
    """`make demo` writes runs/demo-DATE-TIME (the Makefile's DEMO_DIR), not runs/demo: the README
    says so, and that its recorded output shows the folder shortened."""
    import re

    make = (ROOT / "Makefile").read_text()
    prefix = re.search(r"^DEMO_DIR \?= (\S+?)\$\(shell date", make, re.M).group(1)
    assert prefix == "runs/demo-"
    readme = (ROOT / "README.md").read_text()
    prose = re.sub(r"```.*?```", "", readme, flags=re.S)  # the recorded output's paths are shortened
    assert "`runs/demo-DATE-TIME`" in prose
    assert "the run folder to `runs/demo`" in prose  # and the text says the output shows it so
