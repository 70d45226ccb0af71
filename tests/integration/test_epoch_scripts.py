"""A plain Horovod epoch-loop script on the worker library, with real horovodrun:
``examples/mlp_epochs.py`` (an epoch loop over a DataLoader with ``elastic.DistributedSampler``,
a StepLR stepped after each epoch, a test after each epoch), run three ways.

Under ``elastic-ring train`` (no ``--steps``: the script's epochs end the run), resized 1 -> 2
inside epoch 1 and 2 -> 1 at the step that completes it: by checkpoint and relaunch (``overlap``),
in place under Horovod Elastic (``inplace``) and on the Ray backend (a local Ray the controller
starts), where the survivors re-form the ring in their processes and run the script again there
(under ``inplace`` rank 0 keeps its process for the whole run). From the script's trace (each rank writes
each step's sample ids and LR, and each test) and the run folder: every step once, every sample of
every epoch once and in the order of the epoch's permutation across both resizes, the LR of every
step = its world size x the per-epoch schedule (Eq. 7), each epoch's test once, Eq. 7 in the
``relaunched`` events and the first step after each resize at that LR, and learning.

Then plainly: ``horovodrun -np 2 python script.py`` and ``python script.py`` (no run folder, no
stop, no checkpoint), with the same data order as torch's ``DistributedSampler``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from elastic_ring.ckpt import CheckpointStore
from elastic_ring.events import read_events
from tests.conftest import BIN, ROOT, run_cli, tool

pytestmark = pytest.mark.integration

SCRIPT = ROOT / "examples" / "mlp_epochs.py"
TRAIN, BATCH, LR, GAMMA = 1440, 64, 0.1, 0.7


def _trace(folder: Path) -> tuple[dict[int, dict[int, dict]], list[dict]]:
    rows = [json.loads(line) for f in sorted(folder.glob("trace-rank*.jsonl")) for line in f.read_text().splitlines()]
    by_step: dict[int, dict[int, dict]] = {}
    for r in rows:
        if "step" in r:
            assert r["rank"] not in by_step.setdefault(r["step"], {}), f"step {r['step']} done twice"
            by_step[r["step"]][r["rank"]] = r
    return by_step, [r for r in rows if "test" in r]


def _check_epochs(by_step: dict[int, dict[int, dict]], epochs: int) -> dict[int, int]:
    """Every sample of every epoch once, in its permutation's order; returns each step's world."""
    assert sorted(by_step) == list(range(1, len(by_step) + 1))
    order: dict[int, list[int]] = {}
    world = {}
    for s in sorted(by_step):
        ranks = by_step[s]
        w = next(iter(ranks.values()))["world"]
        assert sorted(ranks) == list(range(w)), s
        world[s] = w
        parts = [ranks[r]["ids"] for r in range(w)]  # rank r's batch is every w-th of the step's block
        block = [parts[i % w][i // w] for i in range(sum(map(len, parts)))]
        order.setdefault(ranks[0]["epoch"], []).extend(block)
    assert sorted(order) == list(range(1, epochs + 1))
    for e, ids in order.items():
        assert ids == torch.randperm(TRAIN, generator=torch.Generator().manual_seed(e)).tolist(), e
    return world


@pytest.mark.parametrize("mode", ["overlap", "inplace", pytest.param("ray", marks=pytest.mark.ray)])
def test_epoch_loop_script_resized_1_2_1_exact_samples_lr_and_tests(tmp_path, mode):
    run, trace = tmp_path / "run", tmp_path / "trace"
    if mode == "ray":
        pytest.importorskip("ray")
    launch = ["--backend", "ray"] if mode == "ray" else ["--relaunch", mode]
    p = run_cli("train", "--script", str(SCRIPT), "--gpus", "1", "--schedule", "10:2,17:1", "--slots", "2",
                *launch, "--run-dir", str(run), "--", "--epochs", "3", "--trace", str(trace),
                timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    ev = read_events(run / "events.jsonl")
    # 10 steps at 1 worker, the 7 left of epoch 1 at 2 (800 / 128), then 2 x 23 at 1: the run's
    # length is the script's, 63 steps, with no --steps
    assert [e["step"] for e in ev if e["kind"] == "segment_end"] == [10, 17, 63]
    assert [e["reason"] for e in ev if e["kind"] == "segment_end"][-1] == "finished"
    by_step, tests = _trace(trace)
    world = _check_epochs(by_step, 3)
    assert [s for s in world if world[s] == 2] == list(range(11, 18))
    for s, ranks in by_step.items():
        for r in ranks.values():
            assert r["lr"] == pytest.approx(world[s] * LR * GAMMA ** (r["epoch"] - 1), rel=1e-9), s
    # one test per epoch (epoch 1's in the 2-worker segment, before its stop), and it learned
    assert [t["test"] for t in tests] == [1, 2, 3]
    assert tests[-1]["accuracy"] > 0.85 and tests[-1]["loss"] < tests[0]["loss"]
    rel = [e for e in ev if e["kind"] == "relaunched"]
    firsts = [e for e in ev if e["kind"] == "first_step_after_resize"]
    assert [(r["from_workers"], r["to_workers"], r["step"]) for r in rel] == [(1, 2, 10), (2, 1, 17)]
    for r, f in zip(rel, firsts):
        assert r["lr_new"] == pytest.approx(r["to_workers"] / r["from_workers"] * r["lr_last"])
        assert f["lr"] == pytest.approx(r["lr_new"])
    final = CheckpointStore(run / "checkpoints").load_latest()
    assert final["step"] == 63 and final["data_position"]["epoch"] == 4
    assert json.loads((run / "summary.json").read_text())["state"] == "finished"
    # every throughput window names the epoch its last step was in (not always 0)
    wins = [e for e in ev if e["kind"] == "throughput"]
    assert wins and all(w["epoch"] == by_step[w["step"]][0]["epoch"] for w in wins), wins
    # the summary says what it does not know (no job.record(loss), no job.on_evaluate), not "nan" / "n/a"
    assert "train loss: not recorded" in p.stdout and "test accuracy: no evaluation" in p.stdout, p.stdout
    assert "nan" not in p.stdout.lower().split("state: finished")[-1]
    for f in (e for e in ev if e["kind"] == "first_step"):
        assert all(v >= 0 for v in f["phases"].values()), f  # no negative "imports" (forked workers)
        if mode == "overlap":  # counted from the controller's launch of the segment, fork server start included
            real = f["time"] - next(e["time"] for e in ev if e["kind"] == "launch" and e["segment"] == f["segment"])
            assert 0.8 * real - 0.5 <= f["since_launch_s"] <= real + 0.5, (f, real)
    rank0_pids = {r["pid"] for ranks in by_step.values() for rank, r in ranks.items() if rank == 0}
    if mode == "overlap":  # each segment's workers are new processes
        assert len(rank0_pids) == 3
    elif mode == "inplace":  # rank 0 trained all three segments in one process, the script run again in it
        assert len(rank0_pids) == 1


def _plain(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELASTIC_RING_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_epoch_loop_script_runs_as_plain_horovod_and_as_one_process(tmp_path):
    cmds = {}
    for n in (2, 1):
        cwd = tmp_path / f"np{n}"
        cwd.mkdir()
        args = [str(SCRIPT), "--epochs", "1", "--trace", str(cwd / "trace")]
        cmds[n] = ([tool("horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, *args]
                   if n == 2 else [sys.executable, *args])
    with ThreadPoolExecutor(2) as side_by_side:  # the two runs are independent: both at once
        done = {n: side_by_side.submit(_plain, cmd, tmp_path / f"np{n}") for n, cmd in cmds.items()}
    for n in (2, 1):
        cwd = tmp_path / f"np{n}"
        p = done[n].result()
        assert p.returncode == 0, p.stderr[-3000:]
        by_step, tests = _trace(cwd / "trace")
        world = _check_epochs(by_step, 1)  # torch's DistributedSampler's order, every sample once
        assert set(world.values()) == {n} and len(by_step) == -(-TRAIN // (n * BATCH))
        assert [t["test"] for t in tests] == [1]
        assert sorted(x.name for x in cwd.iterdir()) == ["trace"]  # no run folder, no checkpoint
