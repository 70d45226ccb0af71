"""A script with the relative paths a user's script has: its data at ``--train-dir ../data``
(one number per line) and its own log folder ``./logs`` by default, both meant from the folder
it is run in, as under ``python relative_paths.py``. Each rank appends one line per segment to
``logs/rank<r>.txt`` naming the folder it ran in and the data it read."""

import argparse
import os
from pathlib import Path

import horovod.torch as hvd
import torch

import elastic_ring.worker as elastic


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--train-dir", default="../data")
    p.add_argument("--log-dir", default="./logs")
    a = p.parse_args()

    values = [float(v) for v in (Path(a.train_dir) / "train.txt").read_text().split()]
    job = elastic.init()
    Path(a.log_dir).mkdir(exist_ok=True)
    with open(Path(a.log_dir) / f"rank{job.rank}.txt", "a") as f:
        f.write(f"cwd={os.getcwd()} values={len(values)} size={job.size}\n")
    x = torch.tensor(values).view(-1, 1)
    model = torch.nn.Linear(1, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    data = job.sampler(len(values), batch_size=2, seed=0)
    job.register(model=model, optimizer=opt)
    job.restore()
    for _ in job.steps():
        idx = data.next_batch()
        loss = (model(x[idx]) - x[idx]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        job.record(loss, samples=len(idx))


if __name__ == "__main__":
    main()
