"""The array engine (issue 22) gives exactly the results of the engine before it.

The digests below were computed with the simulator as it was before the per-decision work became
arrays (commit d18db4e): a sha256 of each run's RunResult, its per-job JCTs and its GPU trace.
Any change of a decision, an event time or an accounting step changes them.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from elastic_ring.sched.api import model_rate
from elastic_ring.sched import policies
from elastic_ring.sched.fast import doubling_levels, gain_table, rows_monotone, unit_steps, unit_table
from elastic_ring.sched.policies import doubling_allocate, make_policy, unit_greedy_allocate
from elastic_ring.sim import CONTENTION, SimConfig, load_workload, make_jobs, simulate
from elastic_ring.sim.engine import BATCH_MIN_JOBS

ONE = ("resnet110-cifar10",)
MIX = ("resnet110-cifar10", "resnet50-imagenet")
STEP = ("resnet110-2node", "vgg16-imagenet")
CASES = {  # (jobs, gpus, contention, remaining, workloads) -> digest per policy, old engine
    (200, 64, "moderate", "oracle", ONE): {
        "eight": "9b7ddcca434c6e89", "precompute": "ff7fa3c4a28bea54", "exploratory": "acb49377aa02c738",
        "optimus": "6a742d7d12153726", "srtf": "ab7666168d1e20b5"},
    (600, 128, "high", "oracle", ONE): {
        "eight": "7393240aa6b22455", "precompute": "3c7375c9c62fcb9c", "exploratory": "2eca0dcf821188cb",
        "optimus": "6159ba42b1c8ab3c", "srtf": "78500919a64cbca9"},
    (300, 64, "moderate", "eq1", MIX): {
        "eight": "3d04eb37c1cd2891", "precompute": "f9f1491e88dec33b", "exploratory": "c0511edf9ed2db8a",
        "optimus": "6f1f8ca614738b58", "srtf": "3f26b6b14cb7ea9c"},
    (300, 64, "high", "oracle", STEP): {
        "eight": "c1640f06c459fe65", "precompute": "1decfa7976889d0c", "exploratory": "49a23f2ab267ebaa",
        "optimus": "0025ac083ddcae6c", "srtf": "ef10447256f907f8"},
}


def _digest(jobs: int, gpus: int, cont: str, rem: str, wls: tuple[str, ...], policy: str,
            batch_min_jobs: int = 0) -> str:
    models = {w: load_workload(w).model for w in wls}
    cfg = SimConfig(gpus=gpus, contention=CONTENTION[cont], jobs=jobs, seed=1, remaining=rem, workloads=wls)
    trace: list = []
    r = simulate(cfg, make_policy(policy), make_jobs(cfg, models), models, trace=trace,
                 batch_min_jobs=batch_min_jobs)
    return hashlib.sha256(repr((r, r.jct_s, trace)).encode()).hexdigest()[:16]


@pytest.mark.parametrize("case", list(CASES), ids=lambda c: f"{c[0]}x{c[1]}-{c[2]}-{c[3]}-{len(c[4])}wl")
def test_engine_bit_identical_to_the_old_engine(case, monkeypatch):
    """Every decision on arrays (batch_min_jobs=0) and every doubling by the array code."""
    monkeypatch.setattr(policies, "FAST_MIN_CELLS", 0)
    monkeypatch.setattr(policies, "UNIT_FAST_MIN_FREE", 0)
    for policy, want in CASES[case].items():
        assert _digest(*case, policy) == want, policy


def test_engine_default_switch_points_identical():
    """With the default switch points (small decisions by the per-job loop and the heap)."""
    case = (600, 128, "high", "oracle", ONE)
    for policy in ("precompute", "srtf"):
        assert _digest(*case, policy, batch_min_jobs=BATCH_MIN_JOBS) == CASES[case][policy]


def test_array_doubling_equals_the_heap():
    """Random jobs, clusters 4..16,384 GPUs, ties in Q, four speed curves (one steps at a node)."""
    rates = [model_rate(load_workload(w).model) for w in
             ("resnet110-cifar10", "resnet50-imagenet", "vgg16-imagenet", "resnet110-2node")]
    rng = np.random.default_rng(7)
    state: dict = {}
    for trial in range(200):
        g = int(rng.choice([4, 16, 64, 100, 1024, 16384]))
        n_jobs = int(rng.integers(1, max(2, g // int(rng.choice([1, 2, 4, 10, 40]))) + 3))
        q = rng.exponential(1e6, size=n_jobs) * (rng.random(n_jobs) < 0.9)
        if trial % 5 == 0:
            q = np.round(q, -5)  # equal gains: the heap breaks ties by position
        which = rng.integers(0, len(rates), size=n_jobs)
        want = doubling_allocate([(i, float(q[i]), rates[which[i]]) for i in range(n_jobs)], g)
        n = min(n_jobs, g)
        d = np.array([gain_table(r, g) for r in rates])[which[:n]]
        levels = doubling_levels(q[:n], d, g - n, state)
        assert levels is not None
        assert {i: int(2 ** levels[i]) for i in range(n)} == want


def test_array_doubling_one_table_equals_the_heap():
    """Jobs sharing one gain table (a (1, L) table: the jobs sorted by Q, edges by binary search):
    random Q with ties and zeros, each of three curves, clusters 16..16,384 GPUs."""
    rates = [model_rate(load_workload(w).model) for w in ("resnet110-cifar10", "resnet50-imagenet", "vgg16-imagenet")]
    rng = np.random.default_rng(11)
    state: dict = {}
    for trial in range(150):
        g = int(rng.choice([16, 100, 1024, 16384]))
        rate = rates[trial % len(rates)]
        n_jobs = int(rng.integers(1, max(2, g // int(rng.choice([2, 4, 10, 40]))) + 3))
        q = rng.exponential(1e6, size=n_jobs) * (rng.random(n_jobs) < 0.9)
        if trial % 3 == 0:
            q = np.round(q, -5)  # runs of equal Q: equal gains, broken by position
        want = doubling_allocate([(i, float(q[i]), rate) for i in range(n_jobs)], g)
        n = min(n_jobs, g)
        d = gain_table(rate, g)[None, :]
        assert rows_monotone(d).all()
        levels = doubling_levels(q[:n], d, g - n, state)
        assert {i: int(2 ** levels[i]) for i in range(n)} == want


def test_array_doubling_declines_gains_that_grow():
    """A curve whose per-GPU gain grows with the level: the caller must fall back to the heap."""
    d = np.array([[1.0, 4.0, 0.5]])
    assert not rows_monotone(d)[0]
    assert doubling_levels(np.array([1.0, 2.0]), np.vstack([d, d]), 6) is None


def test_array_unit_steps_equal_the_heap():
    """Optimus's unit-step greedy: the array answer against the heap's, ties in Q included."""
    rates = [model_rate(load_workload(w).model) for w in ("resnet110-cifar10", "resnet50-imagenet")]
    tables = {g: [unit_table(r, g) for r in rates] for g in (16, 100, 1024)}
    rng = np.random.default_rng(3)
    state: dict = {}
    for trial in range(120):
        g = int(rng.choice([16, 100, 1024]))
        n_jobs = int(rng.integers(1, max(2, g // int(rng.choice([1, 4, 40]))) + 3))
        q = rng.exponential(1e6, size=n_jobs) * (rng.random(n_jobs) < 0.9)
        if trial % 4 == 0:
            q = np.round(q, -5)
        which = rng.integers(0, len(rates), size=n_jobs)
        want = unit_greedy_allocate([(i, float(q[i]), rates[which[i]]) for i in range(n_jobs)], g)
        n = min(n_jobs, g)
        add = unit_steps(q[:n], which[:n], tables[g], g - n, state)
        assert {i: 1 + int(add[i]) for i in range(n)} == want


def test_unit_table_declines_a_node_step():
    """8 -> 9 GPUs crosses a node on the two-node curve: not a sorted order, so no table."""
    assert unit_table(model_rate(load_workload("resnet110-2node").model), 64) is None


@pytest.mark.parametrize("policy", ["precompute-rc", "srtf-rc", "optimus-rc"])
def test_resize_aware_on_arrays_equals_the_per_job_path(policy, monkeypatch):
    """NAME-rc through allocate_batch (the inner policy on arrays, the gate on the grows) gives the
    per-job path's results, trace and vetoes: one workload at high load, two with Eq. 1's Q."""
    monkeypatch.setattr(policies, "FAST_MIN_CELLS", 0)
    monkeypatch.setattr(policies, "UNIT_FAST_MIN_FREE", 0)
    for jobs, gpus, cont, rem, wls in [(300, 128, "high", "oracle", ONE), (200, 64, "moderate", "eq1", MIX)]:
        models = {w: load_workload(w).model for w in wls}
        cfg = SimConfig(gpus=gpus, contention=CONTENTION[cont], jobs=jobs, seed=1, remaining=rem, workloads=wls,
                        resize_overhead_s=30.0)
        out = []
        for batch_min_jobs in (0, 10**9):  # every decision on arrays / every one by the per-job loop
            pol, trace = make_policy(policy, resize_cost_s=30.0), []
            r = simulate(cfg, pol, make_jobs(cfg, models), models, trace=trace, batch_min_jobs=batch_min_jobs)
            out.append((r, r.jct_s, trace, pol.vetoed))
        assert out[0][3] > 0  # the gate did veto grows
        assert out[0] == out[1]
