"""Horovod Elastic's API, served by elastic-ring: a script written for ``hvd.elastic`` runs unchanged.

    elastic-ring train --script train_elastic.py --gpus 1 --schedule 100:2,200:1 --relaunch inplace

A script that uses ``@hvd.elastic.run``, ``hvd.elastic.TorchState`` / ``ObjectState``,
``state.commit()``, ``state.register_reset_callbacks()`` and ``hvd.elastic.ElasticSampler`` already
has the contract this tool needs: the decorated function is where training happens, the state
object holds what survives a resize, and a commit marks a consistent point. The worker entry point
(:mod:`elastic_ring.worker.run`) finds such a script by its source (:func:`uses_horovod_elastic`)
and, before running it, :func:`install` puts elastic-ring behind those names on the real
``horovod.torch`` module:

- ``hvd.init()`` starts the worker library (:func:`elastic_ring.worker.api.init`); later calls,
  and the library's own re-initialisation at an in-place resize, reach Horovod's.
- ``@hvd.elastic.run`` restores the newest checkpoint (model, optimizer, every other object the
  state tracks: its samplers' positions, schedulers and plain attributes, as last committed) or
  starts fresh with Horovod's ``state.sync()``, then calls the function.
- ``state.commit()`` saves the state as Horovod does and is the only stop point: a scheduled stop
  happens at the first commit at or after its step (a step is one step of the state's optimizer),
  a live or policy stop at the next commit after the stop vote that tells it is read (a vote every
  K steps, :class:`~elastic_ring.worker.segment.StopVote`; it travels with the next step's
  gradients and is read at the next commit). The periodic background checkpoints are
  taken at commits too, so every checkpoint holds a committed state.
- At a stop the committed state is checkpointed. Where the ring is re-formed in place
  (``--relaunch inplace``, the Ray backend) the same processes re-form the ring at the new size,
  run the state's reset callbacks, sync the state from rank 0 and call the function again, as
  under Horovod Elastic; with the other relaunch modes the
  workers exit and the new ones restore the checkpoint, and the reset callbacks run there when
  the world size changed. The reset callbacks own the LR: no Eq. 7 on top.
- ``state.check_host_updates()`` never interrupts: a host change is taken at the next commit.
- With ``--survive`` (the ring re-formed in place) a lost peer rolls the others back to their last
  commit, in memory, as Horovod Elastic does; they re-form the ring at the size left and call the
  function again (:meth:`Session._roll_back`), instead of a restart from the checkpoint.
- The run ends when the decorated function returns (``--steps``, if given, is a cap).
"""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path
from typing import Any, Callable

from elastic_ring import hvd_patches, protocol
from elastic_ring.worker.segment import StopReason

# A script that names one of these is written for Horovod Elastic.
_ELASTIC_NAMES = re.compile(r"\belastic\.run\b|\bhvd\.elastic\b|\bhorovod\.torch\.elastic\b|\bTorchState\b"
                            r"|\bObjectState\b|\bElasticSampler\b")


class SegmentDone(BaseException):
    """Raised out of the decorated function in a worker whose segment ended at a stop (the
    checkpoint is written): the worker exits, and the script's code after the call does not run.
    A ``BaseException``, so a script's ``except Exception`` does not swallow it."""


class _Stop(BaseException):
    """Raised by ``state.commit()`` when all ranks agreed to stop there."""


def uses_horovod_elastic(target: str) -> bool:
    """Whether the script (a path, or a module name) uses Horovod Elastic's API."""
    path = Path(target)
    if not path.is_file():
        try:
            import importlib.util

            spec = importlib.util.find_spec(target)
        except (ImportError, ValueError):
            return False
        if spec is None or not spec.origin or not Path(spec.origin).is_file():
            return False
        path = Path(spec.origin)
    try:
        return bool(_ELASTIC_NAMES.search(path.read_text(errors="replace")))
    except OSError:
        return False


# The run length of a Horovod Elastic script run without --steps: its function's return ends it.
NO_STEP_CAP = protocol.NO_STEP_LIMIT

_IN_LIBRARY = False  # the worker library's own hvd.init() call is under way
_SESSION: "Session | None" = None


def install() -> None:
    """Put elastic-ring behind Horovod Elastic's names on the real ``horovod.torch`` (idempotent):
    the ``worker`` patches of :mod:`elastic_ring.hvd_patches` (``hvd.init``, ``hvd.elastic.run``,
    ``State.commit``, ``State.check_host_updates``, ``ElasticSampler.record_batch``)."""
    hvd_patches.apply("worker")


def _init(*args: Any, **kwargs: Any) -> None:
    """``hvd.init()``: the script's first call starts the worker library (which initialises Horovod
    through this same name, then reaches Horovod's own); later calls are no-ops unless the library
    shut Horovod down to re-form the ring."""
    from elastic_ring.worker import api, session

    global _IN_LIBRARY
    if session.current() is None and not _IN_LIBRARY:
        _IN_LIBRARY = True
        try:
            api.init()
        finally:
            _IN_LIBRARY = False
        return
    import horovod.torch as hvd

    if not hvd.is_initialized():
        hvd_patches.original("init")(*args, **kwargs)


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """``@hvd.elastic.run``: the function, run by elastic-ring (see the module docstring)."""

    @functools.wraps(func)
    def wrapper(state, *args: Any, **kwargs: Any) -> Any:
        global _SESSION
        from elastic_ring.worker import api

        job = api.init()  # the job hvd.init() started (or, without it, a new one)
        session = Session(job, state)
        _SESSION = session
        try:
            return session.run(func, args, kwargs)
        finally:
            _SESSION = None

    return wrapper


def _commit(state) -> None:
    """``state.commit()``: Horovod's save, then elastic-ring's stop point."""
    state.save()
    session = _SESSION
    if session is not None and session.state is state:
        session.commit_point()


def _record_batch(sampler, batch_idx: int, batch_size: int) -> None:
    """``ElasticSampler.record_batch``: Horovod's, and this rank's samples for the throughput."""
    hvd_patches.original("record_batch")(sampler, batch_idx, batch_size)
    session = _SESSION
    if session is not None and session.counting:
        session.job.progress.window.samples += int(batch_size)


def _check_host_updates(state) -> None:
    """``state.check_host_updates()``: a host change waits for the next commit."""


class _CommittedState:
    """What a checkpoint holds of a Horovod Elastic state besides the model and the optimizer that
    the job saves itself: the state's plain attributes and every other tracked object (samplers,
    schedulers, more models...), each as last committed. Registered with the job as an extra."""

    def __init__(self, state, skip: set[str]) -> None:
        self.state, self.skip = state, skip

    def _handlers(self) -> dict[str, Any]:
        return {k: h for k, h in getattr(self.state, "_handlers", {}).items() if k not in self.skip}

    @staticmethod
    def _saved_attr(handler) -> str | None:
        return next((k for k in vars(handler) if k.startswith("_saved_")), None)

    def state_dict(self) -> dict[str, Any]:
        handlers = {}
        for name, h in self._handlers().items():
            attr = self._saved_attr(h)
            handlers[name] = getattr(h, attr) if attr else h.value.state_dict()
        return {"objects": dict(getattr(self.state, "_saved_state", {})), "handlers": handlers}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        for name, h in self._handlers().items():
            if name in saved["handlers"]:
                value = saved["handlers"][name]
                h.value.load_state_dict(copy.deepcopy(value))
                attr = self._saved_attr(h)
                if attr:
                    setattr(h, attr, copy.deepcopy(value))
        if hasattr(self.state, "_saved_state"):
            self.state._saved_state = dict(saved["objects"])
            self.state._set_attrs()


class Session:
    """One call of a ``@hvd.elastic.run`` function under elastic-ring: the state bound to the job
    (what the checkpoints hold), the optimizer's steps counted, the stop points at commits."""

    def __init__(self, job, state) -> None:
        import torch

        self.job, self.state = job, state
        meter = getattr(job, "meter", None)  # ELASTIC_RING_STEP_COST: the library's entries timed
        if meter is not None:
            for attr, name in (("_before_step", "hvd.before"), ("_after_step", "hvd.after"),
                               ("commit_point", "hvd.commit")):
                if meter.parts:
                    meter.wrap(self, attr, name)
                meter.wrap_entry(self, attr, name)
        handlers = getattr(state, "_handlers", {})
        model = next((k for k, h in handlers.items() if isinstance(h.value, torch.nn.Module)), None)
        opt = next((k for k, h in handlers.items() if isinstance(h.value, torch.optim.Optimizer)), None)
        self.own = {k: handlers[k] for k in (model, opt) if k is not None}  # saved by the job itself
        if not job.state.resize_hooks:
            job.on_resize(lambda old, new, step: None)  # no Eq. 7 on top of them
        job.form = "commits"  # steps and stops are this adapter's, not the epoch loop's hooks
        job.register(model=handlers[model].value if model else None,
                     optimizer=handlers[opt].value if opt else None,
                     hvd_elastic_state=_CommittedState(state, set(self.own)))
        self.optimizer = handlers[opt].value if opt else None
        if self.optimizer is not None and not getattr(self.optimizer, "_elastic_ring_hooked", False):
            self.optimizer.register_step_pre_hook(self._before_step)
            self.optimizer.register_step_post_hook(self._after_step)
            self.optimizer._elastic_ring_hooked = True
        self.boundary = job.boundary
        self.boundary.epoch = self._epoch
        self._first = True
        self.counting = False
        self._depth = 0
        self.committed: int | None = None  # the step of the state's last commit (kept by Horovod's save)

    # ------------------------------------------------------------------ the segment
    def run(self, func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        job, state = self.job, self.state
        job.restore()
        if job.resumed:
            for h in self.own.values():
                h.save()  # the restored model and optimizer are the committed ones
            if job.previous_world != job.size and not job.state.joined_live:
                state.on_reset()  # from a checkpoint at another size: the reset callbacks (LR)
        else:
            state.sync()  # a fresh start: rank 0's state, as Horovod Elastic starts
        self.committed = job.step
        self._begin_segment()
        while True:
            self.counting = True  # the optimizer steps of the function are the job's steps
            try:
                result = func(state, *args, **kwargs)
            except _Stop:
                self.counting = False  # (a broadcast of the optimizer state steps it too)
                if self._pause_and_reset():
                    continue
                self._end()
                raise SegmentDone() from None
            except Exception as e:  # a peer lost: with --survive, go on from the last commit
                self.counting, self._depth = False, 0
                if self._roll_back(e):
                    continue
                raise
            self.counting = False
            self.boundary.stopped(StopReason.FINISHED)
            self._end()
            return result

    def _begin_segment(self) -> None:
        self.boundary.begin(self.job.progress.lr_used)
        self._first = True

    def _epoch(self) -> int:
        epoch = getattr(self.state, "epoch", 0)  # a TorchState(epoch=...) script's epoch
        return epoch if isinstance(epoch, int) else 0

    def _before_step(self, opt, args, kwargs) -> None:
        self._depth += 1  # Horovod's optimizer steps its base class inside its own step: both hook
        if not self.counting or self._depth > 1:
            return
        job = self.job
        job.seg.current = job.step + 1
        if self._first:
            job.progress.lr_used = job.state.current_lr()  # (the job's own hook, run before, saw the LR stepped)

    def _after_step(self, opt, args, kwargs) -> None:
        """One step done: the step boundary (count, heartbeat, windows; the stop waits for a commit)."""
        self._depth -= 1
        if not self.counting or self._depth > 0:
            return
        self._first = False
        self.boundary.after_step(self.job.seg.step + 1)

    # ------------------------------------------------------------------ commits
    def commit_point(self) -> None:
        """After Horovod's save: stop here if all ranks agree (raises :class:`_Stop`), else take the
        periodic checkpoint when due and start the next stop vote."""
        job = self.job
        step = self.committed = job.step
        reason = self.boundary.decide(step)  # --steps caps the run (finished)
        if reason is None:
            if job.rank == 0:
                job.checkpoints.maybe_periodic(step, job.stop_at)
            return
        self.boundary.stopped(reason)
        raise _Stop()

    def _pause_and_reset(self) -> bool:
        """Where the ring is re-formed in place: pause, and on the controller's word re-form the
        ring at the new size (Horovod Elastic's reset: reset callbacks, then the state from rank
        0). True when the function is to run again in this process."""
        # the reset callbacks before the sync, as Horovod Elastic: rank 0's result is what is sent
        if not self.boundary.resized_in_place(before_sync=self.state.on_reset):
            return False
        self._begin_segment()
        return True

    def _roll_back(self, exc: Exception) -> bool:
        """A peer was lost (``exc``) where survivors go on (``--survive``, the ring re-formed in
        place): as Horovod Elastic does, back to the last commit, kept in memory by Horovod's save.
        This rank says it holds that step; on the controller's word it restores the committed
        state, re-forms the ring at the size left, runs the reset callbacks and syncs the state from
        rank 0 (:meth:`_pause_and_reset`'s reset). True when the function is to run again here."""
        from elastic_ring.worker import survive

        job = self.job
        if not survive.enabled() or self.committed is None:
            return False
        action = survive.rollback_word(exc, job, [self.committed])
        if action is None:
            return False
        self.state.restore()
        job.seg.step = job.seg.current = self.committed
        self.boundary.reform(action, before_sync=self.state.on_reset)
        self._begin_segment()
        return True

    def _end(self) -> None:
        """The segment's end: the final checkpoint and ``segment_end`` (rank 0), then all leave."""
        self.boundary.end(evaluate=False)
