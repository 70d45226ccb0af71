"""The controller's sampler of the workers' processes walks the machine's processes at most once a
second (a throughput event every few steps reuses the last sample), or at every event with 0."""

from __future__ import annotations

import os

import pytest

from elastic_ring import env
from elastic_ring.telemetry.probe import Telemetry


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _counted(t: Telemetry) -> list[int]:
    walks = [0]
    procs = t._procs

    def counting():
        walks[0] += 1
        return procs()

    t._procs = counting
    return walks


def test_a_sample_sooner_than_every_s_is_the_last_one_and_a_later_one_walks_again():
    clock = Clock()
    t = Telemetry(os.getpid(), every_s=1.0, clock=clock)
    walks = _counted(t)
    first = t.sample()
    assert walks == [1] and first["processes"] >= 1
    clock.t += 0.5
    again = t.sample()
    assert walks == [1] and again == first
    again["processes"] = -1  # a copy: the caller's change is not the next caller's
    assert t.sample()["processes"] == first["processes"]
    clock.t += 0.6
    t.sample()
    assert walks == [2]


def test_zero_samples_at_every_call():
    clock = Clock()
    t = Telemetry(os.getpid(), every_s=0.0, clock=clock)
    walks = _counted(t)
    for _ in range(3):
        t.sample()
    assert walks == [3]


@pytest.mark.parametrize("value, want", [(None, 1.0), ("0", 0.0), ("2.5", 2.5), ("-1", 1.0), ("soon", 1.0)])
def test_the_period_from_the_environment(value, want):
    e = {} if value is None else {env.TELEMETRY_EVERY_S: value}
    assert env.telemetry_every_s(e) == want
    assert Telemetry(None, env=e).every_s == want
