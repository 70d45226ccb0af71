"""The curve bound (elastic_ring.sim.bound.curve_bound: the LP and the Lagrangian bound): below every
policy's simulated run, tight for a job alone, below SRPT on a linear curve, the LP rising as its grid
is refined."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

from elastic_ring.perfmodel.speed import SpeedModel
from elastic_ring.sched import make_policy
from elastic_ring.sim import JobSpec, SimConfig, load_workload, make_jobs, simulate
from elastic_ring.sim.bound import (BoundError, _grid, _segments, alone_bound, curve_bound, lagrangian_bound,
                                    rate_envelope, srpt_bound)

POLICIES = ("eight", "precompute", "exploratory", "optimus", "srtf", "las", "pollux", "hesrpt")
MIXES = {"resnet110": ("resnet110-cifar10",), "mix": ("resnet50-imagenet", "vgg16-imagenet")}
# (mix, seed, gpus, jobs): small random instances at offered load 0.9
CASES = [("resnet110", 0, 8, 12), ("resnet110", 1, 16, 20), ("mix", 2, 8, 16), ("mix", 3, 16, 10)]


def _models(mix: str) -> dict[str, SpeedModel]:
    return {w: load_workload(w).model for w in MIXES[mix]}


@lru_cache(maxsize=None)
def _instance(mix: str, seed: int, gpus: int, jobs: int):
    models = _models(mix)
    cfg = SimConfig(gpus=gpus, contention=0.9, jobs=jobs, seed=seed, workloads=tuple(models),
                    resize_overhead_s=0.0, remaining="oracle")  # the bound assumes zero resize cost
    js = make_jobs(cfg, models)
    target = simulate(cfg, make_policy("hesrpt"), js, models).avg_jct_s  # the Lagrangian's step target
    return cfg, js, models, curve_bound(js, gpus, models, step_s=600.0, target_avg_s=target, price_steps=3)


@pytest.mark.parametrize("case", CASES, ids=[f"{m}-s{s}-g{g}-n{n}" for m, s, g, n in CASES])
@pytest.mark.parametrize("policy", POLICIES)
def test_no_policy_beats_the_curve_bound(case, policy):
    cfg, jobs, models, b = _instance(*case)
    assert "Optimal" in b.status and b.late_share < 1e-9
    assert b.avg_jct_s == max(b.lp_avg_jct_s, b.lagrangian_avg_jct_s)
    # the certificate never exceeds the LP value, and is tight at the solver's optimum
    assert b.primal_avg_jct_s * (1 - 1e-6) <= b.lp_avg_jct_s <= b.primal_avg_jct_s * (1 + 1e-9)
    r = simulate(cfg, make_policy(policy), jobs, models)
    assert r.completed == len(jobs) and r.resizes >= 0
    assert b.avg_jct_s <= r.avg_jct_s * (1 - 1e-9), (b.avg_jct_s, r.avg_jct_s)


def test_a_job_alone_gets_its_top_rate():
    # alone, a job's best JCT is W/R: the Lagrangian bound gives it exactly (its completion time is
    # exact), the LP up to half a step
    m = load_workload("resnet50-imagenet").model
    models = {"r50": m}
    top = max(m.samples_per_s(w) for w in range(1, 17))
    job = JobSpec(0, 100.0, work=top * 7000.0, workload="r50")
    for step in (3600.0, 60.0):
        b = curve_bound([job], 16, models, step_s=step)
        assert b.avg_jct_s == pytest.approx(7000.0, rel=1e-7) and b.lagrangian_avg_jct_s <= 7000.0 * (1 + 1e-9)
        assert 7000.0 - step / 2 <= b.lp_avg_jct_s <= 7000.0 * (1 + 1e-9)
    # two jobs far apart do not meet: the mean of their alone JCTs
    far = [job, JobSpec(1, 1e6, work=top * 3000.0, workload="r50")]
    assert curve_bound(far, 16, models, step_s=600.0).avg_jct_s == pytest.approx(5000.0, rel=1e-7)


def test_lagrangian_at_zero_prices_is_each_job_alone():
    # free GPUs: every job runs at its top rate from its arrival
    _, jobs, models, _ = _instance("mix", 3, 16, 10)
    ends = np.array([j.arrival + 40 * 3600.0 for j in sorted(jobs, key=lambda j: j.id)])
    starts = _grid(jobs, ends, 900.0)
    val, sub = lagrangian_bound(jobs, 16, models, starts, ends, np.zeros(len(starts) - 1))
    assert val == pytest.approx(alone_bound(jobs, 16, models).mean(), rel=1e-7)
    assert sub.max() > 0  # alone, the jobs together overfill some interval: the prices must rise there
    # windows too short to finish in: each job counts only until its window's end
    short = np.array([j.arrival + 60.0 for j in sorted(jobs, key=lambda j: j.id)])
    starts = _grid(jobs, short, 900.0)
    assert lagrangian_bound(jobs, 16, models, starts, short, np.zeros(len(starts) - 1))[0] == pytest.approx(60.0)
    with pytest.raises(BoundError):
        lagrangian_bound(jobs, 16, models, starts, short, -np.ones(len(starts) - 1))


def test_linear_curve_stays_below_srpt():
    # on a linear curve SRPT on one server of G GPUs is a schedule the cluster can run: the bound
    # may not exceed it; and it must beat each job alone (the LP's jobs share the cluster)
    r110 = load_workload("resnet110-cifar10").model
    models = {"lin": SpeedModel(r110.t0, 0.0, 0.0, 0.0, r110.m, r110.n)}
    cfg = SimConfig(gpus=16, contention=0.9, jobs=20, seed=5, workloads=("lin",))
    jobs = make_jobs(cfg, models)
    srpt = srpt_bound(jobs, 16, models).mean()
    b = curve_bound(jobs, 16, models, step_s=300.0)
    alone = np.mean([j.work / models["lin"].samples_per_s(16) for j in jobs])
    assert alone < b.avg_jct_s <= srpt * (1 + 1e-9)


def test_refining_the_grid_raises_the_bound():
    _, jobs, models, _ = _instance("mix", 2, 8, 16)
    vals = [curve_bound(jobs, 8, models, step_s=s).lp_avg_jct_s for s in (3600.0, 1800.0, 900.0, 450.0)]
    assert all(b >= a * (1 - 1e-7) for a, b in zip(vals, vals[1:])), vals
    assert vals[-1] - vals[0] <= 3600.0 / 2  # the limit is within step/2 of any grid's value


@pytest.mark.parametrize("model", [load_workload("vgg16-imagenet").model,  # not concave
                                   SpeedModel(0.01, 0.02, 0.0, 0.0, 32.0, 1e6)])  # peaks, then falls
def test_rate_envelope_and_its_outer_lines(model):
    w, f = rate_envelope(model, 32)
    pts = np.array([0.0] + [model.samples_per_s(k) for k in range(1, 33)])
    hat = np.interp(np.arange(33), w, f, right=f[-1])  # flat after the top
    slopes = np.diff(f) / np.diff(w)
    assert w[0] == 0 and f[0] == 0 and np.all(slopes > 0) and np.all(np.diff(slopes) <= 1e-12)
    assert np.all(hat >= pts * (1 - 1e-12)) and f[-1] == pts.max()
    assert np.all(np.isin(w, np.arange(33)))  # vertices at integer GPU counts
    c, g = _segments(model, 32, (1, 4, 16))
    xs, ys = np.concatenate([[0], np.cumsum(c * g)]), np.concatenate([[0], np.cumsum(c)])
    assert np.all(np.diff(g) > 0)  # each segment costs more GPUs per unit rate: concave
    assert np.all(np.interp(np.arange(33), xs, ys, right=ys[-1]) >= hat * (1 - 1e-9))  # outer


def test_bad_arguments_are_refused():
    with pytest.raises(BoundError):
        curve_bound([], 8, {})
    _, jobs, models, _ = _instance("mix", 3, 16, 10)
    with pytest.raises(BoundError):
        curve_bound(jobs, 16, models, step_s=0.0)
