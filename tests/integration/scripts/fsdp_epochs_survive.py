"""An epoch loop (``job.epochs`` over a DataLoader with ``elastic.DistributedSampler``, Adam) whose MLP
is sharded with FSDP2's ``fully_shard`` (every Linear, then the whole model), for ``--survive`` tests
of a kill inside an epoch: each rank writes one JSON line per step it completes to
``OUT/rank<r>.jsonl`` (the step, the world size, the epoch, its pid, the sample indices of its batch
and its loss), and rank 1 kills itself (SIGKILL) at the start of step ``--kill-step`` (before its
batch's forward; once rank 0 completed the step before; only once in a run: not the joiner that
takes its place) when ``--kill-step`` is given. ``--step-s``: a sleep per step (pacing).

    elastic-ring train --script tests/integration/scripts/fsdp_epochs_survive.py --collective torch \\
        --gpus 2 --slots 2 --relaunch inplace --survive -- --out OUT --kill-step 3
"""

import argparse
import json
import os
import signal
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

import elastic_ring.worker as elastic

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--kill-step", type=int, default=0, help="rank 1 dies at the start of this step (0: never)")
p.add_argument("--step-s", type=float, default=0.0)
a = p.parse_args()

job = elastic.init()
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.arange(64), torch.randn(64, 8), torch.randint(0, 2, (64,)))
sampler = elastic.DistributedSampler(data, num_replicas=world, rank=rank)
loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer)
fully_shard(model)
opt = torch.optim.Adam(model.parameters(), lr=0.01)
job.register(model=model, optimizer=opt)
job.restore()
mine = os.path.join(a.out, f"rank{rank}.jsonl")
for epoch in job.epochs(1, a.epochs + 1):
    sampler.set_epoch(epoch)
    for ib, xb, yb in loader:
        step = job.step + 1
        if rank == 1 and step == a.kill_step and not os.path.exists(os.path.join(a.out, "killed")):
            open(os.path.join(a.out, "killed"), "w").close()  # once: not its joiner, should it reach the step
            t0, first = time.time(), os.path.join(a.out, "rank0.jsonl")
            while time.time() - t0 < 30 and not any(json.loads(ln)["step"] == step - 1 for ln in
                                                     open(first).read().splitlines()):
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(a.step_s)
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with open(mine, "a") as f:
            f.write(json.dumps({"step": job.step, "world": world, "epoch": epoch, "pid": os.getpid(),
                                "indices": [int(i) for i in ib], "loss": float(loss)}) + "\n")
