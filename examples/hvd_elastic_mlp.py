"""A Horovod Elastic script (an MLP on scikit-learn's digits): it runs as it is under elastic-ring.

    elastic-ring train --script examples/hvd_elastic_mlp.py --steps 1000 --gpus 1 \\
        --schedule 8:2,16:1 --relaunch inplace -- --epochs 2

Nothing in it is elastic-ring's: it is written against Horovod Elastic's API alone, so the same
file also runs under ``horovodrun -np 2 python examples/hvd_elastic_mlp.py`` and under Horovod
Elastic itself (``horovodrun --min-np 1 --max-np 2 --host-discovery-script ...``). The run length
is the script's ``--epochs``; ``--steps`` above is only a cap. The state (model, optimizer, the
sampler's position, epoch) is committed after every batch; a reset callback sets the LR for the
new number of workers. ``--log-samples DIR`` writes every rank's sample indices and LR per step
(one JSON line each, with the time the step ended), for checking that each sample of an epoch is
used exactly once, and for timing resizes.
"""

import argparse
import json
import os
import time

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits


class Indexed(torch.utils.data.Dataset):
    """(x, y, index): the index lets a test account for every sample."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16, help="per worker")
    p.add_argument("--lr", type=float, default=0.05, help="per worker (times the number of workers)")
    p.add_argument("--train-size", type=int, default=384)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--log-samples", default=None, help="folder for per-step sample logs")
    a = p.parse_args()

    hvd.init()
    x, y = load_digits(return_X_y=True)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x, y = torch.tensor(x, dtype=torch.float32)[order] / 16.0, torch.tensor(y)[order]
    n = a.train_size
    train_set, x_te, y_te = Indexed(x[:n], y[:n]), x[n:], y[n:]

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, a.hidden), torch.nn.ReLU(), torch.nn.Linear(a.hidden, 10))
    opt = torch.optim.SGD(model.parameters(), lr=a.lr * hvd.size(), momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    sampler = hvd.elastic.ElasticSampler(train_set, shuffle=True, seed=0)
    loader = torch.utils.data.DataLoader(train_set, batch_size=a.batch_size, sampler=sampler)

    def set_lr():  # after a reset: the LR for the new number of workers
        for g in opt.param_groups:
            g["lr"] = a.lr * hvd.size()

    log = None
    if a.log_samples:
        os.makedirs(a.log_samples, exist_ok=True)
        log = open(os.path.join(a.log_samples, f"samples-{os.getpid()}.jsonl"), "a")

    @hvd.elastic.run
    def train(state):
        while state.epoch < a.epochs:
            for xb, yb, idx in loader:
                lr = opt.param_groups[0]["lr"]
                loss = F.cross_entropy(model(xb), yb)
                opt.zero_grad()
                loss.backward()
                opt.step()
                state.sampler.record_batch(state.batch, a.batch_size)
                state.batch += 1
                if log is not None:
                    log.write(json.dumps({"epoch": state.epoch, "rank": hvd.rank(), "size": hvd.size(),
                                          "lr": lr, "idx": idx.tolist(), "t": time.time()}) + "\n")
                    log.flush()
                state.commit()
            state.epoch, state.batch = state.epoch + 1, 0
            state.sampler.set_epoch(state.epoch)
            state.commit()
        with torch.no_grad():
            return (model(x_te).argmax(1) == y_te).float().mean().item()

    state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0, batch=0)
    state.register_reset_callbacks([set_lr])
    accuracy = train(state)
    if hvd.rank() == 0:
        print(f"final test accuracy {accuracy:.3f}", flush=True)


if __name__ == "__main__":
    main()
