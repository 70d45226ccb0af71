"""`elastic-ring train --relaunch inplace --survive` (one Horovod Elastic job on this host) with real
horovodrun. The flat loop: rank 0 of two workers is killed (kill -9) at the start of step 3; rank 1
keeps its process, becomes rank 0 (each worker slot is a host name of its own, so the survivor
keeps its slot), rolls back to step 2 (the last step both completed, kept in memory) and does
step 3 alone; then a warm worker (a spare process started while the ring trained) takes the dead
one's place as rank 1 (its state by broadcast from rank 0, not from disk) and the two go on; that
joiner stops (SIGSTOP) in step 5, the stall watchdog ends it, rank 0 rolls back again and does
step 5 alone, and a second warm joiner (the next spare, started once the ring trained again) brings
it back to 2 for the last two steps. Its final weights, momentum, data position and LR equal,
bitwise, those of an uninterrupted run with those resizes scheduled: 2 -> 1 at step 2, back to 2
at step 3, 2 -> 1 at step 4, back to 2 at step 5. A Horovod Elastic script rolls back to its last
commit the same way (rank 0 killed), and an epoch-loop script (``job.epochs()``) to the copy of its
last step, its position in the epoch included. Each failing run goes side by side with its
reference."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest
import torch

from elastic_ring import protocol
from elastic_ring.events import read_events
from elastic_ring.controller.hvdrun import JOINER_TRIES
from tests.integration.test_train_resize import _final_model, _start_train

pytestmark = pytest.mark.integration

STEPS, KILL, STALL = 7, 3, 5  # rank 0 is killed in step KILL; the joiner (rank 1) stops in step STALL

SCRIPT = """
import os, signal, sys, time, torch, horovod.torch as hvd
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


def once_the_peer_began(step):  # (it holds the step before in memory)
    peer, t0 = os.path.join(out, f"rank{1 - job.rank}.txt"), time.time()
    while time.time() - t0 < 30 and not any(ln.split()[0] == str(step) for ln in open(peer).read().splitlines()):
        time.sleep(0.01)


for step in job.steps():
    with open(os.path.join(out, f"rank{job.rank}.txt"), "a") as f:
        f.write(f"{step} {os.getpid()} {job.size}\\n")
    if how == "fail" and job.size == 2 and (job.rank, step) in ((0, %d), (1, %d)):
        once_the_peer_began(step)  # rank 0 is killed (once: the survivor is rank 0 then), the joiner stopped
        os.kill(os.getpid(), signal.SIGKILL if step == %d else signal.SIGSTOP)
    idx = data.next_batch()
    loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
    job.record(loss, samples=len(idx))
""" % (KILL, STALL, KILL)


def _rows(run, rank: int = 0) -> list[tuple[int, int, int]]:
    """(step, pid, size) of each step the rank began, in order."""
    return [tuple(map(int, ln.split())) for ln in (run / f"rank{rank}.txt").read_text().splitlines()]


def _inplace(args: list[str]):
    return _start_train(["--relaunch", "inplace", *args])


def _side_by_side(tmp_path, script_text: str, runs: dict[str, list[str]], steps: int, start=_inplace) -> dict:
    """Start one run per entry (its name -> its own options) of the script side by side; wait for all."""
    script = tmp_path / "script.py"
    script.write_text(script_text)
    return _runs_side_by_side(tmp_path, {how: ["--steps", str(steps), *extra, "--script", str(script), "--run-dir",
                                               str(tmp_path / how / "r"), "--", how, str(tmp_path / how)]
                                         for how, extra in runs.items()}, start)


def _runs_side_by_side(tmp_path, runs: dict[str, list[str]], start=_inplace) -> dict:
    """Start one ``train`` of two workers per entry (its name -> the rest of its command line; its
    run folder ``tmp_path/name/r``) side by side, by ``start`` (default: ``--relaunch inplace`` on
    this host); wait for all."""
    procs, dirs = {}, {how: tmp_path / how for how in runs}
    for how, args in runs.items():
        dirs[how].mkdir()
        procs[how] = start(["--gpus", "2", "--slots", "2", *args])
    try:
        outs = {how: p.communicate(timeout=240) for how, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        for d in dirs.values():  # a stopped worker left behind by a failed test
            for rec in protocol.read_pid_records(d / "r"):
                if rec["rank"] != 0 and protocol.pid_alive(rec["pid"]):
                    os.kill(rec["pid"], signal.SIGKILL)
    for how, p in procs.items():
        assert p.returncode == 0, (how, outs[how][1])
    return dirs


def _assert_same_final_state(a: dict, b: dict) -> None:
    assert a["step"] == b["step"] and a["cursor"] == b["cursor"] and a["lr_last"] == b["lr_last"]
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    ma = [s["momentum_buffer"] for s in a["optimizer"]["state"].values()]
    mb = [s["momentum_buffer"] for s in b["optimizer"]["state"].values()]
    assert ma and all(torch.equal(x, y) for x, y in zip(ma, mb))


def test_rank_0_killed_then_a_warm_joiner_then_its_stall_as_scheduled_resizes(tmp_path):
    dirs = _side_by_side(tmp_path, SCRIPT, {
        "fail": ["--survive", "--stall-timeout", "2"],
        # the reference: the same resizes, under the default (survivors kept while the copy is
        # measured: a shrink and a grow one step apart, each grow's worker a warm joiner)
        "none": ["--schedule", f"{KILL - 1}:1,{KILL}:2,{STALL - 1}:1,{STALL}:2"]},
        STEPS)
    run, ref = dirs["fail"] / "r", dirs["none"] / "r"
    assert not read_events(ref / "events.jsonl", kind="restart")
    killed, stalled = read_events(run / "events.jsonl", kind="restart")
    for r, rank, at in ((killed, 0, KILL), (stalled, 1, STALL)):
        assert (r["path"], r["rank"], r["from_step"], r["new_world_size"], r["gave_up"]) == \
            ("memory", rank, at - 1, 1, False), r
        assert r["steps_redone"] <= 1, r
    (st,) = read_events(run / "events.jsonl", kind="stalled")
    assert st["ranks"] == [1] and "stall" in stalled["cause"] and "stall" not in killed["cause"], (st, stalled)
    recs = read_events(run / "events.jsonl", kind="recovered")
    assert [(x["path"], x["from_step"], x["world_size"]) for x in recs] == [("memory", KILL - 1, 1),
                                                                           ("memory", STALL - 1, 1)], recs
    # the joiners: a grow back to 2 after the survivor's step KILL, and again after STALL, asked by no schedule
    reqs = [e for e in read_events(run / "events.jsonl", kind="resize_requested") if e["to_workers"] == 2]
    assert [(e["source"], e["from_workers"], e["at_step"]) for e in reqs] == [("joiner", 1, KILL), ("joiner", 1, STALL)]
    backs = [e for e in read_events(run / "events.jsonl", kind="first_step_after_resize") if e["world_size"] == 2]
    assert [(e["step"], e["joiner"]) for e in backs] == [(KILL + 1, "broadcast"), (STALL + 1, "broadcast")], backs
    for e, failure in zip(backs, (killed, stalled)):
        assert 0 < e["since_failure_s"] == pytest.approx(e["time"] - failure["time"], abs=0.5), e
    rows, joiner = _rows(dirs["fail"]), _rows(dirs["fail"], 1)
    assert [s for s, _, _ in rows] == [*range(1, KILL + 1), *range(KILL, STALL + 1), *range(STALL, STEPS + 1)]
    assert [size for _, _, size in rows] == [2] * KILL + [1] + [2] * (STALL - KILL) + [1] + [2] * (STEPS - STALL)
    assert [s for s, _, _ in joiner] == list(range(1, STEPS + 1))
    pids = [{pid for s, pid, _ in joiner if lo < s <= hi} for lo, hi in ((0, KILL), (KILL, STALL), (STALL, STEPS))]
    assert all(len(p) == 1 for p in pids) and len(set.union(*pids)) == 3  # the survivor, then two new processes
    # the dead rank 0's process did steps 1..KILL; rank 1's went on as rank 0 (each failed step redone)
    (dead,), (survivor,) = {pid for _, pid, _ in rows[:KILL]}, pids[0]
    assert dead != survivor and {pid for _, pid, _ in rows[KILL:]} == {survivor}
    # ... both warm: spares our horovodrun started while the ring trained, each handed rank 1's slot
    handed = re.findall(r"the warm joiner \(pid (\d+)\) takes rank 1", (run / "logs" / "segment-000-w2.log").read_text())
    assert [int(x) for x in handed] == [min(pids[1]), min(pids[2])], handed
    print(f"kill: restart -> next step {recs[0]['detect_to_first_step_s']:.2f} s, lost {recs[0]['time_lost_s']:.2f} s;"
          f" back at 2 workers {backs[0]['since_failure_s']:.2f} s after the kill was seen; "
          f"stall: restart -> next step {recs[1]['detect_to_first_step_s']:.2f} s, back at 2 "
          f"{backs[1]['since_failure_s']:.2f} s after")
    a, b = _final_model(run), _final_model(ref)
    assert a["step"] == b["step"] == STEPS
    _assert_same_final_state(a, b)


HE_STEPS = 6  # rank 0 is killed in the last step: no joiner comes (no step left for it)

HVD_ELASTIC = """
import os, signal, sys, time, torch, horovod.torch as hvd
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
            if state.n == %d and hvd.rank() == %d and hvd.size() == 2 and how == "fail":
                # once the peer began this step too (past the commit of the step before: else it
                # rolls back from inside that commit, the same state, but its rows would differ)
                peer, t0 = os.path.join(out, f"rank{1 - hvd.rank()}.txt"), time.time()
                while time.time() - t0 < 30 and str(state.n) not in open(peer).read().split()[0::3]:
                    time.sleep(0.01)
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
"""


def hvd_elastic_script(killed: int) -> str:
    """The Horovod Elastic script whose rank ``killed`` kills itself in the last step (at 2 workers)."""
    return HVD_ELASTIC % (HE_STEPS, killed)


def test_a_horovod_elastic_script_rolls_back_to_its_last_commit_in_memory(tmp_path):
    """``@hvd.elastic.run`` with ``state.commit()`` after every batch: rank 0 is killed in the last
    step; rank 1 restores its commit of the step before (Horovod's save, in memory), re-forms the
    ring alone as rank 0 (its own slot host), runs the reset callback and calls the function again,
    as Horovod Elastic would, instead of a restart from the checkpoint; the final weights and
    momentum equal those of a scheduled shrink at that step. (On Ray the same script loses rank 1:
    test_ray_survive.py.)"""
    dirs = _side_by_side(tmp_path, hvd_elastic_script(killed=0), {"fail": ["--survive"],
                                                 "none": ["--resize-at", str(HE_STEPS - 1), "--to", "1"]}, HE_STEPS)
    run = dirs["fail"] / "r"
    (r,) = read_events(run / "events.jsonl", kind="restart")
    assert (r["path"], r["rank"], r["from_step"], r["new_world_size"]) == ("memory", 0, HE_STEPS - 1, 1), r
    assert not [e for e in read_events(run / "events.jsonl", kind="resize_requested") if e["source"] == "joiner"]
    rows, survivor = _rows(dirs["fail"]), _rows(dirs["fail"], 1)
    assert [s for s, _, _ in rows] == [*range(1, HE_STEPS + 1), HE_STEPS]
    assert [s for s, _, _ in survivor] == list(range(1, HE_STEPS + 1)) and len({p for _, p, _ in survivor}) == 1
    # the dead rank 0 did steps 1..6; rank 1's process redid step 6 alone, as rank 0
    assert {p for _, p, _ in rows[:-1]} != {survivor[0][1]} and rows[-1][1:] == (survivor[0][1], 1)
    a, b = _final_model(run), _final_model(dirs["none"] / "r")
    assert a["step"] == b["step"] == HE_STEPS
    _assert_same_final_state(a, b)


EPOCH_LOOP = Path(__file__).parent / "scripts" / "epoch_loop.py"
E_KILL = 3  # rank 1 is killed at the start of step 3 of 8 of epoch 1 (64 samples, 2 x 4 a step)


def test_an_epoch_loop_survives_a_kill_inside_an_epoch_as_scheduled_resizes(tmp_path):
    """``for epoch in job.epochs(...)`` over ``elastic.DistributedSampler``: rank 1 is killed inside
    epoch 1; rank 0 keeps its process, rolls back to the step before (its copy in memory, with the
    position in the epoch), redoes the failed step alone, a joiner grows the ring back, and the run
    crosses into epoch 2. Every step's batch, the final weights, momentum, data position and LR
    schedule equal, bitwise, those of a run with the same resizes scheduled (2 -> 1 at step 2, back
    to 2 at step 3)."""
    def args(how: str, extra: list[str], kill: list[str]) -> list[str]:
        return [*extra, "--script", str(EPOCH_LOOP), "--run-dir", str(tmp_path / how / "r"), "--",
                "--out", str(tmp_path / how), "--epochs", "2", *kill]

    dirs = _runs_side_by_side(tmp_path, {
        "fail": args("fail", ["--survive"], ["--kill-step", str(E_KILL)]),
        "none": args("none", ["--schedule", f"{E_KILL - 1}:1,{E_KILL}:2"], [])})
    run, ref = dirs["fail"] / "r", dirs["none"] / "r"
    assert not read_events(ref / "events.jsonl", kind="restart")
    (r,) = read_events(run / "events.jsonl", kind="restart")
    assert (r["path"], r["rank"], r["from_step"], r["new_world_size"], r["gave_up"]) == \
        ("memory", 1, E_KILL - 1, 1, False), r
    assert r["steps_redone"] <= 1, r
    assert r["from_step"] <= r["failed_at_step"] == r["from_step"] + r["steps_redone"], r  # never below it
    (rec,) = read_events(run / "events.jsonl", kind="recovered")
    assert (rec["path"], rec["from_step"], rec["world_size"]) == ("memory", E_KILL - 1, 1), rec
    (req,) = [e for e in read_events(run / "events.jsonl", kind="resize_requested") if e["to_workers"] == 2]
    assert (req["source"], req["from_workers"], req["at_step"]) == ("joiner", 1, E_KILL), req
    (back,) = [e for e in read_events(run / "events.jsonl", kind="first_step_after_resize") if e["world_size"] == 2]
    assert back["step"] == E_KILL + 1 and back["joiner"] == "broadcast", back
    # 16 + 4 samples of epoch 1 by step 3, its 44 left at two workers: steps 4-9; epoch 2: steps 10-17
    last, epoch_end = 17, 9
    rows = [tuple(map(int, ln.split())) for ln in (dirs["fail"] / "rank0.txt").read_text().splitlines()]
    # (step, size) of each step rank 0 began: the failed step 3 again alone, then step 4 begun alone and
    # stopped at its optimizer step for the grow back (the epoch loop's stop point), begun again at 2
    assert [(s, size) for s, _, size, _ in rows] == [(1, 2), (2, 2), (3, 2), (3, 1), (4, 1),
                                                     *((s, 2) for s in range(4, last + 1))]
    assert len({pid for _, pid, _, _ in rows}) == 1  # rank 0 kept its process throughout
    assert {s: e for s, _, _, e in rows} == {s: 1 if s <= epoch_end else 2 for s in range(1, last + 1)}
    ref_rows = [tuple(map(int, ln.split())) for ln in (dirs["none"] / "rank0.txt").read_text().splitlines()]
    assert [r[2:] for r in ref_rows] == [r[2:] for r in rows] and [r[0] for r in ref_rows] == [r[0] for r in rows]
    print(f"kill: restart -> next step {rec['detect_to_first_step_s']:.2f} s, lost {rec['time_lost_s']:.2f} s; "
          f"back at 2 workers {back['since_failure_s']:.2f} s after the kill was seen")
    a, b = _final_model(run), _final_model(ref)
    assert a["step"] == b["step"] == last and a["data_position"] == b["data_position"]
    assert a["data_position"]["epoch"] == 3 and a["schedulers"] == b["schedulers"]
    _assert_same_final_state(a, b)


REJECTED = """
import os, sys, torch, horovod.torch as hvd
import elastic_ring.worker as elastic
how, out = sys.argv[1], sys.argv[2]
job = elastic.init(lazy=True)
real_init = job.ring.init_horovod


def rejected_at_the_last_grow():  # (its ring's hvd.init() never returns: as if Horovod had rejected it)
    aborts = os.path.join(out, "aborts")
    if job.info.go_file is not None:  # a warm joiner: the first joins at the first grow back, the second at the last
        open(os.path.join(out, "joiners"), "a").write(f"{os.getpid()}\\n")
        if len(open(os.path.join(out, "joiners")).read().split()) == 2:
            open(aborts, "a").write(f"{os.getpid()}\\n")
            os.abort()
    elif how == "every" and os.path.exists(aborts) and len(open(aborts).read().split()) < %d:
        open(aborts, "a").write(f"{os.getpid()}\\n")  # the cold worker started again for its slot
        os.abort()
    real_init()


job.ring.init_horovod = rejected_at_the_last_grow
job.connect()
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
    idx = data.next_batch()
    loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
    job.record(loss, samples=len(idx))
""" % JOINER_TRIES


def test_a_joiner_rejected_at_a_grow_right_after_a_shrink_is_started_again_or_the_job_restarts(tmp_path):
    """A shrink and a grow one step apart, twice, in place under the default survive (each slot a
    host of its own, the slot shrunk off grown back a step later, each grow's worker a warm joiner);
    the warm joiner of the last grow dies inside its ring's ``hvd.init()``, as one that Horovod's
    driver told its slot had been removed did (the run then hung: rank 0 waited inside its own
    ``hvd.init()`` for a rank 1 that never came). ``once``: the slot's worker is started again
    (cold) and the run goes on in place, every step trained once. ``every``: the cold ones die
    too; after the last try the job ends with one line and the controller restarts it from disk."""
    sched = f"{KILL - 1}:1,{KILL}:2,{STALL - 1}:1,{STALL}:2"
    dirs = _side_by_side(tmp_path, REJECTED, {"once": ["--schedule", sched], "every": ["--schedule", sched]}, STEPS)
    sizes = [2, 2, 1, 2, 1, 2, 2]  # steps 1..7
    once, every = dirs["once"] / "r", dirs["every"] / "r"
    log = (once / "logs" / "segment-000-w2.log").read_text()
    again = f"the joiner for rank 1 exited (status -6) before its ring formed: starting it again (2 of {JOINER_TRIES})"
    assert again in log, log[-3000:]
    assert not read_events(once / "events.jsonl", kind="restart")
    rows, ones = _rows(dirs["once"]), _rows(dirs["once"], 1)
    assert [(s, size) for s, _, size in rows] == list(zip(range(1, STEPS + 1), sizes)), rows
    assert len({pid for _, pid, _ in rows}) == 1  # rank 0 kept its process
    (aborted,) = map(int, (dirs["once"] / "aborts").read_text().split())
    assert [s for s, _, _ in ones] == [1, 2, 4, 6, 7] and aborted not in {pid for _, pid, _ in ones}, ones
    assert len({pid for s, pid, _ in ones if s >= 6}) == 1 and _final_model(once)["step"] == STEPS
    # every try failed: the job ended at once (not the ring's 300 s timeout) and was restarted from disk
    log = (every / "logs" / "segment-000-w2.log").read_text()
    assert f"before its ring formed, {JOINER_TRIES} times: ending the job" in log, log[-3000:]
    assert len((dirs["every"] / "aborts").read_text().split()) == JOINER_TRIES
    (r,) = read_events(every / "events.jsonl", kind="restart")
    assert (r["path"], r["failed_at_step"], r["gave_up"]) == ("disk", STALL, False), r
    assert r["rank"] == 1 and "the joiner for rank 1 exited" in r["cause"], r
    assert _final_model(every)["step"] == STEPS
