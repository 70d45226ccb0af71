"""A Horovod Elastic script run unchanged by `elastic-ring train --script`, with real horovodrun.

``examples/hvd_elastic_mlp.py`` uses only Horovod Elastic's API (``hvd.init()``, ``@hvd.elastic.run``,
``TorchState``, ``ElasticSampler``, ``state.commit()`` after every batch, a reset callback that sets
the LR to ``0.05 * size``). It is resized 1 -> 2 -> 1, by checkpoint and relaunch (``overlap``),
in place under Horovod Elastic (``inplace``) and in place on the Ray backend (a local Ray the
controller starts; the ring re-formed by the controller): every sample of each epoch is used
exactly once across the resizes, every
step ran at the LR its world size gives (the script's own log and the events), the run ends when
the script's function returns, and it learns. The same file runs under plain ``horovodrun``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from elastic_ring.ckpt import CheckpointStore
from elastic_ring.events import read_events
from tests.conftest import BIN, ROOT, run_cli

pytestmark = pytest.mark.integration

SCRIPT = ROOT / "examples" / "hvd_elastic_mlp.py"
N, BATCH, EPOCHS, LR = 384, 16, 2, 0.05  # epoch 0: steps 1-8 at 1 worker, 9-16 at 2 (its last step)
# A hidden layer of 4096: the gradients (1.2 MB in four tensors of 40 B to 1 MB) are more than the
# 1 MB fusion threshold that Horovod 0.28's re-initialisation leaves a survivor with when the cycle
# time was set in its environment, so a survivor and a joiner fused them differently (a gloo size
# mismatch at the second step after the grow) until in-place rings stopped setting it.
HIDDEN = 4096
STEPS = 8 + 8 + N // BATCH  # epoch 1 at 1 worker: the function returns after step 40


def _samples(folder: Path) -> list[dict]:
    return [json.loads(ln) for f in sorted(folder.glob("samples-*.jsonl")) for ln in f.read_text().splitlines()]


def _check_run(run: Path, samples: Path) -> None:
    rows = _samples(samples)
    for epoch in range(EPOCHS):  # every sample of each epoch once, across the resizes
        used = Counter(i for r in rows if r["epoch"] == epoch for i in r["idx"])
        assert sorted(used) == list(range(N)) and set(used.values()) == {1}, epoch
    for r in rows:  # the LR each step ran at: the reset callback's, for its world size
        assert r["lr"] == pytest.approx(LR * r["size"]), r
    assert Counter(r["size"] for r in rows) == {1: 8 + 24, 2: 2 * 8}  # steps x ranks

    ev = read_events(run / "events.jsonl")
    ends = [e for e in ev if e["kind"] == "segment_end"]
    assert [(e["step"], e["reason"]) for e in ends] == [(8, "scheduled"), (16, "scheduled"), (STEPS, "finished")]
    rel = [e for e in ev if e["kind"] == "relaunched"]
    firsts = [e for e in ev if e["kind"] == "first_step_after_resize"]
    assert [(r["from_workers"], r["to_workers"], r["step"]) for r in rel] == [(1, 2, 8), (2, 1, 16)]
    for r, f in zip(rel, firsts, strict=True):  # the script's LR, not Eq. 7 on top of it
        assert r["lr_new"] == pytest.approx(LR * r["to_workers"]) == f["lr"]
    for t in (e for e in ev if e["kind"] in ("first_step", "throughput")):
        assert t["lr"] == pytest.approx(LR * t["world_size"]), t
    late = [t for t in ev if t["kind"] == "throughput" and t["step"] > 16]  # epoch 1's steps: 17-40
    assert late and all(t["epoch"] == 1 for t in late), late  # the script's epoch, not always 0
    final = CheckpointStore(run / "checkpoints").load_latest()
    assert final["step"] == STEPS
    committed = final["extras"]["hvd_elastic_state"]
    assert committed["objects"]["epoch"] == EPOCHS and committed["objects"]["batch"] == 0
    assert committed["handlers"]["sampler"] == {"epoch": EPOCHS, "processed_num": 0}
    logs = [f.read_text() for f in sorted((run / "logs").glob("*.log"))]  # Ray: the actors' own logs
    log = [t for t in logs if "final test accuracy " in t][-1]
    acc = float(log.split("final test accuracy ")[-1].split()[0])
    assert acc > 0.5, acc  # learned in 40 small steps (chance: 0.1)


@pytest.mark.parametrize("relaunch", ["overlap", "inplace", pytest.param("ray", marks=pytest.mark.ray)])
def test_hvd_elastic_script_resized_1_2_1_unchanged(tmp_path, relaunch):
    run, samples = tmp_path / "r", tmp_path / "s"
    cap = ["--steps", "1000"] if relaunch == "overlap" else []  # a cap only: the script's return ends it
    mode = ["--backend", "ray"] if relaunch == "ray" else ["--relaunch", relaunch]
    if relaunch == "ray":
        pytest.importorskip("ray")
    p = run_cli("train", "--script", str(SCRIPT), *cap, "--gpus", "1", "--schedule", "8:2,16:1",
                "--slots", "2", *mode, "--run-dir", str(run),
                "--", "--epochs", str(EPOCHS), "--hidden", str(HIDDEN), "--log-samples", str(samples), timeout=400)
    assert p.returncode == 0, p.stdout + p.stderr
    _check_run(run, samples)
    if relaunch == "ray":  # the first worker trained the segments at 1 and 2 in one process (one log)
        assert [f for f in samples.glob("samples-*.jsonl") if '"size": 1' in f.read_text()] == \
            [f for f in samples.glob("samples-*.jsonl") if '"rank": 0' in f.read_text()]
        assert len(list(samples.glob("samples-*.jsonl"))) == 2
    if relaunch == "inplace":  # one process tree for the whole run
        launches = [e for e in read_events(run / "events.jsonl") if e["kind"] == "launch"]
        assert len(launches) == 3 and len({tuple(e["command"]) for e in launches}) == 1


def test_same_script_runs_under_plain_horovodrun(tmp_path):
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    p = subprocess.run([str(Path(BIN) / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo",
                        "--network-interface", "lo", sys.executable, str(SCRIPT), "--epochs", "1",
                        "--log-samples", str(tmp_path)], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = _samples(tmp_path)
    used = Counter(i for r in rows for i in r["idx"])
    assert sorted(used) == list(range(N)) and set(used.values()) == {1}
    assert {r["size"] for r in rows} == {2} and all(r["lr"] == pytest.approx(2 * LR) for r in rows)
    assert "final test accuracy" in p.stdout
