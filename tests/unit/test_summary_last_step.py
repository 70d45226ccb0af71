"""A run's last step: the finished segment's end, not a later step an earlier segment named before
it was killed past its checkpoint (tests/integration/test_notice.py's Slurm case: a worker killed
at step 31 after the checkpoint of step 20, the resume finishing at step 30 said 31)."""

from __future__ import annotations

from elastic_ring.controller.summary import last_step
from elastic_ring.events.api import SegmentEnd, Throughput


def _window(step: int) -> Throughput:
    return Throughput(segment=0, step=step, world_size=1, steps=10, seconds=1.0, steps_per_s=10.0, images_per_s=80.0,
                      loss=1.0, lr=0.1, epoch=0)


def _end(step: int, reason: str) -> SegmentEnd:
    return SegmentEnd(segment=1, world_size=1, step=step, reason=reason, lr=0.1, stop_decided_at=0.0)


def test_a_finished_run_ends_at_its_last_segment_end_not_at_a_killed_segment_s_later_window():
    events = [_window(31), _end(30, "finished")]
    assert last_step(events) == 30


def test_a_run_not_finished_names_its_newest_step():
    assert last_step([_window(31), _end(20, "scheduled")]) == 31
    assert last_step([_window(12)]) == 12
