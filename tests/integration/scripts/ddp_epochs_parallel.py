"""``examples/ddp_epochs.py`` with its model wrapped by ``job.parallel(model, optimizer)`` (what an
epoch loop under ``--lr-scaling constant-batch`` on ``--collective torch`` writes instead of
``DistributedDataParallel(model)``), a BatchNorm layer (``--bn-momentum``: its momentum, or
``none``: the cumulative average), and a trace for tests: each step's sample ids per rank and each
epoch's test (loss, accuracy)."""

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import elastic_ring.worker as elastic
from elastic_ring.data import load_digits


class Traced(TensorDataset):
    fetched: list

    def __getitem__(self, i):
        self.fetched.append(int(i))
        return super().__getitem__(i)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--trace", type=Path, required=True)
    p.add_argument("--bn-momentum", default="0.1", help="the BatchNorm layer's momentum; none: the cumulative average")
    args = p.parse_args()

    job = elastic.init()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    x, y = load_digits()
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x, y = torch.tensor(x, dtype=torch.float32)[order] / 16.0, torch.tensor(y)[order]
    train_set, test_set = Traced(x[:1440], y[:1440]), TensorDataset(x[1440:], y[1440:])
    train_set.fetched = []
    train_sampler = elastic.DistributedSampler(train_set, num_replicas=world, rank=rank)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    test_loader = DataLoader(test_set, batch_size=128,
                             sampler=elastic.DistributedSampler(test_set, num_replicas=world, rank=rank,
                                                                shuffle=False))
    momentum = None if args.bn_momentum.lower() == "none" else float(args.bn_momentum)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.BatchNorm1d(64, momentum=momentum), torch.nn.ReLU(),
                                torch.nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    net, optimizer = job.parallel(model, optimizer)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    job.register(model=model, optimizer=optimizer, scheduler=scheduler)
    job.restore()
    args.trace.mkdir(parents=True, exist_ok=True)
    trace = args.trace / f"trace-rank{rank}.jsonl"

    for epoch in job.epochs(1, args.epochs + 1):
        net.train()
        train_sampler.set_epoch(epoch)
        for data, target in train_loader:
            optimizer.zero_grad()
            F.cross_entropy(net(data), target).backward()
            optimizer.step()
            with trace.open("a") as f:
                f.write(json.dumps({"step": job.step, "rank": rank, "world": world, "epoch": epoch,
                                    "ids": train_set.fetched}) + "\n")
            train_set.fetched = []
        with job.evaluating():
            model.eval()
            sums = torch.zeros(3)
            with torch.no_grad():
                for data, target in test_loader:
                    out = model(data)
                    sums += torch.tensor([F.cross_entropy(out, target, reduction="sum").item(),
                                          (out.argmax(1) == target).sum().item(), len(target)])
            dist.all_reduce(sums)
            loss, correct, n = sums.tolist()
            if rank == 0:
                with trace.open("a") as f:
                    f.write(json.dumps({"test": epoch, "accuracy": correct / n, "loss": loss / n}) + "\n")
        scheduler.step()


if __name__ == "__main__":
    main()
