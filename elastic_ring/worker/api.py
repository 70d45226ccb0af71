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

The :class:`Job` is a facade over the parts of a worker, each its own object: the ring (how this
launch forms it and re-forms it: :mod:`elastic_ring.worker.ring`), the job's counters and the stop
vote (:mod:`elastic_ring.worker.segment`), the registered state and its sync
(:mod:`elastic_ring.worker.sync`), the checkpoints (:mod:`elastic_ring.worker.checkpoints`) and
the progress it reports (:mod:`elastic_ring.worker.progress`); the loops that drive a segment are
:mod:`elastic_ring.worker.loop` (``job.steps()``), :mod:`elastic_ring.worker.hooked` (an epoch
loop) and :mod:`elastic_ring.worker.hvd_elastic` (a Horovod Elastic script), which all call one
step boundary between two steps (:mod:`elastic_ring.worker.boundary`). The parts' collectives
go through the ring's :mod:`elastic_ring.worker.collective`: Horovod's, or ``torch.distributed``'s
with ``elastic-ring train --collective torch`` (then ``init()`` forms the process group and
:meth:`Job.parallel` wraps the model in ``DistributedDataParallel``).

A plain Horovod script keeps its own epoch loop instead of ``job.steps()``: ``for epoch in
job.epochs(1, args.epochs + 1)`` over a DataLoader with ``elastic.DistributedSampler``; its stop
points are the registered optimizer's steps (:mod:`elastic_ring.worker.hooked`,
:mod:`elastic_ring.worker.data`). Outside the tool ``init()`` returns the plain job
(:mod:`elastic_ring.worker.plain`).
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from elastic_ring import protocol
from elastic_ring.env import launched_at, process_start
from elastic_ring.protocol import LaunchInfo
from elastic_ring.worker import session, stepcost
from elastic_ring.worker.allocator import keep_freed_memory
from elastic_ring.worker.boundary import StepBoundary
from elastic_ring.worker.checkpoints import Checkpoints
from elastic_ring.worker.checks import check_collectives_untouched
from elastic_ring.worker.data import DistributedSampler
from elastic_ring.worker.errors import ContractError, NotLaunchedError
from elastic_ring.worker.hooked import HookedSteps
from elastic_ring.worker.progress import Progress, StartUp
from elastic_ring.worker.ring import Ring, launched_under_horovod_elastic, ring_from_env
from elastic_ring.worker.sampler import Sampler
from elastic_ring.worker.segment import Segment, StopReason, StopVote
from elastic_ring.worker.survive import reset as survive_reset
from elastic_ring.worker.survive import take_rollback
from elastic_ring.worker.sync import StateSync

if TYPE_CHECKING:
    from elastic_ring.worker.plain import PlainJob

__all__ = ["ContractError", "DistributedSampler", "Job", "NotLaunchedError", "Sampler", "StopReason", "init",
           "reset"]

_T_IMPORTED = time.time()


def _process_start() -> float:
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # noqa: BLE001
        return _T_IMPORTED


def startup_marks(own_start: float, t_imported: float, env: dict[str, str] | None = None) -> StartUp:
    """Where a worker's start-up phases are counted from: the controller's launch of its launcher
    (``LAUNCHED_AT_ENV``; phase ``launcher``: up to the start of the command the launcher ran), and
    for a worker forked from the fork server, that command's start (``PROCESS_START_ENV``), not
    the fork: its ``imports`` (done in the fork server, before) is then the hand-over to the fork
    (``env``: default this process's)."""
    proc = process_start(env) or own_start
    launched = launched_at(env)
    marks: dict[str, float] = {}
    if launched is not None and -2.0 < proc - launched < 600:  # this host's launch (a process start
        marks["launcher"] = proc = max(proc, launched)          # is known to about a second)
        t_start = launched
    else:
        t_start = proc
    marks["imports"] = max(t_imported, own_start, proc)
    return StartUp(t_start, marks)


class Job:
    """One worker process's view of the elastic job (see the module docstring).

    The user-facing methods are here; each delegates to one part: ``ring``
    (:class:`~elastic_ring.worker.ring.Ring`), ``seg`` (:class:`~elastic_ring.worker.segment.Segment`),
    ``vote`` (:class:`~elastic_ring.worker.segment.StopVote`), ``state``
    (:class:`~elastic_ring.worker.sync.StateSync`), ``checkpoints``
    (:class:`~elastic_ring.worker.checkpoints.Checkpoints`), ``progress``
    (:class:`~elastic_ring.worker.progress.Progress`) and ``boundary``
    (:class:`~elastic_ring.worker.boundary.StepBoundary`: what every loop form does between two
    steps, and a segment's stop, pause, in-place re-form and end). ``ring``: the ring (default: this
    launch's, from the environment); ``rejoined``: the job starts over in this process, in
    ``ring`` re-formed in place (``start``: the reset's start-up phases so far).
    """

    elastic = True  # under the controller (the plain job of a script run without it: False)

    def __init__(self, info: LaunchInfo, lazy: bool = False, ring: Ring | None = None,
                 start: StartUp | None = None, rejoined: bool = False, warm_compile: bool = True) -> None:
        import torch

        self.info, self.run_dir = info, Path(info.run_dir)
        self.ring = ring if ring is not None else ring_from_env()
        self.ring.warms_compile = warm_compile
        self.seg = Segment(info.segment, info.stop_at, info.total_steps)
        self.state = StateSync(self.ring, self.seg, info.lr_scaling)
        start = start or startup_marks(_process_start(), _T_IMPORTED)
        self.progress = Progress(self.run_dir, self.ring, self.seg, start, info.throughput_window,
                                 info.eval_every, self.state.current_lr)
        self.progress.rescaled = lambda: self.state.rescaled
        self.checkpoints = Checkpoints(info, self.state.snapshot, self.progress, lambda: self.ring.size,
                                       self.state.current_lr)
        self.vote = StopVote(self.run_dir, self.ring, self.seg, info.control_every, info.stop_latency_ms / 1000)
        self.form = "optimizer"  # where the steps are: "optimizer" (its steps), "steps" (job.steps()),
        #                          "commits" (a Horovod Elastic script's)
        self.boundary = StepBoundary(self)  # everything between two steps, for every form
        self.hooked = HookedSteps(self)  # the steps counted at the optimizer's (an epoch loop)
        self.meter = stepcost.install(self)  # ELASTIC_RING_STEP_COST: the boundary's parts timed
        self.rejoined = rejoined  # started over in this process, in the ring re-formed in place
        self.restored = False
        self._step_depth = 0  # inside the registered optimizer's step (its hooks may nest)
        self.parallel_module: Any = None  # the DDP module parallel() returned (torch.distributed)
        if info.device == "cuda":
            torch.cuda.set_device(self.local_rank)
            self.device = torch.device("cuda", self.local_rank)
            torch.backends.cudnn.benchmark = True
        else:
            self.device = torch.device("cpu")
            keep_freed_memory()  # a step's activations reuse the last step's memory: no page faults
        # on GPUs too: cores launch kernels; a ring re-formed in place says how many it keeps
        torch.set_num_threads(self.ring.threads or protocol.cpu_threads(self.local_size))
        protocol.write_pid_record(self.run_dir, self.rank, info.owner, info.segment)
        if not lazy:
            self.connect()

    # ------------------------------------------------------------------ what the script reads
    rank = property(lambda self: self.ring.rank)
    size = property(lambda self: self.ring.size)
    local_rank = property(lambda self: self.ring.local_rank)
    local_size = property(lambda self: self.ring.local_size)
    hvd = property(lambda self: self.ring.hvd)
    collective = property(lambda self: self.ring.coll, doc="the job's collectives (worker.collective)")
    segment = property(lambda self: self.seg.number)
    stop_at = property(lambda self: self.seg.stop_at)
    total_steps = property(lambda self: self.seg.total_steps)
    finished = property(lambda self: self.seg.finished)
    stop_reason = property(lambda self: self.seg.stop_reason,
                           doc="why the segment's steps stopped (a StopReason; None before they did)")
    resumed = property(lambda self: self.state.resumed)
    previous_world = property(lambda self: self.state.previous_world)
    lr_factor = property(lambda self: self.state.lr_factor, doc="the product of all LR rescalings so far")
    extras = property(lambda self: self.state.extras)
    _epoch_data = property(lambda self: self.state.epoch_data)  # the drop-in samplers' (worker.data)
    global_batch = property(lambda self: (self.info.global_batch or None) if self.info.lr_scaling ==
                            "constant-batch" else None,
                            doc="the run's constant global batch (--lr-scaling constant-batch), else None")

    @property
    def step(self) -> int:
        """The last step done."""
        return self.seg.step

    # ------------------------------------------------------------------ start
    def connect(self) -> None:
        """Wait for the go of a pre-launched segment, then ``hvd.init()`` (idempotent).

        ``init(lazy=True)`` leaves this to the script (or to :meth:`restore`), so that a
        pre-launched worker builds its model and data before it waits.
        """
        if self.ring.connected:
            return
        start = self.progress.start
        start.mark("build")
        go = None
        if self.info.go_file is not None:
            go = self.ring.wait_for_go(self.info.go_file)
            start.mark("wait_for_go")
        self.seg.stop_at = self.ring.connect(go, self.seg.stop_at)
        if go is not None and go.pid_segment is not None:  # a warm joiner: its rank's record, as a cold one writes
            protocol.write_pid_record(self.run_dir, self.rank, self.info.owner, go.pid_segment)
        start.mark("hvd_init")
        self.progress.open_events()

    # ------------------------------------------------------------------ registration
    def distributed_optimizer(self, optimizer, model, **kwargs: Any):
        """``hvd.DistributedOptimizer`` over ``model``'s parameters with elastic-ring's defaults:
        ``op=Average``, and on CPUs ``groups=1`` (every gradient in one allreduce once the backward
        pass has produced them all, as DDP's single bucket does for a small model, instead of many
        small gloo allreduces while it runs: faster on CPUs, measured in docs/reports/peers.md),
        except where the ring is re-formed in place, where a grouped allreduce does not survive
        Horovod's re-initialisation (the ring hangs at the first step after a grow). Keyword
        arguments go to Horovod and win over these defaults. Register the result."""
        if self.collective.name != "horovod":
            raise ContractError("job.distributed_optimizer() is Horovod's: with --collective torch wrap the "
                                "model in DistributedDataParallel (or use job.parallel(model, optimizer))")
        kwargs.setdefault("op", self.hvd.Average)
        if self.device.type == "cpu" and not self.ring.in_place:
            kwargs.setdefault("groups", 1)
        return self.hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(), **kwargs)

    def parallel(self, model, optimizer, **kwargs: Any) -> tuple[Any, Any]:
        """(the module to call, the optimizer to step and register) averaging the gradients over the
        ranks with the job's collective: ``DistributedDataParallel(model)`` and ``optimizer`` on
        ``torch.distributed``, ``model`` and :meth:`distributed_optimizer` on Horovod. Keyword
        arguments go to the wrapper. Register ``model`` (not the DDP wrapper) and the optimizer.
        Where the process group is re-formed in place the module is a
        :class:`~elastic_ring.worker.reformed.ReformedDDP`: DDP rebuilt over each new group."""
        if self.collective.name == "torch":
            if self.ring.in_place:
                from elastic_ring.worker.reformed import ReformedDDP

                self.parallel_module = ReformedDDP(self.ring, model, **kwargs)
            else:
                self.parallel_module = self.collective.data_parallel(model, **kwargs)
            return self.parallel_module, optimizer  # (an epoch loop's constant-batch accumulation holds its syncs)
        return model, self.distributed_optimizer(optimizer, model, **kwargs)

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
        self.state.register(model, optimizer, scheduler, hooks=self._hooks(), **extras)

    def _hooks(self) -> tuple:
        return (self._before_optimizer_step, self._after_optimizer_step)

    def _before_optimizer_step(self, opt, args, kwargs) -> None:
        # Horovod's step calls the wrapped optimizer class's step, hooked again: the outer one counts
        self._step_depth += 1
        if self.state.syncing or self._step_depth > 1:
            return
        if self.form == "optimizer":
            self.hooked.before_step()  # may end the segment here (StopSegment)
        self.progress.optimizer_step(opt)

    def _after_optimizer_step(self, opt, args, kwargs) -> None:
        self._step_depth -= 1
        if self.form == "optimizer" and not self.state.syncing and self._step_depth == 0:
            self.hooked.after_step()

    def epochs(self, start: int, stop: int) -> Iterator[int]:
        """``range(start, stop)`` that a relaunch resumes at the epoch in progress (AdaptDL's
        ``remaining_epochs_until``): ``for epoch in job.epochs(1, args.epochs + 1):``.

        The stop points are the registered optimizer's steps (:mod:`elastic_ring.worker.hooked`):
        a stop inside an epoch resumes at its next batch (the ``elastic.DistributedSampler`` yields
        only the epoch's unused indices), a stop at its last step after the script's end-of-epoch
        code. When the range runs out the run is finished (final checkpoint) and the script goes
        on after its loop, with ``job.finished`` True.
        """
        if self.form == "steps":
            raise ContractError("job.epochs() and job.steps() in one script: use one of them")
        self.state.adopt_distributed_optimizer(hooks=self._hooks())
        if self.global_batch:  # --lr-scaling constant-batch: the optimizer acts once per global batch
            from elastic_ring.worker.accumulate import accumulate_epoch_loop

            accumulate_epoch_loop(self, self.state.optimizer)
        epochs = self.hooked.epochs(start, stop)
        return self.meter.loop(epochs, "epochs.next", self.meter.parts) if self.meter else epochs

    def evaluating(self):
        """``with job.evaluating(): test()``: an evaluation inside the script's own loop, kept out
        of the throughput windows and given the controller's watchdog the allowance of one."""
        return self.progress.evaluating()

    def finish(self) -> None:
        """End the job early (a target reached): the loop ends at the next point where all ranks
        agree (the step after this one with ``control_every`` 1), with the final checkpoint,
        evaluation and the ``finished`` state, as at ``total_steps``. Any rank may call it."""
        self.vote.finish_requested = True

    def sampler(self, size: int, batch_size: int, seed: int = 0, global_batch: int | None = None) -> Sampler:
        """The data position, saved with the state: see :class:`Sampler`. ``global_batch``: the
        samples of every step at any world size, in micro-batches of ``batch_size``
        (:mod:`elastic_ring.worker.accumulate`); the default is the run's own (``elastic-ring train
        --lr-scaling constant-batch --global-batch N``), else none."""
        if global_batch is None and self.info.lr_scaling == "constant-batch":
            global_batch = self.info.global_batch or None
            if global_batch is None:
                raise ContractError("a constant-batch run needs its global batch: job.sampler(..., "
                                    "global_batch=N) or elastic-ring train --global-batch N")
        self.state.sampler = Sampler(self, size, batch_size, seed, global_batch)
        stepcost.entries(self.state.sampler, stepcost.SAMPLER_ENTRIES)
        return self.state.sampler

    def micro_batches(self, sampler: Sampler, net: Any, optimizer: Any) -> Iterator[Any]:
        """This rank's micro-batches of the step, each inside its backward pass's context: the
        step's body for every rule (one micro-batch, the rank's batch, unless the global batch is
        constant): see :func:`elastic_ring.worker.accumulate.micro_batches`."""
        from elastic_ring.worker.accumulate import micro_batches

        return stepcost.loop(micro_batches(sampler, net, optimizer), "micro_batches")

    def on_resize(self, fn: Callable[[int, int, int], None]) -> None:
        """``fn(old_world, new_world, step)`` replaces the default LR rescaling at a new size."""
        self.state.on_resize(fn)

    def on_evaluate(self, fn: Callable[[int], dict[str, float] | None], every: int | None = None) -> None:
        """``fn(step)`` runs on every rank every ``every`` steps (default: the run's eval_every) and
        at the last step of the run; a returned dict with ``test_accuracy``/``test_loss`` becomes an
        ``evaluation`` event."""
        self.progress.eval_hook = fn
        if every is not None:
            self.progress.eval_every = every

    # ------------------------------------------------------------------ restore
    def restore(self) -> bool:
        """Load the newest checkpoint on rank 0 (falling back past a corrupt one) and broadcast it;
        or start fresh with rank 0's weights. Survivors of a failure load instead the copy of the
        step they all hold in memory (:mod:`elastic_ring.worker.survive`). Returns True when resumed."""
        self.connect()
        self._detect_sharded()
        meta, shards = None, None
        kept = take_rollback()  # survivors of a failure: the step they all hold, kept in memory
        if self.rank == 0:
            ckpt = kept if kept is not None else self.checkpoints.load_latest()
            if ckpt is not None:
                meta = self.state.load(ckpt)
                shards = ckpt.get("sharded")
                if self.rejoined:  # a joiner of the re-formed ring learns the segment from rank 0
                    meta.update(segment=self.segment, stop_at=self.stop_at)
        if self.checkpoints.sharded is not None:  # every rank reads its shards of rank 0's choice
            self.checkpoints.sharded.load(shards, kept)  # (kept: the survivors' replicas)
        self._sync(meta)
        self.restored = True
        self.state.remember_restored_weights()
        self.hooked.restored()
        return self.resumed

    def _detect_sharded(self) -> None:
        """A registered model with DTensor parameters (FSDP2's ``fully_shard``) is checkpointed
        sharded from now on (:mod:`elastic_ring.worker.sharded`; one line on rank 0 says so)."""
        from elastic_ring.worker import sharded

        if self.state.sharded or not sharded.is_sharded(self.state.model):
            return
        sharded.check_optimizer(self.state.model, self.state.optimizer)
        self.state.sharded = True
        self.checkpoints.shard(self.state, self.ring, self.vote)
        if self.rank == 0:
            sharded.say(sharded.DETECTED)

    def _sync(self, meta: dict[str, Any] | None, local: bool = False) -> None:
        self.state.sync(meta, local=local)
        self.progress.start.mark("restore_broadcast")
        self.checkpoints.last_step = self.step

    # ------------------------------------------------------------------ the step loop
    def record(self, loss: Any = None, samples: int | None = None) -> None:
        """Per step: this rank's loss (a tensor is read only at window ends) and samples used."""
        w = self.progress.window
        if loss is not None:
            w.losses.append(loss.detach() if hasattr(loss, "detach") else float(loss))
        sampler = self.state.sampler
        if samples is None and sampler is not None:
            samples = sampler.batch_size
            if sampler.global_batch:  # G / world per step on average (the throughput counts rank 0's)
                samples = sampler.layout().samples_at(self.seg.current or self.seg.step + 1)
        w.samples += int(samples or 0)

    def steps(self) -> Iterator[int]:
        """Yield the steps of this segment; stop where the controller asks (see module docstring).

        Where the ring is re-formed in place (``--relaunch inplace``, the Ray backend) a stop for a
        resize does not end the loop: the workers pause, the ring is re-formed at the new size
        (:meth:`~elastic_ring.worker.boundary.StepBoundary.reform`), and the loop goes on with the
        next segment in the same processes.
        """
        from elastic_ring.worker.loop import flat_steps

        if self.hooked.count:
            raise ContractError("job.steps() after steps of an epoch loop: use one of them")
        if self.total_steps >= protocol.NO_STEP_LIMIT:
            raise ContractError("job.steps() needs the run's length: give `elastic-ring train --steps N`")
        self.form = "steps"
        if not self.restored:
            self.restore()
        steps = flat_steps(self)
        return self.meter.loop(steps, "boundary", self.meter.parts) if self.meter else steps


def init(lazy: bool = False, warm_compile: bool = True) -> "Job | PlainJob":
    """Start this worker's part of the elastic job (call once, first thing).

    Sets the device (one GPU per local rank, or ``cores / local workers`` CPU threads), waits for
    the go of a pre-launched segment and calls ``hvd.init()``; with ``lazy=True`` the last two wait
    for :meth:`Job.connect` (or :meth:`Job.restore`), so that the script can build its model and data
    first. Outside ``elastic-ring train --script`` (plain ``horovodrun``, ``torchrun`` or ``python``)
    it returns a :class:`~elastic_ring.worker.plain.PlainJob`: the script runs as plain Horovod or
    plain torch.distributed.

    ``warm_compile``: import ``torch._dynamo`` while the ring forms (or while a pre-launched worker
    waits), off the first step's path: torch's optimizers import it at their first call. False for
    a script whose optimizer never does (the built-in trainer's :class:`elastic_ring.train.optim.SGD`).
    """
    job = session.current()
    if job is not None:
        return job
    info = session.launch()  # (the worker entry's: its launch and the run's settings)
    if info is None:
        from elastic_ring.worker.plain import PlainJob

        job = PlainJob()
        session.started(job)
        return job
    carried = session.take_carried()
    if carried is None:
        check_collectives_untouched(info.collective, launched_under_horovod_elastic())
        session.init_begins()
        job = Job(info, lazy=lazy, warm_compile=warm_compile)
    else:  # the script run again in this process, in the ring re-formed in place
        ring, segment, stop_at, start = carried
        job = Job(replace(info, segment=segment, stop_at=stop_at, go_file=None), lazy=lazy, ring=ring,
                  start=start, rejoined=True, warm_compile=warm_compile)
    session.started(job)
    return job


def reset() -> None:
    """Forget this process's job and its copies in memory (``--survive``): the next :func:`init`
    starts a new one from nothing (a Ray actor's process that left a ring, serving again)."""
    session.reset()
    survive_reset()
