"""The worker library: what every elastic Horovod script needs, and nothing about its model.

A script run by ``elastic-ring train --script`` keeps its own loop; the library owns Horovod's
start, the state that survives a resize or a crash, the data position, and the points where a
stop may happen::

    import horovod.torch as hvd
    import elastic_ring.worker as elastic

    job = elastic.init()                          # pre-launch wait, hvd.init(), device / threads
    model = Net().to(job.device)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05 * job.size),
                                   named_parameters=model.named_parameters())
    data = job.sampler(len(train_set), batch_size=32, seed=0)
    job.register(model=model, optimizer=opt)      # plus scheduler=..., picklable extras
    job.restore()                                 # or start; LR rescaled by Eq. 7 on a new size
    for step in job.steps():                      # stops where the controller asks
        idx = data.next_batch()                   # this rank's share of the global batch
        loss = train_step(idx)
        job.record(loss, samples=len(idx))
    if job.finished:
        print("done")

Life of a segment (one world size): ``init`` -> ``restore`` (rank 0 loads the newest loadable
checkpoint and broadcasts model, optimizer state, extras and counters) -> ``steps()`` yields
``step + 1 .. stop_at``. Between steps the library writes the throughput windows, runs the
evaluation hook, takes periodic checkpoints (rank 0 copies the state to the CPU; a thread writes
it) and, every ``control_every`` steps, lets all ranks agree (one allreduce of rank 0's flag)
whether the controller asked for an early stop (the vote travels with the next step's gradients
and is read one check later: no blocking collective between steps). At the stop it writes a checkpoint and a
``segment_end`` event and all ranks leave together.

The LR on a world-size change: by default every param group's ``lr`` restored from the checkpoint,
and everything the registered LR schedulers compute from (``base_lrs``, ``max_lr``...), is rescaled
by the run's rule (Eq. 7, ``lr_new = w_new / w_last * lr_last``; :func:`elastic_ring.worker.lr.
scale_lr_state`), so every later step's LR is Eq. 7 of the unresized schedule's; ``job.lr_factor``
is the product of all rescalings so far, for scripts that compute their LR themselves; or register
a rule of your own with :meth:`Job.on_resize`. ``job.finish()`` ends the job early.

A plain Horovod script keeps its own epoch loop instead of ``job.steps()``: ``for epoch in
job.epochs(1, args.epochs + 1)`` over a DataLoader with ``elastic.DistributedSampler``; its stop
points are the registered optimizer's steps (:mod:`elastic_ring.worker.hooked`,
:mod:`elastic_ring.worker.data`). Outside the tool ``init()`` returns the plain job
(:mod:`elastic_ring.worker.plain`).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from elastic_ring import protocol
from elastic_ring.protocol import LaunchInfo
from elastic_ring.worker.checks import check_hvd_not_initialised, check_registration
from elastic_ring.worker.data import DataPosition, DistributedSampler  # noqa: F401 - re-exported
from elastic_ring.worker.errors import ContractError, NotLaunchedError  # noqa: F401 - re-exported
from elastic_ring.worker.hooked import HookedSteps, StopSegment  # noqa: F401 - re-exported
from elastic_ring.worker.inplace import (INPLACE_ENV, MEMBER_ENV, RING_BY_CONTROLLER,  # noqa: F401 - re-exported
                                         InPlaceMixin, Retired, inplace_action_file,
                                         take_ahead_action, taken_action_file)
from elastic_ring.worker.loop import StepLoopMixin
from elastic_ring.worker.progress import ProgressMixin, _Window  # noqa: F401 - re-exported
from elastic_ring.worker.resume import CheckpointMixin
from elastic_ring.worker.sampler import Sampler
from elastic_ring.worker.state import (_bind_scheduler, _distributed_optimizers, _restore_in_place,  # noqa: F401
                                       _rng_state, _saved_form, _set_rng_state)

if TYPE_CHECKING:
    from elastic_ring.worker.plain import PlainJob

def warm_imports() -> None:
    """Import what a worker's first optimizer step would import lazily on its critical path:
    ``torch.optim`` imports ``torch._dynamo`` at the first ``step()`` or ``load_state_dict()``
    (seconds in a fresh process; Horovod's optimizer-state broadcast is such a first step)."""
    try:
        import torch._dynamo  # noqa: F401
    except Exception:  # noqa: BLE001 - the lazy import later raises it where it matters
        pass


@contextmanager
def _warming_meanwhile() -> Iterator[None]:
    """Run :func:`warm_imports` in a thread while the caller waits in C code that imports nothing
    (``hvd.init()``, which holds no GIL while the ring's rendezvous waits for the other ranks);
    joined before the caller goes on, so no import of the caller's runs beside it."""
    if "torch._dynamo" in sys.modules:
        yield
        return
    t = threading.Thread(target=warm_imports, daemon=True, name="elastic-ring-warm-imports")
    t.start()
    try:
        yield
    finally:
        t.join()


_T_IMPORTED = time.time()
_INIT_CALLED = False  # read by the entry point's watchdog: a script that never calls init()


class Job(ProgressMixin, CheckpointMixin, InPlaceMixin, StepLoopMixin):
    """One worker process's view of the elastic job (see the module docstring).

    The user-facing methods are here; the machinery behind them is mixed in by concept:
    :class:`~elastic_ring.worker.progress.ProgressMixin` (events, throughput windows, heartbeats),
    :class:`~elastic_ring.worker.resume.CheckpointMixin` (checkpoints, state sync, Eq. 7),
    :class:`~elastic_ring.worker.inplace.InPlaceMixin` (pause and re-formed ring) and
    :class:`~elastic_ring.worker.loop.StepLoopMixin` (a segment's steps and the stop vote).
    """

    def __init__(self, info: LaunchInfo, lazy: bool = False) -> None:
        import torch

        self.info = info
        self.run_dir = Path(info.run_dir)
        self.segment = info.segment
        self.stop_at = info.stop_at
        self.total_steps = info.total_steps
        env = os.environ
        self._marks: dict[str, float] = {"imports": _T_IMPORTED}
        try:
            import psutil

            self._t_start = psutil.Process().create_time()
        except Exception:  # noqa: BLE001
            self._t_start = _T_IMPORTED
        if all(k in env for k in ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE")):
            self.rank, self.size = int(env["HOROVOD_RANK"]), int(env["HOROVOD_SIZE"])
            self.local_rank, self.local_size = int(env["HOROVOD_LOCAL_RANK"]), int(env["HOROVOD_LOCAL_SIZE"])
        else:  # not under horovodrun's environment (e.g. mpirun): ask Horovod now
            self._hvd_init()
            hvd = self.hvd
            self.rank, self.size = hvd.rank(), hvd.size()
            self.local_rank, self.local_size = hvd.local_rank(), hvd.local_size()
        if info.device == "cuda":
            torch.cuda.set_device(self.local_rank)
            self.device = torch.device("cuda", self.local_rank)
            torch.backends.cudnn.benchmark = True
        else:
            self.device = torch.device("cpu")
        torch.set_num_threads(protocol.cpu_threads(self.local_size))  # on GPUs too: cores launch kernels
        self.elastic = True  # under the controller (the plain job of a script run without it: False)
        self._samplers: list[DistributedSampler] = []  # the drop-in samplers, in creation order
        self._iterated: DistributedSampler | None = None  # the one iterated last (feeds the steps)
        self._position = DataPosition()  # the epoch loop's data position
        self._hooked = HookedSteps(self)  # the steps counted at the optimizer's (an epoch loop)
        self._flat = False  # the script runs job.steps()
        self._by_commit = False  # a Horovod Elastic script: its commits are the stop points (hvd_elastic)
        self._saved_rng: dict[str, Any] | None = None  # the RNG state to checkpoint (epoch loop)
        self._threads_warned = False
        self._syncing = False
        self._resume_rng: dict[str, Any] | None = None
        self._step_depth = 0  # inside the registered optimizer's step (its hooks may nest)
        self.step = 0
        self.resumed = False
        self.previous_world: int | None = None
        self.lr_factor = 1.0
        self.finished = False
        self.stop_reason: str | None = None
        self._model = None
        self._optimizer = None
        self._schedulers: list[Any] = []
        self._extras: dict[str, Any] = {}
        self._finish_requested = False
        self._lr_used: float | None = None
        self._lr_stepped: float | None = None
        self._sampler: Sampler | None = None
        self._resize_hooks: list[Callable[[int, int, int], None]] = []
        self._eval_hook: Callable[[int], dict[str, float] | None] | None = None
        self._eval_every = info.eval_every
        self._events = None
        self._store = None
        self._writer = None
        self._last_ckpt_step = -1
        self._last_ckpt_t = time.time()
        self._last_progress_t = 0.0
        self._beat = None  # this rank's heartbeat (controller.watchdog), opened at its first step
        self._beat_key: tuple[int, int] | None = None
        self._restored = False
        self.inplace = os.environ.get(INPLACE_ENV) in ("1", RING_BY_CONTROLLER)
        self.ring_by_controller = os.environ.get(INPLACE_ENV) == RING_BY_CONTROLLER
        self._hosts_updated_at: float | None = None
        self._decided = 0.0
        self.checkpoint_stalls: list[float] = []  # seconds on the training thread per checkpoint
        if self.rank == 0:
            from elastic_ring.events.api import EventLog

            self._events = EventLog(self.run_dir / protocol.WORKER_EVENTS)
        protocol.write_pid_record(self.run_dir, self.rank, info.owner, info.segment)
        if not lazy:
            self.connect()

    # ------------------------------------------------------------------ Horovod
    def _hvd_init(self) -> None:
        import horovod.torch as hvd

        self.hvd = hvd
        if not hvd.is_initialized():
            with _warming_meanwhile():
                hvd.init()

    def connect(self) -> None:
        """Wait for the go of a pre-launched segment, then ``hvd.init()`` (idempotent).

        ``init(lazy=True)`` leaves this to the script (or to :meth:`restore`), so that a
        pre-launched worker builds its model and data before it waits.
        """
        if getattr(self, "_connected", False):
            return
        self._marks["build"] = time.time()
        go = None
        if self.info.go_file is not None:
            go = self._wait_for_go(self.info.go_file)
            self._marks["wait_for_go"] = time.time()
        if self.ring_by_controller and isinstance(go, dict) and go.get("env"):
            # a warm spare joining a ring: its Horovod environment comes with the go (it was
            # started with a placeholder rank), and it syncs from rank 0 in restore()
            os.environ.update({k: str(v) for k, v in go["env"].items()})
            env = os.environ
            self.rank, self.size = int(env["HOROVOD_RANK"]), int(env["HOROVOD_SIZE"])
            self.local_rank, self.local_size = int(env["HOROVOD_LOCAL_RANK"]), int(env["HOROVOD_LOCAL_SIZE"])
        self._hvd_init()
        hvd = self.hvd
        if self.inplace and not self.ring_by_controller:  # Horovod Elastic: the driver's assignment may be newer than the env's
            self._set_rank(hvd)
            from horovod.common.elastic import notification_manager

            notification_manager.init()
            notification_manager.register_listener(self)
        if (hvd.rank(), hvd.size()) != (self.rank, self.size):
            raise RuntimeError(f"Horovod rank {hvd.rank()}/{hvd.size()} differs from the "
                               f"environment's {self.rank}/{self.size}")
        self._marks["hvd_init"] = time.time()
        if self.ring_by_controller:
            self._set_rank(hvd)
        elif self.info.go_file is not None:
            import torch

            self.stop_at = int(hvd.broadcast(torch.tensor([self.stop_at]), root_rank=0,
                                             name="stop_at").item())
        self._connected = True

    def _wait_for_go(self, go: Path, timeout_s: float | None = None) -> dict[str, Any]:
        if timeout_s is None:  # a warm spare may wait for a grow all run long
            timeout_s = 7 * 24 * 3600.0 if self.ring_by_controller else 900.0
        t0 = time.time()
        warm_imports()  # the first step's imports, off the critical path while the old workers train
        while True:
            rec = protocol.read_json(go)
            if isinstance(rec, dict) and "stop_at" in rec:
                self.stop_at = int(rec["stop_at"])
                return rec
            if time.time() - t0 > timeout_s:
                raise RuntimeError(f"no go from the controller within {timeout_s:.0f} s ({go} never appeared)")
            time.sleep(0.02)

    def _set_rank(self, hvd) -> None:
        self.rank, self.size = hvd.rank(), hvd.size()
        self.local_rank, self.local_size = hvd.local_rank(), hvd.local_size()
        import torch

        torch.set_num_threads(protocol.cpu_threads(self.local_size))  # CPU and GPU workers alike
        if self.rank == 0 and self._events is None:
            from elastic_ring.events.api import EventLog

            self._events = EventLog(self.run_dir / protocol.WORKER_EVENTS)

    # ------------------------------------------------------------------ registration
    def distributed_optimizer(self, optimizer, model, **kwargs: Any):
        """``hvd.DistributedOptimizer`` over ``model``'s parameters with elastic-ring's defaults:
        ``op=Average``, and on CPUs ``groups=1`` (every gradient in one allreduce once the backward
        pass has produced them all, as DDP's single bucket does for a small model, instead of many
        small gloo allreduces while it runs: 1.05-1.18x images/s at 2 CPU workers, docs/peers.md),
        except under ``--relaunch inplace``, where a grouped allreduce does not survive Horovod
        Elastic's re-initialisation (the ring hangs at the first step after a grow). Keyword
        arguments go to Horovod and win over these defaults. Register the result."""
        kwargs.setdefault("op", self.hvd.Average)
        if self.device.type == "cpu" and not self.inplace:
            kwargs.setdefault("groups", 1)
        return self.hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), **kwargs)

    def register(self, model=None, optimizer=None, scheduler=None, **extras: Any) -> None:
        """What a checkpoint holds, restored in place at :meth:`restore`.

        ``model``: a module. ``optimizer``: the ``hvd.DistributedOptimizer`` (its state holds the
        momentum buffers). ``scheduler``: a ``torch.optim.lr_scheduler`` (or a list of them), saved
        and, at a new world size, rescaled with the optimizer (Eq. 7 for every later step).
        ``extras``: anything picklable; objects with ``state_dict``/``load_state_dict`` (a
        ``GradScaler``, an EMA module), dicts, lists and tensors are restored in place, so the
        script's own references stay valid; other values (numbers, strings, frozen objects) are
        replaced: read them back from ``job.extras[key]`` after :meth:`restore`.

        Raises:
            ContractError: at once, where a resize would otherwise lose state silently: no
                ``optimizer`` while a ``hvd.DistributedOptimizer`` exists, a scheduler bound to
                another optimizer, an extra that does not pickle (named).
        """
        scheds = check_registration(model, optimizer, scheduler, extras, self._optimizer,
                                    _distributed_optimizers)
        if model is not None:
            self._model = model
        if optimizer is not None:
            if optimizer is not self._optimizer and hasattr(optimizer, "register_step_pre_hook"):
                optimizer.register_step_pre_hook(self._before_optimizer_step)
                optimizer.register_step_post_hook(self._after_optimizer_step)
            self._optimizer = optimizer
        self._schedulers.extend(s for s in scheds if all(s is not t for t in self._schedulers))
        self._extras.update(extras)

    def _before_optimizer_step(self, opt, args, kwargs) -> None:
        # Horovod's step calls the wrapped optimizer class's step, hooked again: the outer one counts
        self._step_depth += 1
        if self._syncing or self._step_depth > 1:
            return
        if not self._flat and not self._by_commit:
            self._hooked.before_step()  # may end the segment here (StopSegment)
        self._on_optimizer_step(opt, args, kwargs)

    def _after_optimizer_step(self, opt, args, kwargs) -> None:
        self._step_depth -= 1
        if not self._flat and not self._by_commit and not self._syncing and self._step_depth == 0:
            self._hooked.after_step()

    def _adopt_distributed_optimizer(self) -> None:
        """A plain Horovod script broadcasts (so registers and restores) its optimizer before
        ``hvd.DistributedOptimizer`` wraps it: the wrapper, which shares its param groups, is the
        one that steps and holds the momentum from then on. Register it instead, with the state
        restored into the wrapped one, and the schedulers re-pointed."""
        opt = self._optimizer
        if opt is None or hasattr(type(opt), "_allreduce_grad_async"):
            return
        for d in _distributed_optimizers():
            if len(d.param_groups) == len(opt.param_groups) and all(
                    a is b for a, b in zip(d.param_groups, opt.param_groups)):
                for p, st in opt.state.items():
                    d.state[p] = st
                self.register(optimizer=d)
                for s in self._schedulers:
                    _bind_scheduler(s, d)
                self._undo_rescale_for_adasum()
                return

    def epochs(self, start: int, stop: int) -> Iterator[int]:
        """``range(start, stop)`` that a relaunch resumes at the epoch in progress (AdaptDL's
        ``remaining_epochs_until``): ``for epoch in job.epochs(1, args.epochs + 1):``.

        The stop points are the registered optimizer's steps (:mod:`elastic_ring.worker.hooked`):
        a stop inside an epoch resumes at its next batch (the ``elastic.DistributedSampler`` yields
        only the epoch's unused indices), a stop at its last step after the script's end-of-epoch
        code. When the range runs out the run is finished (final checkpoint) and the script goes
        on after its loop, with ``job.finished`` True.
        """
        if self._flat:
            raise ContractError("job.epochs() and job.steps() in one script: use one of them")
        self._adopt_distributed_optimizer()
        return self._hooked.epochs(start, stop)

    @contextmanager
    def evaluating(self):
        """``with job.evaluating(): test()``: an evaluation inside the script's own loop, kept out
        of the throughput windows and given the controller's watchdog the allowance of one."""
        t0 = time.time()
        self._heartbeat(self.step, "eval")
        try:
            yield
        finally:
            w = getattr(self, "_window", None)
            if w is not None and w.t0 is not None:
                w.t0 += time.time() - t0
            self._heartbeat(self.step, "step")

    def finish(self) -> None:
        """End the job early (a target reached): the loop ends at the next point where all ranks
        agree (the step after this one with ``control_every`` 1), with the final checkpoint,
        evaluation and the ``finished`` state, as at ``total_steps``. Any rank may call it."""
        self._finish_requested = True

    @property
    def extras(self) -> dict[str, Any]:
        return self._extras

    def sampler(self, size: int, batch_size: int, seed: int = 0) -> Sampler:
        """The data position, saved with the state: see :class:`Sampler`."""
        self._sampler = Sampler(self, size, batch_size, seed)
        return self._sampler

    def on_resize(self, fn: Callable[[int, int, int], None]) -> None:
        """``fn(old_world, new_world, step)`` replaces the default LR rescaling at a new size."""
        self._resize_hooks.append(fn)

    def on_evaluate(self, fn: Callable[[int], dict[str, float] | None], every: int | None = None) -> None:
        """``fn(step)`` runs on every rank every ``every`` steps (default: the run's eval_every) and
        at the last step of the run; a returned dict with ``test_accuracy``/``test_loss`` becomes an
        ``evaluation`` event."""
        self._eval_hook = fn
        if every is not None:
            self._eval_every = every

    # ------------------------------------------------------------------ restore
    def restore(self) -> bool:
        """Load the newest checkpoint on rank 0 (falling back past a corrupt one) and broadcast it;
        or start fresh with rank 0's weights. Returns True when resumed."""
        self.connect()
        ckpt = None
        if self.rank == 0:
            ckpt = self._checkpoint_store().load_latest(warn=self._warn)
        meta = None
        if self.rank == 0 and ckpt is not None:
            if self._model is not None:
                self._model.load_state_dict(ckpt["model"])
            if self._optimizer is not None and ckpt.get("optimizer") is not None:
                self._optimizer.load_state_dict(ckpt["optimizer"])
            if ckpt.get("rng") is not None:
                _set_rng_state(ckpt["rng"])
                self._resume_rng = ckpt["rng"]  # again where an epoch loop's loader resumes (data.py)
            meta = {k: ckpt.get(k) for k in ("step", "cursor", "world_size", "lr_factor", "extras",
                                             "schedulers", "data_position")}
        self._syncing = True  # Horovod's broadcast of a fresh optimizer's state steps it once
        try:
            self._sync(meta)
        finally:
            self._syncing = False
        self._restored = True
        return self.resumed

    def state_dict(self, step: int) -> dict[str, Any]:
        """A CPU snapshot of everything a resume needs (taken on the training thread)."""
        from elastic_ring.ckpt import snapshot

        return snapshot({
            "step": step, "cursor": self._sampler.cursor if self._sampler is not None else 0,
            "world_size": self.size, "lr_factor": self.lr_factor, "lr_last": self.current_lr(),
            "model": self._model.state_dict() if self._model is not None else None,
            "optimizer": self._optimizer.state_dict() if self._optimizer is not None else None,
            "rng": self._saved_rng or _rng_state(), "extras": self._saved_extras(), "segment": self.segment,
            "schedulers": [sch.state_dict() for sch in self._schedulers],
            "data_position": self._position.state(),
        })

    # ------------------------------------------------------------------ the step loop
    def record(self, loss: Any = None, samples: int | None = None) -> None:
        """Per step: this rank's loss (a tensor is read only at window ends) and samples used."""
        w = self._window
        if loss is not None:
            w.loss_sum = w.loss_sum + (loss.detach() if hasattr(loss, "detach") else float(loss))
            w.loss_n += 1
        if samples is None and self._sampler is not None:
            samples = self._sampler.batch_size
        w.samples += int(samples or 0)

    def current_lr(self) -> float:
        if self._optimizer is not None and self._optimizer.param_groups:
            return float(self._optimizer.param_groups[0]["lr"])
        return float("nan")

    def steps(self) -> Iterator[int]:
        """Yield the steps of this segment; stop where the controller asks (see module docstring).

        Under ``--relaunch inplace`` a stop for a resize does not end the loop: the workers pause,
        Horovod Elastic re-forms the ring at the new size (:meth:`_reset_inplace`), and the loop
        goes on with the next segment in the same processes.
        """
        if self._hooked.count:
            raise ContractError("job.steps() after steps of an epoch loop: use one of them")
        if self.total_steps >= protocol.NO_STEP_LIMIT:
            raise ContractError("job.steps() needs the run's length: give `elastic-ring train --steps N`")
        self._flat = True
        if not self._restored:
            self.restore()
        import torch

        from elastic_ring.events.api import SegmentEnd

        while True:
            yield from self._segment_steps()
            decided = time.time()
            if self.inplace and self.stop_reason != "finished":
                if self.rank == 0:
                    self._emit(SegmentEnd(segment=self.segment, world_size=self.size, step=self.step,
                                          reason=self.stop_reason, lr=self.current_lr(),
                                          stop_decided_at=decided))
                self._heartbeat(self.step, "paused")
                action = self._pause_inplace()
                if action.get("action") == "resize":
                    self._reset_inplace(action)
                    continue
            break
        self._heartbeat(self.step, "ending")
        if self.finished:
            self._heartbeat(self.step, "eval")
            self._evaluate(self.step)
        if self.rank == 0:
            self._checkpoint(self.step, wait=True)
            if not self.inplace or self.finished:
                self._emit(SegmentEnd(segment=self.segment, world_size=self.size, step=self.step,
                                      reason=self.stop_reason, lr=self.current_lr(),
                                      stop_decided_at=self._decided))
        self.hvd.allreduce(torch.tensor([0.0]), name="exit_barrier")  # leave together


_JOB: "Job | PlainJob | None" = None


def init(lazy: bool = False) -> "Job | PlainJob":
    """Start this worker's part of the elastic job (call once, first thing).

    Sets the device (one GPU per local rank, or ``cores / local workers`` CPU threads), waits for
    the go of a pre-launched segment and calls ``hvd.init()``; with ``lazy=True`` the last two wait
    for :meth:`Job.connect` (or :meth:`Job.restore`), so that the script can build its model and data
    first. Outside ``elastic-ring train --script`` (plain ``horovodrun`` or ``python``) it returns
    a :class:`~elastic_ring.worker.plain.PlainJob`: the script runs as plain Horovod.
    """
    global _JOB, _INIT_CALLED
    if _JOB is not None:
        return _JOB
    info = LaunchInfo.from_env()
    if info is None:
        from elastic_ring.worker.plain import PlainJob

        _JOB = PlainJob()
        return _JOB
    check_hvd_not_initialised(os.environ.get(INPLACE_ENV) == "1")
    _INIT_CALLED = True
    _JOB = Job(info, lazy=lazy)
    return _JOB


def init_called() -> bool:
    return _INIT_CALLED
