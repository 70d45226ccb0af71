"""A failed parameter-server job reaches the caller as one line naming the rank and the
exception, read from the crash record that ``train`` workers write too (no processes here; the
real mpirun failure is in tests/integration/test_ps_mpirun.py)."""

from __future__ import annotations

import json
import time

import pytest

from elastic_ring.errors import WorkerFailedError
from elastic_ring.events.api import read_events
from elastic_ring.protocol import error_file, write_error_record
from elastic_ring.ps import inprocess
from elastic_ring.ps.api import PSConfig
from elastic_ring.ps.runner import check_run, run_job


def crash(run_dir, rank: int, text: str) -> None:
    try:
        raise RuntimeError(text)
    except RuntimeError as e:
        write_error_record(run_dir, e, rank)


def test_a_rank_failure_is_one_line_with_rank_and_cause(tmp_path):
    def launch(cmd, run_dir, timeout):
        crash(run_dir, 2, "boom at push 3")
        time.sleep(0.01)
        crash(run_dir, 1, "later, not the first")
        return 1

    with pytest.raises(WorkerFailedError) as e:
        run_job(PSConfig(workers=2), tmp_path, launch=launch)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("rank 2 failed: RuntimeError: boom at push 3")
    assert str(error_file(tmp_path, 2)) in msg and e.value.rank == 2
    assert read_events(tmp_path / "events.jsonl", "error")[0]["rank"] == 2


def test_a_crash_record_of_an_earlier_attempt_is_not_this_jobs(tmp_path):
    crash(tmp_path, 1, "an earlier attempt")
    with pytest.raises(WorkerFailedError, match="rank 1 failed"):
        check_run(tmp_path, 0)
    with pytest.raises(WorkerFailedError, match="no ps_finished"):
        check_run(tmp_path, 0, since=time.time() + 1)


def test_the_inprocess_engine_writes_the_same_record(tmp_path, capsys):
    (tmp_path / "ps_config.json").write_text(json.dumps({"workers": 2}))  # clock: wall: refused
    assert inprocess.main([str(tmp_path)]) == 1
    rec = json.loads(error_file(tmp_path, 0).read_text())
    assert rec["rank"] == 0 and rec["type"] == "PSInputError" and "clock: virtual" in rec["message"]
    with pytest.raises(WorkerFailedError, match="rank 0 failed: .*PSInputError: .*clock: virtual"):
        check_run(tmp_path, 1)
    assert "clock: virtual" in capsys.readouterr().err
