"""A torch.distributed (DDP) epoch-loop script that never scales its LR with the world size, as
pytorch/examples' ``mnist/main.py`` made DDP (its ``--lr`` is the LR at any number of processes),
adapted with the library's drop-ins. Each rank writes one JSON line per step it trains to
``OUT/rank<r>.jsonl``: the step, world size and the LR the step ran with.

    elastic-ring train --script tests/integration/scripts/ddp_fixed_lr.py --collective torch --gpus 1 \\
        --schedule 6:2,9:1 --slots 2 -- --out OUT
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import elastic_ring.worker as elastic

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--epochs", type=int, default=1)
p.add_argument("--lr", type=float, default=1.0)
a = p.parse_args()

job = elastic.init()
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
sampler = elastic.DistributedSampler(data, num_replicas=world, rank=rank)
loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler)
net = torch.nn.Linear(8, 2)
model = DistributedDataParallel(net)
opt = torch.optim.Adadelta(model.parameters(), lr=a.lr)  # pytorch/examples' mnist: the same LR at any size
job.register(model=net, optimizer=opt)
job.restore()
for epoch in job.epochs(1, a.epochs + 1):
    sampler.set_epoch(epoch)
    for xb, yb in loader:
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        lr = opt.param_groups[0]["lr"]
        opt.step()
        with open(os.path.join(a.out, f"rank{rank}.jsonl"), "a") as f:
            f.write(json.dumps({"step": job.step, "world": world, "lr": lr}) + "\n")
