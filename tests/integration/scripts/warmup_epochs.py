"""A plain-Horovod epoch-loop script on the worker library with a per-batch LR warm-up over the whole
epoch, Horovod's ``pytorch_imagenet_resnet50.py``'s: its optimizer built with ``base * hvd.size()``,
and before each batch every param group's LR set to ``base * hvd.size() * adj`` with
``adj = (progress * (size - 1) / warmup_epochs + 1) / size`` (from ``base`` to ``base * size`` over the
warm-up), the epoch's progress taken from the sampler's full epoch (``start_batch + batch_idx`` of
``epoch_batches``), not from ``len(loader)`` (the rest of the epoch after a resize). Each rank writes one JSON line per step it trains to ``OUT/rank<r>.jsonl``:
the step, world size, epoch, the warm-up's fraction of the epoch and the LR the step ran with.

    elastic-ring train --script tests/integration/scripts/warmup_epochs.py --gpus 1 --schedule 10:2,12:1 \\
        --slots 2 -- --out OUT
"""

import argparse
import json
import os

import horovod.torch as hvd
import torch
import torch.nn.functional as F

import elastic_ring.worker as elastic

p = argparse.ArgumentParser()
p.add_argument("--out", required=True)
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--base-lr", type=float, default=0.01)
p.add_argument("--warmup-epochs", type=float, default=2.0)
a = p.parse_args()


def adjust(progress: float) -> float:
    """Horovod's ImageNet example's warm-up factor (no decay in the warm-up epochs)."""
    if progress < a.warmup_epochs:
        return (progress * (hvd.size() - 1) / a.warmup_epochs + 1) / hvd.size()
    return 1.0


job = elastic.init()
torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
sampler = elastic.DistributedSampler(data, num_replicas=hvd.size(), rank=hvd.rank())
loader = torch.utils.data.DataLoader(data, batch_size=4, sampler=sampler)
model = torch.nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=a.base_lr * hvd.size(), momentum=0.9)
job.register(model=model, optimizer=opt)
job.restore()
opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
for epoch in job.epochs(1, a.epochs + 1):
    sampler.set_epoch(epoch)
    for batch_idx, (xb, yb) in enumerate(loader):
        frac = (sampler.start_batch + batch_idx) / sampler.epoch_batches
        for g in opt.param_groups:
            g["lr"] = a.base_lr * hvd.size() * adjust(epoch - 1 + frac)
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with open(os.path.join(a.out, f"rank{hvd.rank()}.jsonl"), "a") as f:
            f.write(json.dumps({"step": job.step, "world": hvd.size(), "epoch": epoch, "frac": frac,
                                "lr": opt.param_groups[0]["lr"], "batches": len(loader)}) + "\n")
