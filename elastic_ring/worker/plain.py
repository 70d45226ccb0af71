"""The job of a script run without elastic-ring (:class:`PlainJob`, what ``elastic.init()`` returns
there): plain ``horovodrun -np N python script.py``, plain ``torchrun --nproc_per_node N
script.py``, or ``python script.py``.

The same script then behaves as the plain script it came from, on its collective
(:func:`plain_collective`): on Horovod ``hvd.init()``; on ``torch.distributed``
``init_process_group()`` from torchrun's variables (gloo on the CPU, NCCL on GPUs), or, in one
process, a process group of one (so that ``DistributedDataParallel`` and ``dist.get_rank()`` work
as under torchrun with one worker). One GPU per local rank; ``restore()`` broadcasts rank 0's
weights and optimizer state (the broadcasts it replaced), ``job.epochs(a, b)`` is ``range(a, b)``,
the drop-in sampler is torch's ``DistributedSampler``; no stop, no checkpoint, no event.
``job.steps()`` needs a length there: ``ELASTIC_RING_STEPS`` (the flat loop's ``--steps``); without
it the script ends with that one line (:class:`~elastic_ring.worker.errors.NotLaunchedError`,
printed without a traceback, as are the library's :class:`~elastic_ring.worker.errors.ContractError`
lines: :func:`one_line_errors`).

CPU threads as under the tool (:func:`plain_threads`): where ``OMP_NUM_THREADS`` is not set (by
the user, or by the launcher: torchrun sets it, horovodrun does not), each process takes this
host's cores shared by its local workers (``ELASTIC_RING_CPU_THREADS`` overrides), as a worker of
`elastic-ring train` does, and rank 0 says so in one line.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping

from elastic_ring import env as envvars
from elastic_ring.worker import stepcost
from elastic_ring.worker.collective import COLLECTIVE_ENV, COLLECTIVES, HorovodCollective, TorchCollective
from elastic_ring.worker.data import EpochData
from elastic_ring.worker.errors import ContractError, NotLaunchedError
from elastic_ring.worker.sampler import Sampler
from elastic_ring.worker.segment import StopReason

STEPS_ENV = envvars.STEPS
OMP_ENV = "OMP_NUM_THREADS"


def plain_collective(env: Mapping[str, str] | None = None, modules: Mapping[str, Any] | None = None) -> str:
    """The collective of a script run without the tool: ``ELASTIC_RING_COLLECTIVE`` where set; else
    the launcher's, read from the variables it sets (horovodrun's or mpirun's ranks: ``"horovod"``;
    torchrun's ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``: ``"torch"``); in one
    process, ``"horovod"`` where the script imported ``horovod.torch``, else ``"torch"``.

    Raises:
        ContractError: ``ELASTIC_RING_COLLECTIVE`` names neither collective.
    """
    modules = sys.modules if modules is None else modules
    named = envvars.collective(env)
    if named:
        if named not in COLLECTIVES:
            raise ContractError(f"{COLLECTIVE_ENV}={named}: must be one of {', '.join(COLLECTIVES)}")
        return named
    if envvars.launched_by_horovodrun(env):
        return "horovod"
    if envvars.launched_by_torchrun(env):
        return "torch"
    return "horovod" if "horovod.torch" in modules else "torch"


class PlainJob:
    """``job`` outside the controller: the plain behaviour of the script's collective
    (``collective``: ``"horovod"`` or ``"torch"``; default :func:`plain_collective`), with the
    library's names."""

    elastic = False
    resumed = False
    previous_world = None
    lr_factor = 1.0
    segment = 0
    global_batch = None  # no constant global batch but the one a script gives job.sampler

    def __init__(self, collective: str | None = None) -> None:
        self.hvd: Any = None
        one_line_errors()
        if (collective or plain_collective()) == "torch":
            self._start_torch()
        else:
            self._start_horovod()
        threads = plain_threads(self.local_size)
        if threads is not None:
            import torch

            torch.set_num_threads(threads[0])
            if self.rank == 0:
                print(f"elastic-ring: {threads[0]} CPU thread(s) per worker: {threads[1]} (as under "
                      f"elastic-ring train; {OMP_ENV} sets another)", file=sys.stderr, flush=True)
        self.total_steps = envvars.steps()
        self.stop_at = self.total_steps
        self.step = 0
        self.finished = True  # no segment but this one: a script's final save runs
        self.stop_reason = None
        self._model = self._optimizer = None
        self._schedulers: list[Any] = []
        self._extras: dict[str, Any] = {}
        self._epoch_data = EpochData()  # the drop-in samplers (torch's order here: no position kept)
        self._sampler: Sampler | None = None
        self.restored = False
        self._finish_requested = False
        self._eval_hook: Callable[[int], Any] | None = None
        self._eval_every = 0
        self._in_steps = False
        self._step_depth = 0
        self._syncing = False
        self.meter = stepcost.install_plain(self)  # ELASTIC_RING_STEP_COST(_DIR): the same entries timed

    def _start_horovod(self) -> None:
        import horovod.torch as hvd

        self.hvd = hvd
        if not hvd.is_initialized():
            hvd.init()
        self.rank, self.size = hvd.rank(), hvd.size()
        self.local_rank, self.local_size = hvd.local_rank(), hvd.local_size()
        self.device = _device(self.local_rank)
        from elastic_ring import hvd_patches

        hvd_patches.wait_asleep(self.device.type)  # as under the tool: a CPU worker waits asleep
        self.collective: Any = HorovodCollective(hvd)

    def _start_torch(self) -> None:
        """The script's process group: torchrun's (``init_process_group()`` from its variables), or
        one of this process alone; one the script formed first is taken as it is."""
        import torch
        import torch.distributed as dist

        torchrun = envvars.launched_by_torchrun()
        self.local_rank = envvars.torchrun_local()[0] if torchrun else 0
        self.device = _device(self.local_rank)
        backend = "nccl" if self.device.type == "cuda" and dist.is_nccl_available() else "gloo"
        if not dist.is_initialized():
            if torchrun:
                dist.init_process_group(backend)
            else:
                dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        self.rank, self.size = dist.get_rank(), dist.get_world_size()
        self.local_size = envvars.torchrun_local(size=self.size)[1] if torchrun else 1
        on = self.device if dist.get_backend() == "nccl" else torch.device("cpu")
        self.collective = TorchCollective(dist, on)

    # the names of Job, with the plain meaning of the script's collective
    def connect(self) -> None:
        pass

    def distributed_optimizer(self, optimizer, model, **kwargs: Any):
        if self.hvd is None:
            raise ContractError("job.distributed_optimizer() is Horovod's: on torch.distributed wrap the "
                                "model in DistributedDataParallel (or use job.parallel(model, optimizer))")
        kwargs.setdefault("op", self.hvd.Average)
        return self.hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), **kwargs)

    def parallel(self, model, optimizer, **kwargs: Any) -> tuple[Any, Any]:
        if self.collective.name == "torch":
            return self.collective.data_parallel(model, **kwargs), optimizer
        return model, self.distributed_optimizer(optimizer, model, **kwargs)

    def register(self, model=None, optimizer=None, scheduler=None, **extras: Any) -> None:
        if model is not None:
            self._model = model
        if optimizer is not None and optimizer is not self._optimizer:
            self._optimizer = optimizer
            if hasattr(optimizer, "register_step_post_hook"):
                optimizer.register_step_pre_hook(self._before_optimizer_step)
                optimizer.register_step_post_hook(self._after_optimizer_step)
        if scheduler is not None:
            self._schedulers.extend(scheduler if isinstance(scheduler, (list, tuple)) else [scheduler])
        self._extras.update(extras)

    def _before_optimizer_step(self, opt, args, kwargs) -> None:
        self._step_depth += 1  # Horovod's step runs the wrapped class's step, hooked too

    def _after_optimizer_step(self, opt, args, kwargs) -> None:
        self._step_depth -= 1
        if not self._in_steps and self._step_depth == 0 and not self._syncing:
            # an epoch loop: job.step counts the optimizer's steps
            self.step += 1

    @property
    def extras(self) -> dict[str, Any]:
        return self._extras

    def restore(self) -> bool:
        """Rank 0's weights and optimizer state to every rank (what the plain script broadcast)."""
        if self.size > 1:
            if self._model is not None:
                self.collective.broadcast_parameters(self._model.state_dict(), 0)
            if self._optimizer is not None:
                self._syncing = True  # Horovod steps a fresh optimizer once to create its state
                try:
                    self.collective.broadcast_optimizer_state(self._optimizer, 0)
                finally:
                    self._syncing = False
        self.restored = True
        return False

    def epochs(self, start: int, stop: int) -> Iterator[int]:
        epochs = iter(range(start, stop))
        return self.meter.loop(epochs, "epochs.next", False) if self.meter else epochs

    def steps(self) -> Iterator[int]:
        steps = self._steps()
        return self.meter.loop(steps, "boundary", False) if self.meter else steps

    def _steps(self) -> Iterator[int]:
        if self.total_steps is None:
            raise NotLaunchedError(f"job.steps() outside elastic-ring needs the run's length: set "
                                   f"{STEPS_ENV}=N (or run it with `elastic-ring train --script`)")
        if not self.restored:
            self.restore()
        self._in_steps = True
        for step in range(1, self.total_steps + 1):
            yield step
            self.step = step
            if self._eval_hook is not None and (step == self.total_steps or (
                    self._eval_every and step % self._eval_every == 0)):
                self._evaluate(step)
            if self._sampler is not None and self._sampler._loader:
                self._sampler.cursor += self._sampler.batch_size * self.size
            if self._finish_requested:
                break
        self.stop_reason = StopReason.FINISHED

    def sampler(self, size: int, batch_size: int, seed: int = 0, global_batch: int | None = None) -> Sampler:
        self._sampler = Sampler(self, size, batch_size, seed, global_batch)
        stepcost.entries(self._sampler, stepcost.SAMPLER_ENTRIES)
        return self._sampler

    def micro_batches(self, sampler: Sampler, net: Any, optimizer: Any) -> Iterator[Any]:
        from elastic_ring.worker.accumulate import micro_batches

        return stepcost.loop(micro_batches(sampler, net, optimizer), "micro_batches")

    def record(self, loss: Any = None, samples: int | None = None) -> None:
        pass

    def on_resize(self, fn: Callable[[int, int, int], None]) -> None:
        pass

    def on_evaluate(self, fn: Callable[[int], Any], every: int | None = None) -> None:
        self._eval_hook, self._eval_every = fn, every or 0

    def _evaluate(self, step: int) -> None:
        self._eval_hook(step)

    def finish(self) -> None:
        self._finish_requested = True

    @contextmanager
    def evaluating(self):
        yield



def plain_threads(local_size: int, env: Mapping[str, str] | None = None) -> tuple[int, str] | None:
    """(intra-op threads, why) of a process of a script run without the tool, by the tool's rule
    (:func:`elastic_ring.protocol.cpu_threads`: ``ELASTIC_RING_CPU_THREADS``, else this process's
    cores shared by the ``local_size`` workers of its host); None where ``OMP_NUM_THREADS`` is set
    and ``ELASTIC_RING_CPU_THREADS`` is not (the user's count, or the launcher's, stands)."""
    from elastic_ring import protocol

    ours = envvars.cpu_threads(env)
    if ours is not None:
        return ours, f"{protocol.CPU_THREADS_ENV}={ours}"
    if envvars.omp_threads_set(env):
        return None
    cores = protocol.usable_cores()
    n = max(1, cores // max(1, local_size))
    return n, f"this host's {cores} core(s) shared by its {local_size} worker(s)"


def one_line_errors() -> None:
    """The library's own errors (:class:`NotLaunchedError`, :class:`ContractError`), uncaught by a
    script run without the tool, end it with their one line instead of a traceback (exit status 1,
    as any uncaught exception); every other exception is reported as before."""
    before = sys.excepthook
    if getattr(before, "elastic_ring", False):
        return

    def hook(kind, exc, tb):
        if issubclass(kind, (NotLaunchedError, ContractError)):
            print(f"elastic-ring: error: {exc}", file=sys.stderr, flush=True)
        else:
            before(kind, exc, tb)

    hook.elastic_ring = True
    sys.excepthook = hook


def _device(local_rank: int) -> Any:
    """One GPU per local rank (made the current one), or the CPU."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")
