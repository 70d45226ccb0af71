"""The flat loop, ``for step in job.steps()`` (:func:`flat_steps`): a segment's steps up to its
stop step or an agreed stop (:class:`~elastic_ring.worker.segment.StopVote`, every
K steps, K agreed in the vote), then either the next segment in the same processes (the ring re-formed
in place) or the segment's end.
"""

from __future__ import annotations

import time
from typing import Any, Iterator

from elastic_ring.worker.hooked import check_restored_weights
from elastic_ring.worker.survive import memory_copy


def flat_steps(job: Any) -> Iterator[int]:
    """The steps of every segment this process runs; see :meth:`elastic_ring.worker.api.Job.steps`."""
    while True:
        yield from _segment_steps(job)
        if job.ring.in_place and job.seg.stop_reason != "finished":
            action = job.pause()
            if action.is_resize:
                job.reform(action)
                continue
        break
    job.end_segment()


def _segment_steps(job: Any) -> Iterator[int]:
    """The steps of one segment (one world size), up to ``stop_at`` or an agreed stop."""
    info, seg, progress, vote = job.info, job.seg, job.progress, job.vote
    progress.begin_segment()
    vote.begin()
    step = seg.step
    reason = "finished" if seg.stop_at >= seg.total_steps else "scheduled"
    first = True
    handle = None  # the stop vote in flight
    sampler = job.state.sampler
    copy = memory_copy(job)  # the last completed steps' state, where survivors go on after a failure
    while step < seg.stop_at:
        if copy is not None:
            copy.keep(step)
        step += 1
        seg.current = step
        if first:  # before the step: the LR it runs with, unless it sets the LR itself
            check_restored_weights(job)
            progress.begin_segment(job.current_lr())
        yield step
        seg.step = step
        if sampler is not None and sampler._loader:
            sampler.cursor += sampler.batch_size * job.size
        progress.heartbeat(step, "step")
        progress.window.steps += 1
        now = time.time()
        if first:  # start-up cost ends with the first step of a segment
            first = False
            progress.first_step(step, now)
        elif progress.window.steps >= info.throughput_window or step == seg.stop_at:
            progress.last_loss, now = progress.close_window(step, sampler.epoch if sampler is not None else 0)
        job.between_steps(step, now)
        if step < seg.stop_at:
            if handle is not None:  # started after the last step: it travelled with this step's gradients
                stop, early = vote.result(handle)
                handle = None
                if early or stop:
                    reason = "finished" if early else "requested"
                    break
            if vote.due(step):
                handle = vote.start(step)
    if handle is not None:  # every rank has the same vote in flight: complete it
        if vote.result(handle)[1] and step < seg.total_steps:
            reason = "finished"  # the early stop lands at this segment's last step
    seg.stopped(reason, time.time())
    seg.finished = step >= seg.total_steps or reason == "finished"
