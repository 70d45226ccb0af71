"""The replay used by the simulator-against-live check (scripts/cluster_check_sim.py): step-counted
jobs on measured speed tables, a start overhead, hand-checked."""

from __future__ import annotations

import pytest

from elastic_ring.errors import ConfigError
from elastic_ring.sim.api import SimConfig
from elastic_ring.sim.replay import TableSpeed, replay


def test_eight_on_two_slots_runs_jobs_one_after_another_with_the_start_overhead():
    # job 0: 100 steps at 12 steps/s (2 workers) after 3 s of start: ends at 11.33 s; job 1 waits
    r = replay([(0, 100), (0, 100), (5, 50)], "eight", 2, {1: 10.0, 2: 12.0}, 3.0, 5.0)
    assert r.jct_s == pytest.approx((3 + 100 / 12, 2 * (3 + 100 / 12), 3 * 3 + 250 / 12 - 5))
    assert r.resizes == 0


def test_precompute_keeps_one_worker_when_two_are_slower_in_steps():
    # steps/s falls with workers (fixed per-worker batch, step-counted job): never grows
    r = replay([(0, 100), (2, 40)], "precompute", 2, {1: 10.0, 2: 8.0}, 1.0, 5.0)
    assert r.jct_s == pytest.approx((11.0, 5.0)) and r.resizes == 0


def test_precompute_shrinks_on_arrival_and_pays_the_resize_overhead():
    # 2 workers faster: job 0 alone gets 2, job 1's arrival at t=5 shrinks it to 1 (5 s lost)
    r = replay([(0, 100), (5, 10)], "precompute", 2, {1: 10.0, 2: 15.0}, 0.0, 5.0)
    # t=5: 75 steps done, shrunk to 1 (paused until 10); job 1 runs 10 steps at 10/s, ends at 6;
    # job 0 alone again is grown to 2 at 6 (paused until 11), its last 25 steps take 25/15 s
    assert r.resizes == 2
    assert r.jct_s == pytest.approx((11 + 25 / 15, 1.0))


def test_table_speed_and_bad_input():
    t = TableSpeed({1: 10.0, 2: 12.0})
    assert t.samples_per_s(1) == 10.0 and t.samples_per_s(4) == 12.0
    with pytest.raises(ConfigError):
        TableSpeed({1: 0.0})
    with pytest.raises(ConfigError):
        SimConfig(start_overhead_s=-1)
