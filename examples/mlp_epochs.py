"""An MLP on scikit-learn's handwritten digits in the shape of a plain Horovod script: an epoch
loop over a DataLoader with a DistributedSampler, a StepLR stepped after each epoch and a test
after each epoch. Elastic with four changes to the plain script (docs/worker.md shows the diff):
the import, ``elastic.init()``, ``elastic.DistributedSampler``, ``job.register`` + ``job.restore``
for the broadcasts, and ``job.epochs`` around the epoch range.

    elastic-ring train --script examples/mlp_epochs.py --gpus 1 --schedule 10:2,17:1 --slots 2 -- --epochs 3
    horovodrun -np 2 python examples/mlp_epochs.py --epochs 3    # plain Horovod, no controller
    python examples/mlp_epochs.py --epochs 3                     # one process

The run ends with the last epoch (no ``--steps``); a resize inside an epoch resumes at its next
batch, one at its end after its test and scheduler step.
"""

import argparse
import json
import os
from pathlib import Path

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import elastic_ring.worker as elastic
from elastic_ring.data import load_digits  # scikit-learn's digits, read without importing it


class Traced(TensorDataset):
    """The training set, remembering which samples the loader fetched (for --trace)."""

    fetched: list

    def __getitem__(self, i):
        self.fetched.append(int(i))
        return super().__getitem__(i)


def datasets(traced: bool):
    x, y = load_digits()
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))  # a fixed split
    x, y = torch.tensor(x, dtype=torch.float32)[order] / 16.0, torch.tensor(y)[order]
    split = 1440  # 80% to train (a multiple of the batches of 1 and 2 workers), the rest to test
    train = (Traced if traced else TensorDataset)(x[:split], y[:split])
    train.fetched = []
    return train, TensorDataset(x[split:], y[split:])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64, help="per worker")
    p.add_argument("--lr", type=float, default=0.1, help="per worker (scaled by the world size)")
    p.add_argument("--gamma", type=float, default=0.7, help="LR decay per epoch")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--batch-norm", action="store_true", help="a BatchNorm layer after the hidden one")
    p.add_argument("--log-interval", type=int, default=10)
    p.add_argument("--trace", default="", help="write each step's sample ids and LR, and each test, here")
    args = p.parse_args()

    job = elastic.init()
    torch.manual_seed(0)
    train_set, test_set = datasets(bool(args.trace))
    train_sampler = elastic.DistributedSampler(train_set, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    test_sampler = elastic.DistributedSampler(test_set, num_replicas=hvd.size(), rank=hvd.rank(),
                                              shuffle=False)
    test_loader = DataLoader(test_set, batch_size=128, sampler=test_sampler)

    model = torch.nn.Sequential(torch.nn.Linear(64, args.hidden),
                                *([torch.nn.BatchNorm1d(args.hidden)] if args.batch_norm else []),
                                torch.nn.ReLU(), torch.nn.Linear(args.hidden, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=args.gamma)
    job.register(model=model, optimizer=optimizer, scheduler=scheduler)
    job.restore()
    trace = Path(args.trace, f"trace-rank{hvd.rank()}.jsonl") if args.trace else None
    if trace:
        trace.parent.mkdir(parents=True, exist_ok=True)

    def train(epoch: int) -> None:
        model.train()
        train_sampler.set_epoch(epoch)
        for batch_idx, (data, target) in enumerate(train_loader):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(data), target)
            loss.backward()
            lr = optimizer.param_groups[0]["lr"]
            optimizer.step()
            if trace:
                with trace.open("a") as f:
                    f.write(json.dumps({"step": job.step, "rank": hvd.rank(), "world": hvd.size(), "epoch": epoch,
                                        "ids": train_set.fetched, "lr": lr, "pid": os.getpid()}) + "\n")
                train_set.fetched = []
            if batch_idx % args.log_interval == 0 and hvd.rank() == 0:
                print(f"epoch {epoch} batch {batch_idx}/{len(train_loader)} loss {loss.item():.4f}")

    def test(epoch: int) -> None:
        model.eval()
        sums = torch.zeros(3)  # loss, correct, samples of this rank
        with torch.no_grad():
            for data, target in test_loader:
                out = model(data)
                sums += torch.tensor([F.cross_entropy(out, target, reduction="sum").item(),
                                      (out.argmax(1) == target).sum().item(), len(target)])
        loss, correct, n = hvd.allreduce(sums, op=hvd.Sum, name="test_sums").tolist()
        if hvd.rank() == 0:
            print(f"epoch {epoch} test loss {loss / n:.4f} accuracy {correct / n:.3f}")
            if trace:
                with trace.open("a") as f:
                    f.write(json.dumps({"test": epoch, "accuracy": correct / n, "loss": loss / n}) + "\n")

    for epoch in job.epochs(1, args.epochs + 1):
        train(epoch)
        with job.evaluating():
            test(epoch)
        scheduler.step()


if __name__ == "__main__":
    main()
