"""The LR a user's script trained with, as the run reports it, with real launches (gloo, CPU).

A per-batch warm-up over the whole epoch (``tests/integration/scripts/warmup_epochs.py``: Horovod's
ImageNet example's, its optimizer built with Eq. 7's LR and trained at another) resized 1 -> 2 -> 1
inside its first epoch: the warm-up's fraction, taken from the sampler's ``start_batch`` and
``epoch_batches``, goes on across both resizes (the samples of the epoch done before each step over
the epoch's), and the ``relaunched`` event and the console's resize line give the LR the first step
after each resize ran with, saying that the script set it and what Eq. 7 would have given. A DDP
script that never scales its LR with the world size (``tests/integration/scripts/ddp_fixed_lr.py``,
pytorch/examples' mnist made DDP) keeps its LR at 2 workers under the default ``--lr-scaling auto``,
which the start says in one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from elastic_ring.events import read_events
from tests.conftest import run_cli

pytestmark = pytest.mark.integration

SCRIPTS = Path(__file__).parent / "scripts"
N, BATCH, BASE = 64, 4, 0.01


def _rows(out: Path) -> dict[int, dict[int, dict]]:
    """Each step's rows by rank (each step trained once by each rank of its world)."""
    by_step: dict[int, dict[int, dict]] = {}
    for f in sorted(out.glob("rank*.jsonl")):
        rank = int(f.stem[4:])
        for line in f.read_text().splitlines():
            r = json.loads(line)
            assert rank not in by_step.setdefault(r["step"], {}), f"step {r['step']} trained twice"
            by_step[r["step"]][rank] = r
    assert sorted(by_step) == list(range(1, len(by_step) + 1))
    for s, ranks in by_step.items():
        assert sorted(ranks) == list(range(ranks[0]["world"])), s
    return by_step


def _lr(world: int, progress: float) -> float:
    """The warm-up script's LR (Horovod's ImageNet example's, 2 warm-up epochs)."""
    return BASE * world * (progress * (world - 1) / 2.0 + 1) / world


def _resize_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("resize ")]


def test_warmup_over_the_full_epoch_goes_on_across_resizes_and_the_lr_reported_is_the_one_trained(tmp_path):
    run, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    # 10 steps at 1 worker (40 of epoch 1's 64 samples), 2 at 2 (16), 2 at 1 (the last 8), then epoch 2's 16
    p = run_cli("train", "--script", str(SCRIPTS / "warmup_epochs.py"), "--gpus", "1", "--schedule", "10:2,12:1",
                "--slots", "2", "--run-dir", str(run), "--", "--out", str(out), timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]
    by_step = _rows(out)
    world = {s: ranks[0]["world"] for s, ranks in by_step.items()}
    assert [s for s in world if world[s] == 2] == [11, 12] and len(world) == 14 + 16
    done = {1: 0, 2: 0}  # samples of each epoch trained before the step
    for s in sorted(by_step):
        r = by_step[s][0]
        assert r["frac"] == pytest.approx(done[r["epoch"]] / N, abs=1e-12), s  # continuous across resizes
        assert r["lr"] == pytest.approx(_lr(world[s], r["epoch"] - 1 + r["frac"]), rel=1e-12), s
        done[r["epoch"]] += world[s] * BATCH
    assert by_step[11][0]["batches"] == 3 and by_step[13][0]["batches"] == 2  # len(loader): the rest
    ev = read_events(run / "events.jsonl")
    rel = [e for e in ev if e["kind"] == "relaunched"]
    firsts = [e for e in ev if e["kind"] == "first_step_after_resize"]
    assert [(r["from_workers"], r["to_workers"], r["step"]) for r in rel] == [(1, 2, 10), (2, 1, 12)]
    lines = _resize_lines(p.stderr)
    assert len(lines) == 2, p.stderr[-3000:]
    for r, f, line in zip(rel, firsts, lines):
        trained = by_step[r["step"] + 1][0]["lr"]
        assert r["lr_new"] == pytest.approx(trained, rel=1e-12) and f["lr"] == pytest.approx(trained, rel=1e-12)
        # the stop came at the next step's optimizer.step(): the LR the script set for it at the old size
        assert r["lr_last"] == pytest.approx(_lr(r["from_workers"], by_step[r["step"] + 1][0]["frac"]), rel=1e-12)
        eq7 = r["to_workers"] / r["from_workers"] * r["lr_last"]
        assert r["rule"] == "auto:linear" and r["lr_rule"] == pytest.approx(eq7, rel=1e-9)
        assert abs(trained - eq7) > 1e-3  # the script's warm-up, not Eq. 7, set the LR that ran
        assert line == (f"resize {r['from_workers']} -> {r['to_workers']} after step {r['step']}: "
                        f"LR {r['lr_last']:.4g} -> {trained:.4g} (LR set by the script: {trained:.4g}; "
                        f"Eq. 7 would give {eq7:.4g})")


def test_a_ddp_script_that_does_not_scale_its_lr_keeps_it_and_the_start_says_so(tmp_path):
    run, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    p = run_cli("train", "--script", str(SCRIPTS / "ddp_fixed_lr.py"), "--collective", "torch", "--gpus", "1",
                "--schedule", "6:2,9:1", "--slots", "2", "--run-dir", str(run), "--", "--out", str(out),
                timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]
    assert ("elastic-ring: LR at a resize: as the script scales it (--lr-scaling auto): its optimizer's LR as "
            "built at the new size over that at the old (Eq. 7 where it is not built again); --lr-scaling "
            "linear|sqrt|none sets one") in p.stderr.splitlines()
    by_step = _rows(out)
    world = {s: ranks[0]["world"] for s, ranks in by_step.items()}
    assert [s for s in world if world[s] == 2] == [7, 8, 9] and len(world) == 13
    assert {r["lr"] for ranks in by_step.values() for r in ranks.values()} == {1.0}  # as under torchrun
    rel = read_events(run / "events.jsonl", kind="relaunched")
    assert [(r["from_workers"], r["to_workers"], r["rule"], r["lr_last"], r["lr_new"]) for r in rel] == [
        (1, 2, "auto:none", 1.0, 1.0), (2, 1, "auto:none", 1.0, 1.0)]
    assert _resize_lines(p.stderr) == [
        "resize 1 -> 2 after step 6: LR 1 -> 1 (kept: the script's LR does not change with the workers "
        "(--lr-scaling auto))",
        "resize 2 -> 1 after step 9: LR 1 -> 1 (kept: the script's LR does not change with the workers "
        "(--lr-scaling auto))"]
