"""What a user reads about one real run, from its first second to an extension after its end:
`status`'s state (starting, resizing 1 -> 2, running, finished; never "not a run folder" once
`train` started), `runs`, `logs`, a `--resume` of the finished run (one line, at once) and
`--resume DIR --steps N` (the run goes on to its new total, each step once)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from elastic_ring.controller.status import read_status
from elastic_ring.errors import UserError
from elastic_ring.events import read_events
from tests.conftest import BIN, ROOT, run_cli

pytestmark = pytest.mark.integration


def _watch(proc: subprocess.Popen, rd) -> list[str]:
    """The state lines `status` would print, each change once, until ``proc`` exits."""
    seen: list[str] = []
    while True:
        done = proc.poll() is not None
        if rd.exists():
            try:
                line = read_status(rd).line()
            except UserError as e:
                line = f"error: {e}"
            if not seen or seen[-1] != line:
                seen.append(line)
        if done:
            return seen
        time.sleep(0.05)


def test_status_through_a_run_then_runs_logs_and_an_extension(tmp_path):
    # 3000 steps before the resize: the first segment lasts several of the controller's looks (one
    # every 0.1 s; 0.7 s of segment on a 2-core AVX-512 EPYC), so it sees the run running and
    # `status`, polled every 0.05 s, shows it. Shorter, the controller could see the first step and
    # the segment's end in one look and go from starting to resizing: a fresh-clone CI run did at 8
    # steps, and one at 300 (0.10-0.12 s from the first step to the segment's end on that EPYC)
    rd = tmp_path / "runs" / "mlp"
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "elastic_ring.cli.main", "train", "--script",
                             str(ROOT / "examples" / "mlp_digits.py"), "--steps", "3100", "--gpus", "1",
                             "--resize-at", "3000", "--to", "2", "--slots", "2", "--device", "cpu",
                             "--run-dir", str(rd), "--", "--hidden", "16"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = _watch(proc, rd)
    out, err = proc.communicate()
    assert proc.returncode == 0, err
    assert not any(s.startswith("error") for s in seen), seen  # a run folder from its first moment
    assert seen[0] == "starting" and seen[-1] == "finished", seen
    assert "resizing 1 -> 2" in seen and seen.index("running") < seen.index("resizing 1 -> 2"), seen
    assert "resize 1 -> 2 after step 3000: LR 0.05 -> 0.1 (Eq. 7: x2)" in err

    listed = run_cli("runs", str(tmp_path / "runs"))
    assert listed.returncode == 0 and listed.stdout.splitlines()[1].split()[:4] == [str(rd), "finished", "3100/3100", "2"]
    log = run_cli("logs", str(rd), "--segment", "1")
    assert log.returncode == 0 and log.stdout == (rd / "logs" / "segment-001-w2.log").read_text() != ""

    t0 = time.time()
    again = run_cli("train", "--resume", str(rd))
    assert again.returncode == 2 and "already finished (step 3100 of 3100)" in again.stderr
    answer_s = time.time() - t0

    more = run_cli("train", "--resume", str(rd), "--steps", "3120", timeout=300)
    assert more.returncode == 0, more.stderr
    assert f"elastic-ring: run {rd}: 3100 -> 3120 steps" in more.stderr
    launches = read_events(rd / "events.jsonl", kind="launch")
    assert [(e["start_step"], e["stop_step"], e["world_size"], e["session_start"]) for e in launches] == [
        (1, 3000, 1, True), (3001, 3100, 2, False), (3101, 3120, 2, True)]
    st = run_cli("status", str(rd))
    assert st.stdout.startswith("state: finished   step: 3120/3120   workers: 2"), st.stdout
    print(f"--resume of the finished run answered in {answer_s:.2f} s")
