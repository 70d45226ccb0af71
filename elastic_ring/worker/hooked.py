"""Stop points at the registered optimizer's steps, for a script that keeps its own epoch loop
(:class:`HookedSteps`, held by :class:`elastic_ring.worker.api.Job`).

A plain Horovod script's ``for epoch in job.epochs(1, args.epochs + 1): for batch in loader: ...
optimizer.step()`` has no ``job.steps()``: every step of the registered optimizer is a step of the
job. After a step (the optimizer's post-hook) the step is counted, the training sampler's position
moves, the throughput window and the heartbeat go on, and the stop vote in flight is read (started
L steps before, it travelled with the gradients of the steps since) or, when due, one is started
(:class:`~elastic_ring.worker.segment.StopVote`: every K steps); the script's own code after the
step (a scheduler, a log line) then runs. The next point between two
iterations is the next step's pre-hook (its batch is loaded and its gradients computed, not yet
applied) or, at the end of an epoch, ``job.epochs()`` taking the next epoch (after the script's
end-of-epoch code: a scheduler stepped per epoch, a test). There the periodic checkpoint is taken
and, at an agreed stop, the final one (the RNG state as it was right after the step), all ranks
leave together, and :class:`StopSegment` ends the script: the next segment resumes at the next
batch of the same epoch, or at the next epoch. So the state saved is always that of a whole number
of iterations; the price is one batch's forward and backward computed again after a stop inside
an epoch.

Where the ring is re-formed in place (the Ray backend, ``--relaunch inplace``), a stop for a resize
writes the same checkpoint, pauses for the controller's word and re-forms the ring; then
:class:`Rejoin` ends this run of the script, and the entry point runs it again in the same process
over the new ring, as a relaunch would run it in a new one (no process start, no imports).

When ``job.epochs()`` runs out the run is finished: the final checkpoint, the ``finished`` segment
end, and the script goes on after its loop (its final test and save).

Under ``--survive`` (a ring re-formed in place) every completed step's state is also kept in memory
(:class:`~elastic_ring.worker.survive.MemoryCopy`, the last two; :meth:`HookedSteps.keep_copy`):
what a checkpoint at that point holds (data position in the epoch, schedulers, RNG as right after
the step). It is taken once per step, at the first of: the training sampler handing out the next
batch's first index (the script's code after the step has run, the next step's forward and the
allreduces its backward starts have not: a peer lost there is met only after the copy), the next
step's pre-hook, or ``job.epochs()`` taking the next epoch (after the end-of-epoch code; the copy of
an epoch's last step resumes at the next epoch). Survivors of a failure roll back to it as the flat
loop's do (:func:`elastic_ring.worker.survive.survived`).
"""

from __future__ import annotations

import time
from typing import Any, Iterator

from elastic_ring.worker.boundary import StopReason, check_restored_weights
from elastic_ring.worker.state import _rng_state

__all__ = ["HookedSteps", "Rejoin", "StopSegment", "check_restored_weights"]


class StopSegment(BaseException):
    """Raised out of the script's ``optimizer.step()`` or ``job.epochs()`` once the segment has
    stopped (checkpoint written, all ranks agreed): the worker's entry point ends it cleanly. A
    ``BaseException``, so that a script's ``except Exception`` does not catch it."""


class Rejoin(StopSegment):
    """The segment stopped and this process is a member of the ring re-formed in place for the
    next one: the entry point runs the script again here (:func:`elastic_ring.worker.session.start_over`)."""

    def __init__(self, ring: Any, segment: int, stop_at: int, start: Any) -> None:
        super().__init__(f"rejoin at segment {segment}")
        self.ring, self.segment, self.stop_at, self.start = ring, segment, stop_at, start


class HookedSteps:
    """The segment's steps counted at the registered optimizer's steps (see the module docstring);
    what happens between two of them is the job's :class:`~elastic_ring.worker.boundary.StepBoundary`."""

    def __init__(self, job: Any) -> None:
        self.job = job
        self.boundary = job.boundary
        self.count = 0  # steps counted by the hooks in this process
        self.pending: StopReason | None = None  # a stop decided, acted on at the next point between steps
        self.between_done = -1  # the last step whose between-steps work is done
        self.first_step: int | None = None
        self.ended = False
        self.copies_started = False
        self.rng_at_restore = None  # the RNG right after restore(): the restored step's, for its copy
        self.rng_step = -1  # the step whose RNG state.saved_rng holds (rank 0; every rank with copies)
        self.quiet_step = -1  # the last step after which nothing is due between steps (after_step)
        self._sampler = None  # the training sampler at the last step (the throughput window's epoch)
        self.last_epoch: int | None = None  # job.epochs()'s last epoch (None: no job.epochs() loop)

    # ------------------------------------------------------------------ --survive: the copy in memory
    def restored(self) -> None:
        """``job.restore()`` is done: remember the RNG of the restored step (for its copy, taken
        after the script's loader and forward have drawn from it), where copies are kept."""
        from elastic_ring.worker import survive

        if survive.keeps_copies(self.job):
            self.rng_at_restore = _rng_state()

    def start_copies(self) -> None:
        """Keep a copy of each completed step from now on, where the run keeps survivors going."""
        if self.copies_started:
            return
        self.copies_started = True
        if self.boundary.start_copies() is not None:
            self.job._epoch_data.before_batch = self.keep_copy

    def keep_copy(self) -> None:
        """The last completed step is done with (the script's code after it has run) and the next
        one has not started: copy its state (once per step; see the module docstring)."""
        if self.boundary.copy is None or self.ended:
            return
        state = self.job.state
        if state.saved_rng is None:  # no step yet in this job: the RNG as restored
            state.saved_rng = self.rng_at_restore
        self.boundary.keep_copy(self.job.step)

    # ------------------------------------------------------------------ the optimizer's hooks
    def before_step(self) -> None:
        """Pre-hook: the script's code since the last step has run; stop here if agreed."""
        job = self.job
        if self.first_step is None:  # the segment's first step
            check_restored_weights(job)
            self.first_step = job.step + 1
            self.quiet_step = -1
            self.boundary.epoch = self._epoch
            self.boundary.begin(job.state.current_lr())
            self.start_copies()
            self.keep_copy()
            return
        step = job.seg.step
        if step != self.quiet_step:  # (the common step: nothing between it and this one)
            self.between(step)

    def after_step(self) -> None:
        """Post-hook: move the data position, then the step boundary (count, time, the stop)."""
        job = self.job
        seg = job.seg
        step = seg.step + 1
        seg.current = step
        self.count += 1
        sampler = self._sampler = job._epoch_data.training_sampler()
        samples = 0
        if sampler is not None:  # (its position moved and the step's samples read in one call)
            samples = sampler.stepped(step, int(getattr(job.state.optimizer, "backward_passes_per_step", 1) or 1),
                                      job.elastic)
        boundary = self.boundary
        pending = self.pending = boundary.after_step(step, samples)
        if self._rng_wanted(step, sampler):  # what a checkpoint before the next step holds
            job.state.saved_rng = _rng_state()
            self.rng_step = step
        elif pending is None and boundary.copy is None and not job.progress.evaluation_due(step):
            self.quiet_step = step  # the common step: nothing to do between it and the next

    def _epoch(self) -> int:
        """The epoch a throughput window names: the script's (job.epochs()), else its sampler's."""
        pos, sampler = self.job._epoch_data.position, self._sampler
        return pos.epoch if pos.epoch is not None else sampler.epoch if sampler is not None else 0

    def _rng_wanted(self, step: int, sampler) -> bool:
        """Whether the RNG right after ``step`` may be saved before the next step: by a copy kept
        in memory (every step, on every rank), or, on rank 0, by a checkpoint at the next point
        between steps: a stop there (pending: decided at this step's post-hook, which also reads
        the vote in flight), the periodic checkpoint due, the run's end after the end-of-epoch code
        (the data of ``job.epochs()``'s last epoch used up; with no ``job.epochs()`` any epoch's
        end, and every step where the training sampler is not elastic-ring's: where the script's
        loop ends is not known). Not at the end of another epoch (about 0.2 ms, once an epoch:
        a checkpoint there is a stop's or the periodic one, both taken above). Not at a step that
        only started a vote: it is read at the next step's post-hook, and a stop it brings is then
        pending there, whose RNG is taken then. Else it is not taken (tens of microseconds: numpy's
        and Python's states are copied element by element); a periodic checkpoint that falls due
        before the next step without it waits for the next step (:meth:`between`)."""
        job, boundary = self.job, self.boundary
        if boundary.copy is not None:
            return True
        if not job.checkpoints.writes(job.rank):
            return False
        if self.pending is not None or job.checkpoints.due(step, job.seg.stop_at):
            return True
        if sampler is None:  # no sampler of ours: where an epoch ends is not known
            return True
        pos, last = job._epoch_data.position, self.last_epoch
        return (last is None or pos.epoch == last) and pos.pos >= sampler.size()

    # ------------------------------------------------------------------ between two iterations
    def between(self, step: int) -> None:
        """After the script's code of ``step``: evaluation, periodic checkpoint; the stop, if agreed
        (at ``step``'s post-hook: a stop vote read, the run's length or the segment's stop step).
        Nothing where the post-hook found nothing due (:attr:`quiet_step`: no copy kept, no stop
        pending, no evaluation due, no RNG taken, so no periodic checkpoint; the progress file is
        written at the step), the common step."""
        if step == self.quiet_step:
            return
        self.keep_copy()
        if step > self.between_done:
            self.between_done = step
            # (a periodic checkpoint only with the RNG as right after the step: else at the next)
            self.boundary.between(step, time.time(), periodic=self.rng_step == step)
        if self.pending is not None:
            self.stop(self.pending)

    def stop(self, reason: StopReason) -> None:
        """Checkpoint (rank 0), the segment's end, all ranks leave together: :class:`StopSegment`;
        or, resized in place, :class:`Rejoin` once the ring is re-formed."""
        job, boundary = self.job, self.boundary
        reason = boundary.stopped(reason)  # the vote in flight completed
        checkpointed = False
        if job.ring.in_place and reason is not StopReason.FINISHED:
            self.ended = True
            if job.checkpoints.writes(job.rank):  # (a sharded job: every rank)
                job.checkpoints.write(job.step, wait=True)
            checkpointed = True
            action = boundary.pause()
            if action.is_resize:
                boundary.reform_ring(action)  # a worker left out retires here
                job.progress.beats.stop()  # (the next run of the script beats with a job of its own)
                raise Rejoin(job.ring, action.segment, action.stop_at, job.progress.start)
            self.ended = False
        self._end(checkpoint=not checkpointed)
        raise StopSegment(reason)

    def end(self, reason: StopReason) -> None:
        """The segment's end (also the run's, ``finished``): what ``job.steps()`` does after its loop."""
        if self.ended:
            return
        self.boundary.stopped(reason)
        self._end()

    def _end(self, checkpoint: bool = True) -> None:
        self.ended = True
        self.boundary.end(checkpoint=checkpoint)

    def _leave_out_epoch_end(self) -> None:
        """The script's end-of-epoch code (its own test, a checkpoint of its own) ran since the
        epoch's last step: that time is no step's, so the throughput window leaves it out."""
        w, t = self.job.progress.window, self.boundary.t_done
        if w.t0 is not None and t is not None:
            w.t0 += time.time() - max(t, w.t0)
        self.boundary.t_done = None

    # ------------------------------------------------------------------ the epoch loop
    def epochs(self, start: int, stop: int) -> Iterator[int]:
        """``range(start, stop)`` from the restored epoch: see :meth:`Job.epochs`."""
        job = self.job
        if not job.restored:
            job.restore()
        data = job._epoch_data
        pos = data.position
        self.start_copies()
        first = start if pos.epoch is None else max(start, pos.epoch)
        self.last_epoch = stop - 1  # (its end: the run's, where the RNG is taken: _rng_wanted)
        if pos.epoch is not None and start > pos.epoch:
            # The script's own resume (its own checkpoint files) puts it further on than the state
            # restored: starting at ``start`` would skip the rest of epoch ``pos.epoch`` and report
            # the run finished over data never trained. The restored position wins (the weights,
            # optimizer and data position are the tool's); say so once.
            first = pos.epoch
            job.progress.notice(
                f"the script asked for epochs from {start}, but the restored checkpoint is at epoch "
                f"{pos.epoch} (step {job.step}): training from epoch {pos.epoch} (the script's own "
                "resume is ignored under elastic-ring; see docs/worker.md, 'A script's own checkpoints')")
        for epoch in range(first, stop):
            if pos.epoch != epoch:  # a new epoch: its data from the start
                pos.epoch, pos.pos = epoch, 0
            yield epoch
            self._leave_out_epoch_end()
            pos.epoch, pos.pos = epoch + 1, 0  # the epoch and its end-of-epoch code are done
            for s in data.samplers:
                s.iterating = False
            if self.first_step is not None and not self.ended:
                self.between(job.step)
        if not self.ended:
            self.end(StopReason.FINISHED)
