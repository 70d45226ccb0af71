"""The MLP of ``mlp_digits.py`` written for every LR rule, a constant global batch included:

    elastic-ring train --script examples/mlp_constant_batch.py --steps 600 --gpus 1 --schedule 200:2,400:4 \
        --lr-scaling constant-batch --global-batch 128 -- --batch-size 32

The one change to a ``job.steps()`` loop: the step's body goes over ``job.micro_batches(data, model,
opt)``, and each micro-batch's loss is multiplied by its ``weight`` before ``backward()``. Under
``--lr-scaling constant-batch`` every step trains the same ``--global-batch`` samples at any worker
count: each worker accumulates the gradients of its share of the step's micro-batches (of
``--batch-size``), one allreduce, one update, the LR unchanged. Under the other rules (and outside
the tool) it is one micro-batch per step, the worker's batch, at weight 1: the usual loop.
``--trace DIR``: each rank's samples and part of the step's mean loss per step, for tests.
"""

import argparse
import json
from pathlib import Path

import horovod.torch as hvd
import torch
import torch.nn.functional as F

import elastic_ring.worker as elastic
from elastic_ring.data import load_digits  # scikit-learn's digits, read without importing it


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=32, help="per worker (the micro-batch)")
    p.add_argument("--lr", type=float, default=0.05, help="per batch-size samples of the first step's global batch")
    p.add_argument("--trace", type=Path, default=None)
    a = p.parse_args()

    job = elastic.init()
    x, y = load_digits()
    x, y = torch.tensor(x, dtype=torch.float32) / 16.0, torch.tensor(y)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, a.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(a.hidden, 10)).to(job.device)
    data = job.sampler(len(x), batch_size=a.batch_size, seed=0)  # the run's global batch, if constant
    per_step = data.global_batch or a.batch_size * job.size
    opt = torch.optim.SGD(model.parameters(), lr=a.lr * per_step / a.batch_size, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    job.register(model=model, optimizer=opt)
    job.restore()
    for step in job.steps():
        opt.zero_grad()
        total, taken = 0.0, []
        for mb in job.micro_batches(data, model, opt):
            loss = F.cross_entropy(model(x[mb.indices]), y[mb.indices]) * mb.weight
            loss.backward()
            total += float(loss)
            taken += mb.indices.tolist()
        opt.step()
        job.record(total)
        if a.trace is not None:
            a.trace.mkdir(parents=True, exist_ok=True)
            with (a.trace / f"seg{job.segment:03d}-rank{job.rank}.jsonl").open("a") as f:
                f.write(json.dumps({"step": step, "rank": job.rank, "world": job.size, "indices": taken,
                                    "loss": total / job.size}) + "\n")


if __name__ == "__main__":
    main()
