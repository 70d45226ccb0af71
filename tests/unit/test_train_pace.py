"""The built-in trainer's step floor (``min_step_s``): each loop body lasts at least the floor,
the sleep after the body; without a floor the job's steps are passed on untouched."""

from __future__ import annotations

from elastic_ring.train import worker
from elastic_ring.train.worker import paced


class _Clock:
    """A fake clock: ``sleep`` and the loop body (``work``) advance it; sleeps are recorded."""

    def __init__(self) -> None:
        self.now, self.slept = 0.0, []

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(round(s, 6))
        self.now += s


def test_no_floor_passes_the_steps_on_untouched():
    steps = iter([1, 2, 3])
    assert paced(steps, 0.0) is steps


def test_each_body_lasts_the_floor_and_a_longer_one_is_not_slowed(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(worker, "time", clock)
    work = {1: 0.01, 2: 0.05, 3: 0.0}  # step 2's body takes longer than the floor
    starts = []
    for step in paced(iter([1, 2, 3]), 0.03):
        starts.append(clock.now)
        clock.now += work[step]
    assert clock.slept == [0.02, 0.0, 0.03]  # after each body, what the floor leaves of it
    assert [round(b - a, 6) for a, b in zip(starts, starts[1:])] == [0.03, 0.05]
