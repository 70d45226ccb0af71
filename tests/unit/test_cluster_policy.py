"""The scheduler's shared parts: Eq. 1 remaining-work prediction, the SRTF policy, and the
simulator's handling of simultaneous arrivals and completions (hand-checked)."""

from __future__ import annotations

import numpy as np
import pytest

from elastic_ring.perfmodel.convergence import ConvergenceModel, fit_convergence, predict_remaining
from elastic_ring.perfmodel.speed import SpeedModel
from elastic_ring.sched import JobView, make_policy, model_rate
from elastic_ring.sim import JobSpec, SimConfig, load_workload, make_jobs, simulate

LINEAR = {"lin": SpeedModel(0.0, 0.0, 0.0, 1.0, 1.0, 1.0)}  # 1 step/s, batch 1: samples/s = w


def _cfg(**kw):
    return SimConfig(gpus=8, resize_overhead_s=10.0, workloads=("lin",), **kw)


def test_simultaneous_arrivals_are_one_decision():
    # 800, 800, 1600 samples at t=0 on 8 linear GPUs: doubling gives 2, 2, 4 -> all end at 400 s,
    # nobody resized (the old engine decided per arrival: 415/425/400 s and 6 resizes).
    jobs = [JobSpec(0, 0.0, 800.0, "lin"), JobSpec(1, 0.0, 800.0, "lin"), JobSpec(2, 0.0, 1600.0, "lin")]
    r = simulate(_cfg(), make_policy("precompute"), jobs, LINEAR)
    assert r.jct_s == pytest.approx((400.0, 400.0, 400.0)) and r.resizes == 0


def test_simultaneous_completions_are_completed_before_deciding():
    # 1600, 1600, 3000 at t=0: 2, 2, 4 GPUs; job 2 ends at 750 s; jobs 0 and 1 (100 samples left
    # each) get 4 GPUs each (one resize each, 10 s) and both end at 750 + 10 + 25 = 785 s. The one
    # handled second must not be resized at the first one's completion (it would end at 795 s).
    jobs = [JobSpec(0, 0.0, 1600.0, "lin"), JobSpec(1, 0.0, 1600.0, "lin"), JobSpec(2, 0.0, 3000.0, "lin")]
    r = simulate(_cfg(), make_policy("precompute"), jobs, LINEAR)
    assert r.jct_s == pytest.approx((785.0, 785.0, 750.0)) and r.resizes == 2


def test_fast_grid_fit_is_close_to_the_refined_fit():
    true = ConvergenceModel(3e-7, 1 / 2.2, 0.1)
    xs = np.linspace(2e6, 3e7, 20)
    ls = np.asarray(true.predict(xs)) * (1 + 0.02 * np.random.default_rng(0).standard_normal(20))
    slow, fast = fit_convergence(xs, ls), fit_convergence(xs, ls, grid=48, refine=False)
    assert min(fast) >= 0
    assert np.allclose(fast.predict(xs), slow.predict(xs), rtol=0.02)


def test_predict_remaining_rules_and_convergence():
    true = ConvergenceModel(1e-3, 0.5, 0.2)
    target = float(true.predict(1000.0))
    assert predict_remaining(0.0, [], [], target, prior=777.0) == 777.0  # no curve: the prior
    assert predict_remaining(10.0, [5, 10], [1.0, 0.9], target, prior=777.0) == 777.0  # too few points
    errs = []
    for done in (200.0, 500.0, 900.0):
        xs = np.linspace(done / 20, done, 20)
        q = predict_remaining(done, xs, true.predict(xs), target, prior=1.0)
        errs.append(abs(q - (1000.0 - done)))
    assert errs[-1] < 5.0 and errs[0] < 200.0  # exact curve: close, closer near the end
    # the target below the fitted floor: at least as much again as done
    xs = np.linspace(10, 100, 20)
    assert predict_remaining(100.0, xs, true.predict(xs), 0.1, prior=50.0) == 100.0


def test_srtf_ranks_by_predicted_time_and_admits_the_shortest():
    rate = model_rate(LINEAR["lin"])
    jobs = [JobView(1, 900.0, rate), JobView(2, 100.0, rate), JobView(3, 500.0, rate)]
    a = make_policy("srtf").allocate(jobs, 2, {})
    assert a == {2: 1, 3: 1}  # job 1 (longest) waits
    # weighted gains (N - rank)·Q·(1/w - 1/2w)/w, hand-checked: 3→2, 1→2, 2→2, 3→4 (Precompute,
    # unweighted, doubles the longest job twice instead)
    assert make_policy("srtf").allocate(jobs, 8, {}) == {2: 2, 3: 4, 1: 2}
    assert make_policy("precompute").allocate(jobs, 8, {}) == {1: 4, 2: 2, 3: 2}


def test_eq1_remaining_changes_decisions_but_every_job_completes():
    wl = load_workload("resnet110-cifar10")
    models = {wl.name: wl.model}
    base = dict(gpus=64, contention=0.9, jobs=60, seed=1, workloads=(wl.name,))
    jobs = make_jobs(SimConfig(**base), models)
    assert all(j.curve is not None and j.target_loss is not None for j in jobs)
    # the curve reaches its target exactly at the job's work
    b0, b1, b2 = jobs[0].curve
    assert 1 / (b0 * jobs[0].work + b1) + b2 == pytest.approx(jobs[0].target_loss)
    for s in ("precompute", "srtf"):
        o = simulate(SimConfig(**base, remaining="oracle"), make_policy(s), jobs, models)
        e = simulate(SimConfig(**base, remaining="eq1"), make_policy(s), jobs, models)
        assert o.completed == e.completed == 60
        assert e.jct_s != o.jct_s  # the prediction is not the truth
