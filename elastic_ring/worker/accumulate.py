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
within a rank, then across ranks). Their running statistics are made the unresized run's too
(:class:`RunningStats`): each rank's BatchNorm buffers have followed only its own micro-batches, so
at the step's end the ranks add up their parts of the sequential moving average (one small
allreduce per step, of the buffers' size) and every rank holds what one worker training the
``M`` micro-batches in order would hold.

:func:`passes` gives the contexts of one step's backward passes: Horovod's ``DistributedOptimizer``
allreduces after ``n`` backward passes on this rank (``set_backward_passes_per_step``: the count
may differ between ranks, each rank starts one allreduce per step), DDP skips the allreduce of all
but the last (``no_sync()``).
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Any

from elastic_ring.worker.errors import ContractError

RULE = "constant-batch"
STATS_NAME = "elastic_ring.batchnorm_running_stats"  # the combine's allreduce (RunningStats)


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


class RunningStats:
    """The BatchNorm running statistics of a constant global batch's step made the sequential ones:
    what one worker training the step's ``M`` micro-batches in order would hold.

    A BatchNorm layer in training mode updates its buffers at each forward pass ``k`` from that
    batch's statistics ``s_k``: with momentum ``m``, ``r <- q r + m s_k`` (``q = 1 - m``, linear);
    with ``momentum=None`` the cumulative average ``r <- r + (s_k - r) / t`` (``t``: the passes
    tracked, counting this one). Every rank starts the step with the same buffers ``r0``; rank ``i``
    runs its contiguous micro-batches, the last numbered ``b`` (0-based), ``k_i = n_i f`` forward
    passes of the layer (``n_i`` micro-batches, ``f`` passes each), and ends with ``r_i``. Its part:

    - momentum ``m``: ``c_i = (r_i - q^k_i r0) q^((M - 1 - b) f)``, and ``r = q^(M f) r0 + sum c_i``;
    - cumulative (``N0`` passes tracked at the step's start): ``c_i = (N0 + k_i) r_i - N0 r0``, and
      ``r = (N0 r0 + sum c_i) / (N0 + M f)``;

    ``num_batches_tracked`` becomes ``N0 + M f`` on every rank. The parts (float64) and each rank's
    ``f`` (checked equal) travel in one allreduce per step; at one worker the buffers are left as
    they are (the sequential run itself). Both ends work on all the layers' buffers as one vector
    (a few vector operations a step, whatever the layers: about 0.3 ms instead of 1.1 ms for the
    built-in ResNet-20's 19 layers, in one process), and at the first step of each segment on Horovod
    the allreduce's name is negotiated during the step's passes (:meth:`warm`), not after the
    gradients' allreduce.

    ``r0`` is taken by a forward pre-hook on each layer at the step's first training-mode forward
    pass (the passes are counted there too): any loop form, and after a resize's broadcast.
    :meth:`hold` puts ``r0`` back (what a checkpoint at this step's stop point must hold: the
    step may be dropped there) and returns ``r_i`` for :meth:`combine`.

    The hooks (on when made) are on only while :meth:`watch` says so, set before each step's
    first forward pass: at more than one worker, and in an epoch loop at any size (its stop point,
    the optimizer's step, comes after the step's forward passes and drops the step: a checkpoint
    there needs ``r0``). A ``job.steps()`` loop at one worker (the built-in trainer's) has nothing
    to reconcile and no stop inside a step: no hook, no copy, nothing per step. Its buffers are the
    sequential run's as they go; the first step after a grow takes its ``r0`` from them, and the
    first step after a shrink to one worker goes on from the combined ones. The check that a layer
    runs equally often in every micro-batch is then made at more than one worker only.
    """

    def __init__(self, layers: list[Any], job: Any) -> None:
        self.layers, self.job = layers, job
        self.start: list[tuple[Any, Any, Any]] | None = None  # (mean, var, tracked) per layer
        self.passes = [0] * len(layers)
        self.tag: Any = None
        self.hooks: list[Any] = []  # the layers' forward pre-hooks' handles, while watched
        self._coef: tuple[Any, dict[str, Any]] | None = None  # (key, vectors) of _coefficients
        self._warm_segment: int | None = None  # the segment whose first step warmed the allreduce (warm)
        self._warming: Any = None  # that warm-up's handle, until combine waits for it
        self.watch(True)

    def watch(self, on: bool) -> None:
        """Take ``r0`` and count the passes at the steps from now on (the layers' pre-hooks), or
        not (hooks removed: no step in progress, nothing per forward pass)."""
        if on and not self.hooks:
            self.hooks = [layer.register_forward_pre_hook(functools.partial(self._before, i))
                          for i, layer in enumerate(self.layers)]
        elif not on and self.hooks:
            for handle in self.hooks:
                handle.remove()
            self.hooks, self.start, self._warming = [], None, None

    def _before(self, i: int, layer: Any, args: Any) -> None:
        if not layer.training:
            return
        tag = (self.job.segment, self.job.step)
        if self.start is None or self.tag != tag:  # the step's first pass (or a step dropped at a stop)
            self.begin()
            self.tag = tag
        self.passes[i] += 1

    def begin(self) -> None:
        """``r0``: the buffers as they are now; no pass counted."""
        self.start = [(layer.running_mean.detach().clone(), layer.running_var.detach().clone(),
                       layer.num_batches_tracked.detach().clone()) for layer in self.layers]  # (no device sync)
        self.passes = [0] * len(self.layers)

    def forget(self) -> None:
        """No step in progress: the next training-mode forward pass begins one (a warm-up of a
        step left before its combine, :meth:`warm`, is not waited for)."""
        self.start, self._warming = None, None

    def _ends(self) -> list[tuple[Any, Any]]:
        return [(layer.running_mean.detach().clone(), layer.running_var.detach().clone()) for layer in self.layers]

    def hold(self) -> list[tuple[Any, Any]] | None:
        """This rank's ``r_i`` (None: no training pass this step); the buffers set back to ``r0``."""
        if self.start is None:
            return None
        ends = self._ends()
        for layer, (mean, var, tracked) in zip(self.layers, self.start):
            layer.running_mean.copy_(mean)
            layer.running_var.copy_(var)
            layer.num_batches_tracked.copy_(tracked)
        return ends

    def _per_pass(self, lay: Layout, rank: int) -> list[int]:
        n = len(lay.share(rank))
        for layer, k in zip(self.layers, self.passes):
            if k % n:
                raise ContractError(f"constant-batch: a BatchNorm layer ({type(layer).__name__}) ran {k} training "
                                    f"forward pass(es) over this worker's {n} micro-batch(es) of the step: every "
                                    "micro-batch must run it equally often")
        return [k // n for k in self.passes]

    def _flat(self, pairs: Any) -> Any:
        """Every layer's (mean, var) (1-D buffers) in one float64 vector: layer 0's mean, its
        variance, layer 1's mean..."""
        import torch

        return torch.cat([t for pair in pairs for t in pair[:2]]).double()

    def _coefficients(self, lay: Layout, rank: int, per: list[int]) -> dict[str, Any]:
        """The per-element float64 vectors of :meth:`contribution` and :meth:`apply` that depend on
        the layout, the rank and the passes only (made once per such set, then kept): momentum
        layers' ``q^k``, ``q^((M - 1 - b) f)`` and ``q^(M f)``, which elements are cumulative
        averages, which layers ran, the passes ``k`` and ``M f``; and each layer's elements."""
        import torch

        key = (lay, rank, tuple(per))
        if self._coef is not None and self._coef[0] == key:
            return self._coef[1]
        device = self.layers[0].running_mean.device
        share = lay.share(rank)
        later = lay.micro_batches - share.stop  # micro-batches after this rank's last
        sizes = torch.tensor([2 * layer.running_mean.numel() for layer in self.layers], device=device)

        def spread(values: list[float]) -> Any:
            return torch.tensor(values, dtype=torch.float64, device=device).repeat_interleave(sizes)

        qs = [1.0 if layer.momentum is None else 1.0 - layer.momentum for layer in self.layers]
        cumulative = [layer.momentum is None for layer in self.layers]
        coef = {"a": spread([q ** (len(share) * f) for q, f in zip(qs, per)]),
                "b": spread([1.0 if c else q ** (later * f) for q, c, f in zip(qs, cumulative, per)]),
                "g": spread([1.0 if c or not f else q ** (lay.micro_batches * f)
                             for q, c, f in zip(qs, cumulative, per)]),
                "k": spread([float(len(share) * f) for f in per]),
                "mf": spread([float(lay.micro_batches * f) for f in per]),
                "cum": spread([float(c) for c in cumulative]).bool() if any(cumulative) else None,
                "ran": spread([float(f > 0) for f in per]).bool(), "sizes": sizes,
                "counts": torch.tensor([lay.micro_batches * f for f in per], device=device),
                "per": torch.tensor(per, dtype=torch.float64, device=device)}
        self._coef = (key, coef)
        return coef

    def _tracked0(self, sizes: Any) -> Any:
        """Every layer's ``N0`` (passes tracked at the step's start), float64, per element."""
        import torch

        assert self.start is not None
        return torch.stack([tracked.reshape(()) for _, _, tracked in self.start]).double().repeat_interleave(sizes)

    def contribution(self, lay: Layout, rank: int, ends: list[tuple[Any, Any]]) -> Any:
        """This rank's ``c_i`` of every layer's mean and variance, then its ``f`` per layer: one
        float64 vector, to be summed over the ranks (see the class docstring). All the layers at
        once: ``c = (r_i p - a r0) b`` per element (momentum: ``p, a, b = 1, q^k, q^((M - 1 - b) f)``;
        cumulative: ``N0 + k, N0, 1``), the same float operations as layer by layer in a few
        vector operations instead of a dozen per layer."""
        import torch

        assert self.start is not None
        co = self._coefficients(lay, rank, self._per_pass(lay, rank))
        r0, ri = self._flat(self.start), self._flat(ends)
        if co["cum"] is None:
            c = (ri - co["a"] * r0) * co["b"]
        else:
            n0 = self._tracked0(co["sizes"])
            c = (ri * torch.where(co["cum"], n0 + co["k"], 1.0) - torch.where(co["cum"], n0, co["a"]) * r0) * co["b"]
        return torch.cat([c, co["per"]])

    def apply(self, total: Any, lay: Layout, rank: int) -> None:
        """Write the sequential buffers from the ranks' summed :meth:`contribution`. All the layers
        at once: ``r = (g r0 + c) / h`` per element (momentum: ``g, h = q^(M f), 1``; cumulative:
        ``N0, N0 + M f``); a layer that ran no training pass keeps ``r0``."""
        import torch

        assert self.start is not None
        n, per = len(self.layers), self._per_pass(lay, rank)
        for f_sum, f in zip(total[-n:].tolist(), per):
            if round(f_sum) != f * lay.world:
                raise ContractError("constant-batch: the workers ran a BatchNorm layer a different number of times "
                                    "per micro-batch: its running statistics cannot be combined")
        co = self._coefficients(lay, rank, per)
        r0, c = self._flat(self.start), total[:-n].to(self.layers[0].running_mean.device)
        if co["cum"] is None:
            out = co["g"] * r0 + c
        else:
            cum = co["cum"] & co["ran"]
            n0 = self._tracked0(co["sizes"])
            out = (torch.where(cum, n0, co["g"]) * r0 + c) / torch.where(cum, n0 + co["mf"], 1.0)
        out = torch.where(co["ran"], out, r0)
        bufs = [buf for layer in self.layers for buf in (layer.running_mean, layer.running_var)]
        dtype = bufs[0].dtype
        parts = (out.to(dtype) if all(buf.dtype == dtype for buf in bufs) else out).split(
            [buf.numel() for buf in bufs])
        torch._foreach_copy_(bufs, list(parts))  # (casts where a buffer's type differs)
        tracked = torch.stack([t.reshape(()) for _, _, t in self.start]) + co["counts"]
        torch._foreach_copy_([layer.num_batches_tracked for layer in self.layers], list(tracked.unbind()))

    def warm(self, collective: Any, segment: int) -> None:
        """At the first step of each segment at more than one worker (a relaunch, a ring re-formed
        in place), on Horovod: an allreduce of zeros the size, type and name of :meth:`combine`'s,
        started now, before the step's passes, and waited for by :meth:`combine` before its own.
        Horovod negotiates a tensor name it has not seen yet through its coordinator (the names it
        has seen: a bit in its response cache), and the first float64 allreduce of a new ring is
        slower than the next ones: both then happen in Horovod's background thread while this
        rank runs its forward and backward passes, instead of after the gradients' allreduce on
        the first step's path. Its name, cached before the gradients', then comes first in the
        cycle that carries both at every later step too. (Horovod's timelines of the built-in model
        resized 1 -> 2, machine loaded: without it the first step's combine ended 0.4-22 ms after
        the gradients' allreduce, median 3.1 ms in 5 runs, the later steps' median 1.6 ms after;
        with it the first step's ended 4-9 ms before, the later steps' median 1.6 ms before, in 3
        runs.) Nothing on another collective (no name to negotiate) or a fake one."""
        import torch

        if self._warm_segment == segment or getattr(collective, "name", None) != "horovod":
            return
        self._warm_segment = segment
        size = sum(2 * layer.running_mean.numel() for layer in self.layers) + len(self.layers)
        zeros = torch.zeros(size, dtype=torch.float64, device=self.layers[0].running_mean.device)
        self._warming = collective.allreduce_async(zeros, name=STATS_NAME)

    def combine(self, lay: Layout, rank: int, collective: Any, ends: list[tuple[Any, Any]] | None = None) -> None:
        """At the step's end, on every rank: the buffers become the sequential ones (``ends``: this
        rank's ``r_i`` from :meth:`hold`, else the buffers as they are). Nothing where no layer ran
        a training pass this step (on any rank: they all run the same code)."""
        warming, self._warming = self._warming, None
        if warming is not None:  # (every rank started it at this step: every rank waits for it)
            collective.wait(warming)
        if self.start is None:
            return
        if ends is None:  # (read once, into the contribution's vector: no copy of them first)
            ends = [(layer.running_mean, layer.running_var) for layer in self.layers]
        try:
            if lay.world == 1:  # the sequential run itself: r_i as it is
                self._per_pass(lay, rank)
                for layer, (mean, var), (_, _, tracked), k in zip(self.layers, ends, self.start, self.passes):
                    layer.running_mean.copy_(mean)
                    layer.running_var.copy_(var)
                    layer.num_batches_tracked.copy_(tracked + k)
                return
            total = collective.allreduce(self.contribution(lay, rank, ends), op="sum", name=STATS_NAME)
            self.apply(total, lay, rank)
        finally:
            self.start = None


def running_stats(model: Any, job: Any) -> RunningStats | None:
    """The :class:`RunningStats` of ``model``'s BatchNorm layers with running statistics (made
    once per set of layers, its hooks then registered), or None where it has none."""
    from torch.nn.modules.batchnorm import _BatchNorm
    from torch.nn.parameter import is_lazy

    modules = getattr(model, "modules", None)  # not a torch module: no layers
    layers = [m for m in (modules() if callable(modules) else ()) if isinstance(m, _BatchNorm) and m.track_running_stats
              and m.running_mean is not None and not is_lazy(m.running_mean)]
    if not layers:
        return None
    stats = layers[0].__dict__.get("_elastic_ring_running_stats")
    if stats is None or stats.layers != layers:
        if stats is not None:  # another set of layers: the old one's hooks off
            stats.watch(False)
        stats = RunningStats(layers, job)
        layers[0].__dict__["_elastic_ring_running_stats"] = stats
    model.__dict__["_elastic_ring_running_stats"] = stats  # (found without the walk: micro_batches at one worker)
    stats.job = job
    return stats


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
    job, lay = sampler.job, sampler.layout()
    if lay.world > 1:
        stats = running_stats(net, job)
    else:  # nothing to reconcile: no walk of the model, and the hooks of a step at more workers off
        stats = getattr(net, "__dict__", {}).get("_elastic_ring_running_stats")
        if stats is not None:
            stats.watch(False)
            stats = None
    if stats is not None:  # r0: at the step's first forward pass
        stats.watch(True)
        stats.forget()
        stats.warm(getattr(job, "collective", None), job.segment)  # a segment's first step: see RunningStats.warm
    parts = sampler.next_micro_batches()
    for (start, idx), ctx in zip(parts, passes(net, optimizer, len(parts))):
        with ctx:
            yield MicroBatch(idx, start, lay.loss_weight)
    if stats is not None:  # the BatchNorm buffers the unresized run's (one small allreduce)
        stats.combine(lay, job.rank, job.collective)


class EpochAccumulation:
    """A constant global batch in an epoch loop that calls ``zero_grad()``, ``backward()`` and
    ``step()`` once per loader batch, unchanged: the loader's batches are this rank's micro-batches
    (the training ``elastic.DistributedSampler`` yields them), and the registered optimizer's
    ``zero_grad`` and ``step`` (replaced on the instance) act once per step of the global batch.

    Per step of ``n`` micro-batches on this rank: ``zero_grad()`` clears the gradients only before
    the first; ``step()`` after each of the first ``n - 1`` does nothing (the gradients add up);
    after the ``n``-th it completes the allreduce, multiplies the averaged gradients by ``w / M``
    (the script's loss is each micro-batch's mean: this makes the update the global batch's mean
    gradient, uneven shares included) and runs the real step (its hooks: the stop points, the data
    position). The allreduce: Horovod's, started by its hooks after this rank's ``n``-th backward
    pass (``set_backward_passes_per_step``); DDP's (the module :meth:`~elastic_ring.worker.api.Job.parallel`
    gave, ``ddp``), whose forward pre-hook here turns off the gradients' sync of every forward pass
    but the step's ``n``-th (what ``no_sync()`` does, without the script's code: DDP decides at the
    forward pass). A DDP the script built itself cannot be reached: refused.
    """

    def __init__(self, job: Any, optimizer: Any, ddp: Any = None) -> None:
        if not callable(getattr(optimizer, "synchronize", None)) and ddp is None:
            raise ContractError("an epoch loop with a constant global batch needs the gradients' allreduce it can "
                                "hold back: a hvd.DistributedOptimizer (job.distributed_optimizer) or, with "
                                "--collective torch, the module job.parallel(model, optimizer) returns (not a "
                                "DistributedDataParallel built by the script)")
        self.job, self.opt, self.done, self.ddp = job, optimizer, 0, ddp
        if ddp is not None:
            ddp.register_forward_pre_hook(self._before_forward)
        model = getattr(job.state, "model", None)
        self.stats = running_stats(model, job) if model is not None else None
        if self.stats is not None:  # at one worker too: a stop at the step saves its r0 (hold)
            self.stats.watch(True)
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

    def _before_forward(self, module: Any, args: Any) -> None:
        """DDP: sync this pass's gradients only at this rank's last micro-batch of the step."""
        import torch

        if not module.training or not torch.is_grad_enabled() or self.job.state.syncing:
            return
        sampler = self.job._epoch_data.training_sampler()
        if sampler is None or sampler._layout() is None:  # not a pass of the training loop
            return
        sync = self.done >= self.passes() - 1
        setter = getattr(module, "set_grad_sync", None)  # ReformedDDP: DDP rebuilt per process group
        if callable(setter):
            setter(sync)
        else:
            module.require_backward_grad_sync = sync

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
        if self.ddp is None:
            self.opt.synchronize()
        if lay.loss_weight != 1.0:
            for group in self.opt.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.mul_(lay.loss_weight)
        stats = self.stats
        ends = stats.hold() if stats is not None else None  # a stop here saves the step's start
        with (self.opt.skip_synchronize() if self.ddp is None else contextlib.nullcontext()):
            out = self._step(*args, **kwargs)
        if stats is not None:  # the step is taken: the BatchNorm buffers the unresized run's
            stats.combine(lay, self.job.rank, self.job.collective, ends)
        return out


def accumulate_epoch_loop(job: Any, optimizer: Any) -> None:
    """Install :class:`EpochAccumulation` on the registered ``optimizer`` (once), over the DDP
    module ``job.parallel`` returned, if any."""
    if optimizer is not None and getattr(optimizer, "_elastic_ring_accumulation", None) is None:
        EpochAccumulation(job, optimizer, getattr(job, "parallel_module", None))
