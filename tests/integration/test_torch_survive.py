"""`elastic-ring train --collective torch --survive` (real gloo process groups, real processes).

First what the survivor sees: two processes in a gloo group (and a gloo control group, as the
worker library forms them), rank 1 killed in DDP's backward pass or in the stop vote's allreduce;
rank 0's error is a peer's loss, destroying the broken group returns at once, and a new group of
one forms over a new store with DDP rebuilt.

Then ``--relaunch inplace``: kill -9 of rank 1 of two workers; rank 0 keeps its process, sees the
peer's loss in a gloo collective (DDP's backward hook or the stop vote), destroys the broken group,
rolls back to the last step both completed (kept in memory) and goes on alone in a new group at one
worker (Eq. 7 LR); after its next step a warm spare (a process started for the free slot) joins,
its state by broadcast from rank 0. That joiner is then stopped (SIGSTOP): the stall watchdog ends
it alone and rank 0 goes on from memory again, and the next spare grows it back; the run is
stopped by Ctrl-C. Its final weights equal, bitwise, those of an uninterrupted run with the same
shrinks and grows scheduled.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
import torch

from elastic_ring import protocol
from elastic_ring.events import read_events
from tests.conftest import ROOT, wait_for
from tests.integration.test_torch_collective import _members
from tests.integration.test_train_resize import _final_model, _start_train

pytestmark = pytest.mark.integration

PACED = str(ROOT / "tests" / "integration" / "scripts" / "paced_torch.py")


def _train(run, *extra: str, steps: int, step_s: float):
    return _start_train(["--collective", "torch", "--relaunch", "inplace", "--gpus", "2", "--slots", "2",
                         "--steps", str(steps), *extra, "--script", PACED, "--run-dir", str(run), "--",
                         "--step-s", str(step_s)])


def _step(run) -> int:
    rec = protocol.read_json(run / "control" / "progress.json")
    return int(rec["step"]) if isinstance(rec, dict) else 0


def _pid(run, segment: int, rank: int) -> int:
    """The worker's own pid (its record; not its launcher's stand-in)."""
    rec = protocol.read_json(protocol.pid_dir(run) / f"seg{segment:03d}-rank{rank}.json")
    return int(rec["pid"])


def _same_weights(a_run, b_run, steps: int) -> None:
    a, b = _final_model(a_run), _final_model(b_run)
    assert a["step"] == b["step"] == steps and a["cursor"] == b["cursor"] and a["lr_last"] == b["lr_last"]
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    ma = [s["momentum_buffer"] for s in a["optimizer"]["state"].values()]
    mb = [s["momentum_buffer"] for s in b["optimizer"]["state"].values()]
    assert ma and all(torch.equal(x, y) for x, y in zip(ma, mb))


def _names(run) -> list[dict[str, int]]:
    """Per segment, member name -> rank, from the local in-place backend's lines in the segment logs."""
    import re

    rows = []
    for f in sorted((run / "logs").glob("segment-*.log")):
        for line in f.read_text().splitlines():
            if line.startswith("[local] segment "):
                rows.append({n: int(r) for r, n in re.findall(r"rank (\d+): (w\d+) pid", line)})
    return rows


SURVIVOR = """
import json, os, signal, sys, time
from datetime import timedelta
import torch, torch.distributed as dist
from elastic_ring.worker import survive
how, rank, port, port2 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
t = timedelta(seconds=60)
dist.init_process_group("gloo", store=dist.TCPStore("127.0.0.1", port, is_master=False, timeout=t), rank=rank,
                        world_size=2, timeout=t)
control = dist.new_group(backend="gloo", timeout=t)
torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
ddp = torch.nn.parallel.DistributedDataParallel(model)
try:
    for step in range(1, 6):
        if how == "vote":  # the stop vote: started on the control group, read one step later
            vote = dist.all_reduce(torch.zeros(1), group=control, async_op=True)
        if rank == 1 and step == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        ddp(torch.randn(4, 8)).sum().backward()
        if how == "vote":
            vote.wait()
    raise SystemExit("no error")
except RuntimeError as e:
    t0 = time.time()
    dist.destroy_process_group()
    destroyed = time.time() - t0
    dist.init_process_group("gloo", store=dist.TCPStore("127.0.0.1", port2, is_master=False, timeout=t), rank=0,
                            world_size=1, timeout=t)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp(torch.randn(4, 8)).sum().backward()
    print(json.dumps({"peer_loss": survive._peer_loss(e), "error": str(e)[:200], "destroy_s": destroyed,
                      "step": step}), flush=True)
    os._exit(0)  # as the worker entry does: no interpreter teardown
"""


def test_the_survivor_of_a_killed_peer_sees_a_peer_loss_and_forms_a_new_group(tmp_path):
    """Rank 1 killed in DDP's backward pass, and (a second pair, side by side) in the stop vote's
    allreduce on the control group."""
    import subprocess
    import sys
    from datetime import timedelta

    import torch.distributed as dist

    script = tmp_path / "survivor.py"
    script.write_text(SURVIVOR)
    pairs = {}
    for how in ("backward", "vote"):
        stores = [dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                                timeout=timedelta(seconds=60)) for _ in range(2)]
        ports = [str(s.port) for s in stores]
        pairs[how] = stores, [subprocess.Popen([sys.executable, str(script), how, str(r), *ports], cwd=ROOT,
                                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                              for r in range(2)]
    try:
        outs = {how: procs[0].communicate(timeout=60) for how, (_, procs) in pairs.items()}
    finally:
        for _, procs in pairs.values():
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
    for how, (_, procs) in pairs.items():
        out, err = outs[how]
        assert procs[0].returncode == 0 and procs[1].returncode == -signal.SIGKILL, (how, err)
        rec = json.loads(out.strip().splitlines()[-1])
        assert rec["peer_loss"] and rec["step"] == 3, (how, rec)
        assert rec["destroy_s"] < 2.0, (how, rec)


def _member_pid(run, name: str) -> int:
    """The own pid of the worker the local backend named ``name`` (its newest pid record)."""
    recs = [r for r in protocol.read_pid_records(run) if r.get("member") == name]
    return int(max(recs, key=lambda r: r["segment"])["pid"])


def _back_at_2(run, proc, segment: int) -> None:
    wait_for(lambda: any(e["world_size"] == 2 for e in read_events(run / "events.jsonl", kind="first_step")
                         if e["segment"] >= segment) or proc.poll() is not None, 120,
             f"2 workers from segment {segment}")


def test_kill_9_of_rank_1_then_a_stall_of_its_joiner_the_survivor_goes_on_from_memory_each_time(tmp_path):
    """kill -9 of rank 1 after step 4; the spare joins; then that joiner is stopped (SIGSTOP) and
    ``--stall-timeout 2`` ends it alone: rank 0 goes on from memory again, and the next spare grows
    it back. A Ctrl-C ends the run; the reference runs to its checkpoint with the four resizes
    scheduled, without the pace (a sleep: the same steps, the same weights)."""
    run, ref = tmp_path / "survive", tmp_path / "scheduled"
    proc = _train(run, "--survive", "--stall-timeout", "2", steps=2000, step_s=0.15)
    stopped = None
    try:
        wait_for(lambda: _step(run) >= 4 or proc.poll() is not None, 120, "step 4")
        pid0, pid1 = _pid(run, 0, 0), _pid(run, 0, 1)
        t_kill = time.time()
        os.kill(pid1, signal.SIGKILL)
        _back_at_2(run, proc, 2)
        stopped = _member_pid(run, next(n for n in _names(run)[2] if _names(run)[2][n] == 1))
        os.kill(stopped, signal.SIGSTOP)
        _back_at_2(run, proc, 4)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if stopped is not None and protocol.pid_alive(stopped):
            os.kill(stopped, signal.SIGKILL)
    assert proc.returncode == 130, err
    killed, stalled = read_events(run / "events.jsonl", kind="restart")
    for r in (killed, stalled):
        assert (r["path"], r["rank"], r["new_world_size"], r["gave_up"]) == ("memory", 1, 1, False), r
        assert r["steps_redone"] <= 1, r
    assert "stall" in stalled["cause"] and "stall" not in killed["cause"], (killed, stalled)
    (st,) = read_events(run / "events.jsonl", kind="stalled")
    assert st["ranks"] == [1], st
    recs = read_events(run / "events.jsonl", kind="recovered")
    assert [(x["path"], x["from_step"], x["world_size"]) for x in recs] == [
        ("memory", killed["from_step"], 1), ("memory", stalled["from_step"], 1)], recs
    assert _pid(run, 1, 0) == _pid(run, 3, 0) == pid0  # the survivor kept its process throughout
    reqs = [e for e in read_events(run / "events.jsonl", kind="resize_requested") if e["source"] == "joiner"]
    grows = [e for e in read_events(run / "events.jsonl", kind="relaunched") if e["to_workers"] == 2]
    assert [(e["from_workers"], e["to_workers"]) for e in reqs] == [(1, 2), (1, 2)], reqs
    assert [e["step"] for e in grows] == [killed["from_step"] + 1, stalled["from_step"] + 1], grows
    changes = [(e["cause"], e["step"], e["members_before"], e["members_after"], e["state_source"])
               for e in read_events(run / "events.jsonl", kind="membership_change")]  # one record per change
    assert changes == [("failure", killed["from_step"], 2, 1, "memory"), ("joiner", grows[0]["step"], 1, 2, "peer"),
                       ("stall", stalled["from_step"], 2, 1, "memory"),
                       ("joiner", grows[1]["step"], 1, 2, "peer")], changes
    segs = _members(run)  # rank -> its launcher's stand-in, per segment: rank 0's kept, a new rank 1 each time
    assert [sorted(m) for m in segs] == [[0, 1], [0], [0, 1], [0], [0, 1]] and len({m[0] for m in segs}) == 1, segs
    assert len({segs[0][1], segs[2][1], segs[4][1]}) == 3
    first = [e for e in read_events(run / "events.jsonl", kind="first_step") if e["segment"] == 1]
    print(f"kill -9 -> the survivor's next completed step: {first[0]['time'] - t_kill:.2f} s; "
          f"detected -> step {recs[0]['detect_to_first_step_s']:.2f} s "
          f"(stall: {recs[1]['detect_to_first_step_s']:.2f} s)")
    end = _final_model(run)["step"]
    assert end > grows[-1]["step"]

    p = _train(ref, "--schedule", f"{killed['from_step']}:1,{grows[0]['step']}:2,{stalled['from_step']}:1,"
                                  f"{grows[1]['step']}:2", steps=end, step_s=0.0)
    out, err = p.communicate(timeout=120)  # the same shrinks and grows, scheduled
    assert p.returncode == 0, err
    assert not read_events(ref / "events.jsonl", kind="restart")
    _same_weights(run, ref, end)
