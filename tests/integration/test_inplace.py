"""`--relaunch inplace` (Horovod Elastic) end to end with real horovodrun: grow and shrink,
scheduled and live, exact accounting, Eq. 7, the overhead breakdown, Ctrl-C."""

from __future__ import annotations

import json
import signal

import pytest
import torch

from elastic_ring.data import SampleStream
from tests.conftest import run_cli
from tests.integration.test_train_resize import (RESIZE_1_2_1, TINY, _events, _final_model, _start_train, _trace,
                                                 _wait_for, resize_1_2_1_auto)

pytestmark = pytest.mark.integration


def test_inplace_grow_and_shrink_equals_checkpoint_relaunch(tmp_path, tmp_path_factory):
    """1 -> 2 -> 1 in place: one horovodrun for the whole run, every step and every sample once,
    Eq. 7 at each resize, and the same final weights as the checkpoint-and-relaunch run."""
    run = tmp_path / "inplace"
    p = run_cli(*RESIZE_1_2_1, "--relaunch", "inplace", "--run-dir", str(run), timeout=400)
    assert p.returncode == 0, p.stdout + p.stderr

    steps = _trace(run)
    assert sorted(steps) == list(range(1, 19))
    world = {s: len(v) // 8 for s, v in steps.items()}
    assert [world[s] for s in (1, 6, 7, 12, 13, 18)] == [1, 1, 2, 2, 1, 1]
    flat = [i for s in sorted(steps) for i in steps[s]]
    assert flat == SampleStream(40, seed=0).take(0, len(flat)).tolist()

    launches = _events(run, "launch")
    assert len(launches) == 3 and len({tuple(e["command"]) for e in launches}) == 1
    assert "--host-discovery-script" in launches[0]["command"]
    assert [e["returncode"] for e in _events(run, "workers_exited")] == [0]  # one process tree
    rel = _events(run, "relaunched")
    assert [(r["from_workers"], r["to_workers"], r["step"]) for r in rel] == [(1, 2, 6), (2, 1, 12)]
    for r, f in zip(rel, _events(run, "first_step_after_resize")):
        assert f["lr"] == pytest.approx(r["to_workers"] / r["from_workers"] * r["lr_last"])
    for t in _events(run, "throughput"):  # Eq. 7 on the base LR, decays after steps 9 and 14
        decays = sum(t["step"] > d for d in (9, 14))
        assert t["lr"] == pytest.approx(0.1 * 8 * t["world_size"] / 128 * 0.1 ** decays), t
    ov = _events(run, "resize_overhead")
    assert len(ov) == 2
    for o in ov:  # no checkpoint for an in-place resize; the reset is measured
        assert o["checkpoint_s"] == 0 and o["relaunch_to_first_step_s"] > 0 and o["stop_latency_s"] > 0
    phases = [e["phases"] for e in _events(run, "first_step")[1:]]
    assert all("hvd_reinit" in ph and "restore_broadcast" in ph for ph in phases)

    # the reference: the same run with a checkpoint and a relaunch at each resize (test_train_resize
    # checks it too; it is run once for both)
    ref, p = resize_1_2_1_auto(tmp_path_factory)
    assert p.returncode == 0, p.stderr
    assert json.loads((ref / "run.json").read_text())["relaunch"] == "overlap"
    a, b = _final_model(run), _final_model(ref)
    assert a["step"] == b["step"] == 18 and a["cursor"] == b["cursor"] and a["lr_last"] == b["lr_last"]
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k


def test_inplace_live_shrink_then_interrupt(tmp_path):
    run = tmp_path / "live"
    proc = _start_train(["--gpus", "2", "--steps", "3000", *TINY, "--relaunch", "inplace",
                         "--run-dir", str(run)])
    try:
        _wait_for(lambda: _events(run, "throughput"), 120, "first throughput window")
        r = run_cli("resize", str(run), "--to", "1")
        assert r.returncode == 0, r.stderr
        _wait_for(lambda: _events(run, "resize_overhead"), 120, "the live in-place resize")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    ov = _events(run, "resize_overhead")[0]
    assert (ov["from_workers"], ov["to_workers"]) == (2, 1)
    stopped = json.loads((run / "checkpoints" / "latest.json").read_text())["step"]
    steps = _trace(run)
    assert sorted(steps) == list(range(1, stopped + 1))
    assert {len(v) // 8 for s, v in steps.items() if s > ov["step"]} == {1}
    flat = [i for s in sorted(steps) for i in steps[s]]
    assert flat == SampleStream(40, seed=0).take(0, len(flat)).tolist()
    assert _final_model(run)["cursor"] == len(flat)
