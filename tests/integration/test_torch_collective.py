"""`elastic-ring train --collective torch`: real gloo process groups, launched by the controller's
local launcher (no horovodrun), resized by checkpoint and relaunch, or in place (the processes
stay and re-form their process group)."""

from __future__ import annotations

import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from elastic_ring.data import SampleStream
from elastic_ring.events import read_events
from tests.conftest import ROOT, run_cli, tool
from tests.integration.test_train_resize import RESIZE_1_2_1, _final_model, _trace, resize_1_2_1_auto

pytestmark = pytest.mark.integration


def _exact_1_2_1(run) -> list[dict]:
    """Every step and sample once, Eq. 7 at each resize, an evaluation every 6 steps (returned)."""
    steps = _trace(run)
    assert sorted(steps) == list(range(1, 19))
    assert [len(steps[s]) // 8 for s in (1, 6, 7, 12, 13, 18)] == [1, 1, 2, 2, 1, 1]
    flat = [i for s in sorted(steps) for i in steps[s]]
    assert flat == SampleStream(40, seed=0).take(0, len(flat)).tolist()
    rel = read_events(run / "events.jsonl", kind="relaunched")
    assert [(r["from_workers"], r["to_workers"], r["step"]) for r in rel] == [(1, 2, 6), (2, 1, 12)]
    for r, f in zip(rel, read_events(run / "events.jsonl", kind="first_step_after_resize")):
        assert f["lr"] == pytest.approx(r["to_workers"] / r["from_workers"] * r["lr_last"])
    evals = read_events(run / "events.jsonl", kind="evaluation")
    assert [e["step"] for e in evals] == [6, 12, 18] and all(e["samples"] == 512 for e in evals)
    return evals


def _same_final(run, ref) -> None:
    """The final weights and momentum bitwise equal."""
    a, b = _final_model(run), _final_model(ref)
    assert a["step"] == b["step"] == 18 and a["cursor"] == b["cursor"] and a["lr_last"] == b["lr_last"]
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    for k, st in a["optimizer"]["state"].items():
        assert torch.equal(st["momentum_buffer"], b["optimizer"]["state"][k]["momentum_buffer"]), k


def _exact_1_2_1_equal_to_the_horovod_run(run, tmp_path_factory):
    """:func:`_exact_1_2_1`, and the final weights and momentum bitwise those of the same schedule
    on Horovod (at two workers both average two gradients exactly: a halving is exact)."""
    evals = _exact_1_2_1(run)
    ref, q = resize_1_2_1_auto(tmp_path_factory)  # the Horovod run of the same schedule (overlap)
    assert q.returncode == 0, q.stderr
    _same_final(run, ref)
    # the same test accuracy and loss at one worker (steps 6 and 18); at two, rank 1's BatchNorm statistics
    # differ (DDP broadcasts rank 0's buffers at every forward, Horovod keeps each rank's), so step 12's may
    ref_evals = {e["step"]: e for e in read_events(ref / "events.jsonl", kind="evaluation")}
    for e in (evals[0], evals[-1]):
        assert (e["test_accuracy"], e["test_loss"]) == (ref_evals[e["step"]]["test_accuracy"],
                                                        ref_evals[e["step"]]["test_loss"]), e["step"]


def test_torch_resize_1_2_1_overlap_is_exact_and_equals_the_horovod_run(tmp_path, tmp_path_factory):
    """The built-in ResNet on DistributedDataParallel, 1 -> 2 -> 1 with --relaunch overlap: new
    processes per segment from the local launcher, exact (:func:`_exact_1_2_1_equal_to_the_horovod_run`)."""
    run = tmp_path / "run"
    p = run_cli(*RESIZE_1_2_1, "--collective", "torch", "--relaunch", "overlap", "--run-dir", str(run),
                timeout=400)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "collective torch.distributed (gloo)" in p.stderr
    launches = read_events(run / "events.jsonl", kind="launch")
    assert len(launches) == 3
    assert all("elastic_ring.controller.backends.local" in e["command"] for e in launches)
    assert not any("hvdrun" in c or "horovodrun" in c for e in launches for c in e["command"])
    _exact_1_2_1_equal_to_the_horovod_run(run, tmp_path_factory)


def test_torch_on_two_hosts_launched_by_horovodrun_is_exact_and_equals_the_horovod_run(tmp_path, tmp_path_factory):
    """--collective torch --hosts (two names of this machine): horovodrun launches each segment's
    workers (one per host), which take torchrun's names from its ranks and form their gloo group
    over a store the controller serves; 1 -> 2 -> 1 is exact, and its final weights equal those of
    the local launcher's run beside it (one intra-op thread in both: each worker here is alone on
    its "host", so its share of the cores would differ)."""
    run, ref = tmp_path / "run", tmp_path / "ref"
    one = {"ELASTIC_RING_CPU_THREADS": "1"}
    with ThreadPoolExecutor(1) as beside:
        q = beside.submit(run_cli, *RESIZE_1_2_1, "--collective", "torch", "--run-dir", str(ref), env=one, timeout=400)
        p = run_cli(*RESIZE_1_2_1, "--collective", "torch", "--relaunch", "overlap", "--hosts",
                    "localhost:1,127.0.0.1:1", "--run-dir", str(run), env=one, timeout=400)
        q = q.result()
    assert p.returncode == 0, p.stdout + p.stderr
    assert q.returncode == 0, q.stdout + q.stderr
    assert "collective torch.distributed (gloo)" in p.stderr
    launches = read_events(run / "events.jsonl", kind="launch")
    assert [e["command"][e["command"].index("-H") + 1] for e in launches] == \
        ["localhost:1", "localhost:1,127.0.0.1:1", "localhost:1"]  # the slots each segment uses
    assert all("elastic_ring.controller.hvdrun" in e["command"] for e in launches)
    _exact_1_2_1(run)
    _same_final(run, ref)


def _members(run) -> list[dict[int, int]]:
    """Per segment, rank -> pid, from the local in-place backend's lines in the segment logs."""
    rows = []
    for f in sorted((run / "logs").glob("segment-*.log")):
        for line in f.read_text().splitlines():
            if line.startswith("[local] segment "):
                rows.append({int(r): int(p) for r, p in re.findall(r"rank (\d+): w\d+ pid (\d+)", line)})
    return rows


def test_torch_resize_1_2_1_inplace_keeps_rank_0_and_equals_the_horovod_run(tmp_path, tmp_path_factory):
    """--relaunch inplace on torch.distributed: the processes stay; at each resize the group is
    destroyed and formed again at the new size over a new store the controller serves, DDP rebuilt
    over the same module; the joiner is a new process started ahead, the leaver exits. Rank 0 keeps
    its process throughout, no checkpoint is written for a resize, and the run is exact."""
    run = tmp_path / "run"
    p = run_cli(*RESIZE_1_2_1, "--collective", "torch", "--relaunch", "inplace", "--run-dir", str(run),
                timeout=400)
    assert p.returncode == 0, p.stdout + p.stderr
    launches = read_events(run / "events.jsonl", kind="launch")
    assert len(launches) == 3 and "--ring-by-controller" in launches[0]["command"]
    assert not any("hvdrun" in c or "horovodrun" in c for e in launches for c in e["command"])
    assert [e["returncode"] for e in read_events(run / "events.jsonl", kind="workers_exited")] == [0]
    segs = _members(run)
    assert [sorted(m) for m in segs] == [[0], [0, 1], [0]]
    assert len({m[0] for m in segs}) == 1 and segs[1][1] != segs[0][0]  # rank 0 kept; a new joiner
    for o in read_events(run / "events.jsonl", kind="resize_overhead"):
        assert o["checkpoint_s"] == 0
    _exact_1_2_1_equal_to_the_horovod_run(run, tmp_path_factory)


def test_a_process_group_formed_by_the_script_first_is_one_line_not_retried(tmp_path):
    """Imported from a module of the script's (so the request's check of its text cannot see it)."""
    (tmp_path / "setup_pg.py").write_text(
        "import torch.distributed as dist\n\ndef go():\n    dist.init_process_group('gloo')\n")
    script = tmp_path / "early_pg.py"
    script.write_text("import setup_pg\nimport elastic_ring.worker as elastic\n\nsetup_pg.go()\n"
                      "job = elastic.init()\n")
    p = run_cli("train", "--script", str(script), "--steps", "4", "--collective", "torch", "--slots", "2",
                "--run-dir", str(tmp_path / "r"), timeout=120)
    assert p.returncode == 1, p.stdout + p.stderr
    (line,) = [ln for ln in p.stderr.splitlines() if ln.startswith("elastic-ring: error:")]
    assert "process group before elastic_ring.worker.init()" in line
    assert len(read_events(tmp_path / "r" / "events.jsonl", kind="launch")) == 1  # not retried


def test_ddp_epoch_script_resized_1_2_1_resumes_inside_the_epoch_and_learns(tmp_path):
    """examples/ddp_epochs.py (a torchrun script with the changes docs/worker.md shows): 10 steps at
    1 worker, the 7 left of epoch 1 at 2 (800 / 128), then epoch 2's 23 at 1; Eq. 7 at each relaunch."""
    run = tmp_path / "run"
    p = run_cli("train", "--script", str(ROOT / "examples" / "ddp_epochs.py"), "--collective", "torch", "--gpus",
                "1", "--schedule", "10:2,17:1", "--slots", "2", "--run-dir", str(run), "--", "--epochs", "2",
                timeout=400)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    ev = read_events(run / "events.jsonl")
    assert [e["step"] for e in ev if e["kind"] == "segment_end"] == [10, 17, 40]
    assert [e["reason"] for e in ev if e["kind"] == "segment_end"][-1] == "finished"
    rel = [e for e in ev if e["kind"] == "relaunched"]
    assert [(r["from_workers"], r["to_workers"], r["step"]) for r in rel] == [(1, 2, 10), (2, 1, 17)]
    for r in rel:
        assert r["lr_new"] == pytest.approx(r["to_workers"] / r["from_workers"] * r["lr_last"])
    final = _final_model(run)
    assert final["step"] == 40 and final["data_position"]["epoch"] == 3
    logs = "".join(f.read_text() for f in sorted((run / "logs").glob("segment-*.log")))
    tests = [ln.split() for ln in logs.splitlines() if ln.startswith("epoch ") and " test loss " in ln]
    assert [int(t[1]) for t in tests] == [1, 2]
    assert float(tests[-1][-1]) > 0.7 and float(tests[-1][4]) < float(tests[0][4])  # it learned


def test_ddp_epoch_script_runs_under_plain_torchrun(tmp_path):
    """examples/ddp_epochs.py without the tool, under ``torchrun --nproc_per_node 2``: elastic.init()
    is torchrun's ``init_process_group()``, the drop-in sampler torch's (720 samples a rank: 12
    batches of 64), one test; nothing written (no run folder, no checkpoint). (In one process, a
    group of one: tests/unit/test_worker_epochs.py.)"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELASTIC_RING_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    cmd = [tool("torchrun"), "--standalone", "--nproc_per_node", "2", str(ROOT / "examples" / "ddp_epochs.py"),
           "--epochs", "1"]
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    # torch's own abort at the interpreter's exit (gloo threads torn down late: "terminate called
    # without an active exception", SIGABRT) after the script's work and output: seen here in 1 of
    # 12 runs at load 3 of a minimal DDP script on torch alone that calls destroy_process_group()
    # itself (pytorch/pytorch#179291 is about it), and in one CI run of this test; not ours, so
    # taken as an exit once the output below is whole
    torch_abort = p.returncode != 0 and "terminate called without an active exception" in p.stderr
    assert p.returncode == 0 or torch_abort, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    assert [ln.split()[3] for ln in lines if " batch " in ln] == ["0/12", "10/12"]  # rank 0's only
    (test,) = [ln.split() for ln in lines if " test loss " in ln]
    assert test[1] == "1" and 0.0 <= float(test[-1]) <= 1.0
    assert list(tmp_path.iterdir()) == []
