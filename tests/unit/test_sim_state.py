"""The engine's per-job arrays (elastic_ring/sim/state.py) give the per-job engine's results.

For each SimConfig option the live replay uses, every policy runs three ways on the machine the
test runs on: with no decision on arrays (batch_min_jobs=10**9, the per-job code: the reference),
with every decision on arrays (batch_min_jobs=0), and with the arrays switched on and off as the
active count crosses 8 (batch_min_jobs=8). The three runs' RunResult, per-job JCTs and GPU trace
must be equal; nothing is compared with a value computed on another machine.
"""

from __future__ import annotations

import numpy as np
import pytest

from elastic_ring.perfmodel.speed import fit_speed_few
from elastic_ring.sched.api import model_rate
from elastic_ring.sched.fast import gain_table, rows_monotone
from elastic_ring.sched.registry import make_policy
from elastic_ring.sim import CONTENTION, SimConfig, Simulator, load_workload, make_jobs, simulate
from elastic_ring.sim.job import _fit_model, _row_monotone

ONE = ("resnet110-cifar10",)
MIX = ("resnet110-cifar10", "resnet50-imagenet")
OPTS = {  # name -> (SimConfig options, workloads)
    "per_worker": (dict(start_overhead_s=20.0, overhead_per_worker_s=2.0), ONE),
    "after_launch": (dict(resize_after_launch=True, start_overhead_s=20.0, overhead_per_worker_s=1.5), ONE),
    "share_node": (dict(launches_share_node=True, start_overhead_s=10.0, overhead_per_worker_s=1.0), MIX),
    "live_like": (dict(resize_after_launch=True, launches_share_node=True, start_overhead_s=15.0,
                       overhead_per_worker_s=0.5, explore_phase_work=2.0e6), ONE),
}
POLICIES = ("eight", "precompute", "srtf", "optimus", "exploratory", "precompute-rc", "srtf-rc", "optimus-rc")


@pytest.mark.parametrize("opt", list(OPTS))
def test_arrays_equal_the_per_job_engine_under_each_option(opt):
    """120 jobs on 32 GPUs, high load, seed 2."""
    kw, wls = OPTS[opt]
    models = {w: load_workload(w).model for w in wls}
    cfg = SimConfig(gpus=32, contention=CONTENTION["high"], jobs=120, seed=2, workloads=wls, **kw)
    jobs = make_jobs(cfg, models)
    for policy in POLICIES:
        runs = {}
        for batch_min_jobs in (10**9, 0, 8):
            trace: list = []
            r = simulate(cfg, make_policy(policy), jobs, models, trace=trace, batch_min_jobs=batch_min_jobs)
            runs[batch_min_jobs] = (repr(r), list(r.jct_s), trace)
        want = runs[10**9]
        assert want[2], (policy, "the run left no GPU trace")
        for batch_min_jobs in (0, 8):
            got = runs[batch_min_jobs]
            assert got[0] == want[0], (policy, batch_min_jobs, "RunResult")
            assert got[1] == want[1], (policy, batch_min_jobs, "per-job JCTs")
            assert got[2] == want[2], (policy, batch_min_jobs, "GPU trace")


def test_compiled_apply_only_where_a_change_is_one_jobs_own():
    models = {ONE[0]: load_workload(ONE[0]).model}
    pol = make_policy("srtf")
    assert Simulator(SimConfig(overhead_per_worker_s=1.0), pol, models)._compiled_apply
    assert not Simulator(SimConfig(resize_after_launch=True), pol, models)._compiled_apply
    assert not Simulator(SimConfig(launches_share_node=True), pol, models)._compiled_apply

    class Costly:  # a launch model of its own (elastic_ring.sim.engine.Launches)
        def cost(self, sim, j, w, base, t0):  # noqa: ANN001
            return base + 1.0

    assert not Simulator(SimConfig(), pol, models, launches=Costly())._compiled_apply


def test_exploration_fit_equals_fit_speed_few():
    """The fit without residuals gives fit_speed_few's model to the bit (4 counts, noisy speeds,
    repeats), and falls back to it for fewer counts."""
    m = load_workload("resnet110-cifar10").model
    rng = np.random.default_rng(5)
    for trial in range(300):
        ws = [1, 2, 4, 8] if trial % 3 else [int(x) for x in rng.choice([1, 2, 3, 4, 8, 16], size=rng.integers(1, 7))]
        fs = [max(m.samples_per_s(w) / (m.m * w) * (1 + 0.05 * rng.standard_normal()), 1e-12) for w in ws]
        assert _fit_model(ws, fs, m.m, m.n) == fit_speed_few(ws, fs, m.m, m.n)[0].model


def test_compiled_fit_inputs_equal_numpys():
    """The exploration's compiled NNLS inputs are NumPy's to the bit, and give nnls_model's model
    (random measurements over wide ranges)."""
    from elastic_ring.perfmodel.speed import _scaled_features, nnls_model
    from elastic_ring.sim import job

    rng = np.random.default_rng(8)
    for trial in range(400):
        w = rng.choice([1.0, 2.0, 3.0, 4.0, 8.0, 16.0], size=int(rng.integers(4, 9)))
        f = 10 ** rng.uniform(-3, 4, w.size)
        b, n = float(rng.choice([1.0, 32.0, 128.0])), float(10 ** rng.uniform(0, 9))
        for x, y in zip(job._scaled_features(w, f, b, n), _scaled_features(w, f, b, n)):
            assert x.tobytes() == y.tobytes()
        if np.unique(w).size >= 4:
            assert nnls_model(w, f, b, n, scaled=job._scaled_features) == nnls_model(w, f, b, n)


def test_row_monotone_equals_rows_monotone():
    rates = [model_rate(load_workload(w).model) for w in
             ("resnet110-cifar10", "resnet50-imagenet", "vgg16-imagenet", "resnet110-2node")]
    rng = np.random.default_rng(3)
    rows = [gain_table(r, g) for r in rates for g in (1, 2, 8, 64, 16384)]
    rows += [rng.standard_normal(int(rng.integers(1, 15))) for _ in range(100)]
    rows += [np.array([1.0, 0.5 * (1 - 1e-13)]), np.array([1.0, np.inf]), np.array([2.0, 0.999]),
             np.array([np.inf]), np.array([]), np.array([np.nan, 1.0])]
    for d in rows:
        assert _row_monotone(d) == bool(rows_monotone(d[None, :])[0]), d


@pytest.mark.parametrize("policy", ["precompute", "srtf-rc", "optimus", "exploratory"])
def test_replay_on_arrays_equals_the_per_job_replay(policy, monkeypatch):
    """The live replay (its launch model: wake-up events, hand-over, shared launches) with every
    decision on arrays gives the per-job replay's result, changes and seconds lost."""
    from elastic_ring.experiment import replay as replay_mod

    rng = np.random.default_rng(11)
    jobs = [(float(t), int(s)) for t, s in zip(np.cumsum(rng.exponential(4.0, 40)), rng.integers(200, 2000, 40))]
    speed = {1: 10.0, 2: 18.0, 4: 30.0, 8: 45.0}
    out = []
    for arrays in (False, True):
        if arrays:
            class OnArrays(replay_mod.Simulator):
                def __init__(self, *a, **kw):  # noqa: ANN002, ANN003
                    super().__init__(*a, batch_min_jobs=0, **kw)

            monkeypatch.setattr(replay_mod, "Simulator", OnArrays)
        lost, changes = [], []
        r = replay_mod.replay(jobs, policy, 8, speed, start_overhead_s=3.0, resize_overhead_s=2.0,
                              overhead_per_worker_s=0.5, explore_steps=30, lost=lost, changes=changes)
        out.append((r, r.jct_s, lost, changes))
    assert out[0][3]  # changes happened
    assert out[0] == out[1]
