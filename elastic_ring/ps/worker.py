"""A worker rank (Algorithm 1, worker side): wait for OK (it carries the weights: the pull),
compute a gradient on a minibatch, emulate a slower device by sleeping, push.

Heterogeneity: the base step is ``max(compute, base_step_s)``; worker i's step lasts
``base * slowdown[i] * (1 + noise * z)`` (z standard normal from a per-worker seeded generator;
never shorter than the compute itself); the difference to the compute time is slept. With
``base_step_s`` well above the compute, every step lasts its *target* ``base_step_s * slowdown[i] *
(1 + noise * z)`` whatever the machine's load; a step whose compute exceeded its target is an
*overrun* (its length then depends on the load) and is counted, so a reader can see the padding held.
The i-th step of worker r draws the same z for every paradigm of a seed (the runs are paired).

Fault injection for tests: ``ELASTIC_RING_PS_FAIL=RANK:PUSH`` makes that rank raise before its
PUSH-th push.
"""

from __future__ import annotations

import time

import numpy as np
import torch
import torch.nn.functional as F

from elastic_ring import env
from elastic_ring.data import SampleStream, load_dataset, make_batch
from elastic_ring.ps.api import PSConfig
from elastic_ring.ps.model import build_model, get_buffers, get_grads, set_buffers, set_params

TAG_PUSH, TAG_OK, TAG_STOP, TAG_FINAL = 1, 2, 3, 4
FAIL_ENV = env.PS_FAIL


def injected_failure(rank: int) -> int | None:
    """The push before which this rank must fail (``ELASTIC_RING_PS_FAIL=RANK:PUSH``), or None."""
    fail = env.ps_fail()
    return fail[1] if fail is not None and fail[0] == rank else None


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
    return step_plan(compute_s, cfg, slowdown, rng)[0]


def step_plan(compute_s: float, cfg: PSConfig, slowdown: float,
              rng: np.random.Generator) -> tuple[float, float, bool]:
    """(duration, target, overrun) of one step.

    target: ``base_step_s * slowdown * (1 + noise * z)`` (0 without a base step); overrun: the
    compute alone took longer than a positive target, so the step lasted its compute.
    """
    base = max(compute_s, cfg.base_step_s)
    factor = slowdown * (1.0 + cfg.noise * rng.standard_normal()) if cfg.noise else slowdown
    target = cfg.base_step_s * factor
    return max(compute_s, base * factor), target, bool(target > 0 and compute_s > target)


class WorkerCompute:
    """What a worker does between OK and push: load the pulled weights, compute the gradient on its
    next minibatch. Its state is the data position and the augmentation generator of (seed, rank),
    so the MPI worker and the in-process engine (:mod:`elastic_ring.ps.inprocess`) compute the same
    gradients from the same pulls. ``model`` may be shared between workers of one process."""

    def __init__(self, cfg: PSConfig, rank: int, model: torch.nn.Module | None = None, train=None) -> None:
        self.cfg = cfg
        self.model = model if model is not None else build_model(cfg)
        self.model.train()
        self.train = train if train is not None else load_dataset(cfg.dataset, True, cfg.data_dir,
                                                                  cfg.synthetic_size, cfg.seed)
        self.stream = SampleStream(len(self.train), cfg.seed * 1000 + rank)
        self.aug = torch.Generator().manual_seed(cfg.seed * 1000 + rank)
        self.cursor = 0

    def gradient(self, weights: np.ndarray, buffers: np.ndarray) -> tuple[np.ndarray, np.ndarray, float, float]:
        """(gradient, updated BatchNorm buffers, loss, compute seconds) at the pulled weights."""
        set_params(self.model, weights)
        set_buffers(self.model, buffers)
        t = time.monotonic()
        x, y = make_batch(self.train, self.stream.take(self.cursor, self.cfg.batch_size), self.cfg.augment, self.aug)
        self.cursor += self.cfg.batch_size
        self.model.zero_grad(set_to_none=True)
        loss = F.cross_entropy(self.model(x), y)
        loss.backward()
        grad = get_grads(self.model)
        return grad, get_buffers(self.model), loss.item(), time.monotonic() - t


def run_worker(cfg: PSConfig, rank: int, comm) -> None:
    from mpi4py import MPI

    torch.set_num_threads(1)
    work = WorkerCompute(cfg, rank)
    rng = np.random.default_rng(cfg.seed * 7919 + rank)
    slowdown = cfg.slowdowns[rank - 1]
    fail_at = injected_failure(rank)
    pushes = 0
    compute_tot = sleep_tot = blocked_tot = max_compute = 0.0
    overruns = 0
    comm.Barrier()
    start = sent = time.monotonic()
    status = MPI.Status()
    while True:
        msg = recv_idle(comm, 0, MPI.ANY_TAG, status)
        blocked_tot += time.monotonic() - sent
        if status.Get_tag() == TAG_STOP:
            comm.send(dict(pushes=pushes, compute_s=compute_tot, sleep_s=sleep_tot, blocked_s=blocked_tot,
                           wall_s=time.monotonic() - start, overruns=overruns, max_compute_s=max_compute),
                      dest=0, tag=TAG_FINAL)
            return
        version, weights, buffers = msg
        if fail_at is not None and pushes + 1 >= fail_at:
            raise RuntimeError(f"injected failure before push {pushes + 1} ({FAIL_ENV})")
        grad, bufs, loss, compute = work.gradient(weights, buffers)
        if cfg.clock == "virtual":  # the server emulates the step length: no sleep, no overrun
            duration, target, overrun = compute, 0.0, False
        else:
            duration, target, overrun = step_plan(compute, cfg, slowdown, rng)
        sleep = duration - compute
        overruns += overrun
        max_compute = max(max_compute, compute)
        if sleep > 0:
            time.sleep(sleep)
        compute_tot += compute
        sleep_tot += sleep
        pushes += 1
        comm.send(dict(grad=grad, buffers=bufs, version=version, loss=loss,
                       compute_s=compute, sleep_s=sleep, target_s=target), dest=0, tag=TAG_PUSH)
        sent = time.monotonic()
