"""A worker rank (Algorithm 1, worker side): wait for OK (it carries the weights: the pull),
compute a gradient on a minibatch, emulate a slower device by sleeping, push.

Heterogeneity: the base step is ``max(compute, base_step_s)``; worker i's step lasts
``base * slowdown[i] * (1 + noise * z)`` (z standard normal from a per-worker seeded generator;
never shorter than the compute itself); the difference to the compute time is slept.

Fault injection for tests: ``ELASTIC_RING_PS_FAIL=RANK:PUSH`` makes that rank raise before its
PUSH-th push.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch
import torch.nn.functional as F

from elastic_ring.data import SampleStream, load_dataset, make_batch
from elastic_ring.ps.api import PSConfig
from elastic_ring.ps.model import build_model, get_buffers, get_grads, set_buffers, set_params

TAG_PUSH, TAG_OK, TAG_STOP, TAG_FINAL = 1, 2, 3, 4
FAIL_ENV = "ELASTIC_RING_PS_FAIL"


def injected_failure(rank: int) -> int | None:
    """The push before which this rank must fail (``ELASTIC_RING_PS_FAIL=RANK:PUSH``), or None."""
    raw = os.environ.get(FAIL_ENV, "")
    if not raw:
        return None
    r, _, p = raw.partition(":")
    return int(p or 1) if int(r) == rank else None


def recv_idle(comm, source: int, tag: int, status, max_sleep_s: float = 0.001):
    """``comm.recv`` that sleeps while waiting instead of busy-polling.

    Open MPI's blocking receive spins a core; with more ranks than cores (the CPU emulation) a held
    worker's spin would slow the others' compute, a cost that only paradigms that hold would pay.
    Polling ``Iprobe`` with a short, growing sleep (50 us up to ``max_sleep_s``) frees the core.
    """
    delay = 5e-5
    while not comm.Iprobe(source=source, tag=tag, status=status):
        time.sleep(delay)
        delay = min(max_sleep_s, delay * 2)
    return comm.recv(source=status.Get_source(), tag=status.Get_tag(), status=status)


def step_duration(compute_s: float, cfg: PSConfig, slowdown: float, rng: np.random.Generator) -> float:
    """Emulated duration of one step (seconds), >= the compute time."""
    base = max(compute_s, cfg.base_step_s)
    factor = slowdown * (1.0 + cfg.noise * rng.standard_normal()) if cfg.noise else slowdown
    return max(compute_s, base * factor)


def run_worker(cfg: PSConfig, rank: int, comm) -> None:
    from mpi4py import MPI

    torch.set_num_threads(1)
    model = build_model(cfg)
    model.train()
    train = load_dataset(cfg.dataset, True, cfg.data_dir, cfg.synthetic_size, cfg.seed)
    stream = SampleStream(len(train), cfg.seed * 1000 + rank)
    aug = torch.Generator().manual_seed(cfg.seed * 1000 + rank)
    rng = np.random.default_rng(cfg.seed * 7919 + rank)
    slowdown = cfg.slowdowns[rank - 1]
    fail_at = injected_failure(rank)
    cursor = pushes = 0
    compute_tot = sleep_tot = blocked_tot = 0.0
    comm.Barrier()
    start = sent = time.monotonic()
    status = MPI.Status()
    while True:
        msg = recv_idle(comm, 0, MPI.ANY_TAG, status)
        blocked_tot += time.monotonic() - sent
        if status.Get_tag() == TAG_STOP:
            comm.send(dict(pushes=pushes, compute_s=compute_tot, sleep_s=sleep_tot, blocked_s=blocked_tot,
                           wall_s=time.monotonic() - start), dest=0, tag=TAG_FINAL)
            return
        version, weights, buffers = msg
        set_params(model, weights)
        set_buffers(model, buffers)
        if fail_at is not None and pushes + 1 >= fail_at:
            raise RuntimeError(f"injected failure before push {pushes + 1} ({FAIL_ENV})")
        t = time.monotonic()
        x, y = make_batch(train, stream.take(cursor, cfg.batch_size), cfg.augment, aug)
        cursor += cfg.batch_size
        model.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        grad = get_grads(model)
        compute = time.monotonic() - t
        sleep = step_duration(compute, cfg, slowdown, rng) - compute
        if sleep > 0:
            time.sleep(sleep)
        compute_tot += compute
        sleep_tot += sleep
        pushes += 1
        comm.send(dict(grad=grad, buffers=get_buffers(model), version=version, loss=loss.item(),
                       compute_s=compute, sleep_s=sleep), dest=0, tag=TAG_PUSH)
        sent = time.monotonic()
