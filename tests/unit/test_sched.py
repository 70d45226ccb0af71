"""Allocation policies on hand-checked cases (Eq. 6 doubling vs unit-step greedy)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from elastic_ring.errors import ConfigError
from elastic_ring.perfmodel.speed import SpeedModel
from elastic_ring.sched import (DEFAULT_RESIZE_OVERHEAD_S, Eight, Exploratory, JobView, Optimus, Precompute,
                                doubling_allocate, doubling_allocate_naive, make_policy, model_rate,
                                unit_greedy_allocate)
from tests.conftest import ROOT


def node_boundary_rate(w: int) -> float:
    """Samples/s: linear up to one 8-GPU node; 9..15 GPUs span two nodes and gain nothing; 16 pays."""
    if w <= 8:
        return 100.0 * w
    if w < 16:
        return 800.0
    return 1500.0


def linear(w: int) -> float:
    return float(w)


def test_unit_step_greedy_is_stuck_at_8_where_doubling_reaches_16():
    jobs = [(0, 1.2e6, node_boundary_rate)]
    # greedy: 8 -> 9 saves Q/800 - Q/800 = 0 s, so it stops at 8 and leaves 8 GPUs idle
    assert unit_greedy_allocate(jobs, 16) == {0: 8}
    assert Optimus().allocate([JobView(0, 1.2e6, node_boundary_rate)], 16, {}) == {0: 8}
    # doubling: 8 -> 16 saves (1.2e6/800 - 1.2e6/1500)/8 = (1500 - 800)/8 = 87.5 s per added GPU
    assert doubling_allocate(jobs, 16) == {0: 16}
    assert Precompute().allocate([JobView(0, 1.2e6, node_boundary_rate)], 16, {}) == {0: 16}


def test_doubling_two_jobs_by_hand():
    # start 1 + 1, 2 free. gains at w=1: Q*(1/1 - 1/2)/1 -> job1: 150, job0: 50. job1 doubles to 2
    # (free 1); its next doubling needs 2 > 1 free, dropped; job0 doubles to 2 (free 0).
    jobs = [(0, 100.0, linear), (1, 300.0, linear)]
    assert doubling_allocate(jobs, 4) == {0: 2, 1: 2}
    # 5 GPUs: after job1 -> 2 (free 2), gains job1 at 2: 300*(1/2-1/4)/2 = 37.5 < job0's 50 -> job0 -> 2
    # (free 1); job0 at 2: 12.5, job1 at 2 needs 2 > 1 free: both dropped, one GPU stays idle.
    assert doubling_allocate(jobs, 5) == {0: 2, 1: 2}
    assert doubling_allocate(jobs, 6) == {0: 2, 1: 4}


def test_more_jobs_than_gpus_first_come_first_served_at_one_gpu():
    jobs = [(i, 10.0 * (i + 1), linear) for i in range(5)]
    assert doubling_allocate(jobs, 3) == {0: 1, 1: 1, 2: 1}
    assert unit_greedy_allocate(jobs, 3) == {0: 1, 1: 1, 2: 1}


def test_no_doubling_when_more_gpus_slow_a_job_down():
    slower = lambda w: 10.0 / w  # noqa: E731
    assert doubling_allocate([(0, 50.0, slower)], 64) == {0: 1}
    assert unit_greedy_allocate([(0, 50.0, slower)], 64) == {0: 1}


def test_heap_doubling_equals_naive_reference_on_random_eq5_jobs():
    rng = np.random.default_rng(11)
    for _ in range(40):
        jobs = []
        for i in range(int(rng.integers(1, 30))):
            m = SpeedModel(rng.uniform(0, 1e-3), rng.uniform(0, 5e-3), rng.uniform(0, 5e-9), rng.uniform(0, 0.05),
                           64, rng.uniform(1e6, 1e8))
            jobs.append((i, float(rng.uniform(1e5, 1e8)), model_rate(m)))
        g = int(rng.integers(1, 300))
        a = doubling_allocate(jobs, g)
        assert a == doubling_allocate_naive(jobs, g)
        assert sum(a.values()) <= g
        assert all(w & (w - 1) == 0 for w in a.values())  # powers of two


def test_doubling_cost_does_not_grow_with_gpus():
    calls = []

    def rate(w: int) -> float:
        calls.append(w)
        return float(w) ** 0.9

    doubling_allocate([(0, 1e9, rate), (1, 2e9, rate), (2, 3e9, rate)], 2 ** 20)
    assert len(calls) < 2 * 3 * 2 * 21  # two calls per doubling, <= log2(G) doublings per job


def test_eight_fifo_and_exploratory_reserves_8_for_explorers():
    views = [JobView(i, 1.0, linear) for i in range(4)]
    assert Eight().allocate(views, 20, {}) == {0: 8, 1: 8}
    assert Eight().allocate(views, 4, {}) == {0: 4}
    ready = JobView(0, 100.0, linear, current=4)
    exploring = JobView(1, 100.0, None, current=8, exploring=True)
    new = JobView(2, 100.0, None, needs_exploration=True)
    late = JobView(3, 100.0, None, needs_exploration=True)
    a = Exploratory().allocate([ready, exploring, new, late], 20, {})
    assert a == {1: 8, 2: 8, 0: 4}  # 4 left for the measured job: 1 -> 2 -> 4; `late` waits


def test_make_policy_names_and_overhead_default():
    assert {make_policy(n).name for n in ("eight", "precompute", "exploratory", "optimus")} == \
        {"eight", "precompute", "exploratory", "optimus"}
    with pytest.raises(ConfigError):
        make_policy("fastest")
    # the default charge per resize traces to its measurement: the overlapped relaunch's median
    # time lost per resize in results/bench_resize.json (train's CPU default mode)
    rows = json.loads((ROOT / "results" / "bench_resize.json").read_text())["rows"]
    lost = [r["resize_lost_median_s"] for r in rows if r["mode"] == "overlap"]
    assert lost and min(lost) - 0.25 <= DEFAULT_RESIZE_OVERHEAD_S <= max(lost) + 0.25
    with pytest.raises(ConfigError):
        Precompute().allocate([JobView(0, 1.0, None)], 8, {})


def test_resize_aware_vetoes_only_grows_that_do_not_pay():
    """A running job grown 1 -> 2 with a few seconds left gains less than the resize costs it: kept
    at 1. A long job grown the same way keeps its grow; a queued job's start is never vetoed."""
    from elastic_ring.sched.policies import ResizeAware

    rate = lambda w: 100.0 * w  # noqa: E731 - samples/s, linear
    class Grow:  # the inner policy: everyone to 2 GPUs
        name = "grow"

        def allocate(self, jobs, total_gpus, current):
            return {j.id: 2 for j in jobs}

    gate = ResizeAware(Grow(), resize_cost_s=10.0)  # horizon 100 s
    jobs = [JobView(0, 100.0 * 5, rate, current=1),       # 2.5 s left at 2 GPUs: gain 250 < 2000
            JobView(1, 100.0 * 1000, rate, current=1),    # gain 100 * 100 s = 10000 > 2000
            JobView(2, 50.0, rate, current=0)]            # a start
    assert gate.allocate(jobs, 8, {0: 1, 1: 1, 2: 0}) == {0: 1, 1: 2, 2: 2}
    assert gate.vetoed == 1 and gate.name == "grow-rc"
    assert make_policy("precompute-rc", 3.0).resize_cost_s == 3.0


# ---------------------------------------------------------------- anchors (issue 22, point 2)
def concave(w: int) -> float:
    return float(w) ** 0.8


def test_las_ranks_by_attained_service_in_discrete_queues_not_by_remaining_work():
    from elastic_ring.sched.anchors import LAS, las_queue

    assert [las_queue(x, 100.0) for x in (0, 99, 100, 199, 200, 400, 1000)] == [0, 0, 1, 1, 2, 3, 4]
    # 3 jobs, 2 GPUs: the one with the most attained service (job 0, 500 s at 1 GPU) waits
    jobs = [JobView(0, 1.0, linear, done=500.0), JobView(1, 1e9, linear, done=10.0), JobView(2, 5.0, linear, done=0.0)]
    assert LAS(first_queue_s=100.0).allocate(jobs, 2, {}) == {1: 1, 2: 1}
    # remaining work is not used: the same answer whatever it says
    jobs2 = [j._replace(remaining=r) for j, r in zip(jobs, (1e9, 1.0, 7.0))]
    assert LAS(first_queue_s=100.0).allocate(jobs2, 2, {}) == {1: 1, 2: 1}
    # within a queue, arrival order (FIFO): jobs 1 and 2 are both in queue 0
    jobs3 = [JobView(0, 1.0, linear, done=50.0), JobView(1, 1.0, linear, done=5.0)]
    a = LAS(power=3.0, first_queue_s=100.0).allocate(jobs3, 16, {})
    assert a[0] >= a[1] and sum(a.values()) <= 16


def test_pollux_balances_speedups_over_the_fair_share():
    from elastic_ring.sched.anchors import Pollux

    flat = lambda w: min(float(w), 2.0)  # noqa: E731 - stops scaling at 2 GPUs
    a = Pollux().allocate([JobView(0, 1.0, flat), JobView(1, 1.0, linear)], 8, {})
    assert a[0] == 2 and a[1] == 6  # GPUs beyond 2 do nothing for job 0
    b = Pollux().allocate([JobView(i, 1.0, concave) for i in range(4)], 8, {})
    assert sorted(b.values()) == [2, 2, 2, 2]  # identical jobs: the fair share
    assert Pollux().allocate([], 8, {}) == {}


def test_hesrpt_gives_the_shortest_job_the_largest_share_and_every_gpu():
    from elastic_ring.sched.anchors import HeSRPT

    jobs = [JobView(0, 900.0, concave), JobView(1, 100.0, concave), JobView(2, 500.0, concave)]
    a = HeSRPT(scale=1.0).allocate(jobs, 32, {})
    assert sum(a.values()) == 32 and a[1] > a[2] > a[0] >= 1
    # p = 0.8: a = 5, the smallest of 3 gets 1 - (2/3)^5 = 86.8% of 32 GPUs = 27.8, the middle one
    # 12.8% = 4.1, the largest 0.4% = 0.1 -> its 1-GPU floor takes the remainder: 27 + 4 + 1
    assert (a[1], a[2], a[0]) == (27, 4, 1)
    # a smaller scale spreads the GPUs more evenly
    b = HeSRPT(scale=0.25).allocate(jobs, 32, {})
    assert b[1] < a[1] and sum(b.values()) == 32
    # more jobs than GPUs: the G shortest get 1 each
    many = [JobView(i, float(i + 1), concave) for i in range(5)]
    assert HeSRPT().allocate(many, 3, {}) == {0: 1, 1: 1, 2: 1}
    with pytest.raises(ConfigError):
        HeSRPT(scale=0)


def test_make_policy_knows_the_anchors_and_their_rc_variants():
    assert make_policy("las").name == "las" and make_policy("pollux").name == "pollux"
    assert make_policy("hesrpt-rc", 2.0).name == "hesrpt-rc"
    with pytest.raises(ConfigError, match="las"):
        make_policy("nope")
