"""``run.json`` read once per process while it is unchanged (elastic_ring.protocol.run_info), and
the controller's rewrites at a resume seen by the next read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from elastic_ring import protocol
from elastic_ring.controller import resume, rundir
from elastic_ring.errors import UserError


@pytest.fixture
def counted(monkeypatch):
    """The number of times run.json's text is read from the disk."""
    n = {"reads": 0}
    real = Path.read_text

    def read_text(self, *a, **k):
        if self.name == protocol.RUN_FILE:
            n["reads"] += 1
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "read_text", read_text)
    return n


def _run(tmp_path: Path, **info) -> Path:
    rd = tmp_path / "run"
    rd.mkdir()
    (rd / protocol.RUN_FILE).write_text(json.dumps({"total_steps": 10, "worker": {"keep": 2}, **info}))
    return rd


def test_read_once_while_unchanged_and_each_caller_gets_its_own_copy(tmp_path, counted):
    rd = _run(tmp_path)
    a = protocol.run_info(rd)
    a["worker"]["keep"] = 9  # a caller's change stays its own
    assert protocol.run_info(rd)["worker"]["keep"] == 2 and resume.read_run_info(rd)["total_steps"] == 10
    assert protocol.read_run_json(rd)["total_steps"] == 10 and counted["reads"] == 1


def test_the_controllers_rewrite_is_seen_without_reading_it_back(tmp_path, counted):
    rd = _run(tmp_path)
    assert protocol.run_info(rd)["total_steps"] == 10
    rundir.update_run_info(rd, total_steps=20)
    rundir.update_worker_settings(rd, keep=3)
    info = protocol.run_info(rd)
    assert (info["total_steps"], info["worker"]["keep"]) == (20, 3) and counted["reads"] == 1
    assert json.loads((rd / protocol.RUN_FILE).read_bytes()) == info  # the file says the same


def test_a_rewrite_by_another_process_is_read_again(tmp_path, counted):
    rd = _run(tmp_path)
    assert protocol.run_info(rd)["total_steps"] == 10
    tmp = rd / ".other"  # another process replaces it by a rename (a new inode), same size
    tmp.write_text(json.dumps({"total_steps": 30, "worker": {"keep": 2}}))
    tmp.replace(rd / protocol.RUN_FILE)
    assert protocol.run_info(rd)["total_steps"] == 30 and counted["reads"] == 2


def test_a_damaged_or_missing_file_is_still_told_in_one_line(tmp_path):
    rd = tmp_path / "run"
    rd.mkdir()
    assert protocol.read_run_json(rd) is None
    (rd / protocol.RUN_FILE).write_text("{not json")
    assert protocol.read_run_json(rd) is None
    with pytest.raises(UserError, match=r"run.json is damaged: not valid JSON \(line 1, column 2\)"):
        resume.read_run_info(rd)
