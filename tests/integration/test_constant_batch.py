"""A resize that does not change the training (``--lr-scaling constant-batch``), end to end with real
horovodrun (gloo, CPU workers) and torch.distributed (DDP), against the unresized run.

The built-in ResNet-8 (width 4) on 40 synthetic samples, a global batch of 32 in micro-batches of 8,
12 steps. Each run writes its per-rank trace: the samples of every step and the rank's part of the
step's mean loss (``trace_samples``); the final checkpoint holds the weights.

Tolerances: the resized and the unresized runs compute the same float32 operations on the same
micro-batches (the same samples, the same augmentation, the same BatchNorm batches); what differs is
the order of the gradient sums (micro-batches summed on a rank, then across ranks by gloo, versus all
on one rank) and the CPU kernels' own reduction order at another thread count (1 thread per worker
at 2 and 4 workers on 2 cores, 2 at 1). Each such sum is exact to about float32's epsilon (6e-8)
relative, and 12 steps of SGD carry it forward without amplifying it much: measured 0 to 6e-8
relative on the losses and 6e-8 absolute on the weights (order 1). The bounds, 1e-5 relative on each
step's loss and 1e-5 absolute on every weight, are over a hundred times that noise and far below
what a change of the training does: under ``linear`` the same resizes change the losses by 1e-3 and
more from the first resized step.

BatchNorm's running statistics are combined across the workers at every step (one allreduce:
``elastic_ring.worker.accumulate.RunningStats``), so they are the unresized run's too, up to the
same kind of noise: measured 1e-7 to 2.4e-7 absolute on buffers up to 3 (the statistics come from
forward passes on weights that differ by 6e-8, then float64 sums cast to float32); the bound,
1e-5, is the weights'. ``num_batches_tracked`` is equal exactly. Before the combination rank 0's
statistics were off by 3e-2 to 5e-2 (it saw only its own micro-batches) and an epoch loop's test
accuracy by 0.3 points.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli, shared_dir

pytestmark = pytest.mark.integration

TINY = ["--dataset", "synthetic", "--set", "synthetic_size=40", "--set", "synthetic_side=16", "--depth", "8",
        "--set", "width=4", "--batch-size", "8", "--set", "throughput_window=2", "--set", "trace_samples=true",
        "--set", "augment=true", "--slots", "4", "--steps", "12", "--gpus", "1"]
CONSTANT = ["--lr-scaling", "constant-batch", "--global-batch", "32"]
RESIZED = ["--schedule", "3:2,6:4,9:1"]  # 1 -> 2 -> 4 -> 1 workers
LOSS_RTOL = 1e-5
WEIGHT_ATOL = 1e-5
BN_ATOL = 1e-5


def _run(folder: Path, *args: str) -> subprocess.CompletedProcess:
    p = run_cli("train", *TINY, *args, "--run-dir", str(folder / "run"), timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    (folder / "stderr.txt").write_text(p.stderr)
    return p


def _unresized_constant(tmp_path_factory) -> Path:
    """1 worker, the global batch of 32 as 4 accumulated micro-batches: the reference (run once)."""
    return shared_dir(tmp_path_factory, "constant-batch-unresized", lambda f: _run(f, *CONSTANT)) / "run"


def _steps(run: Path) -> dict[int, tuple[list[int], float, int]]:
    """step -> (the global batch's samples in stream order, the step's mean loss, workers)."""
    rows: dict[int, dict[int, dict]] = {}
    for f in sorted((run / "trace").glob("*.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            assert r["rank"] not in rows.setdefault(r["step"], {}), f"step {r['step']} repeated"
            rows[r["step"]][r["rank"]] = r
    return {s: ([i for k in sorted(v) for i in v[k]["indices"]], sum(v[k]["loss"] for k in v), len(v))
            for s, v in rows.items()}


def _weights(run: Path, buffers: bool = False) -> dict:
    """The final checkpoint's trained parameters, or (``buffers``) its BatchNorm running statistics
    and passes tracked (rank 0's: every rank holds the same, combined at each step)."""
    from elastic_ring.ckpt import CheckpointStore

    ckpt = CheckpointStore(run / "checkpoints").load_latest()
    assert ckpt is not None and ckpt["step"] == 12
    return {k: v for k, v in ckpt["model"].items() if ("running_" in k or "num_batches" in k) == buffers}


def _max_loss_rel(a: dict, b: dict, steps) -> float:
    return max(abs(a[s][1] - b[s][1]) / abs(b[s][1]) for s in steps)


def _max_weight_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize("collective,schedule,worlds,relaunch", [
    ("horovod", RESIZED, [1, 1, 1, 2, 2, 2, 4, 4, 4, 1, 1, 1], "auto"),
    ("horovod", RESIZED, [1, 1, 1, 2, 2, 2, 4, 4, 4, 1, 1, 1], "inplace"),  # the processes kept
    ("torch", ["--schedule", "4:3,8:1"], [1] * 4 + [3] * 4 + [1] * 4, "auto"),  # 3 workers: 2 + 1 + 1
])
def test_resized_constant_batch_trains_as_the_unresized_run(tmp_path, tmp_path_factory, collective, schedule, worlds,
                                                            relaunch):
    ref = _unresized_constant(tmp_path_factory)
    p = _run(tmp_path, *CONSTANT, *schedule, "--collective", collective, "--relaunch", relaunch)
    run = tmp_path / "run"
    if collective == "horovod":
        assert ("resize 2 -> 4 after step 6: LR 0.025 unchanged (constant-batch: global batch 32 = "
                "4 worker(s) x 1 micro-batch(es) of 8)") in p.stderr
        assert "resize 4 -> 1 after step 9: LR 0.0025 unchanged (constant-batch: global batch 32 = " \
               "1 worker(s) x 4 micro-batch(es) of 8)" in p.stderr
    else:
        assert ("resize 1 -> 3 after step 4: LR 0.025 unchanged (constant-batch: global batch 32 = "
                "1 worker(s) x 2 + 2 worker(s) x 1 micro-batch(es) of 8)") in p.stderr
    got, want = _steps(run), _steps(ref)
    assert sorted(got) == sorted(want) == list(range(1, 13))
    assert [got[s][2] for s in range(1, 13)] == worlds
    for s in range(1, 13):  # the same 32 samples, in the same order, at every step and world size
        assert got[s][0] == want[s][0] and len(got[s][0]) == 32, s
    assert _max_loss_rel(got, want, range(1, 13)) < LOSS_RTOL
    assert _max_weight_diff(_weights(run), _weights(ref)) < WEIGHT_ATOL
    bn, bn_ref = _weights(run, buffers=True), _weights(ref, buffers=True)
    assert {k: int(v) for k, v in bn.items() if "num_batches" in k} == \
        {k: 12 * 4 for k in bn_ref if "num_batches" in k}  # every micro-batch once, as unresized
    assert _max_weight_diff(bn, bn_ref) < BN_ATOL


def test_the_same_resizes_under_linear_change_the_training(tmp_path):
    """The comparison that holds under constant-batch fails under Eq. 7: the resized run trains
    other samples per step (8, 16, 32 per step as the workers go 1, 2, 4) with other LRs."""
    base = _run(tmp_path / "base")
    resized = _run(tmp_path / "resized", *RESIZED)
    assert "(Eq. 7: x2)" in resized.stderr and "unchanged" not in resized.stderr
    a, b = _steps(tmp_path / "resized" / "run"), _steps(tmp_path / "base" / "run")
    assert [len(a[s][0]) for s in range(1, 13)] == [8] * 3 + [16] * 3 + [32] * 3 + [8] * 3
    assert all(len(b[s][0]) == 8 for s in range(1, 13))
    assert _max_loss_rel(a, b, range(1, 4)) < LOSS_RTOL  # the same until the first resize
    assert _max_loss_rel(a, b, range(4, 13)) > 100 * LOSS_RTOL
    assert _max_weight_diff(_weights(tmp_path / "resized" / "run"), _weights(tmp_path / "base" / "run")) \
        > 100 * WEIGHT_ATOL
    del base


def test_a_job_steps_script_with_micro_batches_trains_as_unresized(tmp_path):
    """The script form (``examples/mlp_constant_batch.py``: ``job.steps()`` over
    ``job.micro_batches``), 1 -> 2 -> 4 -> 3 workers (3: uneven shares of 4 micro-batches) against
    the unresized run of the same global batch; the same tolerances (a float32 MLP)."""
    script = str(ROOT / "examples" / "mlp_constant_batch.py")
    runs = {}
    for name, sched in (("base", []), ("resized", ["--schedule", "3:2,6:4,9:3"])):
        folder = tmp_path / name
        p = run_cli("train", "--script", script, "--steps", "12", "--gpus", "1", "--slots", "4", *sched,
                    "--lr-scaling", "constant-batch", "--global-batch", "64", "--run-dir", str(folder / "run"),
                    "--", "--batch-size", "16", "--trace", str(folder / "run" / "trace"), timeout=300)
        assert p.returncode == 0, p.stdout + p.stderr
        runs[name] = (folder / "run", p)
    assert ("resize 4 -> 3 after step 9: LR 0.2 unchanged (constant-batch: global batch 64 shared by 3 "
            "worker(s) in the script's micro-batches)") in runs["resized"][1].stderr
    got, want = _steps(runs["resized"][0]), _steps(runs["base"][0])
    assert [got[s][2] for s in range(1, 13)] == [1] * 3 + [2] * 3 + [4] * 3 + [3] * 3
    for s in range(1, 13):
        assert got[s][0] == want[s][0] and len(got[s][0]) == 64, s
    assert _max_loss_rel(got, want, range(1, 13)) < LOSS_RTOL
    assert _max_weight_diff(_weights(runs["resized"][0]), _weights(runs["base"][0])) < WEIGHT_ATOL


def _epoch_run(folder: Path, *args: str, ddp: bool = False, workers: int = 1,
               bn_momentum: str = "0.1") -> tuple[Path, subprocess.CompletedProcess]:
    """``examples/mlp_epochs.py --batch-norm`` (Horovod), or (``ddp``) its DDP twin over
    ``job.parallel`` (``tests/integration/scripts/ddp_epochs_parallel.py``, ``--collective torch``,
    its BatchNorm's momentum ``bn_momentum``)."""
    run = folder / "run"
    script, more = ((ROOT / "tests" / "integration" / "scripts" / "ddp_epochs_parallel.py", ["--collective", "torch"])
                    if ddp else (ROOT / "examples" / "mlp_epochs.py", []))
    p = run_cli("train", "--script", str(script), "--gpus", str(workers), "--slots", "4", *more,
                *args, "--lr-scaling", "constant-batch", "--global-batch", "128", "--run-dir", str(run),
                "--", "--epochs", "2", "--batch-size", "32",
                *(["--bn-momentum", bn_momentum] if ddp else ["--batch-norm"]),
                "--trace", str(folder / "trace"), timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return run, p


def _ddp_epochs_unresized(tmp_path_factory) -> Path:
    """The DDP epoch loop's unresized run (:func:`_epoch_run` with ``ddp``), the folder of its run
    and trace: the reference of both relaunch modes (run once)."""
    return shared_dir(tmp_path_factory, "constant-batch-ddp-epochs-unresized", lambda f: _epoch_run(f, ddp=True))


def _epoch_trace(folder: Path) -> tuple[dict[int, list[int]], list[dict]]:
    """(epoch -> every sample the loaders fetched in it, sorted; the tests' lines)."""
    ids: dict[int, list[int]] = {}
    tests = []
    for f in sorted((folder / "trace").glob("trace-rank*.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            if "test" in r:
                tests.append(r)
            else:
                ids.setdefault(r["epoch"], []).extend(r["ids"])
    return {e: sorted(v) for e, v in ids.items()}, sorted(tests, key=lambda r: r["test"])


def test_an_unchanged_epoch_loop_trains_as_unresized(tmp_path):
    """``examples/mlp_epochs.py`` as it is (``zero_grad``, ``backward``, ``step`` per loader batch,
    ``elastic.DistributedSampler``, a StepLR per epoch), with a BatchNorm layer, 1 -> 2 -> 4 -> 3
    workers inside its first epoch: its loader batches are the micro-batches and its optimizer
    steps once per global batch, so it trains as the unresized run (12 steps of 128 per epoch of
    1,440: the last padded), BatchNorm's running statistics included (the checkpoints of the stops,
    each dropping the step it stopped at, hold the statistics of the step before), and each rank
    tests its shard of the test set with the same statistics, so the test's loss and accuracy are
    the unresized run's."""
    base, _ = _epoch_run(tmp_path / "base")
    resized, p = _epoch_run(tmp_path / "resized", "--schedule", "4:2,8:4,11:3")
    assert "resize 2 -> 4 after step 8: LR 0.1 unchanged" in p.stderr
    windows = _samples_per_step(resized)  # 128 per step at every size (3: 42.67 each, rounded)
    assert {1, 2, 4} <= {w for w, _ in windows} and all(abs(n - 128) <= 1.5 for _, n in windows), windows
    assert _weights_at(resized, 24).keys() == _weights_at(base, 24).keys()
    assert any("running_var" in k for k in _weights_at(base, 24))
    assert _max_weight_diff(_weights_at(resized, 24), _weights_at(base, 24)) < WEIGHT_ATOL  # BN's too
    (ids_r, tests_r), (ids_b, tests_b) = _epoch_trace(tmp_path / "resized"), _epoch_trace(tmp_path / "base")
    assert all(len(v) == 12 * 128 for v in ids_b.values())  # 12 steps of 128 per epoch, no more
    # the resized run fetched every sample too, and also the micro-batches of each step a stop
    # dropped (the stop point is the optimizer's step, after this rank's micro-batches of it)
    assert {e: set(v) for e, v in ids_r.items()} == {e: set(v) for e, v in ids_b.items()}
    assert [t["test"] for t in tests_r] == [t["test"] for t in tests_b] == [1, 2]
    for a, b in zip(tests_r, tests_b):
        assert abs(a["loss"] - b["loss"]) / b["loss"] < LOSS_RTOL and a["accuracy"] == b["accuracy"]


@pytest.mark.parametrize("relaunch", ["auto", "inplace"])
def test_a_ddp_epoch_loop_over_job_parallel_trains_as_unresized(tmp_path, tmp_path_factory, relaunch):
    """The same on ``--collective torch``: an unchanged DDP epoch loop over the module
    ``job.parallel`` returns (with a BatchNorm layer), 1 -> 2 -> 4 -> 3 workers (3: uneven shares)
    inside its first epoch, relaunched or re-formed in place (DDP rebuilt over each process group),
    against the unresized run: every micro-batch but a worker's last of the step skips DDP's
    allreduce, one update per global batch, the same weights, statistics and tests."""
    base_dir = _ddp_epochs_unresized(tmp_path_factory)
    base = base_dir / "run"
    resized, p = _epoch_run(tmp_path / "resized", "--schedule", "4:2,8:4,11:3", "--relaunch", relaunch, ddp=True)
    assert "resize 4 -> 3 after step 11: LR 0.1 unchanged (constant-batch: global batch 128 shared by 3 " \
           "worker(s)" in p.stderr
    windows = _samples_per_step(resized)
    assert {1, 2, 4} <= {w for w, _ in windows} and all(abs(n - 128) <= 1.5 for _, n in windows), windows
    wr, wb = _weights_at(resized, 24), _weights_at(base, 24)
    assert wr.keys() == wb.keys() and any("running_var" in k for k in wb)
    assert int(wb["1.num_batches_tracked"]) == 24 * 4 == int(wr["1.num_batches_tracked"])
    assert _max_weight_diff(wr, wb) < WEIGHT_ATOL
    (ids_r, tests_r), (ids_b, tests_b) = _epoch_trace(tmp_path / "resized"), _epoch_trace(base_dir)
    assert all(len(v) == 12 * 128 for v in ids_b.values())
    assert {e: set(v) for e, v in ids_r.items()} == {e: set(v) for e, v in ids_b.items()}
    assert [t["test"] for t in tests_r] == [t["test"] for t in tests_b] == [1, 2]
    for a, b in zip(tests_r, tests_b):
        assert abs(a["loss"] - b["loss"]) / b["loss"] < LOSS_RTOL and a["accuracy"] == b["accuracy"]


def test_batchnorm_cumulative_average_at_two_workers_is_the_one_workers(tmp_path):
    """BatchNorm with ``momentum=None`` (the cumulative moving average: each pass weighted by one
    over the passes tracked so far) in the DDP epoch loop over ``job.parallel``: 2 workers (2 of
    the 4 micro-batches of each step each), 1 after step 6, 2 again after step 9, 1 after step 20
    (each stop at an epoch loop's step, at 2 workers and at 1, drops that step), against the run
    at 1 worker throughout: the same statistics (the weights' tolerance, as above), the same
    passes tracked (96: every micro-batch once), the same weights, and the same final test (at 1
    worker: the first, at 2, pads the 357 test samples to 358)."""
    base, _ = _epoch_run(tmp_path / "base", ddp=True, bn_momentum="none")
    two, p = _epoch_run(tmp_path / "two", "--schedule", "6:1,9:2,20:1", ddp=True, workers=2, bn_momentum="none")
    assert "resize 1 -> 2 after step 9: LR" in p.stderr and "resize 2 -> 1 after step 20: LR" in p.stderr
    rows = [json.loads(line) for f in (tmp_path / "two" / "trace").glob("*.jsonl")
            for line in f.read_text().splitlines()]
    done = {(r["step"], r["world"]) for r in rows if "world" in r}  # (the last step done, at each micro-batch)
    assert {s for s, w in done if w == 2} == {*range(0, 7), *range(9, 21)}  # (6, 20: the dropped steps' passes)
    assert {s for s, w in done if w == 1} == {*range(6, 10), *range(20, 25)}
    wt, wb = _weights_at(two, 24), _weights_at(base, 24)
    assert wt.keys() == wb.keys() and any("running_var" in k for k in wb)
    assert int(wb["1.num_batches_tracked"]) == 24 * 4 == int(wt["1.num_batches_tracked"])
    assert _max_weight_diff({k: v for k, v in wt.items() if "running_" in k},
                            {k: v for k, v in wb.items() if "running_" in k}) < BN_ATOL
    assert _max_weight_diff(wt, wb) < WEIGHT_ATOL
    (_, tests_t), (_, tests_b) = _epoch_trace(tmp_path / "two"), _epoch_trace(tmp_path / "base")
    assert [t["test"] for t in tests_t] == [t["test"] for t in tests_b] == [1, 2]
    a, b = tests_t[1], tests_b[1]
    assert abs(a["loss"] - b["loss"]) / b["loss"] < LOSS_RTOL and a["accuracy"] == b["accuracy"]


def _samples_per_step(run: Path) -> list[tuple[int, float]]:
    """(workers, images/s over steps/s) of each throughput window: the samples a step trained."""
    rows = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    return [(r["world_size"], r["images_per_s"] / r["steps_per_s"]) for r in rows if r.get("kind") == "throughput"]


def _weights_at(run: Path, step: int) -> dict:
    from elastic_ring.ckpt import CheckpointStore

    ckpt = CheckpointStore(run / "checkpoints").load_latest()
    assert ckpt is not None and ckpt["step"] == step
    return ckpt["model"]
