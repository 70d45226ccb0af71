"""The model as flat arrays (what travels between server and workers) and its evaluation.

Parameters travel as one float32 vector; so do the BatchNorm running statistics (the float
buffers). Workers train with batch statistics and push their updated running statistics with
each gradient; the server keeps the latest pushed ones (a running average carried from worker to
worker) and evaluates with them.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from elastic_ring.data import ArrayDataset, make_batch
from elastic_ring.nn.resnet import resnet
from elastic_ring.ps.api import PSConfig


def build_model(cfg: PSConfig) -> nn.Module:
    """``model: resnet``: the CIFAR ResNet of ``depth``/``width``; ``model: mlp``: one hidden layer
    of ``width`` units on the flattened 32x32x3 image (about 50 times cheaper per step than
    ResNet-8/8, for designs that must run many jobs on a few CPU cores)."""
    torch.manual_seed(cfg.seed)
    if cfg.model == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, cfg.width), nn.ReLU(), nn.Linear(cfg.width, 10))
    return resnet(cfg.depth, cfg.width, 10)


def float_buffers(model: nn.Module) -> list[torch.Tensor]:
    return [b for b in model.buffers() if b.is_floating_point()]


def get_params(model: nn.Module) -> np.ndarray:
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().numpy().astype(np.float32, copy=True)


def set_params(model: nn.Module, flat: np.ndarray) -> None:
    torch.nn.utils.vector_to_parameters(torch.from_numpy(np.asarray(flat, dtype=np.float32)), model.parameters())


def get_grads(model: nn.Module) -> np.ndarray:
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).numpy().astype(np.float32, copy=True)


def set_grads(model: nn.Module, flat: np.ndarray) -> None:
    v = torch.from_numpy(np.asarray(flat, dtype=np.float32))
    i = 0
    for p in model.parameters():
        n = p.numel()
        p.grad = v[i:i + n].view_as(p).clone()
        i += n


def get_buffers(model: nn.Module) -> np.ndarray:
    bufs = float_buffers(model)
    if not bufs:
        return np.zeros(0, np.float32)
    return torch.cat([b.reshape(-1) for b in bufs]).numpy().astype(np.float32, copy=True)


def set_buffers(model: nn.Module, flat: np.ndarray) -> None:
    v = torch.from_numpy(np.asarray(flat, dtype=np.float32))
    i = 0
    with torch.no_grad():
        for b in float_buffers(model):
            n = b.numel()
            b.copy_(v[i:i + n].view_as(b))
            i += n


@torch.no_grad()
def evaluate(model: nn.Module, test: ArrayDataset, max_samples: int = 0, batch: int = 512) -> tuple[float, float]:
    """(accuracy, mean loss) on the test set (its first ``max_samples`` samples if > 0)."""
    model.eval()
    n = len(test) if not max_samples else min(max_samples, len(test))
    correct, loss = 0, 0.0
    for start in range(0, n, batch):
        idx = torch.arange(start, min(n, start + batch))
        x, y = make_batch(test, idx, augment=False)
        out = model(x)
        loss += float(F.cross_entropy(out, y, reduction="sum"))
        correct += int((out.argmax(1) == y).sum())
    model.train()
    return correct / n, loss / n
