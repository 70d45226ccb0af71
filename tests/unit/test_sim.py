"""Small simulations: conservation, capacity, determinism, resize accounting, held-out planning."""

from __future__ import annotations

import pytest

from elastic_ring.errors import ConfigError
from elastic_ring.perfmodel.speed import SpeedModel
from elastic_ring.sched import make_policy
from elastic_ring.sim import CONTENTION, JobSpec, SimConfig, builtin_workloads, load_workload, make_jobs, simulate
from elastic_ring.sim.engine import SimError, Simulator

STRATS = ("eight", "precompute", "exploratory", "optimus")


@pytest.fixture(scope="module")
def models():
    wl = load_workload("resnet110-cifar10")
    return {wl.name: wl.model}


@pytest.mark.parametrize("level", ["low", "extreme"])
@pytest.mark.parametrize("strategy", STRATS)
def test_every_job_completes_within_capacity(models, strategy, level):
    cfg = SimConfig(gpus=32, contention=CONTENTION[level], jobs=40, seed=1)
    jobs = make_jobs(cfg, models)
    trace: list = []
    r = simulate(cfg, make_policy(strategy), jobs, models, trace=trace)
    assert r.completed == 40 and len(r.jct_s) == 40
    assert all(j > 0 for j in r.jct_s)
    assert 0 < r.utilisation <= 1 + 1e-9
    assert max(u for _, u in trace) <= 32 and r.max_gpus_in_use <= 32
    # no job finishes faster than alone on its best GPU count (no free lunch)
    best = max(models["resnet110-cifar10"].samples_per_s(w) for w in range(1, 33))
    for spec, jct in zip(jobs, r.jct_s):
        assert jct >= spec.work / best - 1e-6
    if strategy == "eight":
        assert r.resizes == 0


@pytest.mark.parametrize("strategy", STRATS)
def test_same_seed_same_result(models, strategy):
    cfg = SimConfig(gpus=16, contention=1.0, jobs=25, seed=4)
    a = simulate(cfg, make_policy(strategy), make_jobs(cfg, models), models)
    b = simulate(cfg, make_policy(strategy), make_jobs(cfg, models), models)
    assert a == b and a.jct_s == b.jct_s
    c = SimConfig(gpus=16, contention=1.0, jobs=25, seed=5)
    assert simulate(c, make_policy(strategy), make_jobs(c, models), models).jct_s != a.jct_s


def test_single_job_hand_checked(models):
    m = models["resnet110-cifar10"]
    cfg = SimConfig(gpus=8, jobs=1, resize_overhead_s=10.0)
    job = [JobSpec(0, 100.0, work=m.samples_per_s(8) * 3600.0, workload="resnet110-cifar10")]
    # Eight: exactly one hour on 8 GPUs
    assert simulate(cfg, make_policy("eight"), job, models).avg_jct_s == pytest.approx(3600.0)
    # Precompute doubles 1 -> 8 at once (one decision, no resize): also one hour
    r = simulate(cfg, make_policy("precompute"), job, models)
    assert r.avg_jct_s == pytest.approx(3600.0) and r.resizes == 0
    # Exploratory: 150 s at 1 GPU, then 2 and 4 GPUs each 150 s minus a 10 s restart, then 8 GPUs
    # (after a 10 s restart) until done: 8 is also what doubling picks after the measurement
    r = simulate(cfg, make_policy("exploratory"), job, models)
    done = 150 * m.samples_per_s(1) + 140 * (m.samples_per_s(2) + m.samples_per_s(4))
    t8 = 10 + (job[0].work - done) / m.samples_per_s(8)
    assert r.avg_jct_s == pytest.approx(450 + t8) and r.resizes == 3


def test_resize_overhead_costs_time(models):
    cfg0 = SimConfig(gpus=64, contention=0.7, jobs=60, seed=2, resize_overhead_s=0.0)
    cfg1 = SimConfig(gpus=64, contention=0.7, jobs=60, seed=2, resize_overhead_s=120.0)
    jobs = make_jobs(cfg0, models)
    a = simulate(cfg0, make_policy("precompute"), jobs, models)
    b = simulate(cfg1, make_policy("precompute"), jobs, models)
    assert a.resizes > 0 and b.avg_jct_s > a.avg_jct_s


def test_planning_with_a_wrong_model_changes_decisions():
    # a mix: the planner believes every job scales like ResNet-110; the VGG-16 half does not
    wls = {n: load_workload(n).model for n in builtin_workloads()}
    true = {k: wls[k] for k in ("resnet110-cifar10", "vgg16-imagenet")}
    plan = {k: wls["resnet110-cifar10"] for k in true}
    cfg = SimConfig(gpus=64, contention=0.5, jobs=60, seed=3, workloads=tuple(true))
    jobs = make_jobs(cfg, true)
    a = simulate(cfg, make_policy("precompute"), jobs, true)
    b = simulate(cfg, make_policy("precompute"), jobs, true, plan)
    assert a.jct_s != b.jct_s and b.completed == 60


def test_overallocating_policy_is_caught(models):
    class Greedy:
        name, explores = "greedy", False

        def allocate(self, jobs, total, current):
            return {j.id: total for j in jobs}

    cfg = SimConfig(gpus=8, contention=2.0, jobs=5)
    with pytest.raises(SimError, match="allocated"):
        simulate(cfg, Greedy(), make_jobs(cfg, models), models)


def test_config_validation_and_contention_definition():
    with pytest.raises(ConfigError):
        SimConfig(gpus=0)
    with pytest.raises(ConfigError):
        SimConfig(contention=-1)
    cfg = SimConfig(gpus=64, contention=1.0)
    # offered load 1: arrivals x 8 GPUs x mean hours at 8 == 64 GPUs
    assert cfg.arrival_rate * 8 * cfg.mean_hours_at_8 * 3600 == pytest.approx(64)
    assert list(CONTENTION) == ["low", "moderate", "high", "extreme"]
    for path in builtin_workloads().values():
        assert "ASSUMED" in load_workload(path.stem).source


def test_speedmodel_table_of_builtin_matches_paper_efficiency():
    m: SpeedModel = load_workload("resnet110-cifar10").model
    assert m.samples_per_s(8) / (2 * m.samples_per_s(4)) == pytest.approx(0.945, abs=1e-4)


# Results of the engine before it became a class (closures, tuple events; commit f2ff12a), for the
# same job streams: (avg JCT s, makespan s, resizes, max GPUs in use). The class must reproduce them.
GOLDEN = {
    (0, 'eight'): (25080.097676507914, 155869.98257004187, 0, 32),
    (0, 'precompute'): (25695.64070936218, 136948.86206671793, 141, 32),
    (0, 'exploratory'): (27874.954710323924, 139455.04843808737, 537, 32),
    (0, 'optimus'): (26023.69538365204, 136641.21335338935, 205, 32),
    (1, 'eight'): (15199.307455670549, 111347.68023322709, 0, 32),
    (1, 'precompute'): (14778.264352929289, 103618.42113442253, 152, 32),
    (1, 'exploratory'): (17321.96667815406, 104418.52211459936, 534, 32),
    (1, 'optimus'): (15123.860353551432, 103585.17814350939, 228, 32),
    (2, 'eight'): (16170.134701363178, 104739.47237241484, 0, 32),
    (2, 'precompute'): (16094.81780465031, 85986.51798896209, 189, 32),
    (2, 'exploratory'): (17875.963481389506, 89241.79775709326, 597, 32),
    (2, 'optimus'): (16265.39650425883, 85636.37636020855, 239, 32),
}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_engine_reproduces_recorded_results(seed):
    wls = {n: load_workload(n).model for n in ("resnet110-cifar10", "vgg16-imagenet")}
    cfg = SimConfig(gpus=32, contention=1.2, jobs=50, seed=seed, workloads=tuple(wls))
    jobs = make_jobs(cfg, wls)
    for s in STRATS:
        r = simulate(cfg, make_policy(s), jobs, wls)
        avg, makespan, resizes, max_used = GOLDEN[seed, s]
        assert (r.resizes, r.max_gpus_in_use, r.completed) == (resizes, max_used, 50), s
        assert r.avg_jct_s == pytest.approx(avg, rel=1e-9) and r.makespan_s == pytest.approx(makespan, rel=1e-9), s


def test_simulator_frees_every_gpu_and_counts_what_it_did(models):
    cfg = SimConfig(gpus=16, contention=1.0, jobs=20, seed=6)
    jobs = make_jobs(cfg, models)
    sim = Simulator(cfg, make_policy("exploratory"), models)
    r = sim.run(jobs)
    assert r.completed == 20 and len(r.jct_s) == 20 and sim.gpus_in_use == 0  # all GPUs free
    assert sim.resizes == r.resizes > 0  # the exploring policy resizes its jobs
    assert 1 <= r.max_gpus_in_use <= 16 and 0 < r.utilisation <= 1


class _Explorer:
    """An exploring policy that gives ``first`` GPUs to a new job, then ``later`` once it explores."""

    name, explores = "bad-explorer", True

    def __init__(self, first, later):
        self.first, self.later = first, later

    def allocate(self, jobs, total, current):
        return {j.id: self.later if j.exploring else self.first for j in jobs}


@pytest.mark.parametrize("first, later, msg", [(4, 4, "gave unexplored job 0 4 GPUs, not 8"),
                                                (8, 2, r"changed exploring job \d+ to 2 GPUs")])
def test_policy_breaking_the_exploration_rules_is_caught(models, first, later, msg):
    cfg = SimConfig(gpus=16, contention=1.0, jobs=3)
    with pytest.raises(SimError, match=msg):
        simulate(cfg, _Explorer(first, later), make_jobs(cfg, models), models)


# ---------------------------------------------------------------- a curve that steps at the node boundary
def _two_node():
    from elastic_ring.sim.workload import load_workload

    return load_workload("resnet110-2node").model


def test_multinode_curve_steps_at_the_node_boundary():
    m = _two_node()
    # on one node it is the smooth ResNet-110 curve; 9 GPUs cross the slow link: fewer images/s than 8
    from elastic_ring.sim.workload import load_workload

    base = load_workload("resnet110-cifar10").model
    for w in (1, 2, 4, 8):
        assert m.samples_per_s(w) == pytest.approx(base.samples_per_s(w))
    assert m.samples_per_s(9) < m.samples_per_s(8) < m.samples_per_s(16) < m.samples_per_s(32)
    # by hand: step at 9 = 0.1 + 8 t1 + 1.28e-8 * n * 8/9
    t1, n = base.t1, base.n
    assert m.step_time(9) == pytest.approx(0.1 + 8 * t1 + 1.28e-8 * n * 8 / 9, rel=1e-6)
    assert m.samples_per_s(9) == pytest.approx(128 * 9 / m.step_time(9))


def test_doubling_crosses_the_node_boundary_where_unit_steps_stop():
    """Two equal jobs on 32 GPUs (4 nodes): unit-step greedy stops at 8 each (8 -> 9 costs
    throughput), Eq. 6 doubling goes 8 -> 16 each; one job alone: doubling 16 finishes sooner."""
    from elastic_ring.sched.api import model_rate
    from elastic_ring.sched.policies import doubling_allocate, unit_greedy_allocate
    from elastic_ring.sim.api import JobSpec, SimConfig

    m = _two_node()
    rate = model_rate(m)
    jobs = [(0, 1e7, rate), (1, 1e7, rate)]
    assert unit_greedy_allocate(jobs, 32) == {0: 8, 1: 8}
    assert doubling_allocate(jobs, 32) == {0: 16, 1: 16}
    work = 3600 * m.samples_per_s(8)  # one hour alone on 8 GPUs
    cfg = SimConfig(gpus=16, jobs=1, resize_overhead_s=0.0)
    spec = [JobSpec(id=0, arrival=0.0, work=work, workload="w")]
    pre = simulate(cfg, make_policy("precompute"), spec, {"w": m})
    opt = simulate(cfg, make_policy("optimus"), spec, {"w": m})
    assert opt.jct_s[0] == pytest.approx(3600.0)
    assert pre.jct_s[0] == pytest.approx(work / m.samples_per_s(16))
    assert pre.jct_s[0] < 0.65 * opt.jct_s[0]


# ---------------------------------------------------------------- bounds (issue 22, point 2)
class _Lin:
    """samples/s = w (a linear curve, 1 sample per GPU-second)."""

    def samples_per_s(self, w):
        return float(w)


def test_srpt_bound_by_hand():
    from elastic_ring.sim.bound import alone_bound, srpt_bound

    # 2 GPUs; A (10 GPU-s) at t=0, B (2 GPU-s) at t=1. A does 2 by t=1 (8 left); B is shorter:
    # done at t=2 (JCT 1); A then needs 8/2 = 4 s: done at t=6 (JCT 6)
    jobs = [JobSpec(0, 0.0, 10.0, "lin"), JobSpec(1, 1.0, 2.0, "lin")]
    assert list(srpt_bound(jobs, 2, {"lin": _Lin()})) == pytest.approx([6.0, 1.0])
    assert list(alone_bound(jobs, 2, {"lin": _Lin()})) == pytest.approx([5.0, 1.0])


@pytest.mark.parametrize("strategy", ["eight", "precompute", "optimus", "srtf", "las", "pollux", "hesrpt"])
def test_no_policy_beats_the_bounds(models, strategy):
    from elastic_ring.sim.bound import alone_bound, srpt_bound

    cfg = SimConfig(gpus=16, contention=0.9, jobs=30, seed=3, resize_overhead_s=0.0, remaining="oracle")
    jobs = make_jobs(cfg, models)
    r = simulate(cfg, make_policy(strategy), jobs, models)
    assert r.avg_jct_s >= srpt_bound(jobs, 16, models).mean() * (1 - 1e-9)
    assert all(a >= b * (1 - 1e-9) for a, b in zip(r.jct_s, alone_bound(jobs, 16, models)))


def test_the_warm_up_compiles_under_every_policy_the_registry_names(capsys):
    """``python -m elastic_ring.sim.warm`` (set-up runs it) simulates under every name
    ``make_policy`` takes, so that no policy's kernels are left to compile at first use; it takes
    no arguments (one line, exit 2)."""
    from elastic_ring.sched.anchors import ANCHORS
    from elastic_ring.sched.policies import POLICIES
    from elastic_ring.sched.registry import policy_names
    from elastic_ring.sim import warm

    names = policy_names()  # warm's default
    assert set(POLICIES) | set(ANCHORS) <= set(names)
    assert {"precompute-rc", "srtf-rc", "pollux-rc"} <= set(names) and "eight-rc" not in names
    for name in names:
        make_policy(name)  # each one a name the registry takes
    assert warm.main(["--now"]) == 2
    assert capsys.readouterr().err.strip() == "elastic_ring.sim.warm takes no arguments, got '--now'"
