"""The constant-batch speed model (Eq. 5 with micro-batches) and what the scheduler and the simulator
make of it: its invariants, a policy decision that differs between the rules, the same trace under
both rules, ``simulate --compare-rules``."""

from __future__ import annotations

import json
import math

import pytest

from elastic_ring.errors import ConfigError
from elastic_ring.perfmodel.accumulated import AccumulatedModel, accumulated
from elastic_ring.perfmodel.speed import SpeedModel
from elastic_ring.sched.api import JobView, model_rate
from elastic_ring.sched.policies import Precompute
from elastic_ring.sim.api import SimConfig
from elastic_ring.sim.engine import simulate
from elastic_ring.sim.multinode import NodeSteppedModel
from elastic_ring.sim.workload import load_workload, make_jobs, with_rule
from tests.conftest import run_inproc

# b = 32 samples per micro-batch, n = 1e6 parameters; a visible communication term
EQ5 = SpeedModel(t0=1e-3, t1=2e-3, t2=1e-8, t3=5e-3, m=32.0, n=1e6)


@pytest.mark.parametrize("base", [EQ5, NodeSteppedModel(EQ5, 4, 8e-3, 4e-8)])
@pytest.mark.parametrize("micro", [1, 2, 3, 4, 6, 8, 16])
def test_one_micro_batch_each_is_the_plain_step(base, micro):
    m = AccumulatedModel(base, micro)
    assert m.step_time(micro) == base.step_time(micro)  # the same number, not an approximation
    assert m.samples_per_s(micro) == pytest.approx(base.samples_per_s(micro), rel=1e-12)
    assert m.global_batch == micro * base.m


@pytest.mark.parametrize("micro", [1, 3, 5, 8, 12, 16])
def test_the_compute_part_never_grows_with_workers_and_communication_is_once_per_step(micro):
    m = AccumulatedModel(EQ5, micro)
    one = EQ5.step_time(1)  # t0·b + t3: one micro-batch's compute
    compute = [m.step_time(w) - (EQ5.step_time(w) - one) for w in range(1, micro + 1)]
    for w in range(1, micro + 1):
        assert compute[w - 1] == pytest.approx(math.ceil(micro / w) * one, rel=1e-12)
    assert all(a >= b - 1e-15 for a, b in zip(compute, compute[1:]))
    # at 1 worker: M micro-batches, no communication (T(1) has none)
    assert m.step_time(1) == pytest.approx(micro * one, rel=1e-12)
    # one allreduce per step: the step exceeds the plain step by the extra micro-batches' compute only
    for w in range(1, micro + 1):
        assert m.step_time(w) - EQ5.step_time(w) == pytest.approx((math.ceil(micro / w) - 1) * one, rel=1e-9, abs=1e-15)


def test_workers_beyond_the_micro_batches_add_nothing():
    m = AccumulatedModel(EQ5, 4)
    assert m.samples_per_s(5) == m.samples_per_s(8) == m.samples_per_s(4)
    assert list(m.samples_per_s([4, 8])) == [m.samples_per_s(4)] * 2


def test_communication_is_amortised_over_the_micro_batches():
    """At 2 workers of a global batch of 8 micro-batches the step carries one allreduce for 4
    micro-batches per worker: more samples/s than Eq. 7's 2 workers (one allreduce per batch)."""
    m = AccumulatedModel(EQ5, 8)
    assert m.samples_per_s(1) == pytest.approx(EQ5.samples_per_s(1), rel=1e-12)
    assert m.samples_per_s(2) > EQ5.samples_per_s(2)
    assert m.samples_per_s(8) == pytest.approx(EQ5.samples_per_s(8), rel=1e-12)


def test_accumulated_refuses_a_global_batch_that_is_not_whole_micro_batches():
    assert accumulated(EQ5, 128).micro_batches == 4
    for bad in (100, 16, 0):
        with pytest.raises(ConfigError, match="not a multiple"):
            accumulated(EQ5, bad)


def test_plain_step_times_inverts_the_model():
    m = AccumulatedModel(EQ5, 8)
    ws = [1, 2, 4, 8]
    plain = m.plain_step_times(ws, [m.step_time(w) for w in ws])
    assert plain == pytest.approx([EQ5.step_time(w) for w in ws], rel=1e-12)


def test_precompute_gives_a_constant_batch_job_no_more_gpus_than_micro_batches():
    """The same job, alone on 8 GPUs: under Eq. 7 doubling pays up to 8 GPUs; under constant-batch
    with 2 micro-batches a 3rd GPU adds nothing (the batch is 2 micro-batches), so it keeps 2."""
    pol = Precompute()
    linear = pol.allocate([JobView(0, 1e7, model_rate(EQ5))], 8, {})
    cb = pol.allocate([JobView(0, 1e7, model_rate(AccumulatedModel(EQ5, 2)))], 8, {})
    assert linear == {0: 8}
    assert cb == {0: 2}


def test_two_jobs_split_differently_under_the_rules():
    """Two equal jobs on 4 GPUs: under Eq. 7 each gets 2; a constant-batch job of 1 micro-batch (its
    batch is one worker's) cannot use a second GPU and keeps 1."""
    pol = Precompute()
    both_linear = pol.allocate([JobView(0, 1e7, model_rate(EQ5)), JobView(1, 1e7, model_rate(EQ5))], 4, {})
    one_cb = pol.allocate([JobView(0, 1e7, model_rate(AccumulatedModel(EQ5, 1))), JobView(1, 1e7, model_rate(EQ5))],
                          4, {})
    assert both_linear == {0: 2, 1: 2}
    assert one_cb[0] == 1 and one_cb[1] == 2


def test_the_same_trace_under_both_rules():
    wl = load_workload("resnet110-cifar10")
    lin, cb = with_rule(wl, "linear"), with_rule(wl, "constant-batch", 4 * wl.model.m)
    assert cb.scaling == "constant-batch" and cb.model.micro_batches == 4 and cb.global_batch == 4 * wl.model.m
    assert with_rule(cb, "linear").model == wl.model
    cfg = SimConfig(gpus=16, jobs=15, seed=3, workloads=(wl.name,))
    jobs_l, jobs_c = make_jobs(cfg, {wl.name: lin.model}), make_jobs(cfg, {wl.name: cb.model})
    assert [j.work for j in jobs_l] == [j.work for j in jobs_c]
    from elastic_ring.sched.registry import make_policy

    rl = simulate(cfg, make_policy("precompute"), jobs_l, {wl.name: lin.model})
    rc = simulate(cfg, make_policy("precompute"), jobs_c, {wl.name: cb.model})
    assert rl.completed == rc.completed == 15
    assert rc.max_gpus_in_use <= 16
    assert rl.avg_jct_s != rc.avg_jct_s  # a different speed curve: a different schedule


def test_exploring_a_constant_batch_job_fits_its_accumulated_curve():
    from elastic_ring.sched.policies import Exploratory

    wl = with_rule(load_workload("resnet110-cifar10"), "constant-batch", 0)  # 8 micro-batches
    cfg = SimConfig(gpus=16, jobs=6, seed=1, workloads=(wl.name,), explore_noise=0.0)
    r = simulate(cfg, Exploratory(), make_jobs(cfg, {wl.name: wl.model}), {wl.name: wl.model})
    assert r.completed == 6


def test_a_profile_can_carry_the_rule(tmp_path):
    src = json.loads(open(load_workload("resnet110-cifar10").path).read())
    p = tmp_path / "cb.json"
    p.write_text(json.dumps(dict(src, scaling="constant-batch", global_batch=512)))
    wl = load_workload(str(p))
    assert wl.scaling == "constant-batch" and isinstance(wl.model, AccumulatedModel) and wl.model.micro_batches == 4
    p.write_text(json.dumps(dict(src, scaling="constant-batch", global_batch=500)))
    with pytest.raises(ConfigError, match="not a multiple"):
        load_workload(str(p))


def test_simulate_compare_rules_writes_the_table(tmp_path, capsys):
    out = tmp_path / "rules"
    r = run_inproc(capsys, "simulate", "--compare-rules", "512", "--gpus", "16", "--jobs", "10", "--seeds", "1",
                   "--strategies", "precompute,srtf", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "| precompute | constant-batch |" in r.stdout and "| srtf | linear |" in r.stdout
    d = json.loads((out / "rules.json").read_text())
    row = d["summary"]["moderate"]["precompute"]
    assert set(row) == {"linear", "constant-batch"}
    # 4 micro-batches of 128: no constant-batch job ever runs on more than 4 GPUs
    assert row["constant-batch"]["share"]["5-8"] == 0 and row["constant-batch"]["share"][">8"] == 0
    assert row["linear"]["share"]["5-8"] + row["linear"]["share"][">8"] > 0


def test_simulate_compare_rules_refuses_a_bad_global_batch(capsys):
    from tests.conftest import one_line_error

    one_line_error(run_inproc(capsys, "simulate", "--compare-rules", "100", "--jobs", "2", "--seeds", "1"),
                   "--compare-rules", "not a multiple", "128")
