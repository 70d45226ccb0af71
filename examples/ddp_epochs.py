"""An MLP on scikit-learn's handwritten digits in the shape of a torchrun script: the ranks from
the process group, ``DistributedDataParallel``, an epoch loop over a DataLoader with a
DistributedSampler, a StepLR stepped after each epoch and a test after each epoch. Elastic under
``--collective torch`` with the changes docs/worker-torch.md shows as a diff: the import,
``elastic.init()`` for ``init_process_group()``, ``elastic.DistributedSampler``, ``job.register`` +
``job.restore`` for the script's own snapshot, and ``job.epochs`` around the epoch range.

    elastic-ring train --script examples/ddp_epochs.py --collective torch --gpus 1 --schedule 10:2,17:1 \\
        --slots 2 -- --epochs 3

The run ends with the last epoch (no ``--steps``); a resize inside an epoch resumes at its next
batch, one at its end after its test and scheduler step. Without the tool the same file is the plain
torchrun script (``elastic.init()`` is its ``init_process_group()``; no stop, no checkpoint), or, in
one process, a process group of one:

    torchrun --standalone --nproc_per_node 2 examples/ddp_epochs.py --epochs 3
    python examples/ddp_epochs.py --epochs 3
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

import elastic_ring.worker as elastic
from elastic_ring.data import load_digits  # scikit-learn's digits, read without importing it


def datasets():
    x, y = load_digits()
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))  # a fixed split
    x, y = torch.tensor(x, dtype=torch.float32)[order] / 16.0, torch.tensor(y)[order]
    split = 1440  # 80% to train, the rest to test
    return TensorDataset(x[:split], y[:split]), TensorDataset(x[split:], y[split:])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=64, help="per worker")
    p.add_argument("--lr", type=float, default=0.1, help="per worker (scaled by the world size)")
    p.add_argument("--gamma", type=float, default=0.7, help="LR decay per epoch")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--log-interval", type=int, default=10)
    args = p.parse_args()

    job = elastic.init()  # forms the process group (torchrun's script: dist.init_process_group())
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    train_set, test_set = datasets()
    train_sampler = elastic.DistributedSampler(train_set, num_replicas=world, rank=rank)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    test_loader = DataLoader(test_set, batch_size=128,
                             sampler=elastic.DistributedSampler(test_set, num_replicas=world, rank=rank,
                                                                shuffle=False))
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(64, args.hidden), torch.nn.ReLU(),
                                                        torch.nn.Linear(args.hidden, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * world, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=args.gamma)
    job.register(model=model.module, optimizer=optimizer, scheduler=scheduler)
    job.restore()  # the newest checkpoint, or a start; rank 0's state to every rank

    def train(epoch: int) -> None:
        model.train()
        train_sampler.set_epoch(epoch)
        for batch_idx, (data, target) in enumerate(train_loader):
            optimizer.zero_grad()
            loss = F.cross_entropy(model(data), target)
            loss.backward()
            optimizer.step()
            if batch_idx % args.log_interval == 0 and rank == 0:
                print(f"epoch {epoch} batch {batch_idx}/{len(train_loader)} loss {loss.item():.4f}")

    def test(epoch: int) -> None:
        model.eval()
        sums = torch.zeros(3)  # loss, correct, samples of this rank
        with torch.no_grad():
            for data, target in test_loader:
                out = model.module(data)
                sums += torch.tensor([F.cross_entropy(out, target, reduction="sum").item(),
                                      (out.argmax(1) == target).sum().item(), len(target)])
        dist.all_reduce(sums)
        loss, correct, n = sums.tolist()
        if rank == 0:
            print(f"epoch {epoch} test loss {loss / n:.4f} accuracy {correct / n:.3f}", flush=True)

    for epoch in job.epochs(1, args.epochs + 1):
        train(epoch)
        with job.evaluating():
            test(epoch)
        scheduler.step()


if __name__ == "__main__":
    main()
