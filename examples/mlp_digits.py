"""An MLP on scikit-learn's handwritten digits (1,797 real 8x8 images, offline), run elastically.

    elastic-ring train --script examples/mlp_digits.py --steps 600 --gpus 1 --resize-at 200 --to 2 \
        -- --hidden 128

The script keeps its own loop; `elastic_ring.worker` owns Horovod's start, the checkpointed state,
the data position and the points where a resize may stop it. The LR is set for the first world
size; at a resize the library rescales it by Eq. 7 (lr_new = w_new / w_old * lr_old).
"""

import argparse

import horovod.torch as hvd
import torch
import torch.nn.functional as F

import elastic_ring.worker as elastic
from elastic_ring.data import load_digits  # scikit-learn's digits, read without importing it


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--lr", type=float, default=0.05, help="per worker (scaled by the world size)")
    a = p.parse_args()

    job = elastic.init()
    x, y = load_digits()
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))  # a fixed split
    x, y = torch.tensor(x, dtype=torch.float32)[order] / 16.0, torch.tensor(y)[order]
    split = len(x) * 4 // 5  # 80% to train, 20% to test
    x_tr, y_tr, x_te, y_te = x[:split], y[:split], x[split:], y[split:]

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, a.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(a.hidden, 10)).to(job.device)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr * job.size, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    data = job.sampler(len(x_tr), batch_size=a.batch_size, seed=0)

    def evaluate(step: int) -> dict:
        with torch.no_grad():  # every rank evaluates the whole (small) test set
            out = model(x_te.to(job.device))
            return {"test_accuracy": (out.argmax(1).cpu() == y_te).float().mean().item(),
                    "test_loss": F.cross_entropy(out.cpu(), y_te).item(), "samples": len(y_te)}

    job.register(model=model, optimizer=opt)
    job.on_evaluate(evaluate, every=100)
    job.restore()
    for step in job.steps():
        idx = data.next_batch()
        loss = F.cross_entropy(model(x_tr[idx].to(job.device)), y_tr[idx].to(job.device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        job.record(loss, samples=len(idx))
    if job.finished and job.rank == 0:
        print(f"final test accuracy {evaluate(job.step)['test_accuracy']:.3f}")


if __name__ == "__main__":
    main()
