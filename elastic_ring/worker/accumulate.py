"""A constant global batch across world sizes (``lr_scaling: constant-batch``): the micro-batch
layout of a step and the gradient accumulation that trains it.

A step trains the global batch ``G``: ``M = G / b`` micro-batches of ``b`` samples, micro-batch
``m`` being the stream positions ``[cursor + m * b, cursor + (m + 1) * b)`` whatever the world size
(the per-worker batch of the run's start: with ``M`` workers, one micro-batch each, the step is the
one a run without accumulation trains). At ``w`` workers rank ``r`` takes a contiguous block of
``M // w`` micro-batches, one more for the first ``M % w`` ranks (:meth:`Layout.share`): uneven
shares where ``w`` does not divide ``M``. Each micro-batch's mean loss is weighted by ``w / M``
before its backward pass; the collective averages the ranks' summed gradients (divides by ``w``),
so the step's gradient is ``(1 / M) * sum over micro-batches`` = the gradient of the global batch's
mean loss, at any ``w`` and with uneven shares. A world of more than ``M`` workers is refused (a
worker with no micro-batch would have no gradient to give); so is a ``G`` that is not a multiple of
``b``. One step is one optimizer update; the data position moves by ``G`` per step.

Models with batch statistics (BatchNorm) see the same micro-batches at every world size, so their
forward passes are the same too; only the float reduction order differs (the sum of gradients
within a rank, then across ranks).

:func:`passes` gives the contexts of one step's backward passes: Horovod's ``DistributedOptimizer``
allreduces after ``n`` backward passes on this rank (``set_backward_passes_per_step``: the count
may differ between ranks, each rank starts one allreduce per step), DDP skips the allreduce of all
but the last (``no_sync()``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from elastic_ring.worker.errors import ContractError

RULE = "constant-batch"


def valid_worlds(global_batch: int, micro_batch: int) -> range:
    """The world sizes that can train ``global_batch`` in micro-batches of ``micro_batch``."""
    return range(1, global_batch // micro_batch + 1)


def layout_problem(global_batch: int, micro_batch: int, worlds: "list[int] | tuple[int, ...]" = ()) -> str | None:
    """Why ``global_batch`` cannot be trained in micro-batches of ``micro_batch`` at each of
    ``worlds`` (one line), or None."""
    if micro_batch < 1 or global_batch < micro_batch or global_batch % micro_batch:
        return (f"constant-batch: the global batch {global_batch} is not a multiple of the per-worker "
                f"batch {micro_batch} (the micro-batch): give --global-batch k x {micro_batch}")
    m = global_batch // micro_batch
    bad = sorted({w for w in worlds if not 1 <= w <= m})
    if bad:
        return (f"constant-batch: the global batch {global_batch} is {m} micro-batch(es) of {micro_batch}, "
                f"which {', '.join(map(str, bad))} worker(s) cannot share; valid worker counts: 1-{m} "
                f"(or a larger --global-batch)")
    return None


@dataclass(frozen=True)
class Layout:
    """The micro-batch layout of a step: ``global_batch`` samples in micro-batches of
    ``micro_batch``, over ``world`` workers (see the module docstring).

    Raises:
        ContractError: a global batch that is not a multiple of the micro-batch, or more workers
            than micro-batches.
    """

    global_batch: int
    micro_batch: int
    world: int

    def __post_init__(self) -> None:
        why = layout_problem(self.global_batch, self.micro_batch, (self.world,))
        if why is not None:
            raise ContractError(why)

    @property
    def micro_batches(self) -> int:
        """Micro-batches per step (all ranks)."""
        return self.global_batch // self.micro_batch

    def share(self, rank: int) -> range:
        """The micro-batches (numbers in the step, 0-based) rank ``rank`` trains."""
        q, r = divmod(self.micro_batches, self.world)
        first = rank * q + min(rank, r)
        return range(first, first + q + (1 if rank < r else 0))

    @property
    def loss_weight(self) -> float:
        """What each micro-batch's mean loss is multiplied by before its backward pass: ``w / M``
        (the collective then divides the sum of the ranks' gradients by ``w``)."""
        return self.world / self.micro_batches

    def samples_at(self, step: int) -> int:
        """Samples to count for this rank at ``step`` in the throughput (which counts rank 0's
        times the world): ``G / w`` per step, its fraction carried over, so that a window's count
        is the global batch's times its steps."""
        g, w = self.global_batch, self.world
        return step * g // w - (step - 1) * g // w

    def describe(self) -> str:
        """E.g. ``global batch 32 = 2 worker(s) x 2 micro-batch(es) of 8``; uneven:
        ``global batch 24 = 1 worker(s) x 2 + 1 worker(s) x 1 micro-batch(es) of 8``."""
        q, r = divmod(self.micro_batches, self.world)
        parts = [f"{self.world - r} worker(s) x {q}"] if r == 0 else [f"{r} worker(s) x {q + 1}"] + (
            [f"{self.world - r} worker(s) x {q}"] if q else [])
        return f"global batch {self.global_batch} = {' + '.join(parts)} micro-batch(es) of {self.micro_batch}"


def passes(net: Any, optimizer: Any, n: int) -> list[Any]:
    """The ``n`` contexts of this rank's backward passes of one step, in order: the gradients of
    all ``n`` are summed on this rank, and only then do they travel (one allreduce per step).

    Horovod's ``DistributedOptimizer`` (it has ``set_backward_passes_per_step``): its hooks start
    the allreduce at the ``n``-th backward pass (set before the step's first pass; it takes effect
    at once and again after every ``step()``). DDP (a module with ``no_sync``): every pass but the
    last under ``no_sync()``. Anything else (one process, no wrapper): plain passes."""
    if n < 1:
        raise ContractError(f"a step needs at least one backward pass on every rank, got {n}")
    setter = getattr(optimizer, "set_backward_passes_per_step", None)
    if callable(setter):
        if getattr(optimizer, "backward_passes_per_step", None) != n:
            setter(n)
        return [contextlib.nullcontext() for _ in range(n)]
    no_sync = getattr(net, "no_sync", None)
    if callable(no_sync):
        return [no_sync() for _ in range(n - 1)] + [contextlib.nullcontext()]
    return [contextlib.nullcontext() for _ in range(n)]


@dataclass(frozen=True)
class MicroBatch:
    """One of this rank's micro-batches of a step: ``indices`` (a LongTensor), ``start`` (the stream
    position of its first sample: a seed for its augmentation that does not depend on the world
    size), and ``weight``: what its mean loss is multiplied by before ``backward()``."""

    indices: Any
    start: int
    weight: float


def micro_batches(sampler: Any, net: Any, optimizer: Any) -> Any:
    """This rank's micro-batches of the step (:class:`MicroBatch`), each yielded inside the context
    of its backward pass (:func:`passes`): the loop's body runs its forward and backward there::

        opt.zero_grad()
        for mb in job.micro_batches(data, net, opt):
            loss = F.cross_entropy(net(x[mb.indices]), y[mb.indices]) * mb.weight
            loss.backward()
        opt.step()

    Under a constant global batch (a sampler with ``global_batch``) the step's share of this rank,
    the data position moved by the global batch; otherwise one micro-batch, the rank's batch
    (``next_batch()``) at weight 1, so that the same loop runs with every rule and outside the tool."""
    if not getattr(sampler, "global_batch", None):
        idx = sampler.next_batch()
        yield MicroBatch(idx, int(getattr(sampler, "last_start", 0)), 1.0)
        return
    weight = sampler.layout().loss_weight
    parts = sampler.next_micro_batches()
    for (start, idx), ctx in zip(parts, passes(net, optimizer, len(parts))):
        with ctx:
            yield MicroBatch(idx, start, weight)


class EpochAccumulation:
    """A constant global batch in an epoch loop that calls ``zero_grad()``, ``backward()`` and
    ``step()`` once per loader batch, unchanged: the loader's batches are this rank's micro-batches
    (the training ``elastic.DistributedSampler`` yields them), and the registered optimizer's
    ``zero_grad`` and ``step`` (replaced on the instance) act once per step of the global batch.

    Per step of ``n`` micro-batches on this rank: ``zero_grad()`` clears the gradients only before
    the first; ``step()`` after each of the first ``n - 1`` does nothing (the gradients add up);
    after the ``n``-th it completes the allreduce (Horovod: started by its hooks after this rank's
    ``n``-th backward pass, ``set_backward_passes_per_step``), multiplies the averaged gradients by
    ``w / M`` (the script's loss is each micro-batch's mean: this makes the update the global
    batch's mean gradient, uneven shares included) and runs the real step (its hooks: the stop
    points, the data position). Horovod only: DDP would allreduce every pass (its ``no_sync`` wraps
    the forward, in the script's code).
    """

    def __init__(self, job: Any, optimizer: Any) -> None:
        if not callable(getattr(optimizer, "synchronize", None)):
            raise ContractError("an epoch loop with a constant global batch needs a hvd.DistributedOptimizer "
                                "(job.distributed_optimizer); with --collective torch use job.steps() "
                                "with job.micro_batches()")
        self.job, self.opt, self.done = job, optimizer, 0
        self._step, self._zero_grad = optimizer.step, optimizer.zero_grad

        def step(*args: Any, **kwargs: Any) -> Any:
            return self.step(*args, **kwargs)

        if hasattr(self._step, "_wrapped_by_lr_sched"):  # it calls the schedulers' wrapper: no warning
            step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
        optimizer.step, optimizer.zero_grad = step, self.zero_grad
        optimizer._elastic_ring_accumulation = self

    def layout(self) -> Layout:
        sampler = self.job._epoch_data.training_sampler()
        lay = sampler._layout() if sampler is not None else None
        if lay is None:
            raise ContractError("a constant global batch in an epoch loop is split by elastic.DistributedSampler: "
                                "iterate the training set through one")
        return lay

    def passes(self) -> int:
        """This rank's micro-batches per step (set on Horovod's optimizer, where it changes)."""
        n = len(self.layout().share(self.job.rank))
        if getattr(self.opt, "backward_passes_per_step", n) != n:
            self.opt.set_backward_passes_per_step(n)
        return n

    def zero_grad(self, *args: Any, **kwargs: Any) -> Any:
        if self.done == 0 or self.job.state.syncing:
            return self._zero_grad(*args, **kwargs)
        return None

    def step(self, *args: Any, **kwargs: Any) -> Any:
        if self.job.state.syncing:
            return self._step(*args, **kwargs)
        n = self.passes()
        self.done += 1
        if self.done < n:
            return None
        self.done = 0
        lay = self.layout()
        self.opt.synchronize()
        if lay.loss_weight != 1.0:
            for group in self.opt.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.mul_(lay.loss_weight)
        with self.opt.skip_synchronize():
            return self._step(*args, **kwargs)


def accumulate_epoch_loop(job: Any, optimizer: Any) -> None:
    """Install :class:`EpochAccumulation` on the registered ``optimizer`` (once)."""
    if optimizer is not None and getattr(optimizer, "_elastic_ring_accumulation", None) is None:
        EpochAccumulation(job, optimizer)
