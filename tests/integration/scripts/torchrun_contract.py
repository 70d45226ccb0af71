"""A script of torchrun's contract only (no elastic_ring, no horovod), written for the tests: it
reads its rank and world from the environment, forms its group with ``init_process_group("gloo")``,
loads its own snapshot if there is one, and saves it every ``--every`` steps (rank 0, atomically).
Step ``s`` trains the global batch of samples ``s*B .. s*B+B-1`` (mod the dataset) of a fixed
dataset, each rank its share: the data of a step depends on the step only, at any world size.

Rank 0 appends JSON lines to ``OUT/log.jsonl``: ``start`` (the snapshot's step it resumes from, its
world size and torchrun's environment as it got it), ``step`` (the step, its world size and the
samples it trained, the time it ended), ``saved`` (a snapshot on disk). Every rank writes its pid to ``OUT/pid-<rank>``.

    torchrun --standalone --nproc-per-node 2 torchrun_contract.py --out OUT
    elastic-ring train --script torchrun_contract.py --workers 2 --slots 2 -- --out OUT
"""

import argparse
import json
import os
import signal
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
       "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_MAX_RESTARTS")

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--steps", type=int, default=40)
p.add_argument("--every", type=int, default=5, help="snapshot every this many steps")
p.add_argument("--batch", type=int, default=8, help="global batch")
p.add_argument("--step-s", type=float, default=0.0, help="seconds each step takes at least")
a = p.parse_args()

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.set_num_threads(1)
dist.init_process_group("gloo")
os.makedirs(a.out, exist_ok=True)
with open(os.path.join(a.out, f"pid-{rank}"), "w") as f:
    f.write(str(os.getpid()))

g = torch.Generator().manual_seed(0)
xs, ys = torch.randn(96, 8, generator=g), torch.randint(0, 2, (96,), generator=g)
torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
snapshot = os.path.join(a.out, "snapshot.pt")
start = 0
if os.path.exists(snapshot):  # the script's own snapshot: every rank loads it
    snap = torch.load(snapshot)
    model.load_state_dict(snap["model"])
    opt.load_state_dict(snap["opt"])
    start = snap["step"]
ddp = DistributedDataParallel(model)


def log(**rec):
    if rank == 0:
        with open(os.path.join(a.out, "log.jsonl"), "a") as f:
            f.write(json.dumps(rec) + "\n")


log(kind="start", resumed_from=start, world=world, env={k: os.environ.get(k) for k in ENV}, t=time.time())
for step in range(start + 1, a.steps + 1):
    t0 = time.time()
    samples = [(step * a.batch + i) % len(xs) for i in range(a.batch)]
    mine = samples[rank::world]
    loss = torch.nn.functional.cross_entropy(ddp(xs[mine]), ys[mine])
    opt.zero_grad()
    loss.backward()
    opt.step()
    log(kind="step", step=step, world=world, samples=samples, loss=loss.item(), t=time.time())
    if step % a.every == 0 and rank == 0:
        tmp = snapshot + ".tmp"
        torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()}, tmp)
        # the snapshot and its "saved" record together: a stop's SIGTERM between the two left a
        # snapshot the log did not name (SIGTERM waits until both are done; SIGKILL comes later)
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        os.replace(tmp, snapshot)
        log(kind="saved", step=step)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    time.sleep(max(0.0, a.step_s - (time.time() - t0)))
dist.destroy_process_group()
