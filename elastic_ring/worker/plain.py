"""The job of a script run without elastic-ring: plain ``horovodrun -np N python script.py`` or
``python script.py`` (:class:`PlainJob`, what ``elastic.init()`` returns there).

The same script then behaves as the plain Horovod script it came from: ``hvd.init()``, one GPU per
local rank, ``restore()`` broadcasts rank 0's weights and optimizer state (the broadcasts it
replaced), ``job.epochs(a, b)`` is ``range(a, b)``, the drop-in sampler is torch's
``DistributedSampler``; no stop, no checkpoint, no event. ``job.steps()`` needs a length there:
``ELASTIC_RING_STEPS`` (the flat loop's ``--steps``).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from elastic_ring.worker.data import EpochData
from elastic_ring.worker.errors import NotLaunchedError
from elastic_ring.worker.sampler import Sampler

STEPS_ENV = "ELASTIC_RING_STEPS"


class PlainJob:
    """``job`` outside the controller: Horovod's own behaviour, with the library's names."""

    elastic = False
    inplace = False
    resumed = False
    previous_world = None
    lr_factor = 1.0
    segment = 0

    def __init__(self) -> None:
        import horovod.torch as hvd
        import torch

        self.hvd = hvd
        if not hvd.is_initialized():
            hvd.init()
        self.rank, self.size = hvd.rank(), hvd.size()
        self.local_rank, self.local_size = hvd.local_rank(), hvd.local_size()
        if torch.cuda.is_available():
            torch.cuda.set_device(self.local_rank)
            self.device = torch.device("cuda", self.local_rank)
        else:
            self.device = torch.device("cpu")
        raw = os.environ.get(STEPS_ENV, "").strip()
        self.total_steps = int(raw) if raw.isdigit() else None
        self.stop_at = self.total_steps
        self.step = 0
        self.finished = True  # no segment but this one: a script's final save runs
        self.stop_reason = None
        self._model = self._optimizer = None
        self._schedulers: list[Any] = []
        self._extras: dict[str, Any] = {}
        self.epoch_data = EpochData()  # the drop-in samplers (torch's order here: no position kept)
        self._sampler: Sampler | None = None
        self.restored = False
        self._finish_requested = False
        self._eval_hook: Callable[[int], Any] | None = None
        self._eval_every = 0
        self._in_steps = False
        self._step_depth = 0
        self._syncing = False

    # the names of Job, with Horovod's plain meaning
    def connect(self) -> None:
        pass

    def distributed_optimizer(self, optimizer, model, **kwargs: Any):
        kwargs.setdefault("op", self.hvd.Average)
        return self.hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), **kwargs)

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
                self.hvd.broadcast_parameters(self._model.state_dict(), root_rank=0)
            if self._optimizer is not None:
                self._syncing = True  # Horovod steps a fresh optimizer once to create its state
                try:
                    self.hvd.broadcast_optimizer_state(self._optimizer, root_rank=0)
                finally:
                    self._syncing = False
        self.restored = True
        return False

    def epochs(self, start: int, stop: int) -> Iterator[int]:
        return iter(range(start, stop))

    def steps(self) -> Iterator[int]:
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
                self._eval_hook(step)
            if self._sampler is not None and self._sampler._loader:
                self._sampler.cursor += self._sampler.batch_size * self.size
            if self._finish_requested:
                break
        self.stop_reason = "finished"

    def sampler(self, size: int, batch_size: int, seed: int = 0) -> Sampler:
        self._sampler = Sampler(self, size, batch_size, seed)
        return self._sampler

    def record(self, loss: Any = None, samples: int | None = None) -> None:
        pass

    def on_resize(self, fn: Callable[[int, int, int], None]) -> None:
        pass

    def on_evaluate(self, fn: Callable[[int], Any], every: int | None = None) -> None:
        self._eval_hook, self._eval_every = fn, every or 0

    def finish(self) -> None:
        self._finish_requested = True

    @contextmanager
    def evaluating(self):
        yield

    def current_lr(self) -> float:
        if self._optimizer is not None and self._optimizer.param_groups:
            return float(self._optimizer.param_groups[0]["lr"])
        return float("nan")
