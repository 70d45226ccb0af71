"""`elastic-ring train --script`: users' own scripts on the worker library, with real horovodrun.

Each example of ``examples/`` is resized 1 -> 2 -> 1 (the paced one 1 -> 2): every step once (the segments tile the run
and the sample cursor of the final checkpoint is exactly the samples the schedule consumes), Eq. 7
at each relaunch, and a final loss that shows it learned. Then the contract's bad inputs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from elastic_ring.ckpt import CheckpointStore
from elastic_ring.events import read_events
from tests.conftest import ROOT, run_cli

pytestmark = pytest.mark.integration


def _check_elastic_run(run: Path, steps: int, schedule: list[tuple[int, int]], batch: int) -> list[dict]:
    ev = read_events(run / "events.jsonl")
    launches = [e for e in ev if e["kind"] == "launch"]
    ends = [e for e in ev if e["kind"] == "segment_end"]
    bounds = [0] + [s for s, _ in schedule] + [steps]
    assert [(e["start_step"], e["stop_step"]) for e in launches] == list(zip(
        [b + 1 for b in bounds[:-1]], bounds[1:]))
    assert [e["step"] for e in ends] == bounds[1:]
    # the sample stream: each step took world * batch positions, none skipped or repeated
    worlds = [launches[0]["world_size"]] + [w for _, w in schedule]
    expected = sum((b1 - b0) * w * batch for b0, b1, w in zip(bounds, bounds[1:], worlds))
    final = CheckpointStore(run / "checkpoints").load_latest()
    assert final["step"] == steps and final["cursor"] == expected
    # Eq. 7 at each relaunch, and the first step after it runs at that LR
    rel = [e for e in ev if e["kind"] == "relaunched"]
    firsts = [e for e in ev if e["kind"] == "first_step_after_resize"]
    assert [(r["from_workers"], r["to_workers"], r["step"]) for r in rel] == [
        (a, b, s) for (s, b), a in zip(schedule, worlds)]
    for r, f in zip(rel, firsts):
        assert r["lr_new"] == pytest.approx(r["to_workers"] / r["from_workers"] * r["lr_last"])
        assert f["lr"] == pytest.approx(r["lr_new"])
    return ev


def test_mlp_on_digits_resized_1_2_1_learns(tmp_path):
    run = tmp_path / "mlp"
    p = run_cli("train", "--script", str(ROOT / "examples" / "mlp_digits.py"), "--steps", "300",
                "--gpus", "1", "--schedule", "100:2,200:1", "--slots", "2", "--run-dir", str(run),
                "--", "--hidden", "64", timeout=400)
    assert p.returncode == 0, p.stderr
    ev = _check_elastic_run(run, 300, [(100, 2), (200, 1)], batch=32)
    thr = [e for e in ev if e["kind"] == "throughput"]
    assert thr[-1]["loss"] < 0.35 * math.log(10), thr[-1]  # from ln(10) = 2.30 at chance
    acc = [e for e in ev if e["kind"] == "evaluation"]
    assert [e["step"] for e in acc] == [100, 200, 300] and acc[-1]["test_accuracy"] > 0.9
    assert "final test accuracy" in (run / "logs" / "segment-002-w1.log").read_text()


def test_char_transformer_resized_1_2_1_learns(tmp_path):
    run = tmp_path / "lm"
    p = run_cli("train", "--script", str(ROOT / "examples" / "char_lm.py"), "--steps", "240",
                "--gpus", "1", "--schedule", "80:2,160:1", "--slots", "2", "--run-dir", str(run),
                timeout=600)
    assert p.returncode == 0, p.stderr
    ev = _check_elastic_run(run, 240, [(80, 2), (160, 1)], batch=16)
    evals = [e for e in ev if e["kind"] == "evaluation"]
    first, last = evals[0], evals[-1]
    assert last["step"] == 240 and last["test_loss"] < first["test_loss"]
    assert last["test_loss"] < 0.5 * math.log(34), last  # far below a uniform guess over ~34 chars
    s = json.loads((run / "summary.json").read_text())
    assert [x["workers"] for x in s["sizes"]] == [1, 2] and len(s["resizes"]) == 2


def test_paced_example_keeps_its_pace_and_speeds_up_with_workers(tmp_path):
    # examples/paced.py: a step lasts --step-s / W (a sleep after the real step), so steps/s is
    # about W / step_s: never faster than the pace, and nearly twice as fast at 2 workers. (0.25 s:
    # the real step of its tiny model and the allreduce stay far below the 0.125 s of a 2-worker step)
    pace = 0.25
    run = tmp_path / "paced"
    p = run_cli("train", "--script", str(ROOT / "examples" / "paced.py"), "--steps", "48", "--gpus", "1",
                "--schedule", "24:2", "--slots", "2", "--run-dir", str(run), "--", "--step-s", str(pace),
                timeout=300)
    assert p.returncode == 0, p.stderr
    ev = _check_elastic_run(run, 48, [(24, 2)], batch=8)
    by_size: dict[int, list[float]] = {}
    for e in ev:
        if e["kind"] == "throughput" and e["steps"] >= 10:
            by_size.setdefault(e["world_size"], []).append(e["steps"] / e["seconds"])
    r1, r2 = max(by_size[1]), max(by_size[2])
    assert r1 <= 1 / pace * 1.02 and r2 <= 2 / pace * 1.02, by_size  # the sleep sets a floor on the step
    assert r2 > 1.4 * r1, by_size  # (the real step and the allreduce of the 2 workers take a little)


RAISES_EARLY = """
import elastic_ring.worker as elastic
job = elastic.init()
raise ValueError("no such column 'label' in the training table")
"""

NO_LIBRARY = """
import time, horovod.torch as hvd
hvd.init()          # a plain Horovod script: it never calls elastic_ring.worker
while True:
    time.sleep(1)
"""


def test_script_that_raises_before_its_first_step(tmp_path):
    script = tmp_path / "early.py"
    script.write_text(RAISES_EARLY)
    p = run_cli("train", "--script", str(script), "--steps", "10", "--gpus", "2", "--slots", "2",
                "--run-dir", str(tmp_path / "r"), timeout=300)
    assert p.returncode == 1
    (line,) = [ln for ln in p.stderr.splitlines() if ln.startswith("elastic-ring: error:")]
    assert "failed: ValueError: no such column 'label' in the training table" in line
    assert f"({script}:4)" in line  # the place in the script
    assert "worker rank 0" in line or "worker rank 1" in line
    assert "the script failed before its first step: not retried" in line  # deterministic
    assert len(read_events(tmp_path / "r" / "events.jsonl", kind="launch")) == 1
    log = sorted((tmp_path / "r" / "logs").glob("segment-*.log"))[-1].read_text()
    assert log.rstrip().endswith("ValueError: no such column 'label' in the training table")


def test_script_that_never_calls_the_library_fails_fast(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text(NO_LIBRARY)
    p = run_cli("train", "--script", str(script), "--steps", "10", "--slots", "2",
                "--run-dir", str(tmp_path / "r"), timeout=120)
    assert p.returncode == 1
    (line,) = [ln for ln in p.stderr.splitlines() if ln.startswith("elastic-ring: error:")]
    assert "called hvd.init() itself" in line and "elastic_ring.worker.init()" in line
    assert len(read_events(tmp_path / "r" / "events.jsonl", kind="launch")) == 1  # not retried


def test_missing_script_is_a_one_line_error(tmp_path):
    p = run_cli("train", "--script", str(tmp_path / "nope.py"), "--steps", "10")
    assert p.returncode == 2
    assert p.stderr.strip() == f"elastic-ring: error: script {tmp_path / 'nope.py'} does not exist"
