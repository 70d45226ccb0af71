"""Stop points at the registered optimizer's steps, for a script that keeps its own epoch loop
(:class:`HookedSteps`, held by :class:`elastic_ring.worker.api.Job`).

A plain Horovod script's ``for epoch in job.epochs(1, args.epochs + 1): for batch in loader: ...
optimizer.step()`` has no ``job.steps()``: every step of the registered optimizer is a step of the
job. After a step (the optimizer's post-hook) the step is counted, the training sampler's position
moves, the throughput window and the heartbeat go on, and the stop vote is started; the script's
own code after the step (a scheduler, a log line) then runs. The next point between two
iterations is the next step's pre-hook (its batch is loaded and its gradients computed, not yet
applied) or, at the end of an epoch, ``job.epochs()`` taking the next epoch (after the script's
end-of-epoch code: a scheduler stepped per epoch, a test). There the periodic checkpoint is taken
and, at an agreed stop, the final one (the RNG state as it was right after the step), all ranks
leave together, and :class:`StopSegment` ends the script: the next segment resumes at the next
batch of the same epoch, or at the next epoch. So the state saved is always that of a whole number
of iterations; the price is one batch's forward and backward computed again after a stop inside
an epoch.

When ``job.epochs()`` runs out the run is finished: the final checkpoint, the ``finished`` segment
end, and the script goes on after its loop (its final test and save).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Iterator

from elastic_ring.worker.errors import ContractError
from elastic_ring.worker.progress import _Window
from elastic_ring.worker.state import _rng_state

if TYPE_CHECKING:
    from elastic_ring.worker.api import Job


class StopSegment(BaseException):
    """Raised out of the script's ``optimizer.step()`` or ``job.epochs()`` once the segment has
    stopped (checkpoint written, all ranks agreed): the worker's entry point ends it cleanly. A
    ``BaseException``, so that a script's ``except Exception`` does not catch it."""


class HookedSteps:
    """The segment's steps counted at the registered optimizer's steps (see the module docstring)."""

    def __init__(self, job: "Job") -> None:
        self.job = job
        self.count = 0  # steps counted by the hooks in this process
        self.pending: str | None = None  # a stop decided, acted on at the next point between steps
        self.vote = None  # the stop vote in flight
        self.between_done = -1  # the last step whose between-steps work is done
        self.first_step: int | None = None
        self.ended = False

    # ------------------------------------------------------------------ the optimizer's hooks
    def before_step(self) -> None:
        """Pre-hook: the script's code since the last step has run; stop here if agreed."""
        job = self.job
        if self.first_step is None:  # the segment's first step
            if job.inplace:
                raise ContractError("an epoch loop (steps counted at optimizer.step()) is not supported "
                                    "under --relaunch inplace or --backend ray: use job.steps()")
            self.first_step = job.step + 1
            job._window = _Window()
            job._lr_used, job._lr_stepped = job.current_lr(), None
            return
        self.between(job.step)

    def after_step(self) -> None:
        """Post-hook: count the step, move the data position, time it, start the stop vote."""
        job = self.job
        info = job.info
        step = job.step + 1
        job.step = job._current = step
        self.count += 1
        sampler = self.training_sampler()
        if sampler is not None and job.elastic:
            sampler.advance()
        job._heartbeat(step, "step")
        w = job._window
        w.steps += 1
        w.samples += self._samples(sampler)
        now = time.time()
        if step == self.first_step:
            job._emit_first_step(step, now)
        elif w.steps >= info.throughput_window or step == job.stop_at:
            job.last_loss, now = job._close_window(step)
        job._saved_rng = _rng_state()  # what a checkpoint before the next step holds
        if step >= job.total_steps:
            self.pending = "finished"
        elif step >= job.stop_at:
            self.pending = "scheduled"
        elif self.vote is None and step % info.control_every == 0:
            self.vote = job._start_stop_vote()

    def training_sampler(self):
        """The drop-in sampler that feeds the steps: the one that fed them before (restored with
        the checkpoint), else the one iterated last (a test set's sampler iterated in the middle
        of an epoch does not take over once training has claimed one)."""
        job = self.job
        i = job._position.sampler_index
        if i is not None and 0 <= i < len(job._samplers):
            return job._samplers[i]
        return job._iterated

    def _samples(self, sampler) -> int:
        if sampler is None:
            return 0
        b = sampler.batch_size or sampler._loader_batch
        return int(b) if b else 0

    # ------------------------------------------------------------------ between two iterations
    def between(self, step: int) -> None:
        """After the script's code of ``step``: evaluation, periodic checkpoint, the vote (started
        after the step, it has travelled with the next step's gradients); the stop, if agreed."""
        job = self.job
        if step > self.between_done:
            self.between_done = step
            job._between_steps(step, time.time())
        if self.pending is None and self.vote is not None:
            stop, early = job._vote_result(self.vote)
            self.vote = None
            self.pending = "finished" if early else "requested" if stop else None
        if self.pending is not None:
            self.stop(self.pending)

    def stop(self, reason: str) -> None:
        """Checkpoint (rank 0), the segment's end, all ranks leave together: :class:`StopSegment`."""
        job = self.job
        if self.vote is not None:  # every rank has the same vote in flight: complete it
            job._vote_result(self.vote)
            self.vote = None
        self.end(reason)
        raise StopSegment(reason)

    def end(self, reason: str) -> None:
        """The segment's end (also the run's, ``finished``): what ``job.steps()`` does after its loop."""
        from elastic_ring.events.api import SegmentEnd

        job = self.job
        if self.ended:
            return
        self.ended = True
        job._decided = time.time()
        job.stop_reason = reason
        job.finished = reason == "finished"
        job._heartbeat(job.step, "ending")
        if job.finished:
            job._heartbeat(job.step, "eval")
            job._evaluate(job.step)
        if job.rank == 0:
            job._checkpoint(job.step, wait=True)
            job._emit(SegmentEnd(segment=job.segment, world_size=job.size, step=job.step, reason=reason,
                                 lr=job.current_lr(), stop_decided_at=job._decided))
        import torch

        job.hvd.allreduce(torch.tensor([0.0]), name="exit_barrier")  # leave together

    # ------------------------------------------------------------------ the epoch loop
    def epochs(self, start: int, stop: int) -> Iterator[int]:
        """``range(start, stop)`` from the restored epoch: see :meth:`Job.epochs`."""
        job = self.job
        if not job._restored:
            job.restore()
        pos = job._position
        first = start if pos.epoch is None else max(start, pos.epoch)
        for epoch in range(first, stop):
            if pos.epoch != epoch:  # a new epoch: its data from the start
                pos.epoch, pos.pos = epoch, 0
            yield epoch
            pos.epoch, pos.pos = epoch + 1, 0  # the epoch and its end-of-epoch code are done
            for s in job._samplers:
                s.iterating = False
            if self.first_step is not None and not self.ended:
                self.between(job.step)
        if not self.ended:
            if self.vote is not None:
                job._vote_result(self.vote)
                self.vote = None
            self.end("finished")
