"""The built-in training script: a CIFAR ResNet (He et al. 2016) on the worker library.

It is a script like any user's (``elastic-ring train --script`` runs those the same way): the
library (:mod:`elastic_ring.worker`) owns the collective's start (Horovod, or torch.distributed with
``--collective torch``), the checkpointed state, the sample stream, the stop protocol and the
events; this file owns the model, the data and the LR recipe. Rank 0 prints a line at the first
step of each segment and every throughput window (what `elastic-ring logs` shows).

The recipe is read from ``RUN_DIR/config.yaml`` (:class:`~elastic_ring.config.api.TrainConfig`).
The LR is a pure function of the step and a saved :class:`~elastic_ring.worker.lr.LRState`
(an extra of the checkpoint); at a new world size the LR rule of the config (Eq. 7 by default)
rescales its base, so the decays still fire at the same steps. Under ``constant-batch`` the global
batch is ``global_batch`` at every world size: each rank trains its share of the step's
micro-batches of ``batch_size`` and accumulates their gradients before the one allreduce of the
step (:mod:`elastic_ring.worker.accumulate`), and the LR stays. The augmentation of each sample is
seeded by its position in the stream, so a resume is exact whatever the world sizes.

Model and data are built before the worker connects (``init(lazy=True)``): pre-launched workers
have everything ready when the old ones have checkpointed. On a GPU the training set is kept on the
device (CIFAR-10: 150 MB) and each batch is gathered, augmented and normalised there, so no batch
preparation runs on the host between the steps; and one warm-up step on a copy of the model (cuDNN's
autotuning for the batch's shapes, CUDA's lazy loading of kernels) runs before connecting, which
for a pre-launched worker is before it waits for the go. NCCL's communicators cannot be set up
there: the ring they belong to is formed only after the go.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Iterable, Iterator

import torch
import torch.nn.functional as F

import elastic_ring.worker as elastic
from elastic_ring.config.api import load_config
from elastic_ring.data import load_dataset, make_batch
from elastic_ring.nn import resnet
from elastic_ring.train.optim import SGD
from elastic_ring.worker.accumulate import RULE as CONSTANT_BATCH
from elastic_ring.worker.lr import RULES, LRState, initial_base_lr


def _aug_generator(seed: int, stream_pos: int) -> torch.Generator:
    return torch.Generator().manual_seed((seed * 7_919 + stream_pos) % (2**63 - 1))


def _trace(run_dir: Path, segment: int, rank: int, world: int, step: int, indices: torch.Tensor,
           loss: float | None = None) -> None:
    """One rank's samples of a step (and, once the step is done, ``loss``: its part of the global
    batch's mean loss; the ranks' parts sum to it)."""
    path = run_dir / "trace" / f"seg{segment:03d}-rank{rank}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    row = {"step": step, "rank": rank, "world": world, "indices": indices.tolist()}
    if loss is not None:
        row["loss"] = loss
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")


def warm_up(model: torch.nn.Module, ds, batch_size: int, augment: bool, device: torch.device,
            waits: bool = False) -> float:
    """One forward and backward pass of a training-sized batch on a copy of ``model`` (on a GPU, or
    on a CPU for a worker that waits for a go, ``waits``: a warm joiner): cuDNN autotunes for these
    shapes (``cudnn.benchmark``) and CUDA loads the kernels, the CPU's kernels are built for them
    (a warm joiner's first step at load 9 on 2 cores: 0.6 s without, 0.36 s with; one run each),
    before the go instead of after it. The model, its optimizer and every RNG are left untouched. Seconds taken."""
    if (device.type != "cuda" and not waits) or len(ds) == 0:
        return 0.0
    import copy
    import time

    t0 = time.perf_counter()
    m = copy.deepcopy(model)
    idx = torch.arange(batch_size) % len(ds)
    x, y = make_batch(ds, idx, augment, torch.Generator().manual_seed(0))
    F.cross_entropy(m(x), y).backward()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    del m, x, y
    return time.perf_counter() - t0


def shard_model(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` sharded with FSDP2's ``fully_shard``: each residual block, then the whole model
    (the stem and the head); its parameters become DTensors, which the worker library checkpoints
    sharded (BatchNorm's running statistics stay each rank's own, as under DDP)."""
    from torch.distributed.fsdp import fully_shard

    from elastic_ring.nn.resnet import BasicBlock

    for m in model.modules():
        if isinstance(m, BasicBlock):
            fully_shard(m)
    fully_shard(model)
    return model


def evaluate(job: elastic.Job, model: torch.nn.Module, test_ds, cfg) -> dict[str, float]:
    """Test loss and accuracy, each rank a strided share of the test set, summed by allreduce."""
    n = len(test_ds) if cfg.max_test_samples == 0 else min(len(test_ds), cfg.max_test_samples)
    mine = torch.arange(job.rank, n, job.size)
    model.eval()
    loss_sum, correct = 0.0, 0
    # a sharded model's forward gathers its shards from every rank: each rank runs as many
    batches = range(0, -(-n // job.size) if cfg.shard else len(mine), cfg.eval_batch_size)
    with torch.no_grad():
        for i in batches:
            if i >= len(mine):  # (a sharded model's rank with fewer test samples: a forward to match)
                model(make_batch(test_ds, torch.arange(1), False)[0].to(job.device))
                continue
            x, y = make_batch(test_ds, mine[i:i + cfg.eval_batch_size], False)
            out = model(x.to(job.device))
            y = y.to(job.device)
            loss_sum += float(F.cross_entropy(out, y, reduction="sum"))
            correct += int((out.argmax(1) == y).sum())
    tot = job.collective.allreduce(torch.tensor([loss_sum, float(correct)], dtype=torch.float64), "sum",
                                   name="eval")
    model.train()
    return {"test_loss": float(tot[0]) / n, "test_accuracy": float(tot[1]) / n, "samples": n}


def paced(steps: Iterable[int], floor_s: float) -> Iterable[int]:
    """``steps`` (the job's step boundary) with each loop body lasting at least ``floor_s``
    (``min_step_s``): the sleep comes after the body, its record included, before the next
    boundary. With no floor, ``steps`` itself (nothing added to the step's path)."""
    return _floored(steps, floor_s) if floor_s else steps


def _floored(steps: Iterable[int], floor_s: float) -> Iterator[int]:
    for step in steps:
        t0 = time.perf_counter()
        yield step
        time.sleep(max(0.0, floor_s - (time.perf_counter() - t0)))


def main() -> int:
    job = elastic.init(lazy=True, warm_compile=False)  # its SGD never imports torch._dynamo
    cfg = load_config(job.run_dir / "config.yaml")
    torch.manual_seed(cfg.seed)
    model = resnet(cfg.depth, cfg.width, cfg.num_classes).to(job.device)
    base_opt = SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                               weight_decay=cfg.weight_decay)
    cache = job.run_dir / "cache"
    train_ds = load_dataset(cfg.dataset, True, cfg.data_dir, cfg.synthetic_size, cfg.seed,
                            download=False, cache_dir=cache, synthetic_side=cfg.synthetic_side)
    if job.device.type == "cuda":
        train_ds = train_ds.to(job.device)  # batches are made on the GPU (make_batch)
    constant = cfg.lr_scaling == CONSTANT_BATCH
    global_batch = (cfg.global_batch or cfg.batch_size * job.size) if constant else None
    data = job.sampler(len(train_ds), cfg.batch_size, cfg.seed, global_batch=global_batch)
    test_ds = None
    warm_up(model, train_ds, cfg.batch_size, cfg.augment, job.device, waits=job.info.go_file is not None)

    job.connect()
    # Horovod: hvd.DistributedOptimizer builds a new optimizer over the same parameter groups with
    # its own (empty) state: `opt` holds the momentum buffers; register `opt`, not `base_opt`.
    # torch.distributed: `net` is DistributedDataParallel(model) and `opt` is `base_opt`.
    if cfg.shard:  # FSDP2: every residual block, then the model, sharded over the ranks; the
        net = shard_model(model)  # optimizer built again on its (new, DTensor) parameters
        opt = SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    else:
        net, opt = job.parallel(model, base_opt)  # average the gradients with the job's collective
    base = (initial_base_lr(cfg.lr, cfg.lr_reference_batch, global_batch, 1) if constant else
            initial_base_lr(cfg.lr, cfg.lr_reference_batch, cfg.batch_size, job.size))
    start = LRState(base, base / job.size, 0, cfg.warmup_steps) if cfg.warmup_steps else LRState(base)
    job.register(model=model, optimizer=opt, lr_state=vars(start).copy())

    def rescale(old: int, new: int, step: int) -> None:  # Eq. 7 on the base; decays unchanged
        st = LRState(**job.extras["lr_state"]).resized(RULES[cfg.lr_scaling], old, new, step,
                                                       cfg.resize_warmup_steps)
        job.extras["lr_state"] = vars(st).copy()

    def run_eval(step: int) -> dict[str, float]:
        nonlocal test_ds
        if test_ds is None:
            test_ds = load_dataset(cfg.dataset, False, cfg.data_dir, cfg.synthetic_size, cfg.seed,
                                   download=False, cache_dir=cache, synthetic_side=cfg.synthetic_side)
        return evaluate(job, model, test_ds, cfg)

    job.on_resize(rescale)
    job.on_evaluate(run_eval, every=cfg.eval_every)
    job.restore()
    lr_dict = job.extras["lr_state"]
    lr_state = LRState(**lr_dict)
    decay_steps, factor, b = cfg.decay_steps, cfg.decay_factor, cfg.batch_size
    model.train()
    every = max(1, job.info.throughput_window)  # rank 0's log line: at the first step, then every window
    first = job.step + 1
    for step in paced(job.steps(), cfg.min_step_s):
        if job.extras["lr_state"] is not lr_dict:  # rescaled in place (--relaunch inplace)
            lr_dict = job.extras["lr_state"]
            lr_state = LRState(**lr_dict)
        lr = lr_state.lr_at(step, decay_steps, factor)
        for g in opt.param_groups:
            g["lr"] = lr
        if constant:
            loss, samples, idx = accumulated_step(job, net, opt, data, train_ds, cfg, step)
        else:
            idx = data.next_batch()
            x, y = make_batch(train_ds, idx, cfg.augment, _aug_generator(cfg.seed, data.last_start))
            x, y = x.to(job.device, non_blocking=True), y.to(job.device, non_blocking=True)  # no-op on GPU data
            opt.zero_grad()
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            samples = b
        if cfg.trace_samples:
            _trace(job.run_dir, job.segment, job.rank, job.size, step, idx, float(loss) / job.size)
        job.record(loss, samples=samples)
        if job.rank == 0 and (step == first or step % every == 0 or step == job.stop_at):
            print(f"step {step}/{job.total_steps}  workers {job.size}  loss {loss.detach().item():.4f}  lr {lr:.4g}",
                  flush=True)
    return 0


def accumulated_step(job: elastic.Job, net, opt, data, train_ds, cfg,
                     step: int) -> tuple[torch.Tensor, int, torch.Tensor]:
    """One step of a constant global batch: this rank's micro-batches, each one's mean loss weighted
    by ``world / micro-batches`` and its gradients summed here, one allreduce (the collective's
    average), one optimizer update. Returns (this rank's weighted loss sum, whose mean over the
    ranks is the global batch's mean loss; the samples to count; this rank's indices)."""
    opt.zero_grad()
    total, taken = torch.zeros((), device=job.device), []
    for mb in job.micro_batches(data, net, opt):  # each inside its backward pass's context
        x, y = make_batch(train_ds, mb.indices, cfg.augment, _aug_generator(cfg.seed, mb.start))
        x, y = x.to(job.device, non_blocking=True), y.to(job.device, non_blocking=True)
        loss = F.cross_entropy(net(x), y) * mb.weight
        loss.backward()
        total += loss.detach()
        taken.append(mb.indices)
    opt.step()
    return total, data.layout().samples_at(step), torch.cat(taken)


if __name__ == "__main__":
    sys.exit(main())
