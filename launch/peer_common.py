"""What the peer scripts share with each other and with `elastic-ring train`'s built-in worker:
the same model (``elastic_ring.nn.resnet``), the same synthetic CIFAR-shaped data and the same
batch assembly (``elastic_ring.data.make_batch``), so that only the training harness differs.

Used by ``launch/peer_hvd.py`` (plain Horovod), ``launch/peer_ddp.py`` (torch DDP under torchrun)
and ``launch/peer_elastic.py`` (Horovod Elastic), all launched by ``scripts/bench_peers.py``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from elastic_ring import protocol
from elastic_ring.data import load_dataset, make_batch
from elastic_ring.data.stream import SampleStream
from elastic_ring.nn import resnet


def arguments(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--depth", type=int, default=20)
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=32, help="per worker")
    p.add_argument("--steps", type=int, default=200, help="total steps of the run")
    p.add_argument("--warmup", type=int, default=20, help="steps left out of the images/s")
    p.add_argument("--synthetic-size", type=int, default=4096)
    p.add_argument("--lr", type=float, default=0.1, help="per 128 images (scaled by the global batch)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--out", type=Path, default=None, help="rank 0 appends its records here (JSON lines)")
    return p


def setup(local_rank: int, local_size: int, device: str) -> torch.device:
    """One GPU per local rank, or ``cores / local workers`` CPU threads (as elastic-ring does)."""
    if device == "cuda":
        torch.cuda.set_device(local_rank)
        torch.backends.cudnn.benchmark = True
        return torch.device("cuda", local_rank)
    torch.set_num_threads(protocol.cpu_threads(local_size))
    return torch.device("cpu")


def build(a: argparse.Namespace, dev: torch.device):
    torch.manual_seed(0)
    model = resnet(a.depth, a.width, 10).to(dev)
    data = load_dataset("synthetic", True, synthetic_size=a.synthetic_size, seed=0, download=False)
    return model, data, SampleStream(len(data), 0)


def batch(data, stream: SampleStream, cursor: int, rank: int, b: int, dev: torch.device):
    idx = stream.take(cursor + rank * b, b)
    x, y = make_batch(data, idx, False)
    return x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)


def train_step(model, opt, x, y) -> torch.Tensor:
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss


def record(path: Path | None, **rec) -> None:
    if path is None:
        return
    rec.setdefault("time", time.time())
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()
