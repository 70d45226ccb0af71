"""The compiled kernels of the policies' array decisions (elastic_ring/sched/kernels.py) against
the heaps of elastic_ring/sched/policies.py, the reference: the same allocation for every job.

Each test replays a sequence of decisions on one policy object (the kernels keep state between
calls: the last threshold, the last order of the jobs), where jobs come and go and their remaining
work shrinks, as in the simulator; each decision is also made by ``allocate`` (the heaps, fresh
views) and the two must agree exactly.
"""

from __future__ import annotations

import numpy as np
import pytest

from elastic_ring.sched import kernels
from elastic_ring.sched.api import JobBatch, JobView, model_rate
from elastic_ring.sched.fast import doubling_levels, gain_table, rows_monotone
from elastic_ring.sched.policies import ResizeAware, doubling_allocate
from elastic_ring.sched.registry import make_policy
from elastic_ring.sim import load_workload

CURVES = ("resnet110-cifar10", "resnet50-imagenet", "vgg16-imagenet")


def _rates(names=CURVES):
    return [model_rate(load_workload(w).model) for w in names]


def _batch(ids, q, current, rows, rates, gpus, needs=None, exploring=None) -> JobBatch:
    tables = np.array([gain_table(r, gpus) for r in rates])
    n = ids.size
    z = np.zeros(n, dtype=bool)
    return JobBatch(ids, q, current, rows, z if needs is None else needs, z if exploring is None else exploring,
                    tables, rates, np.array([r(1) for r in rates]), rows_monotone(tables))


def _views(b: JobBatch) -> list[JobView]:
    return [JobView(int(b.ids[i]), float(b.remaining[i]), b.rates[b.rows[i]] if b.rows[i] >= 0 else None,
                    int(b.current[i]), bool(b.needs_exploration[i]), bool(b.exploring[i])) for i in range(b.ids.size)]


def _stream(rng, gpus: int, n0: int, steps: int, n_rates: int, ties: bool):
    """Batches of an evolving set of jobs: each step some finish, some arrive, the rest run."""
    next_id = 0
    jobs: dict[int, list] = {}  # id -> [q, row]

    def arrive(k):
        nonlocal next_id
        for _ in range(k):
            q = float(rng.exponential(1e6)) * (rng.random() < 0.95)
            jobs[next_id] = [round(q, -5) if ties else q, int(rng.integers(n_rates))]
            next_id += 1

    arrive(n0)
    current = {}
    for _ in range(steps):
        for i in list(jobs):
            if rng.random() < 0.03:
                del jobs[i]
        arrive(int(rng.integers(0, 4)))
        for i, job in jobs.items():
            if current.get(i, 0) and rng.random() < 0.7:  # running: work done since the last decision
                job[0] = max(0.0, job[0] - float(rng.uniform(0, 2e4)) * current[i])
        ids = np.array(sorted(jobs), dtype=np.int64)
        q = np.array([jobs[i][0] for i in ids])
        rows = np.array([jobs[i][1] for i in ids], dtype=np.int64)
        held = np.array([current.get(int(i), 0) for i in ids], dtype=np.int64)
        alloc = yield ids, q, held, rows
        current = {int(i): int(w) for i, w in zip(ids, alloc)}


@pytest.mark.parametrize("policy,gpus,n0,n_rates", [
    ("precompute", 16384, 1200, 1), ("precompute", 256, 60, 3), ("srtf", 16384, 1000, 1), ("srtf", 64, 90, 2),
    ("optimus", 16384, 1200, 1), ("optimus", 1024, 200, 2), ("exploratory", 4096, 300, 3),
    ("precompute-rc", 4096, 300, 1), ("srtf-rc", 1024, 150, 2), ("optimus-rc", 4096, 300, 1)])
def test_policy_kernels_equal_the_heaps_over_a_stream(policy, gpus, n0, n_rates):
    rng = np.random.default_rng(hash((policy, gpus)) % 2**32)
    rates = _rates(CURVES[:n_rates])
    pol = make_policy(policy, resize_cost_s=30.0) if policy.endswith("-rc") else make_policy(policy)
    ref = make_policy(policy, resize_cost_s=30.0) if policy.endswith("-rc") else make_policy(policy)
    stream = _stream(rng, gpus, n0, 12, n_rates, ties=policy in ("precompute", "srtf") and gpus < 1000)
    alloc = None
    for _ in range(12):
        ids, q, held, rows = stream.send(alloc) if alloc is not None else next(stream)
        needs = rng.random(ids.size) < 0.05 if policy == "exploratory" else None
        b = _batch(ids, q, held, rows, rates, gpus, needs=needs)
        got = pol.allocate_batch(b, gpus)
        want = ref.allocate(_views(b), gpus, {int(i): int(w) for i, w in zip(ids, held)})
        assert [int(x) for x in got] == [want.get(int(i), 0) for i in ids]
        if policy.endswith("-rc"):
            assert pol.vetoed == ref.vetoed and pol.last_vetoed == ref.last_vetoed
        alloc = got
    if policy.endswith("-rc"):
        assert pol.vetoed > 0  # the gate did veto grows


def test_doubling_from_a_far_threshold_and_with_ties_and_zeros():
    """The threshold search starts from the last call's: far too low, far too high, not finite."""
    rate = _rates()[0]
    rng = np.random.default_rng(5)
    for gpus in (16, 1024, 16384):
        n = gpus // 8
        q = np.round(rng.exponential(1e6, n), -5) * (rng.random(n) < 0.8)
        want = doubling_allocate([(i, float(q[i]), rate) for i in range(n)], gpus)
        d = gain_table(rate, gpus)[None, :]
        for tau in (1e-300, 1e-3, 1e3, 1e300, float("inf"), float("nan")):
            levels = doubling_levels(q, d, gpus - n, {"tau": tau})
            assert {i: int(2 ** levels[i]) for i in range(n)} == want, (gpus, tau)


def test_doubling_kernel_declines_what_the_heap_must_do():
    """A gain that is not finite, or one that grows with the level: ok is False (the heap runs)."""
    tables = np.array([[1.0, 0.4, 0.1]])
    rows = np.zeros(2, dtype=np.int64)
    assert kernels.doubling(np.array([1.0, np.nan]), rows, tables, 6, 0.0)[1] is False
    assert kernels.doubling(np.array([1.0, np.inf]), rows, tables, 6, 0.0)[1] is False
    assert kernels.doubling(np.array([1.0, 2.0]), rows, np.array([[1.0, 4.0, 0.5]]), 6, 0.0)[1] is False
    assert kernels.doubling(np.array([1.0, 2.0]), rows, tables, 6, 0.0)[1] is True


def test_ordered_keeps_the_last_order_and_sorts_like_lexsort():
    """Keys with ties (broken by id), jobs gone and new, a previous order far from the new one
    (the full sort), ids beyond the scratch array (the full sort)."""
    rng = np.random.default_rng(9)
    slot = np.full(5000, -1, dtype=np.int64)
    prev = np.zeros(0, dtype=np.int64)
    for trial in range(60):
        n = int(rng.integers(1, 400))
        ids = np.sort(rng.choice(4000 if trial % 10 else 9000, size=n, replace=False)).astype(np.int64)
        keys = np.round(rng.exponential(10.0, n), 0 if trial % 3 == 0 else 6)
        if trial % 7 == 0:
            prev = rng.permutation(prev)
        order, top = kernels.ordered(keys, ids, prev, slot)
        assert top == ids.max()
        assert order.tolist() == np.lexsort((ids, keys)).tolist()
        prev = ids[order]


def test_gate_fills_missing_rates_and_uses_a_fixed_horizon():
    """ResizeAware on arrays with a horizon given: the rates it has not looked up yet are filled
    (the first call), the answer and the vetoes equal the per-job path's."""
    rate = _rates()[0]
    gpus = 256
    rng = np.random.default_rng(2)
    for horizon in (None, 5.0, 1e6):
        for trial in range(4):
            n = 40
            ids = np.arange(n, dtype=np.int64)
            held = rng.integers(0, 9, n).astype(np.int64)
            q = rng.exponential(3e5, n)
            b = _batch(ids, q, held, np.zeros(n, dtype=np.int64), [rate], gpus)
            pol, ref = (ResizeAware(make_policy("precompute"), 20.0, horizon) for _ in range(2))
            got = pol.allocate_batch(b, gpus)
            want = ref.allocate(_views(b), gpus, {int(i): int(w) for i, w in zip(ids, held)})
            assert [int(x) for x in got] == [want.get(int(i), 0) for i in ids]
            assert pol.vetoed == ref.vetoed and pol.last_vetoed == ref.last_vetoed


def test_unit_steps_at_cluster_scale_equal_the_heap():
    """Optimus on 16,384 GPUs: one table, the order kept between calls, ties in Q."""
    rate = _rates()[0]
    rng = np.random.default_rng(4)
    pol, ref = make_policy("optimus"), make_policy("optimus")
    for trial in range(3):
        n = int(rng.integers(500, 1500))
        ids = np.arange(n, dtype=np.int64) + 7 * trial
        q = np.round(rng.exponential(1e6, n), -4 if trial == 1 else 2)
        b = _batch(ids, q, np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64), [rate], 16384)
        got = pol.allocate_batch(b, 16384)
        want = ref.allocate(_views(b), 16384, {})
        assert [int(x) for x in got] == [want.get(int(i), 0) for i in ids]


def _explored_stream(rng, gpus: int, steps: int):
    """Exploratory's decisions as the simulator makes them: jobs arrive unexplored, explore, then
    get a fitted curve of their own (a new row appended to the one list of rates); some leave."""
    from elastic_ring.perfmodel.speed import SpeedModel

    rates: list = []
    jobs: dict[int, dict] = {}
    next_id = 5000  # beyond the cache's first slot-by-id array: it grows
    for step in range(steps):
        for i in list(jobs):
            if jobs[i]["row"] >= 0 and rng.random() < 0.05:
                del jobs[i]
        for _ in range(int(rng.integers(0, max(3, gpus // (40 if step < 3 else 400))))):
            jobs[next_id] = {"q": float(rng.exponential(1e6)), "row": -1, "exploring": False}
            next_id += 1
        for job in jobs.values():
            if job["exploring"] and rng.random() < 0.5:  # explored: a curve of its own
                m = SpeedModel(*(rng.uniform(0.1, 2.0, 4) * [1e-4, 1e-3, 1e-9, 1e-2]), 128.0, 1.7e6)
                rates.append(model_rate(m))
                job["row"], job["exploring"] = len(rates) - 1, False
            elif job["row"] < 0 and not job["exploring"] and rng.random() < 0.6:
                job["exploring"] = True
            elif job["row"] >= 0:
                job["q"] = max(0.0, job["q"] - float(rng.uniform(0, 5e4)))
        ids = np.array(sorted(jobs), dtype=np.int64)
        rows = np.array([jobs[i]["row"] for i in ids], dtype=np.int64)
        exploring = np.array([jobs[i]["exploring"] for i in ids], dtype=bool)
        yield ids, np.array([jobs[i]["q"] for i in ids]), rows, ~exploring & (rows < 0), exploring, rates


def test_exploratory_cache_equals_the_heaps_over_a_stream():
    """Exploratory's compiled decision on its cache of table rows (kept between decisions) gives the
    heaps' answer: jobs with a row each and jobs sharing one, jobs leaving (their slots reused), ids
    beyond the cache, a job whose row changes, a row whose gain grows with the level or a Q of inf
    (the kernel declines: the heap), Q out of the bounds that spare the gains' check (0, tiny,
    huge), more ready jobs than GPUs, and a new list of rates (the cache emptied)."""
    rng = np.random.default_rng(11)
    for gpus in (64, 4096):
        pol, ref = make_policy("exploratory"), make_policy("exploratory")
        declined = []
        step = 0
        pol._allocate_arrays = lambda b, g, inner=pol._allocate_arrays: declined.append(step) or inner(b, g)
        for step, (ids, q, rows, needs, exploring, rates) in enumerate(_explored_stream(rng, gpus, 40)):
            if step in (20, 21):  # remaining work out of the bounds that spare the check: checked
                q = q.copy()
                q[np.flatnonzero(rows >= 0)[:2]] = (5e-324, 1e300) if step == 20 else (0.0, np.inf)
            if step == 25:  # a row that pays more per GPU at a higher level: not a sort
                rates.append(lambda w: 1.0 if w < 4 else 1e6)  # (appended: the list the cache keeps)
                rows = rows.copy()
                rows[np.flatnonzero(rows >= 0)[:1]] = len(rates) - 1
            if step == 30:  # a job's row changes (to a curve that scales perfectly)
                rates.append(lambda w: 1e4 * w)
                rows[np.flatnonzero(rows >= 0)[1:2]] = len(rates) - 1
            if step == 33:  # a new list of rates, whose row of a cached job is another curve
                rates = list(rates)
                rates[rows[rows >= 0][0]] = lambda w: 1e4 * w
            b = _batch(ids, q, np.zeros(ids.size, dtype=np.int64), rows, rates or [lambda w: 1.0], gpus,
                       needs=needs, exploring=exploring)
            got = pol.allocate_batch(b, gpus)
            want = ref.allocate(_views(b), gpus, {})
            assert [int(x) for x in got] == [want.get(int(i), 0) for i in ids], (gpus, step)
            if step == 35:  # fewer GPUs than ready jobs
                few = max(1, int((rows >= 0).sum()) - 1)
                want = ref.allocate(_views(b), few, {})
                assert [int(x) for x in pol.allocate_batch(b, few)] == [want.get(int(i), 0) for i in ids]
        assert {21, 25, 35} <= set(declined) and len(declined) < 10, declined  # the cache decided the others
