"""A script with its own per-epoch checkpoints and its own resume (Horovod's ImageNet example's
shape: ``tests/integration/scripts/own_resume.py``), with real horovodrun.

1 worker for steps 1-6 (epoch 0 is 16 steps at 1 worker: the resize's checkpoint is at sample 24 of
64), 2 workers from step 7 (epoch 0's last 40 samples are steps 7-11; then the script saves its own
``checkpoint-1``), and rank 1 killed by SIGKILL at step 14, inside epoch 1. The restart resumes from
the tool's checkpoint of step 6, inside epoch 0, while the script's own resume finds
``checkpoint-1`` and asks for ``job.epochs(1, 3)``: taken as asked, the rest of epoch 0 would never
be trained and the run would still end ``finished``. The restored position wins, one line says so,
and every sample of every epoch is trained once in the run's history.

A script that loads its own weights after ``job.restore()`` is stopped with one line instead.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from elastic_ring.events import read_events
from tests.conftest import ROOT, run_cli

pytestmark = pytest.mark.integration

SCRIPT = ROOT / "tests" / "integration" / "scripts" / "own_resume.py"


def _history(out: Path) -> dict[int, dict[int, dict]]:
    """Each step's batches as the run's final history has them: a step begun again after a restart
    (by the processes that resumed from the checkpoint) replaces its earlier, discarded try."""
    by_step: dict[int, dict[int, dict]] = {}
    for f in sorted(out.glob("trace-rank*.jsonl")):
        for line in f.read_text().splitlines():  # a rank's file is in time order: the last try wins
            r = json.loads(line)
            by_step.setdefault(r["step"], {})[r["rank"]] = r
    for s, ranks in list(by_step.items()):  # a try by a larger world than the last one: drop its extra ranks
        w = ranks[0]["world"]
        by_step[s] = {k: v for k, v in ranks.items() if k < w and v["world"] == w}
    return by_step


def test_own_resume_ahead_of_the_checkpoint_trains_every_sample_once(tmp_path):
    run, out, ckpt = tmp_path / "run", tmp_path / "out", tmp_path / "ckpt"
    out.mkdir()
    p = run_cli("train", "--script", str(SCRIPT), "--gpus", "1", "--schedule", "6:2", "--slots", "2",
                "--run-dir", str(run), "--", "--out", str(out), "--ckpt", str(ckpt), "--kill-step", "14",
                timeout=400)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    assert (out / "killed").exists()
    (restart,) = read_events(run / "events.jsonl", kind="restart")
    assert restart["from_step"] == 6, restart
    notes = read_events(run / "events.jsonl", kind="notice")
    assert len(notes) == 1 and "epochs from 1" in notes[0]["message"] and "epoch 0" in notes[0]["message"], notes
    assert "note: the script asked for epochs from 1" in p.stderr, p.stderr[-2000:]  # the console
    by_step = _history(out)
    assert sorted(by_step) == list(range(1, len(by_step) + 1))
    per_epoch: dict[int, list[int]] = {}
    for s in sorted(by_step):
        ranks = by_step[s]
        assert sorted(ranks) == list(range(ranks[0]["world"])), (s, ranks)
        assert len({r["epoch"] for r in ranks.values()}) == 1, s
        per_epoch.setdefault(ranks[0]["epoch"], []).extend(i for r in ranks.values() for i in r["ids"])
    assert sorted(per_epoch) == [0, 1, 2]
    for e, ids in per_epoch.items():  # every sample of every epoch once (64 divides evenly: no padding)
        assert sorted(ids) == list(range(64)), (e, sorted(ids))
    s = json.loads((run / "summary.json").read_text())
    assert s["state"] == "finished"
    # epoch 0: 6 steps at 1 worker + 5 at 2; epochs 1 and 2: 8 steps each at 2
    assert max(by_step) == 6 + 5 + 8 + 8


def test_weights_loaded_after_restore_stop_the_run_in_one_line(tmp_path):
    run, out, ckpt = tmp_path / "run", tmp_path / "out", tmp_path / "ckpt"
    out.mkdir()
    ckpt.mkdir()
    first = run_cli("train", "--script", str(SCRIPT), "--gpus", "1", "--schedule", "6:2", "--slots", "2",
                    "--run-dir", str(run), "--", "--out", str(out), "--ckpt", str(ckpt), "--epochs", "1",
                    "--load-after-restore", timeout=300)
    # the first segment starts fresh (nothing restored, the script's own load is its business); the
    # second resumes from the tool's checkpoint of step 6 and the script then loads checkpoint-...:
    # none exists yet (epoch 0 is not over), so nothing is overwritten and the run finishes
    assert first.returncode == 0, first.stdout + first.stderr[-3000:]
    # a second run over the same own checkpoints, resumed at step 6 by the tool, loads checkpoint-1 over it
    shutil.rmtree(run)
    (out / "killed").unlink(missing_ok=True)
    p = run_cli("train", "--script", str(SCRIPT), "--gpus", "1", "--schedule", "6:2", "--slots", "2",
                "--run-dir", str(run), "--", "--out", str(out), "--ckpt", str(ckpt), "--epochs", "2",
                "--load-after-restore", timeout=300)
    assert p.returncode == 1, p.stdout + p.stderr[-3000:]
    (line,) = [ln for ln in p.stderr.splitlines() if ln.startswith("elastic-ring: error:")]
    assert "loaded other weights after elastic-ring restored step 6" in line, line
    assert len(read_events(run / "events.jsonl", kind="launch")) == 2  # the resize's launch; not retried
    assert json.loads((run / "controller.json").read_text())["state"] == "failed"
    assert not read_events(run / "events.jsonl", kind="finished")
