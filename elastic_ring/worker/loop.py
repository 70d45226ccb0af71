"""The flat loop, ``for step in job.steps()`` (:func:`flat_steps`): a segment's steps up to its
stop step or an agreed stop (everything between two steps is the job's
:class:`~elastic_ring.worker.boundary.StepBoundary`: one call after each step), then either the
next segment in the same processes (the ring re-formed in place) or the segment's end.
"""

from __future__ import annotations

from typing import Any, Iterator

from elastic_ring.worker.boundary import StopReason, check_restored_weights


def flat_steps(job: Any) -> Iterator[int]:
    """The steps of every segment this process runs; see :meth:`elastic_ring.worker.api.Job.steps`."""
    boundary = job.boundary
    while True:
        yield from _segment_steps(job, boundary)
        if not boundary.resized_in_place():
            break
    boundary.end()


def _segment_steps(job: Any, boundary: Any) -> Iterator[int]:
    """The steps of one segment (one world size), up to ``stop_at`` or an agreed stop."""
    seg = job.seg
    sampler = job.state.sampler
    boundary.epoch = (lambda: sampler.epoch) if sampler is not None else (lambda: 0)
    boundary.begin()
    step = seg.step
    if step >= seg.stop_at:  # nothing to run in this segment
        done = step >= seg.total_steps or seg.stop_at >= seg.total_steps
        boundary.stopped(StopReason.FINISHED if done else StopReason.SCHEDULED)
        return
    boundary.start_copies()  # --survive: the last completed steps' state, where survivors go on
    boundary.keep_copy(step)
    step += 1
    seg.current = step
    check_restored_weights(job)  # before the first step: the LR it runs with, unless it sets it itself
    job.progress.begin_segment(job.state.current_lr())
    after_step = boundary.after_step
    while True:
        yield step
        if sampler is not None and sampler._loader:
            sampler.cursor += sampler.batch_size * job.size
        reason = after_step(step)  # the next step's counter and copy too, unless it stops here
        if reason is not None:
            break
        step += 1
    boundary.stopped(reason)
