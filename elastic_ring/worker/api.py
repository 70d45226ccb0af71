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
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from elastic_ring import protocol
from elastic_ring.protocol import LaunchInfo
from elastic_ring.worker.errors import ContractError, NotLaunchedError  # noqa: F401 - re-exported
from elastic_ring.worker.sampler import Sampler
from elastic_ring.worker.state import (_bind_scheduler, _distributed_optimizers, _restore_in_place,  # noqa: F401
                                       _rng_state, _saved_form, _set_rng_state)

_T_IMPORTED = time.time()
INPLACE_ENV = "ELASTIC_RING_INPLACE"  # "1": running under Horovod Elastic (--relaunch inplace)
# INPLACE_ENV = RING_BY_CONTROLLER: resized in place, but the controller re-forms the ring itself
# (the Ray backend: it serves the rendezvous and hands every member its new Horovod environment)
RING_BY_CONTROLLER = "controller"
MEMBER_ENV = "ELASTIC_RING_MEMBER"  # this worker's name in a resize action's "members"


class Retired(BaseException):
    """Raised out of ``job.steps()`` in a worker whose slot a controller-driven in-place shrink
    removed: it has left the ring; its process may serve again (the Ray backend's actor)."""


def inplace_action_file(run_dir: Path, segment: int) -> Path:
    """The controller's word to paused in-place workers at the end of ``segment`` (a JSON object:
    ``{"action": "exit"}`` or ``{"action": "resize", "to": N, "segment": S, "stop_at": T}``).

    A resize written *ahead* (before the pause, for a scheduled resize) also names ``at_step``,
    the step it applies at: rank 0 takes it only at a scheduled stop at that step, and only by
    renaming the file to :func:`taken_action_file` (the controller withdraws it the same way, so
    exactly one of the two wins; see :func:`take_ahead_action`)."""
    return protocol.control_dir(Path(run_dir)) / f"inplace-{segment}.json"


def taken_action_file(run_dir: Path, segment: int) -> Path:
    """Where rank 0 moves an action written ahead when it takes it."""
    return protocol.control_dir(Path(run_dir)) / f"inplace-{segment}.taken.json"


def take_ahead_action(run_dir: Path, segment: int) -> bool:
    """Rank 0 takes the action written ahead for ``segment`` (True), unless the controller
    withdrew it first (the file is gone: False). One rename of the same file: one winner."""
    try:
        os.rename(inplace_action_file(run_dir, segment), taken_action_file(run_dir, segment))
    except FileNotFoundError:
        return False
    return True

_INIT_CALLED = False  # read by the entry point's watchdog: a script that never calls init()


@dataclass
class _Window:
    t0: float | None = None
    steps: int = 0
    samples: int = 0
    loss_sum: Any = 0.0
    loss_n: int = 0


class Job:
    """One worker process's view of the elastic job (see the module docstring)."""

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
        while True:
            rec = protocol.read_json(go)
            if isinstance(rec, dict) and "stop_at" in rec:
                self.stop_at = int(rec["stop_at"])
                return rec
            if time.time() - t0 > timeout_s:
                raise RuntimeError(f"no go from the controller within {timeout_s:.0f} s ({go} never appeared)")
            time.sleep(0.02)

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
        import pickle

        if optimizer is None and model is not None and self._optimizer is None:
            dist = _distributed_optimizers()
            if dist:
                raise ContractError("register(optimizer=...) is missing while a "
                                    "hvd.DistributedOptimizer exists: its state and Eq. 7 would be "
                                    "lost at every resize")
        scheds = [] if scheduler is None else list(scheduler) if isinstance(scheduler, (list, tuple)) \
            else [scheduler]
        opt = optimizer if optimizer is not None else self._optimizer
        for sch in scheds:
            if not hasattr(sch, "state_dict") or not hasattr(sch, "load_state_dict"):
                raise ContractError(f"scheduler={type(sch).__name__}: not an LR scheduler "
                                    "(no state_dict/load_state_dict)")
            _bind_scheduler(sch, opt)
        for key, value in extras.items():
            if key in ("model", "optimizer", "scheduler"):
                continue
            try:
                pickle.dumps(_saved_form(value))
            except Exception as e:  # noqa: BLE001 - any pickling failure
                raise ContractError(f"register(): extra {key!r} ({type(value).__name__}) does not "
                                    f"pickle ({type(e).__name__}: {e}); register its state instead"
                                    ) from None
        if model is not None:
            self._model = model
        if optimizer is not None:
            if optimizer is not self._optimizer and hasattr(optimizer, "register_step_pre_hook"):
                optimizer.register_step_pre_hook(self._on_optimizer_step)
            self._optimizer = optimizer
        self._schedulers.extend(s for s in scheds if all(s is not t for t in self._schedulers))
        self._extras.update(extras)

    def _on_optimizer_step(self, opt, args, kwargs) -> None:
        """Before the registered optimizer's step (a pre-hook, so before Horovod waits there for
        the other ranks' gradients): the heartbeat says this rank is done with its own part of
        the step (phase ``sync``), so a rank hung in its data loader or its forward pass is told
        apart from the ranks waiting for it. Also the LR the step really runs with (the script
        may set it inside the step, or a scheduler may move it after), for ``first_step``."""
        self._heartbeat(self.step, "sync")
        if opt.param_groups:
            self._lr_stepped = float(opt.param_groups[0]["lr"])

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
    def _emit(self, event) -> None:
        if self._events is not None:
            self._events.write(event)

    def _warn(self, msg: str) -> None:
        print(f"elastic-ring worker: {msg}", file=sys.stderr, flush=True)
        from elastic_ring.events.api import ErrorEvent

        self._emit(ErrorEvent(message=msg, rank=self.rank, segment=self.segment))

    def _checkpoint_store(self):
        if self._store is None:
            from elastic_ring.ckpt import BackgroundWriter, CheckpointStore

            self._store = CheckpointStore(self.run_dir / "checkpoints", keep=self.info.keep)
            self._writer = BackgroundWriter(self._store)
        return self._store

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
            meta = {k: ckpt.get(k) for k in ("step", "cursor", "world_size", "lr_factor", "extras",
                                             "schedulers")}
        self._sync(meta)
        self._restored = True
        return self.resumed

    def _sync(self, meta: dict[str, Any] | None, local: bool = False) -> None:
        """Rank 0's ``meta`` (counters), optimizer state and weights to every rank; then apply them
        (and Eq. 7 when the world size differs from the one ``meta`` was saved at). ``local``: this
        process is rank 0 of a ring of one, resized in place: nothing to send, only apply."""
        hvd = self.hvd
        if not local:
            meta = hvd.broadcast_object(meta, root_rank=0, name="resume_meta")
            if meta is not None and self._optimizer is not None:
                hvd.broadcast_optimizer_state(self._optimizer, root_rank=0)
            if self._model is not None:
                hvd.broadcast_parameters(self._model.state_dict(), root_rank=0)
        self._marks["restore_broadcast"] = time.time()
        if meta is not None:
            self.resumed = True
            self.step = int(meta["step"])
            self.previous_world = int(meta["world_size"])
            self.lr_factor = float(meta.get("lr_factor") or 1.0)
            if meta.get("extras"):
                for key, saved in meta["extras"].items():
                    self._extras[key] = _restore_in_place(self._extras.get(key), saved)
            saved_scheds = meta.get("schedulers")  # None: a checkpoint from before schedulers
            saved_scheds = [] if saved_scheds is None else saved_scheds
            if meta.get("schedulers") is not None and len(saved_scheds) != len(self._schedulers):
                raise ContractError(f"the checkpoint holds {len(saved_scheds)} scheduler(s), the "
                                    f"script registered {len(self._schedulers)}")
            for sch, st in zip(self._schedulers, saved_scheds):
                sch.load_state_dict(st)
            if self._sampler is not None:
                self._sampler.cursor = int(meta.get("cursor") or 0)
            if meta.get("segment") is not None:  # an in-place reset: the segment goes on here
                self.segment, self.stop_at = int(meta["segment"]), int(meta["stop_at"])
            if self.previous_world != self.size:
                self._rescale(self.previous_world, self.size)
        self._last_ckpt_step = self.step

    def _rescale(self, old: int, new: int) -> None:
        """Eq. 7 (the run's rule) from ``old`` to ``new`` workers: the optimizer's LRs and all that
        the registered schedulers scale from (:func:`elastic_ring.worker.lr.scale_lr_state`), or
        the script's :meth:`on_resize` hooks instead."""
        from elastic_ring.worker.lr import RULES, rule_factor, scale_lr_state

        rule = RULES[self.info.lr_scaling]
        self.lr_factor = rule.scale(self.lr_factor, old, new)
        if self._resize_hooks:
            for fn in self._resize_hooks:
                fn(old, new, self.step)
        elif self._optimizer is not None or self._schedulers:
            scale_lr_state(self._optimizer, self._schedulers, rule_factor(rule, old, new))

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

    def _segment_steps(self) -> Iterator[int]:
        """The steps of one segment (one world size), up to ``stop_at`` or an agreed stop."""
        info = self.info
        self._window = _Window()
        last_loss = float("nan")
        step = self.step
        reason = "finished" if self.stop_at >= self.total_steps else "scheduled"
        first = True
        vote = None  # the stop vote in flight (see _start_stop_vote)
        loader = self._sampler if self._sampler is not None else None
        while step < self.stop_at:
            step += 1
            self._current = step
            if first:
                self._lr_used = self.current_lr()  # before the step: what it runs with unless it
                self._lr_stepped = None            # sets the LR itself (seen by the step hook)
            yield step
            self.step = step
            if loader is not None and loader._loader:
                loader.cursor += loader.batch_size * self.size
            self._heartbeat(step, "step")
            w = self._window
            w.steps += 1
            now = time.time()
            if first:  # start-up cost ends with the first step of a segment
                first = False
                self._emit_first_step(step, now)
            elif w.steps >= info.throughput_window or step == self.stop_at:
                last_loss, now = self._close_window(step)
            self._between_steps(step, now)
            if step < self.stop_at and step % info.control_every == 0:
                # the vote started at the previous check has travelled with this step's gradients
                if vote is not None:
                    stop, early = self._vote_result(vote)
                    if early or stop:
                        vote = None
                        reason = "finished" if early else "requested"
                        break
                vote = self._start_stop_vote()
        if vote is not None:  # every rank has the same vote in flight: complete it
            if self._vote_result(vote)[1] and step < self.total_steps:
                reason = "finished"  # the early stop lands at this segment's last step
        self._decided = time.time()
        self.stop_reason = reason
        self.finished = step >= self.total_steps or reason == "finished"
        self.last_loss = last_loss

    def _emit_first_step(self, step: int, now: float) -> None:
        """The segment's first step is done: its start-up phases (after an in-place reset: the
        reset's) and the LR it ran with; the first throughput window starts now."""
        from elastic_ring.events.api import FirstStep

        phases, prev = {}, self._t_start
        for name, t in self._marks.items():
            phases[name] = round(t - prev, 4)
            prev = t
        self._emit(FirstStep(segment=self.segment, world_size=self.size, step=step,
                             since_launch_s=now - self._t_start,
                             lr=self._lr_stepped if self._lr_stepped is not None else self._lr_used,
                             phases=phases))
        self._window = _Window(t0=time.time())

    def _close_window(self, step: int) -> tuple[float, float]:
        """End the throughput window at ``step``: the ranks' mean loss (one allreduce), the
        ``throughput`` event; returns (that loss, the time the next window starts)."""
        import torch

        from elastic_ring.events.api import Throughput

        hvd, w = self.hvd, self._window
        local = float(w.loss_sum) / w.loss_n if w.loss_n else float("nan")
        mean_loss = float(hvd.allreduce(torch.tensor([local]), op=hvd.Average, name="window_loss").item())
        now = time.time()
        dt = max(now - (w.t0 or now), 1e-9)
        epoch = self._sampler.epoch if self._sampler is not None else 0
        self._emit(Throughput(segment=self.segment, world_size=self.size, step=step, steps=w.steps,
                              seconds=dt, images_per_s=w.samples * self.size / dt,
                              steps_per_s=w.steps / dt, loss=mean_loss, lr=self.current_lr(), epoch=epoch))
        self._window = _Window(t0=now)
        return mean_loss, now

    def _between_steps(self, step: int, now: float) -> None:
        """After ``step``: the evaluation when due (kept out of the throughput window); on rank 0
        the periodic checkpoint and the progress file (at most twice a second)."""
        if self._eval_every and step % self._eval_every == 0 and step < self.total_steps:
            t_eval = time.time()
            self._heartbeat(step, "eval")
            self._evaluate(step)
            if self._window.t0 is not None:
                self._window.t0 += time.time() - t_eval
        if self.rank == 0:
            self._maybe_periodic_checkpoint(step)
            if now - self._last_progress_t > 0.5:
                self._last_progress_t = now
                protocol.write_json_atomic(protocol.control_dir(self.run_dir) / protocol.PROGRESS_FILE,
                                           {"step": step, "segment": self.segment, "time": now})

    # ------------------------------------------------------------------ in-place resize
    def on_hosts_updated(self, timestamp: float, update_res: Any) -> None:
        """Horovod Elastic's driver (on rank 0): the discovery script reports other slots now."""
        self._hosts_updated_at = timestamp

    def _pause_inplace(self, poll_s: float = 0.05) -> dict[str, Any]:
        """All ranks wait, between two steps, for the controller's word on this segment's end.

        Rank 0 reads ``control/inplace-<segment>.json``: ``{"action": "exit"}`` (a Ctrl-C: checkpoint
        and leave), or ``{"action": "resize", "to": N, "segment": S, "stop_at": T}``, acted on once
        Horovod's driver has told rank 0 that the hosts changed (then the driver has the new slot
        assignment, and a new worker is being started). Rank 0's decision is broadcast each poll.
        The notification must be for the discovery file the action refers to (``hosts_written``:
        Horovod stamps it with the second the driver saw the change; a notification about a slot
        count reported ahead for a scheduled resize may arrive before the pause, which is fine).
        """
        hvd = self.hvd
        while True:
            decision = None
            if self.rank == 0:
                act = protocol.read_json(inplace_action_file(self.run_dir, self.segment))
                updated = self._hosts_updated_at
                if isinstance(act, dict) and "at_step" in act:  # written ahead (ring by controller)
                    if (act.get("action") == "resize" and int(act["at_step"]) == self.step
                            and self.stop_reason == "scheduled" and take_ahead_action(self.run_dir, self.segment)):
                        decision = act
                        for go, rec in (act.get("go_files") or {}).items():  # its joiners' word
                            protocol.write_json_atomic(Path(go), rec)
                elif isinstance(act, dict) and (act.get("action") == "exit" or (
                        act.get("action") == "resize" and (self.ring_by_controller or (
                            updated is not None and updated >= float(act.get("hosts_written", 0.0)) - 1.0)))):
                    decision = act
            decision = hvd.broadcast_object(decision, root_rank=0, name="inplace_action")
            if decision is not None:
                return decision
            time.sleep(poll_s)

    def _reset_inplace(self, action: dict[str, Any]) -> None:
        """Re-form the ring at the new size in this process (Horovod Elastic's reset), then sync.

        ``hvd.shutdown()`` + ``hvd.init()``: the driver assigns the new ranks (a worker whose slot
        was removed is ended by Horovod inside ``init``); a new worker runs :meth:`restore`, whose
        collectives match :meth:`_sync` here: rank 0 broadcasts the counters (step, sample cursor,
        LR factor, extras, segment and stop step), the optimizer state and the weights; then every
        rank rescales the LR by the run's rule (Eq. 7) through :meth:`_rescale`. The sample cursor
        is global, so the next step's shares are re-partitioned over the new ranks: every sample of
        an epoch is still used once, every step done once.
        """
        hvd = self.hvd
        t0 = time.time()
        meta = self._live_meta(next_segment=int(action["segment"]), stop_at=int(action["stop_at"]))
        hvd.shutdown()
        self._hosts_updated_at = None
        if self.ring_by_controller:  # the controller names every member's new Horovod environment
            mine = (action.get("members") or {}).get(os.environ.get(MEMBER_ENV, ""))
            if mine is None:
                raise Retired(f"not a member of segment {action['segment']}")
            os.environ.update({k: str(v) for k, v in mine.items()})
        hvd.init()
        self._marks = {"reset_request": t0, "hvd_reinit": time.time()}
        self._t_start = t0
        self._set_rank(hvd)
        # a ring of one: rank 0 alone, whose state is the state (a broadcast to itself is a no-op)
        self._sync(meta if self.rank == 0 else None, local=hvd.size() == 1 and self.ring_by_controller)
        self._marks["sync"] = time.time()

    def _live_meta(self, next_segment: int, stop_at: int) -> dict[str, Any]:
        return {"step": self.step, "cursor": self._sampler.cursor if self._sampler is not None else 0,
                "world_size": self.size, "lr_factor": self.lr_factor, "extras": self._saved_extras(),
                "schedulers": [sch.state_dict() for sch in self._schedulers],
                "segment": next_segment, "stop_at": stop_at}

    def _set_rank(self, hvd) -> None:
        self.rank, self.size = hvd.rank(), hvd.size()
        self.local_rank, self.local_size = hvd.local_rank(), hvd.local_size()
        import torch

        torch.set_num_threads(protocol.cpu_threads(self.local_size))  # CPU and GPU workers alike
        if self.rank == 0 and self._events is None:
            from elastic_ring.events.api import EventLog

            self._events = EventLog(self.run_dir / protocol.WORKER_EVENTS)

    def _start_stop_vote(self):
        """Start, without waiting, the allreduce of rank 0's stop flag (the stop file exists).

        It is completed at the next check (``_vote_result``), one check later: meanwhile it is
        negotiated and reduced by Horovod's background thread together with the next step's
        gradients, so the agreement costs no collective of its own on the training thread (a
        blocking allreduce between steps did: a full negotiation round, ~5-8% of a step on a
        loaded CPU). Every rank starts and completes the same votes at the same steps, so all
        ranks still stop after the same step; a stop lands ``control_every`` steps later.
        """
        import torch

        flag = 1.0 if self.rank == 0 and protocol.stop_file(self.run_dir, self.segment).exists() else 0.0
        early = 1.0 if self._finish_requested else 0.0  # job.finish() on any rank
        return self.hvd.allreduce_async(torch.tensor([flag, early]), op=self.hvd.Sum, name="stop_flag")

    def _vote_result(self, handle) -> tuple[bool, bool]:
        """(the controller asked for a stop, some rank called job.finish())."""
        v = self.hvd.synchronize(handle)
        return bool(v[0].item() > 0), bool(v[1].item() > 0)

    def _evaluate(self, step: int) -> None:
        if self._eval_hook is None:
            return
        res = self._eval_hook(step)
        if res and self.rank == 0:
            from elastic_ring.events.api import Evaluation

            self._emit(Evaluation(step=step, test_loss=float(res.get("test_loss", float("nan"))),
                                  test_accuracy=float(res.get("test_accuracy", float("nan"))),
                                  samples=int(res.get("samples", 0))))

    # ------------------------------------------------------------------ checkpoints
    def _maybe_periodic_checkpoint(self, step: int) -> None:
        info = self.info
        due = (info.checkpoint_every and step - self._last_ckpt_step >= info.checkpoint_every) or \
              (info.checkpoint_every_s and time.time() - self._last_ckpt_t >= info.checkpoint_every_s)
        if due and step < self.stop_at:
            self._checkpoint(step, wait=False)

    def state_dict(self, step: int) -> dict[str, Any]:
        """A CPU snapshot of everything a resume needs (taken on the training thread)."""
        from elastic_ring.ckpt import snapshot

        return snapshot({
            "step": step, "cursor": self._sampler.cursor if self._sampler is not None else 0,
            "world_size": self.size, "lr_factor": self.lr_factor, "lr_last": self.current_lr(),
            "model": self._model.state_dict() if self._model is not None else None,
            "optimizer": self._optimizer.state_dict() if self._optimizer is not None else None,
            "rng": _rng_state(), "extras": self._saved_extras(), "segment": self.segment,
            "schedulers": [sch.state_dict() for sch in self._schedulers],
        })

    def _saved_extras(self) -> dict[str, Any]:
        return {k: _saved_form(v) for k, v in self._extras.items()}

    def _checkpoint(self, step: int, wait: bool) -> None:
        """Rank 0: snapshot now, write in the background (``wait``: and block until written).

        The stall on the training thread is the wait for the previous write (if it is still
        going), plus the copy of the state to the CPU; it is reported in ``checkpoint_written``.
        """
        from elastic_ring.events.api import CheckpointWritten

        self._checkpoint_store()
        self._heartbeat(step, "checkpoint")
        if not self._owner_is_current():
            raise RuntimeError("another controller owns the run folder now: not writing a checkpoint")
        t0 = time.perf_counter()
        self._writer.wait()
        state = self.state_dict(step)
        stall = time.perf_counter() - t0
        lr = self.current_lr()

        def done(path: Path, nbytes: int, secs: float) -> None:
            self._emit(CheckpointWritten(step=step, path=str(path.relative_to(self.run_dir)),
                                         seconds=secs, bytes=nbytes, world_size=self.size, lr=lr,
                                         stall_s=stall, background=not wait))

        self._writer.submit(state, done)
        if wait:
            self._writer.wait()
        self.checkpoint_stalls.append(time.perf_counter() - t0)
        self._last_ckpt_step, self._last_ckpt_t = step, time.time()

    def _heartbeat(self, step: int, phase: str) -> None:
        """Tell the controller's stall watchdog this rank's step and phase (one ``pwrite``)."""
        key = (self.segment, self.rank)
        if self._beat is None or self._beat_key != key:
            from elastic_ring.heartbeat import Heartbeat

            if self._beat is not None:
                self._beat.close()
            self._beat, self._beat_key = Heartbeat(self.run_dir, *key), key
        self._beat.beat(step, phase, time.time())

    def _owner_is_current(self) -> bool:
        if not self.info.owner:
            return True
        hb = protocol.read_json(protocol.control_dir(self.run_dir) / protocol.HEARTBEAT_FILE)
        return not isinstance(hb, dict) or hb.get("owner") in (None, self.info.owner)


_JOB: Job | None = None


def init(lazy: bool = False) -> Job:
    """Start this worker's part of the elastic job (call once, first thing).

    Sets the device (one GPU per local rank, or ``cores / local workers`` CPU threads), waits for
    the go of a pre-launched segment and calls ``hvd.init()``; with ``lazy=True`` the last two wait
    for :meth:`Job.connect` (or :meth:`Job.restore`), so that the script can build its model and data
    first.

    Raises:
        NotLaunchedError: the script was not started by ``elastic-ring train --script``.
    """
    global _JOB, _INIT_CALLED
    if _JOB is not None:
        return _JOB
    hvd = sys.modules.get("horovod.torch")
    if hvd is not None and not os.environ.get(INPLACE_ENV) == "1":
        try:
            own_init = hvd.is_initialized()
        except Exception:  # noqa: BLE001
            own_init = False
        if own_init:
            raise ContractError("the script called hvd.init() before elastic_ring.worker.init(): "
                                "call only elastic_ring.worker.init() (it initialises Horovod)")
    info = LaunchInfo.from_env()
    if info is None:
        raise NotLaunchedError("this script uses elastic_ring.worker: run it with "
                               "`elastic-ring train --script SCRIPT`")
    _INIT_CALLED = True
    _JOB = Job(info, lazy=lazy)
    return _JOB


def init_called() -> bool:
    return _INIT_CALLED
