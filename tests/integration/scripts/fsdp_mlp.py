"""An MLP sharded with FSDP2's ``fully_shard`` (every Linear, then the whole model) on
``torch.distributed`` (gloo), in the library's step form; ``--ddp``: the same model and steps
data-parallel instead (``job.parallel``: DistributedDataParallel), the reference of the same
schedule. Each rank writes one JSON line per step to ``OUT/rank<r>.jsonl``: the step, the world
size, the sample indices it trained on, its loss and the LR.

    elastic-ring train --script tests/integration/scripts/fsdp_mlp.py --collective torch --gpus 2 \\
        --slots 2 --steps 12 --schedule 4:1,8:2 -- --out OUT
"""

import argparse
import json
import os
import time

import torch

import elastic_ring.worker as elastic

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--ddp", action="store_true")
p.add_argument("--step-s", type=float, default=0.0)
a = p.parse_args()

job = elastic.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
                            torch.nn.Linear(32, 4))
if a.ddp:
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * job.size)
    net, opt = job.parallel(model, opt)
else:
    from torch.distributed.fsdp import fully_shard

    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    net = model
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * job.size)
g = torch.Generator().manual_seed(1)
x, y = torch.randn(96, 16, generator=g), torch.randint(0, 4, (96,), generator=g)
data = job.sampler(96, batch_size=4, seed=0)
job.register(model=model, optimizer=opt)
job.restore()
for step in job.steps():
    t0 = time.perf_counter()
    idx = data.next_batch()
    loss = torch.nn.functional.cross_entropy(net(x[idx]), y[idx])
    opt.zero_grad()
    loss.backward()
    lr = opt.param_groups[0]["lr"]
    opt.step()
    job.record(loss, samples=len(idx))
    with open(os.path.join(a.out, f"rank{job.rank}.jsonl"), "a") as f:
        f.write(json.dumps({"step": step, "world": job.size, "indices": [int(i) for i in idx],
                            "loss": float(loss), "lr": lr}) + "\n")
    time.sleep(max(0.0, a.step_s - (time.perf_counter() - t0)))
