"""The recipes of docs/worker.md, run for real: ``examples/cnn_recipes.py`` (AdamW + warm-up/cosine
scheduler, a DataLoader with 2 loader processes, bfloat16 autocast + GradScaler, clipping, EMA,
evaluation, early stop) under ``elastic-ring train`` with horovodrun, resized 1 -> 2 -> 1.

Checked from the script's own trace (each rank writes the sample ids and the LR of every step it
trains) and the run folder: every step once, every sample of the stream exactly once in order
across both resizes (the DataLoader prefetches; prefetched, untrained batches are not lost), the
LR of every step = world / first world x the unresized schedule, the GradScaler and EMA in the
final checkpoint, the early stop at the step after the evaluation that reached the target, and
the checkpoint read back by ``elastic_ring.ckpt.load`` and ``elastic-ring export``.
"""

from __future__ import annotations

import json

import pytest
import torch

from elastic_ring.ckpt import load
from elastic_ring.data.stream import SampleStream
from elastic_ring.events import read_events
from tests.conftest import ROOT, load_module, run_cli

pytestmark = pytest.mark.integration

STEPS, BATCH, TRAIN = 60, 16, 1437  # 80% of the 1,797 digits
SCHEDULE = [(8, 2), (16, 1)]
TARGET = 0.75


def _example():
    return load_module(ROOT / "examples" / "cnn_recipes.py")


def test_recipes_example_resized_twice_exact_data_lr_and_early_stop(tmp_path):
    run, trace = tmp_path / "run", tmp_path / "trace"
    p = run_cli("train", "--script", str(ROOT / "examples" / "cnn_recipes.py"), "--steps", str(STEPS),
                "--gpus", "1", "--schedule", ",".join(f"{s}:{w}" for s, w in SCHEDULE), "--slots", "2",
                "--run-dir", str(run), "--", "--trace", str(trace), "--eval-every", "4",
                "--target-accuracy", str(TARGET), timeout=600,
                env={"ELASTIC_RING_STOP_LATENCY_MS": "0"})  # a stop vote after every step (not every K)
    assert p.returncode == 0, p.stderr[-3000:]
    ev = read_events(run / "events.jsonl")
    evals = [e for e in ev if e["kind"] == "evaluation"]
    reached = [e["step"] for e in evals if e["test_accuracy"] >= TARGET]
    assert reached and reached[0] > SCHEDULE[-1][0], evals  # the target comes after the resizes
    end = reached[0] + 1  # finish() at step e is agreed with step e + 1's gradients
    assert end < STEPS
    assert json.loads((run / "summary.json").read_text())["state"] == "finished"
    assert [e["step"] for e in ev if e["kind"] == "segment_end"] == [8, 16, end]

    rows = [json.loads(line) for f in sorted(tmp_path.glob("trace-rank*.jsonl"))
            for line in f.read_text().splitlines()]
    by_step: dict[int, dict[int, dict]] = {}
    for r in rows:
        assert r["rank"] not in by_step.setdefault(r["step"], {}), f"step {r['step']} done twice"
        by_step[r["step"]][r["rank"]] = r
    assert sorted(by_step) == list(range(1, end + 1))
    world = {s: (1 if s <= 8 else 2 if s <= 16 else 1) for s in by_step}
    # data: the ranks' shares of each step, in rank order, are the next world * batch positions
    flat = [i for s in sorted(by_step) for rk in sorted(by_step[s]) for i in by_step[s][rk]["ids"]]
    assert [len(by_step[s]) for s in sorted(by_step)] == [world[s] for s in sorted(by_step)]
    assert flat == SampleStream(TRAIN, 0).take(0, len(flat)).tolist()
    # LR: every step's LR is world / 1 x the schedule of a run that never resized
    ex = _example()
    opt = torch.optim.AdamW(torch.nn.Linear(1, 1).parameters(), lr=1e-2)
    sched = ex.make_scheduler(opt, STEPS, 10)
    for s in range(1, end + 1):
        for r in by_step[s].values():
            assert r["lr"] == pytest.approx(world[s] * opt.param_groups[0]["lr"], rel=1e-9), s
        opt.step()
        sched.step()
    # the checkpoint outside the tool: verified load, and a plain torch.save by `export`
    state = load(run)
    assert state["step"] == end and state["cursor"] == len(flat)
    assert set(state["extras"]) == {"ema", "scaler"} and state["extras"]["scaler"]["scale"] > 0
    assert len(state["schedulers"]) == 1
    out = tmp_path / "model.pt"
    e = run_cli("export", str(run), "--out", str(out))
    assert e.returncode == 0, e.stderr
    model = ex.make_model()
    model.load_state_dict(torch.load(out, weights_only=True))
    assert torch.equal(model[0].weight, state["model"]["0.weight"])
    bad = run_cli("export", str(tmp_path / "nope"), "--out", str(out))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "does not exist" in bad.stderr
