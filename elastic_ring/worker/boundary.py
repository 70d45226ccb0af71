"""What a worker does between two steps, for every loop form (:class:`StepBoundary`).

The three forms a script's steps come in all call this one object: the flat loop
(``job.steps()``, :mod:`elastic_ring.worker.loop`) after each yielded step, an epoch loop's
registered optimizer (:mod:`elastic_ring.worker.hooked`) from its post-hook, and a Horovod Elastic
script (:mod:`elastic_ring.worker.hvd_elastic`) from its optimizer's post-hook, deciding at its
commits. On the hot path one call per step, :meth:`StepBoundary.after_step`: the step counted, the
heartbeat noted (a thread writes it: :class:`~elastic_ring.heartbeat.Beats`), the throughput window (closed every ``throughput_window`` steps and at the segment's
stop step; where the form decides the stop at the step, its mean loss rides in the next stop vote,
one started at its close where the vote's period is not shorter than the window; else in an
allreduce of its own, read one window later), the evaluation, periodic checkpoint and progress
file where the form does them there (:meth:`StepBoundary.between`), and the stop: the run's
length, the segment's stop step, or the stop vote read (started L steps before, it travelled with
the gradients of the steps since and is done: its read waits for nothing; a new one started every
K steps, or at a window's close where K is not shorter than the window, one in flight at a time,
:class:`~elastic_ring.worker.segment.StopVote`), as a :class:`~elastic_ring.worker.segment.StopReason`.
Nothing else runs per step: no collective of its own, no RNG capture (an epoch loop takes the RNG
only where a checkpoint may hold it), the survivors' copy only with ``--survive``.

The form decides what runs at the step and what at its own points (:meth:`StepBoundary.begin`):

=============  =====================================  ==========================================
form           after the step (``after_step``)        at the form's own points
=============  =====================================  ==========================================
``steps``      count, window, between, stop,          --
               the copy (``--survive``)
``optimizer``  count, window, stop, the progress      between (where something is due there),
               file                                   the copy: next step's pre-hook, the next
                                                      batch, the next epoch
``commits``    count, window, the progress file       stop and periodic checkpoint: the next
                                                      ``state.commit()`` (:meth:`decide`)
=============  =====================================  ==========================================

At a stop: :meth:`StepBoundary.stopped` completes the vote in flight (a ``job.finish()`` it carries
makes a scheduled stop the run's end), then either the segment's end (:meth:`StepBoundary.end`:
checkpoint, ``segment_end``, all ranks leave together) or, where the ring is re-formed in place,
:meth:`StepBoundary.pause` for the controller's word and :meth:`StepBoundary.reform`.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from elastic_ring import protocol
from elastic_ring.seam import Action
from elastic_ring.worker import survive
from elastic_ring.worker.errors import ContractError
from elastic_ring.worker.segment import StopReason

__all__ = ["StepBoundary", "StopReason", "check_restored_weights"]

# what each form does at the step itself: (the between-steps work, or only the progress file,
# the stop decided there, the flat loop's next step prepared there: the copy and the step counter)
_FORMS = {"steps": (True, False, True, True), "optimizer": (False, True, True, False),
          "commits": (False, True, False, False)}


def check_restored_weights(job: Any) -> None:
    """Before the first step after a resume: stop (one line, not retried) if the script wrote other
    weights over the restored ones, e.g. its own checkpoint loaded after ``job.restore()``."""
    if job.state.restored_weights_overwritten():
        raise ContractError(
            f"the script loaded other weights after elastic-ring restored step {job.step} "
            "(its own checkpoint?): training on would mix two positions; load your own "
            "checkpoint before job.restore()/job.epochs(), or leave resuming to elastic-ring "
            "(docs/worker.md, 'A script's own checkpoints')")


class StepBoundary:
    """Everything between two steps of ``job`` (see the module docstring): its counters (in
    ``job.seg``), heartbeat and windows (``job.progress``), the stop vote in flight (``job.vote``),
    the survivors' copy, and the segment's stop, pause, in-place re-form and end."""

    def __init__(self, job: Any) -> None:
        self.job = job
        self.seg, self.progress, self.vote = job.seg, job.progress, job.vote
        self.window_steps = 1  # steps per throughput window (the run's, read at each segment's begin)
        self.epoch: Callable[[], int] = lambda: 0  # the epoch a throughput window names (the form's)
        self.handle = None  # the stop vote in flight
        self.vote_step = 0  # the step after which it started
        self.first = True  # the segment's first step is still to come
        self.t_done: float | None = None  # when the last step's boundary ended
        self.copy: survive.MemoryCopy | None = None  # --survive: the last completed steps' state
        self._between = self._progress = self._decide = self._flat = False

    # ------------------------------------------------------------------ the steps
    def begin(self, lr: float | None = None) -> None:
        """A segment's steps start (also after an in-place re-form), in the job's form: a new
        throughput window (``lr``: the LR its first step runs with, unless the step sets it), the
        first stop vote at its first step."""
        self._between, self._progress, self._decide, self._flat = _FORMS[self.job.form]
        self._progress = self._progress and self.progress.ring.rank == 0  # (the progress file is rank 0's)
        self.window_steps = self.job.info.throughput_window
        self.progress.begin_segment(lr)
        self.vote.begin()
        self.vote.windows = self._decide  # (decided at the step: its windows ride in the votes)
        self.first, self.handle = True, None

    def after_step(self, step: int, samples: int = 0) -> StopReason | None:
        """``step`` is done on this rank (``samples``: this rank's, for the throughput): count it,
        beat, time it, and what the form does here (module docstring); the stop after it, if any
        (the ``optimizer`` form acts on it at its next point, the ``commits`` form decides at its
        commits: None)."""
        seg, progress = self.seg, self.progress
        seg.step = step
        w = progress.window
        w.steps += 1
        w.samples += samples
        now = time.time()
        progress.beat(step, "step", now)  # (noted: a thread writes it)
        if self.first:  # start-up cost ends with the first step of a segment
            self.first = False
            progress.first_step(step, now)
        elif step == seg.stop_at:  # (no vote at a scheduled stop: the window's own allreduce)
            progress.last_loss, now = progress.close_window(step, self.epoch())
        elif w.steps >= self.window_steps:  # decided here: its loss rides in the vote started now
            progress.last_loss, now = progress.close_window(step, self.epoch(), ride=self._decide)
        self.t_done = now
        if self._between:
            self.between(step, now)
        elif self._progress and now > progress.progress_due_t:  # (rank 0's, where between-steps work
            progress.write_progress(step, now, self.vote.every, self.vote.lag)  # is not at every step)
        if not self._decide:
            return None
        reason = self.decide(step)
        if reason is None and self._flat:  # job.steps(): the next step starts when this returns
            if self.copy is not None:
                self.copy.keep(step)
            seg.current = step + 1
        return reason

    def decide(self, step: int) -> StopReason | None:
        """The stop after ``step`` (the same on every rank): the run's length, the segment's stop
        step, or the stop vote in flight read where its agreed lag is over (started after an
        earlier step, its allreduce done in the background by now); else None, and the next vote
        started when due (none is in flight: one at a time)."""
        seg = self.seg
        if step >= seg.total_steps:
            return StopReason.FINISHED
        if step >= seg.stop_at:
            return StopReason.SCHEDULED
        vote = self.vote
        handle = self.handle
        if handle is not None:
            if step < vote.read_at:  # (vote.readable(step), without a call on the common step)
                return None
            self.handle = None
            asked, early = self._read(handle)
            if early:
                return StopReason.FINISHED
            if asked:
                return StopReason.REQUESTED
        # (vote.due(step), without a call on the common step). A closed window rides in the next
        # vote: within K steps where K < the window (at most one closes between two votes), else
        # in a vote started at its close, or at the read of the vote in flight then (and the next
        # one K steps after it)
        if step >= vote.next_at or (self.progress.window_waiting is not None and vote.every >= self.window_steps):
            vote.ride = self.progress.take_window()
            self.handle, self.vote_step = vote.start(step), step
        return None

    def _read(self, handle) -> tuple[bool, bool]:
        """The vote in flight read (:meth:`StopVote.result`), and the window it carried told."""
        vote = self.vote
        result = vote.result(handle)
        if vote.rode is not None:
            self.progress.window_rode(vote.rode)
            vote.rode = None
        return result

    def between(self, step: int, now: float, periodic: bool = True) -> None:
        """After ``step`` and the script's code of it: the evaluation when due (kept out of the
        throughput window); on rank 0 the periodic checkpoint (unless not ``periodic`` now) and the
        progress file."""
        job, progress = self.job, self.progress
        if progress.evaluation_due(step):
            with progress.evaluating():
                progress.evaluate(step)
        if periodic and job.checkpoints.writes(job.rank):  # (a sharded job: every rank)
            job.checkpoints.maybe_periodic(step, self.seg.stop_at)
        if not self._progress and now > progress.progress_due_t and job.rank == 0:  # (else at the step)
            progress.write_progress(step, now, self.vote.every, self.vote.lag)

    def start_copies(self) -> survive.MemoryCopy | None:
        """``--survive`` on a ring re-formed in place: keep each completed step's state from now on."""
        self.copy = survive.memory_copy(self.job)
        return self.copy

    def keep_copy(self, step: int) -> None:
        """``step`` is complete and the next has not started: copy its state (once per step)."""
        if self.copy is not None:
            self.copy.keep(step)

    # ------------------------------------------------------------------ the stop
    def stopped(self, reason: StopReason) -> StopReason:
        """The segment's steps stop for ``reason`` (every rank the same): the vote in flight is
        completed (every rank has it; a ``job.finish()`` it carries makes a scheduled stop the
        run's end), the vote thread ended, and the stop recorded in the job's counters; returns
        the reason."""
        seg, reason = self.seg, StopReason(reason)
        if self.handle is not None:
            early = self._read(self.handle)[1]
            self.handle = None
            if early and reason is StopReason.SCHEDULED:
                reason = StopReason.FINISHED
        self.vote.close()  # (no vote follows in this segment: its launching thread ends)
        seg.stopped(reason, time.time())
        return seg.stop_reason

    def pause(self) -> Action:
        """A segment resized in place ends: its ``segment_end`` (rank 0), then all ranks wait for
        the controller's word (:meth:`Ring.await_action`). At a scheduled stop rank 0 first takes
        the next ring written ahead, if one is: the controller follows the workers once it reads
        the ``segment_end``, and before, it could withdraw that ring between the event and rank
        0's take (seen on a loaded machine: the test's ``inplace-1.taken.json`` missing)."""
        job, seg, progress = self.job, self.seg, self.progress
        progress.flush_window()  # the last window's event before the segment's end
        scheduled, taken = seg.stop_reason is StopReason.SCHEDULED, None
        if job.rank == 0:
            taken = job.ring.take_ahead(job.run_dir, seg.number, seg.step, scheduled)
            self._segment_end()
        progress.heartbeat(seg.step, "paused")
        return job.ring.await_action(job.run_dir, seg.number, seg.step, scheduled, taken=taken)

    def reform_ring(self, action: Action, t0: float | None = None) -> None:
        """Re-form the ring in this process as ``action`` says (the survivors of a failure keep
        their threads: :func:`~elastic_ring.worker.survive.reform_survivors`; a worker left out
        raises :class:`~elastic_ring.worker.ring.Retired`); the reset's start-up phases from
        ``t0`` (default: now)."""
        t0 = time.time() if t0 is None else t0
        ring = self.job.ring
        if action.rollback_to is not None:  # the survivors of a failure (a Horovod Elastic script's)
            survive.reform_survivors(ring, action)
        else:
            ring.reform(action)
        start = self.progress.start
        start.restart(t0)
        start.mark("hvd_reinit")
        if action.segment is not None:  # its rank may be another now: the controller's map of ranks to processes
            protocol.write_pid_record(self.job.run_dir, self.job.rank, self.job.info.owner, action.segment,
                                      reformed=True)

    def reform(self, action: Action, before_sync: Callable[[], None] | None = None) -> None:
        """Re-form the ring at the new size in this process, then sync rank 0's live state.

        The ring's ``reform`` (:meth:`reform_ring`); a new worker runs ``job.restore()``, whose
        collectives match the sync here: rank 0 broadcasts the counters (step, sample cursor, LR
        factor, extras, segment and stop step), the optimizer state and the weights; then every
        rank applies the LR rule. ``before_sync``: Horovod Elastic's reset callbacks, which run
        before the state comes from rank 0. The sample cursor is global, so the next step's shares
        are re-partitioned over the new ranks: every sample of an epoch is still used once.
        """
        job = self.job
        t0 = time.time()
        meta = job.state.live_meta(next_segment=action.segment, stop_at=action.stop_at)
        self.reform_ring(action, t0)
        self.progress.open_events()
        if before_sync is not None:
            before_sync()
        # a ring of one: rank 0 alone, whose state is the state (a broadcast to itself is a no-op)
        job._sync(meta if job.rank == 0 else None, local=job.ring.alone())
        self.progress.start.mark("sync")
        self.seg.stop_reason = None  # the next segment's steps go on here

    def resized_in_place(self, before_sync: Callable[[], None] | None = None) -> bool:
        """After a stop that did not finish the run, where the ring is re-formed in place: pause,
        and on the controller's resize re-form the ring here (:meth:`reform`). True when the
        next segment runs in this process. A sharded model's shards cannot be re-formed live: the
        ranks checkpoint them and the script runs again in the new ring, restoring at the new size
        (:class:`~elastic_ring.worker.hooked.Rejoin`)."""
        job = self.job
        if not job.ring.in_place or self.seg.finished:
            return False
        if job.state.sharded:  # its shards are bound to this ring: every rank checkpoints them first
            job.checkpoints.write(self.seg.step, wait=True)
        action = self.pause()
        if not action.is_resize:
            return False
        if job.state.sharded:  # the script runs again in the new ring: shards itself, restores (DCP)
            from elastic_ring.worker.hooked import Rejoin
            from elastic_ring.worker.sharded import forget_meshes

            self.reform_ring(action)
            forget_meshes()
            self.progress.beats.stop()  # (the next run of the script beats with a job of its own)
            raise Rejoin(job.ring, action.segment, action.stop_at, self.progress.start)
        self.reform(action, before_sync)
        return True

    def end(self, evaluate: bool = True, checkpoint: bool = True) -> None:
        """The segment's end, once its stop is agreed (:meth:`stopped`): the final evaluation of a
        finished run, the checkpoint and ``segment_end`` (rank 0; a segment resized in place told
        its end at the pause), and all ranks leave together."""
        job, seg, progress = self.job, self.seg, self.progress
        progress.flush_window()  # the last window's event before the segment's end
        meter = job.meter
        if meter is not None:
            meter.write(job.run_dir, seg.number, job.rank, form=job.form,
                        collective=job.collective.name, vote_every=getattr(self.vote, "every", None),
                        vote_lag=getattr(self.vote, "lag", None))
        progress.heartbeat(seg.step, "ending")
        progress.beats.stop()  # (no step follows: the thread ends; a next segment starts it again)
        if seg.finished and evaluate:
            progress.heartbeat(seg.step, "eval")
            progress.evaluate(seg.step)
        if job.rank == 0:
            progress.flush_progress()
        if checkpoint and job.checkpoints.writes(job.rank):  # (a sharded job: every rank)
            job.checkpoints.write(seg.step, wait=True)
        if job.rank == 0 and (not job.ring.in_place or seg.finished):
            self._segment_end()
        job.ring.coll.barrier(name="exit_barrier")  # leave together

    def _segment_end(self) -> None:
        from elastic_ring.events.api import SegmentEnd

        job, seg = self.job, self.seg
        self.progress.emit(SegmentEnd(segment=seg.number, world_size=job.size, step=seg.step,
                                      reason=StopReason(seg.stop_reason).value, lr=job.state.current_lr(),
                                      stop_decided_at=seg.decided))
