"""A small CNN on scikit-learn's digits with the parts real scripts have, run elastically:
AdamW with a warm-up + cosine LR scheduler, a DataLoader with loader processes, mixed precision
(bfloat16 autocast on CPU, float16 on a GPU) with a GradScaler, gradient clipping, an EMA of the
weights, periodic evaluation and an early stop at a target accuracy.

    elastic-ring train --script examples/cnn_recipes.py --steps 300 --gpus 1 \
        --schedule 100:2,200:1 -- --target-accuracy 0.9

Each of the recipes of docs/worker.md is a few lines here; tests/integration/test_recipes.py runs it.
"""

import argparse
import copy
import json

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR
from torch.utils.data import DataLoader, TensorDataset

import elastic_ring.worker as elastic
from elastic_ring.data import load_digits  # scikit-learn's digits, read without importing it


def make_scheduler(opt, total_steps: int, warmup: int):
    """Linear warm-up, then cosine decay to 5% (per step)."""
    return SequentialLR(opt, [LinearLR(opt, start_factor=0.1, total_iters=warmup),
                              CosineAnnealingLR(opt, T_max=max(1, total_steps - warmup),
                                                eta_min=opt.param_groups[0]["lr"] * 0.05)],
                        milestones=[warmup])


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.MaxPool2d(2), torch.nn.Flatten(), torch.nn.Linear(256, 10))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=16, help="per worker")
    p.add_argument("--lr", type=float, default=1e-2, help="per worker (scaled by the world size)")
    p.add_argument("--warmup", type=int, default=10, help="warm-up steps of the scheduler")
    p.add_argument("--loader-workers", type=int, default=2)
    p.add_argument("--amp", choices=["on", "off"], default="on")
    p.add_argument("--ema", type=float, default=0.9)
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--target-accuracy", type=float, default=0.0, help="stop early once reached")
    p.add_argument("--trace", default="", help="append each step's sample ids and LR here (JSONL)")
    a = p.parse_args()

    job = elastic.init()
    x, y = load_digits()
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x = torch.tensor(x, dtype=torch.float32)[order].reshape(-1, 1, 8, 8) / 16.0
    y = torch.tensor(y)[order]
    split = len(x) * 4 // 5
    train_set = TensorDataset(x[:split], y[:split], torch.arange(split))
    x_te, y_te = x[split:].to(job.device), y[split:].to(job.device)

    torch.manual_seed(0)
    model = make_model().to(job.device)
    ema = copy.deepcopy(model).requires_grad_(False)  # an extra module: restored in place
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr * job.size, weight_decay=1e-4)
    sched = make_scheduler(opt, job.total_steps, a.warmup)  # built before the wrapper: fine
    opt = job.distributed_optimizer(opt, model)
    amp_dtype = torch.bfloat16 if job.device.type == "cpu" else torch.float16
    scaler = torch.amp.GradScaler(job.device.type, enabled=a.amp == "on")
    data = job.sampler(len(train_set), batch_size=a.batch_size, seed=0)

    def evaluate(step: int) -> dict:
        with torch.no_grad():
            out = ema(x_te).float()
        acc = (out.argmax(1) == y_te).float().mean().item()
        if a.target_accuracy and acc >= a.target_accuracy:
            job.finish()  # every rank sees the same accuracy; one rank would be enough
        return {"test_accuracy": acc, "test_loss": F.cross_entropy(out, y_te).item(),
                "samples": len(y_te)}

    job.register(model=model, optimizer=opt, scheduler=sched, ema=ema, scaler=scaler)
    job.on_evaluate(evaluate, every=a.eval_every)
    job.restore()
    # the loader after restore(): it starts at the restored data position
    loader = DataLoader(train_set, batch_sampler=data, num_workers=a.loader_workers,
                        persistent_workers=False)
    batches = iter(loader)
    trace = open(f"{a.trace}-rank{job.rank}.jsonl", "a") if a.trace else None
    for step in job.steps():
        xb, yb, ids = next(batches)
        xb, yb = xb.to(job.device), yb.to(job.device)
        lr = opt.param_groups[0]["lr"]
        with torch.autocast(job.device.type, dtype=amp_dtype, enabled=a.amp == "on"):
            loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad()
        scaler.scale(loss).backward()
        opt.synchronize()  # Horovod's allreduce before unscaling and clipping
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        with opt.skip_synchronize():
            scaler.step(opt)
        scaler.update()
        sched.step()
        with torch.no_grad():
            for pe, pm in zip(ema.parameters(), model.parameters()):
                pe.lerp_(pm, 1.0 - a.ema)
        job.record(loss, samples=len(ids))
        if trace is not None:
            trace.write(json.dumps({"step": step, "rank": job.rank, "world": job.size, "lr": lr,
                                    "ids": ids.tolist()}) + "\n")
    del batches  # ends the loader processes before the worker exits
    if trace is not None:
        trace.close()
    if job.finished and job.rank == 0:
        print(f"finished at step {job.step}: test accuracy {evaluate(job.step)['test_accuracy']:.3f}")


if __name__ == "__main__":
    main()
