"""Where a run's workers run: the folder `train` was run in, recorded in ``run.json``, taken again
by a resume, handed to each worker (``LaunchInfo.cwd``), which changes to it; the package found
from any folder."""

from __future__ import annotations

import os

import pytest

from elastic_ring.controller.backends import api
from elastic_ring.controller.resume import _resumed_cwd
from elastic_ring.errors import UserError
from elastic_ring import protocol
from elastic_ring.worker import run, session


def test_a_resume_runs_where_the_run_started(tmp_path, monkeypatch):
    start, here = tmp_path / "start", tmp_path / "here"
    start.mkdir()
    here.mkdir()
    monkeypatch.chdir(here)
    assert _resumed_cwd(tmp_path / "r", {"cwd": str(start)}) == str(start)
    assert _resumed_cwd(tmp_path / "r", {}) == str(here)  # a run recorded before the folder was
    with pytest.raises(UserError, match=rf"^run .* was started in {tmp_path / 'gone'}, which is gone"):
        _resumed_cwd(tmp_path / "r", {"cwd": str(tmp_path / "gone")})


def test_the_worker_changes_to_the_folder_it_is_told(tmp_path, monkeypatch, capsys):
    protocol.write_json_atomic(tmp_path / "run.json", {"worker": {"total_steps": 1, "cwd": str(tmp_path)}})
    a, _ = run._parse(["--run-dir", str(tmp_path), "--segment", "0", "--stop-at", "1", "--", "script.py"])
    monkeypatch.setattr(os, "environ", os.environ.copy())
    monkeypatch.setattr(session, "_PROCESS", session._Process())
    monkeypatch.chdir("/")
    info, _ = run._launch_info(a)  # run.json's worker entry, handed to the library: it runs there
    assert info.cwd == str(tmp_path) and session.launch() is info and os.getcwd() == str(tmp_path)
    monkeypatch.chdir("/")
    run._enter(str(tmp_path))
    assert os.getcwd() == str(tmp_path)
    run._enter(str(tmp_path / "elsewhere"))  # another host without that folder: stays, and says so
    assert os.getcwd() == str(tmp_path)
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"elastic-ring worker: cannot run in {tmp_path / 'elsewhere'} (") and line.endswith(
        f"running in {tmp_path}")


def test_the_package_is_found_from_any_folder(monkeypatch, tmp_path):
    monkeypatch.setattr(api, "ROOT", tmp_path / "checkout")
    assert api.package_path("") == str(tmp_path / "checkout")
    assert api.package_path(f"/a{os.pathsep}/b") == os.pathsep.join(["/a", "/b", str(tmp_path / "checkout")])
    assert api.package_path(str(tmp_path / "checkout")) == str(tmp_path / "checkout")  # there already
    monkeypatch.setattr(api, "ROOT", tmp_path / "lib" / "site-packages")
    assert api.package_path("/a") == "/a"  # installed: found anyway
