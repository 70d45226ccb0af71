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
    r = replay([(0, 100), (5, 10)], "precompute", 2, {1: 10.0, 2: 15.0}, 0.0, 5.0, resize_after_launch=False)
    # t=5: 75 steps done, shrunk to 1 (paused until 10); job 1 runs 10 steps at 10/s, ends at 6;
    # job 0 alone again is grown to 2 at 6 (paused until 11), its last 25 steps take 25/15 s
    assert r.resizes == 2
    assert r.jct_s == pytest.approx((11 + 25 / 15, 1.0))


def test_live_hand_over_a_resize_waits_for_the_launch_in_flight():
    # as above, but the grow at t=6 (job 1 done) waits for the shrink's relaunch (paused until 10):
    # paused until 15, then 25 steps at 15/s
    r = replay([(0, 100), (5, 10)], "precompute", 2, {1: 10.0, 2: 15.0}, 0.0, 5.0)
    assert r.resizes == 2 and r.jct_s == pytest.approx((15 + 25 / 15, 1.0))


def test_live_hand_over_slots_of_a_launching_job_are_free_only_after_its_launch():
    # job 0 starts on both slots at t=0 with a 10 s launch; job 1 arrives at 1: job 0 is shrunk,
    # but only once launched (t=10, then 5 s of relaunch at 1 worker), and job 1 starts on the
    # slot given back at t=10 (10 s launch): 10 steps at 10/s, done at 21
    r = replay([(0, 100), (1, 10)], "precompute", 2, {1: 10.0, 2: 15.0}, 10.0, 5.0)
    assert r.jct_s[1] == pytest.approx(21 - 1)
    # job 0: paused until 15, 100 steps at 1 worker until job 1 ends at 21 (60 done), then
    # grown to 2 at 21 (5 s), the last 40 at 15/s
    assert r.jct_s[0] == pytest.approx(26 + 40 / 15) and r.resizes == 2
    # the paper's instant hand-over: job 1 starts at t=1
    r = replay([(0, 100), (1, 10)], "precompute", 2, {1: 10.0, 2: 15.0}, 10.0, 5.0, resize_after_launch=False)
    assert r.jct_s[1] == pytest.approx(11.0)


def test_overhead_per_worker_and_exploratory_on_a_small_node():
    # eight on 4 slots: every start at 4 workers costs 2 + 3 x 1 s
    r = replay([(0, 40), (0, 40)], "eight", 4, {1: 10.0, 2: 20.0, 4: 40.0}, 2.0, 1.0, overhead_per_worker_s=1.0)
    assert r.jct_s == pytest.approx((6.0, 12.0))
    # exploratory on 4 slots: measured at 1, 2, 4 (hold 4), Eq. 5 fitted from 3 counts, finishes
    r = replay([(0, 400), (5, 100)], "exploratory", 4, {1: 10.0, 2: 20.0, 4: 40.0}, 2.0, 1.0)
    assert r.completed == 2 and r.resizes >= 2


def test_launches_side_by_side_share_the_per_worker_cost():
    # two 1-worker jobs start together on 2 slots: the second launch counts the first one's worker
    # (2 + 1 s), the first saw none (2 s); 10 steps at 10/s each (2 workers no faster: no grow)
    speeds = {1: 10.0, 2: 10.0}
    r = replay([(0, 10), (0, 10)], "optimus", 2, speeds, 2.0, 1.0, overhead_per_worker_s=1.0)
    assert sorted(r.jct_s) == pytest.approx([3.0, 4.0])
    r = replay([(0, 10), (0, 10)], "optimus", 2, speeds, 2.0, 1.0, overhead_per_worker_s=1.0,
               launches_share_node=False)
    assert r.jct_s == pytest.approx((3.0, 3.0))


def test_table_speed_and_bad_input():
    t = TableSpeed({1: 10.0, 2: 12.0})
    assert t.samples_per_s(1) == 10.0 and t.samples_per_s(4) == 12.0
    with pytest.raises(ConfigError):
        TableSpeed({1: 0.0})
    with pytest.raises(ConfigError):
        SimConfig(start_overhead_s=-1)


def test_replay_keeps_the_seconds_each_resize_cost():
    # the shrink at t=5 (to 1 worker) and the grow at t=6 (to 2): 5 s each, + 1 s per worker
    # beyond the first; the first start (start overhead) is not a resize
    lost = []
    r = replay([(0, 100), (5, 10)], "precompute", 2, {1: 10.0, 2: 15.0}, 3.0, 5.0, resize_after_launch=False,
               overhead_per_worker_s=1.0, launches_share_node=False, lost=lost)
    assert r.resizes == 2 and lost == pytest.approx([5.0, 6.0])
