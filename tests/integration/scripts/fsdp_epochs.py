"""An epoch loop (``job.epochs`` over a DataLoader with ``elastic.DistributedSampler``) whose model is
sharded with FSDP2's ``fully_shard``; each rank writes one JSON line per step it trains to
``OUT/rank<r>.jsonl``: the step, the world size, the loss.

    elastic-ring train --script tests/integration/scripts/fsdp_epochs.py --collective torch --gpus 2 \\
        --slots 2 --schedule 4:1,8:2 -- --out OUT
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

import elastic_ring.worker as elastic

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
a = p.parse_args()

job = elastic.init()
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
sampler = elastic.DistributedSampler(data, num_replicas=world, rank=rank)
loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
fully_shard(model)
opt = torch.optim.Adam(model.parameters(), lr=0.01)
job.register(model=model, optimizer=opt)
job.restore()
for epoch in job.epochs(1, 3):
    sampler.set_epoch(epoch)
    for xb, yb in loader:
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with open(os.path.join(a.out, f"rank{rank}.jsonl"), "a") as f:
            f.write(json.dumps({"step": job.step, "world": world, "loss": float(loss)}) + "\n")
