"""`elastic-ring train --relaunch inplace --survive` (one Horovod Elastic job on this host) with real
horovodrun: rank 1 of two workers dies at the start of step 7, by kill -9, or stops (SIGSTOP) and
the stall watchdog ends it. Rank 0 keeps its process, rolls back to step 6 (the last step both
completed, kept in memory) and goes on alone, without a restart from the checkpoint; its final
weights, momentum, data position and LR equal, bitwise, those of an uninterrupted run with a
scheduled shrink 2 -> 1 at step 6. The three runs go side by side."""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch

from elastic_ring import protocol
from elastic_ring.events import read_events
from tests.integration.test_train_resize import _final_model, _start_train

pytestmark = pytest.mark.integration

STEPS, AT = 10, 7

SCRIPT = """
import os, signal, sys, torch, horovod.torch as hvd
import elastic_ring.worker as elastic
how, out = sys.argv[1], sys.argv[2]
job = elastic.init()
torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01 * job.size, momentum=0.9),
                               named_parameters=model.named_parameters())
data = job.sampler(64, batch_size=4, seed=0)
x, y = torch.randn(64, 8), torch.randint(0, 2, (64,))
job.register(model=model, optimizer=opt)
job.restore()
for step in job.steps():
    with open(os.path.join(out, f"rank{job.rank}.txt"), "a") as f:
        f.write(f"{step} {os.getpid()} {job.size}\\n")
    if step == %d and job.rank == 1 and how != "none":
        os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGSTOP)
    idx = data.next_batch()
    loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
    job.record(loss, samples=len(idx))
""" % AT


def _rows(run) -> list[tuple[int, int, int]]:
    """(step, pid, size) of each step rank 0 began, in order."""
    return [tuple(map(int, ln.split())) for ln in (run / "rank0.txt").read_text().splitlines()]


def test_rank_1_killed_or_stalled_rank_0_goes_on_from_memory_as_a_scheduled_shrink(tmp_path):
    script = tmp_path / "dies.py"
    script.write_text(SCRIPT)
    runs = {how: tmp_path / how for how in ("kill", "stop", "none")}
    procs = {}
    for how, run in runs.items():
        run.mkdir()
        extra = (["--survive", "--stall-timeout", "2"] if how != "none" else
                 ["--resize-at", str(AT - 1), "--to", "1"])  # the reference: the same shrink, scheduled
        procs[how] = _start_train(["--relaunch", "inplace", "--gpus", "2", "--slots", "2", "--steps", str(STEPS),
                                   *extra, "--script", str(script), "--run-dir", str(run / "r"), "--",
                                   how, str(run)])
    try:
        outs = {how: p.communicate(timeout=300) for how, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        for run in runs.values():  # a stopped rank 1 left behind by a failed test
            for rec in protocol.read_pid_records(run / "r"):
                if rec["rank"] == 1 and protocol.pid_alive(rec["pid"]):
                    os.kill(rec["pid"], signal.SIGKILL)
    for how, p in procs.items():
        assert p.returncode == 0, (how, outs[how][1])
    ref = runs["none"] / "r"
    assert not read_events(ref / "events.jsonl", kind="restart")
    b = _final_model(ref)
    for how in ("kill", "stop"):
        run = runs[how] / "r"
        (r,) = read_events(run / "events.jsonl", kind="restart")
        assert (r["path"], r["rank"], r["from_step"], r["new_world_size"], r["gave_up"]) == \
            ("memory", 1, AT - 1, 1, False), r
        assert r["steps_redone"] <= 1, r
        (rec,) = read_events(run / "events.jsonl", kind="recovered")
        assert rec["path"] == "memory" and rec["from_step"] == AT - 1 and rec["world_size"] == 1, rec
        if how == "stop":
            (st,) = read_events(run / "events.jsonl", kind="stalled")
            assert st["ranks"] == [1] and "stall" in r["cause"], (st, r)
        rows = _rows(runs[how])
        assert [s for s, _, _ in rows] == [*range(1, AT + 1), *range(AT, STEPS + 1)]  # step 7 redone once
        assert len({pid for _, pid, _ in rows}) == 1 and rows[-1][2] == 1  # rank 0 kept its process
        print(f"{how}: restart -> next step {rec['detect_to_first_step_s']:.2f} s, lost {rec['time_lost_s']:.2f} s")
        a = _final_model(run)
        assert a["step"] == b["step"] == STEPS and a["cursor"] == b["cursor"] and a["lr_last"] == b["lr_last"]
        for k in a["model"]:
            assert torch.equal(a["model"][k], b["model"][k]), (how, k)
        ma = [s["momentum_buffer"] for s in a["optimizer"]["state"].values()]
        mb = [s["momentum_buffer"] for s in b["optimizer"]["state"].values()]
        assert ma and all(torch.equal(x, y) for x, y in zip(ma, mb)), how
    assert json.loads((runs["kill"] / "r" / "summary.json").read_text())["step"] == STEPS


HVD_ELASTIC = """
import os, signal, sys, torch, horovod.torch as hvd
import torch.nn.functional as F
how, out = sys.argv[1], sys.argv[2]
hvd.init()
torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
model = torch.nn.Linear(8, 2)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9),
                               named_parameters=model.named_parameters())
sampler = hvd.elastic.ElasticSampler(data, shuffle=True, seed=0)
loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler)


def set_lr():
    for g in opt.param_groups:
        g["lr"] = 0.01 * hvd.size()


@hvd.elastic.run
def train(state):
    while state.epoch < 1:
        for xb, yb in loader:
            state.n += 1
            with open(os.path.join(out, f"rank{hvd.rank()}.txt"), "a") as f:
                f.write(f"{state.n} {os.getpid()} {hvd.size()}\\n")
            if state.n == %d and hvd.rank() == 1 and how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            state.sampler.record_batch(state.batch, 4)
            state.batch += 1
            state.commit()
        state.epoch, state.batch = state.epoch + 1, 0


state = hvd.elastic.TorchState(model=model, optimizer=opt, sampler=sampler, epoch=0, batch=0, n=0)
state.register_reset_callbacks([set_lr])
train(state)
""" % AT


def test_a_horovod_elastic_script_rolls_back_to_its_last_commit_in_memory(tmp_path):
    """``@hvd.elastic.run`` with ``state.commit()`` after every batch: rank 1 is killed in step 7;
    rank 0 restores its commit of step 6 (Horovod's save, in memory), re-forms the ring alone, runs
    the reset callback and calls the function again, as Horovod Elastic would, instead of a restart
    from the checkpoint; the final weights and momentum equal those of a scheduled shrink at step 6."""
    script = tmp_path / "hvd_elastic_dies.py"
    script.write_text(HVD_ELASTIC)
    runs = {how: tmp_path / how for how in ("kill", "none")}
    procs = {}
    for how, run in runs.items():
        run.mkdir()
        extra = ["--survive"] if how == "kill" else ["--resize-at", str(AT - 1), "--to", "1"]
        procs[how] = _start_train(["--relaunch", "inplace", "--gpus", "2", "--slots", "2", "--steps", "100",
                                   *extra, "--script", str(script), "--run-dir", str(run / "r"), "--",
                                   how, str(run)])
    try:
        outs = {how: p.communicate(timeout=300) for how, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    for how, p in procs.items():
        assert p.returncode == 0, (how, outs[how][1])
    run = runs["kill"] / "r"
    (r,) = read_events(run / "events.jsonl", kind="restart")
    assert (r["path"], r["rank"], r["from_step"], r["new_world_size"]) == ("memory", 1, AT - 1, 1), r
    rows = _rows(runs["kill"])
    assert [s for s, _, _ in rows] == [*range(1, AT + 1), *range(AT, 11)] and len({p for _, p, _ in rows}) == 1
    a, b = _final_model(run), _final_model(runs["none"] / "r")
    assert a["step"] == b["step"] == 10
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    ma = [s["momentum_buffer"] for s in a["optimizer"]["state"].values()]
    mb = [s["momentum_buffer"] for s in b["optimizer"]["state"].values()]
    assert ma and all(torch.equal(x, y) for x, y in zip(ma, mb))
