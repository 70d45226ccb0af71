"""Deterministic failures: what the worker entry point records, and the controller's rule that
does not retry them. The entry point runs for real (a subprocess of ``python -m
elastic_ring.worker.run``, without horovodrun: these scripts fail before Horovod starts)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from elastic_ring.controller.restart_rule import append_traceback, not_retried


def _run_worker(tmp_path: Path, script_text: str, *args: str) -> tuple[dict, subprocess.CompletedProcess]:
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"worker": {"total_steps": 5}}))
    script = tmp_path / "user_script.py"
    script.write_text(script_text)
    p = subprocess.run([sys.executable, "-m", "elastic_ring.worker.run", "--run-dir", str(run),
                        "--segment", "0", "--stop-at", "5", "--", str(script), *args],
                       capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin",
                                                                        "HOROVOD_RANK": "0"})
    (rec_file,) = (run / "logs").glob("error-rank*.json")
    return json.loads(rec_file.read_text()), p


def test_syntax_error_names_file_and_line_and_is_not_retried(tmp_path):
    rec, p = _run_worker(tmp_path, "x = 1\nif x\n    pass\n")
    assert p.returncode == 1
    assert rec["kind"] == "syntax" and rec["where"].endswith("user_script.py:2")
    assert rec["message"].startswith("SyntaxError: ") and "user_script.py:2" in rec["message"]
    assert not_retried(rec) == "a syntax error in the script: not retried"


def test_rejected_arguments_show_argparse_message_and_are_not_retried(tmp_path):
    rec, p = _run_worker(tmp_path, "import argparse\np = argparse.ArgumentParser()\n"
                                   "p.add_argument('--lr', type=float)\np.parse_args()\n",
                         "--lr", "fast")
    assert rec["kind"] == "usage" and rec["fatal"]
    assert "the script rejected its arguments: argument --lr: invalid float value: 'fast'" in rec["message"]
    assert "breaks the worker library" not in rec["message"]
    assert not_retried(rec) == "not retried"


def test_user_exception_before_first_step_names_its_line(tmp_path):
    rec, _ = _run_worker(tmp_path, "def load():\n    raise KeyError('label')\n\nload()\n")
    assert rec["kind"] == "setup" and rec["where"].endswith("user_script.py:2")
    assert rec["message"] == "KeyError: 'label' (" + rec["where"] + ")"
    assert not_retried(rec) == "the script failed before its first step: not retried"


def test_a_missing_file_before_the_first_step_is_not_retried(tmp_path):
    """docs/worker.md: an exception in the script's own code before its first step is not retried;
    a FileNotFoundError (a wrong --train-dir) was taken for a passing OS error and retried once."""
    rec, _ = _run_worker(tmp_path, "open('../no/such/train/dir/labels.txt')\n")
    assert rec["kind"] == "setup" and rec["type"] == "FileNotFoundError", rec
    assert not_retried(rec) == "the script failed before its first step: not retried"


def test_import_error_is_not_retried(tmp_path):
    rec, _ = _run_worker(tmp_path, "import no_such_module_here\n")
    assert rec["kind"] == "import" and not_retried(rec)


@pytest.mark.parametrize("rec, retried", [
    ({"type": "RuntimeError", "kind": None, "step": 7}, True),          # at a step: once
    ({"type": "HorovodInternalError", "peer_loss": True, "kind": "setup"}, True),
    ({"type": "OSError", "kind": None, "step": None}, True),
    ({"type": "ScriptError", "fatal": True}, False),                    # an old record
    ({"type": "PicklingError", "kind": "pickling"}, False),
    (None, True),
])
def test_restart_rule(rec, retried):
    assert (not_retried(rec) is None) == retried


def test_log_ends_with_the_users_traceback(tmp_path):
    log = tmp_path / "seg.log"
    log.write_text("horovodrun: Traceback ... runner\n")
    append_traceback(log, {"rank": 1, "traceback": "Traceback\n  File \"train.py\", line 3\nKeyError: 'x'\n"})
    assert log.read_text().rstrip().endswith("KeyError: 'x'")


def test_a_worker_names_its_process_after_its_run_and_rank(tmp_path):
    """`ps -e` tells the ranks apart (a fork-server child's command line is the fork server's): the
    worker entry names its process ``er<rank>:<run folder>``; without horovodrun's rank variables,
    ``er:<run folder>``."""
    (tmp_path / "myrun" / "logs").mkdir(parents=True)
    (tmp_path / "myrun" / "run.json").write_text(json.dumps({"worker": {"total_steps": 5}}))
    script = tmp_path / "show.py"
    script.write_text("print(open('/proc/self/comm').read().strip(), flush=True)\n")
    env = {"PATH": "/usr/bin:/bin", "HOROVOD_RANK": "1", "ELASTIC_RING_NO_ZYGOTE": "1"}
    p = subprocess.run([sys.executable, "-m", "elastic_ring.worker.run", "--run-dir", str(tmp_path / "myrun"),
                        "--segment", "0", "--stop-at", "5", "--", str(script)],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.stdout.splitlines()[0] == "er1:myrun", (p.stdout, p.stderr)
    from elastic_ring.worker.run import process_name

    assert process_name(Path("/x/runs/demo-20261202-114127"), 12) == "er12:demo-20261"  # 15 characters
    assert process_name(Path("/x/r"), None) == "er:r"
