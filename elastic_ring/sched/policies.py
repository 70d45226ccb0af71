"""Allocation policies of Table 3 plus an Optimus-style unit-step greedy for comparison.

Eight        every job gets 8 GPUs in arrival order; the rest queue (never preempted or resized).
Precompute   Eq. 6 doubling with speed models known in advance: every job (in arrival order, as
             many as there are GPUs) starts at 1 GPU; while GPUs remain, the job j maximising
             ``(Q_j/f_j(w_j) - Q_j/f_j(2·w_j)) / w_j`` is doubled. A job whose doubling does not
             fit in the GPUs left is dropped from the candidates (free GPUs only shrink, so it
             never fits later); the loop stops when no doubling saves time (gain <= 0). Free GPUs
             that no doubling can use stay idle.
Exploratory  a new job first measures itself (the simulator runs it 2.5 min at each of 1, 2, 4 and
             8 GPUs while it holds 8); exploring jobs come first, 8 GPUs each in arrival order,
             taking GPUs from running jobs; a job that cannot get 8 (fewer than 8 GPUs not held
             by explorers) waits until an explorer finishes. The GPUs explorers do not hold are
             shared by Eq. 6 doubling among the measured jobs, with their fitted models.
SRTF         ours: shortest predicted remaining time first, with Eq. 6's doubling. Jobs are ranked
             by predicted remaining time alone on one GPU, ``Q_j/f_j(1)`` (Q: the prediction the
             policy is given, Eq. 1 by default); the first G in that order get 1 GPU (the rest
             wait); the doubling then runs with each job's Eq. 6 gain weighted by ``(N - rank)^2``
             (N admitted jobs, rank 0 the shortest): when a job ends sooner, every job ranked after
             it gets GPUs sooner, so a second saved on the shortest job saves up to N seconds of
             total JCT (the weighting of heSRPT, Berg et al. 2020, applied to Eq. 6's doublings);
             the square favours the shortest more, and a higher exponent trades the tail (p99) for
             the average; ``simulate --tune-seeds`` picks it on seeds the table does not report
             (the figures per exponent: docs/reports/simulate.md).
Optimus      unit-step greedy: start at 1 GPU each, repeatedly add ONE GPU to the job with the
             largest time saving ``Q/f(w) - Q/f(w+1)``, stop when none saves time. It is stuck
             where w -> w+1 does not pay but w -> 2w does (e.g. 8 -> 9 crosses a node boundary).

Cost: doubling runs a heap over jobs; each pop doubles one job, so a decision costs
O(J log J + D log J) with D <= min(G, J·log2 G) doublings — never O(G^2). The unit-step greedy is
O(G log J) per decision. :func:`doubling_allocate_naive` (O(J) scan per doubling) is the reference
the tests and the benchmark compare against.
"""

from __future__ import annotations

import heapq
from typing import Mapping, Sequence

import numpy as np

from elastic_ring.errors import ConfigError
from elastic_ring.sched.api import JobBatch, JobView, Rate
from elastic_ring.sched.fast import compiled, distinct, doubling_rows, stack_unit_tables, unit_steps_rows, unit_table

EXPLORE_GPUS = 8
# doubling_batch runs the heap below this many (job, level) cells, Optimus.allocate_batch below
# this many free GPUs. The compiled kernels are faster than the heaps at every size measured
# (docs/reports/simulate.md, "The policies' decisions compiled"), so the heaps run only where a
# kernel declines (a curve whose greedy order is not a sort) and in
# the tests, as the reference. Same answer either way.
FAST_MIN_CELLS = 0
UNIT_FAST_MIN_FREE = 0
# SRTF and Optimus keep the last order of the jobs (by job id) in a scratch array indexed by id
# up to this size; larger ids get a full sort at every decision.
_SLOT_MAX = 1 << 26
_NO_SLOT = np.zeros(0, dtype=np.int64)


def _gain_double(q: float, rate: Rate, w: int) -> float:
    return q * (1.0 / rate(w) - 1.0 / rate(2 * w)) / w


def doubling_allocate(jobs: Sequence[tuple[int, float, Rate]], total_gpus: int,
                      weights: Sequence[float] | None = None) -> dict[int, int]:
    """Eq. 6 doubling heuristic. ``jobs``: (id, remaining Q, rate) in priority (arrival) order.

    ``weights`` (optional, one per job): each job's gain is multiplied by its weight (SRTF)."""
    alloc: dict[int, int] = {}
    n = min(len(jobs), total_gpus)
    free = total_gpus - n
    heap = []
    if weights is not None:
        jobs = [(jid, q * wt, rate) for (jid, q, rate), wt in zip(jobs, weights)]  # gain is linear in Q
    for i in range(n):
        jid, q, rate = jobs[i]
        alloc[jid] = 1
        heap.append((-_gain_double(q, rate, 1), i))
    heapq.heapify(heap)
    while free > 0 and heap:
        neg, i = heapq.heappop(heap)
        if neg >= 0:
            break
        jid, q, rate = jobs[i]
        w = alloc[jid]
        if w > free:
            continue
        free -= w
        w *= 2
        alloc[jid] = w
        if w <= free:
            heapq.heappush(heap, (-_gain_double(q, rate, w), i))
    return alloc


def doubling_allocate_naive(jobs: Sequence[tuple[int, float, Rate]], total_gpus: int) -> dict[int, int]:
    """The same heuristic by a full scan per doubling (O(J) each): the reference implementation."""
    n = min(len(jobs), total_gpus)
    alloc = {jobs[i][0]: 1 for i in range(n)}
    free = total_gpus - n
    live = set(range(n))
    while free > 0 and live:
        best, best_g = -1, 0.0
        for i in sorted(live):
            jid, q, rate = jobs[i]
            g = _gain_double(q, rate, alloc[jid])
            if g > best_g:
                best, best_g = i, g
        if best < 0:
            break
        jid = jobs[best][0]
        if alloc[jid] > free:
            live.discard(best)
            continue
        free -= alloc[jid]
        alloc[jid] *= 2
        if alloc[jid] > free:
            live.discard(best)
    return alloc


def unit_greedy_allocate(jobs: Sequence[tuple[int, float, Rate]], total_gpus: int) -> dict[int, int]:
    """Optimus-style: +1 GPU at a time to the job with the largest ``Q/f(w) - Q/f(w+1)``."""
    alloc: dict[int, int] = {}
    n = min(len(jobs), total_gpus)
    free = total_gpus - n
    heap = []
    for i in range(n):
        jid, q, rate = jobs[i]
        alloc[jid] = 1
        heap.append((-q * (1.0 / rate(1) - 1.0 / rate(2)), i))
    heapq.heapify(heap)
    while free > 0 and heap:
        neg, i = heapq.heappop(heap)
        if neg >= 0:
            break
        jid, q, rate = jobs[i]
        w = alloc[jid] + 1
        alloc[jid] = w
        free -= 1
        heapq.heappush(heap, (-q * (1.0 / rate(w) - 1.0 / rate(w + 1)), i))
    return alloc


def doubling_batch(b: JobBatch, sel: np.ndarray | None, total_gpus: int, weights: np.ndarray | None = None,
                   state: dict | None = None) -> np.ndarray:
    """:func:`doubling_allocate` on the batch's jobs at positions ``sel`` (in that priority order;
    None: all, in the batch's order): GPUs per selected job, by the compiled kernel of
    :func:`~elastic_ring.sched.fast.doubling_rows` (the heap when its check fails, and for small
    decisions). Same answer as the heap, bit for bit."""
    rows = b.rows if sel is None else b.rows[sel]
    if (rows < 0).any():
        bad = int((b.ids if sel is None else b.ids[sel])[rows < 0][0])
        raise ConfigError(f"job {bad} has no speed model; this policy needs one")
    size = rows.size
    n = min(size, total_gpus)
    q = b.remaining if sel is None else b.remaining[sel]
    if weights is not None:
        q = q * weights
    out = np.zeros(size, dtype=np.int64)
    if n == 0:
        return out
    levels = None
    if n * max(1, (total_gpus - n).bit_length()) >= FAST_MIN_CELLS:
        levels = doubling_rows(q[:n], rows[:n], b.tables, total_gpus - n, state)
    if levels is not None:
        out[:n] = 1 << levels
        return out
    jobs = [(i, float(q[i]), b.rates[rows[i]]) for i in range(size)]
    for i, w in doubling_allocate(jobs, total_gpus).items():
        out[i] = w
    return out


def _planned(jobs: Sequence[JobView]) -> list[tuple[int, float, Rate]]:
    out = []
    for j in jobs:
        if j.rate is None:
            raise ConfigError(f"job {j.id} has no speed model; this policy needs one")
        out.append((j.id, j.remaining, j.rate))
    return out


class Eight:
    """Every job gets 8 GPUs (or all of them, on a smaller cluster), FIFO; the rest queue."""

    name = "eight"
    explores = False
    uses_remaining = False  # allocate_batch gets JobBatch.remaining = None

    def __init__(self, gpus_per_job: int = 8):
        self.gpus_per_job = gpus_per_job

    def allocate(self, jobs: Sequence[JobView], total_gpus: int, current: Mapping[int, int]) -> dict[int, int]:
        per = min(self.gpus_per_job, total_gpus)
        return {j.id: per for j in jobs[: total_gpus // per]}

    def allocate_batch(self, b: JobBatch, total_gpus: int) -> np.ndarray:
        per = min(self.gpus_per_job, total_gpus)
        out = np.zeros(b.ids.size, dtype=np.int64)
        out[: total_gpus // per] = per
        return out


class Precompute:
    """Eq. 6 doubling with the speed models known in advance."""

    name = "precompute"
    explores = False

    def __init__(self) -> None:
        self._state: dict = {}

    def allocate(self, jobs: Sequence[JobView], total_gpus: int, current: Mapping[int, int]) -> dict[int, int]:
        return doubling_allocate(_planned(jobs), total_gpus)

    def allocate_batch(self, b: JobBatch, total_gpus: int) -> np.ndarray:
        return doubling_batch(b, None, total_gpus, state=self._state)


class SRTF:
    """Ours: shortest predicted remaining time first, with rank-weighted Eq. 6 doubling."""

    name = "srtf"
    explores = False

    def __init__(self, power: float = 2.0):
        self.power = power
        self._state: dict = {}
        self._w: dict[int, np.ndarray] = {}

    def allocate(self, jobs: Sequence[JobView], total_gpus: int, current: Mapping[int, int]) -> dict[int, int]:
        planned = sorted(_planned(jobs), key=lambda x: (x[1] / x[2](1), x[0]))[:total_gpus]
        n = len(planned)
        return doubling_allocate(planned, total_gpus, weights=[(n - r) ** self.power for r in range(n)])

    def allocate_batch(self, b: JobBatch, total_gpus: int) -> np.ndarray:
        if (b.rows < 0).any():
            raise ConfigError(f"job {int(b.ids[b.rows < 0][0])} has no speed model; this policy needs one")
        st = self._state
        n = min(b.ids.size, total_gpus)
        weights = self._weights(n)
        slot = st.get("slot", _NO_SLOT)
        f64, i64 = np.float64, np.int64
        out, order, status, tau, by_id, top = compiled().srtf(
            np.ascontiguousarray(b.remaining, dtype=f64), np.ascontiguousarray(b.rate1, dtype=f64),
            np.ascontiguousarray(b.rows, dtype=i64), np.ascontiguousarray(b.ids, dtype=i64), weights,
            np.ascontiguousarray(b.tables, dtype=f64), int(total_gpus), float(st.get("tau", 0.0)),
            st.get("prev", _NO_SLOT), slot)
        if slot.size <= top < _SLOT_MAX:  # the order-keeping scratch, by job id
            st["slot"] = np.full(max(2 * top + 2, 1024), -1, dtype=np.int64)
        if status == 2:  # a NaN time: NumPy's ranking (NaN last)
            key = b.remaining / b.rate1[b.rows]
            order = np.argsort(key)
            ks = key[order]
            if ks.size > 1 and bool((ks[1:] == ks[:-1]).any()):  # equal times: the lower id first
                order = np.lexsort((b.ids, key))
            out = np.zeros(b.ids.size, dtype=np.int64)
            out[order[:n]] = doubling_batch(b, order[:n], total_gpus, weights=weights, state=st)
            return out
        st["prev"], st["tau"] = by_id, tau
        if status == 1:  # the heap, on the same order and weights
            jobs = [(i, float(b.remaining[i]), b.rates[b.rows[i]]) for i in order[:n].tolist()]
            out = np.zeros(b.ids.size, dtype=np.int64)
            for i, w in doubling_allocate(jobs, total_gpus, weights=weights.tolist()).items():
                out[i] = w
        return out

    def _weights(self, n: int) -> np.ndarray:
        """``(n - r)**power`` for ranks r = 0 .. n-1 (kept for the last few n)."""
        w = self._w.get(n)
        if w is None:
            if len(self._w) > 64:
                self._w.clear()
            w = self._w[n] = np.arange(n, 0, -1, dtype=float) ** self.power
        return w


class Optimus:
    """Unit-step greedy on the marginal time saving (Optimus-style)."""

    name = "optimus"
    explores = False

    def __init__(self) -> None:
        self._state: dict = {}
        self._unit: dict = {}  # id(rate) -> (rate, total_gpus, unit_table or None)
        self._stacked: dict = {}  # (rows, ids of their rates, total_gpus) -> (rates, stacked tables or None)

    def allocate(self, jobs: Sequence[JobView], total_gpus: int, current: Mapping[int, int]) -> dict[int, int]:
        return unit_greedy_allocate(_planned(jobs), total_gpus)

    def allocate_batch(self, b: JobBatch, total_gpus: int) -> np.ndarray:
        if (b.rows < 0).any():
            raise ConfigError(f"job {int(b.ids[b.rows < 0][0])} has no speed model; this policy needs one")
        size = b.ids.size
        n = min(size, total_gpus)
        out = np.zeros(size, dtype=np.int64)
        q = b.remaining
        if n and total_gpus - n >= UNIT_FAST_MIN_FREE and bool(np.isfinite(q[:n]).all()):
            tabs = self._tables(b, b.rows[:n], total_gpus)
            if tabs is not None:
                rows, utab, ulen = tabs
                if utab.shape[0] == 1:  # one table: the jobs kept in order of Q between decisions
                    st = self._state
                    slot = st.get("slot", _NO_SLOT)
                    add, st["tau"], st["prev"], top = compiled().unit_steps_one(
                        np.ascontiguousarray(q[:n], dtype=np.float64), np.ascontiguousarray(b.ids[:n], dtype=np.int64),
                        rows, utab, ulen, total_gpus - n, float(st.get("tau", 0.0)), st.get("prev", _NO_SLOT), slot)
                    if slot.size <= top < _SLOT_MAX:
                        st["slot"] = np.full(max(2 * top + 2, 1024), -1, dtype=np.int64)
                else:
                    add = unit_steps_rows(q[:n], rows, utab, ulen, total_gpus - n, self._state)
                out[:n] = 1 + add
                return out
        for jid, w in unit_greedy_allocate([(i, float(q[i]), b.rates[b.rows[i]]) for i in range(size)],
                                           total_gpus).items():
            out[jid] = w
        return out

    def _tables(self, b: JobBatch, rows: np.ndarray, total_gpus: int):
        """(rows renumbered, stacked unit tables, their lengths) for the kernel, or None when a
        table is not a sorted order (:func:`~elastic_ring.sched.fast.unit_table`): the heap runs."""
        uniq = distinct(rows)
        key = (tuple(uniq.tolist()), tuple(id(b.rates[r]) for r in uniq.tolist()), total_gpus)
        hit = self._stacked.get(key)
        if hit is None or any(h is not b.rates[r] for h, r in zip(hit[0], uniq.tolist())):
            tables = []
            for r in uniq.tolist():
                rate = b.rates[r]
                one = self._unit.get(id(rate))
                if one is None or one[0] is not rate or one[1] != total_gpus:
                    one = self._unit[id(rate)] = (rate, total_gpus, unit_table(rate, total_gpus))
                tables.append(one[2])
            stacked = None if any(t is None for t in tables) else stack_unit_tables(tables)
            if len(self._stacked) > 64:
                self._stacked.clear()
            hit = self._stacked[key] = ([b.rates[r] for r in uniq.tolist()], stacked)
        if hit[1] is None:
            return None
        renum = np.zeros(rows.size, dtype=np.int64) if uniq.size == 1 else np.searchsorted(uniq, rows)
        return renum, hit[1][0], hit[1][1]


class Exploratory:
    """Measure a new job at 1/2/4/8 GPUs (8 held) first, then Eq. 6 doubling with the fitted model."""

    name = "exploratory"
    explores = True  # the simulator runs the measuring phase for jobs with needs_exploration

    def __init__(self, explore_gpus: int = EXPLORE_GPUS):
        # GPUs an explorer holds: 8 in the simulator (the paper's); the live scheduler passes fewer
        # on a node with fewer than 8 slots
        if explore_gpus < 1:
            raise ConfigError(f"explore_gpus must be >= 1, got {explore_gpus}")
        self.explore_gpus = explore_gpus
        self._state: dict = {}
        self._cache: dict | None = None  # allocate_batch's table rows, kept between decisions

    def allocate(self, jobs: Sequence[JobView], total_gpus: int, current: Mapping[int, int]) -> dict[int, int]:
        alloc: dict[int, int] = {}
        free = total_gpus
        hold = self.explore_gpus
        for j in jobs:  # explorers first (already exploring ones are earlier in arrival order)
            if (j.exploring or j.needs_exploration) and free >= hold:
                alloc[j.id] = hold
                free -= hold
        ready = [j for j in jobs if not (j.exploring or j.needs_exploration)]
        alloc.update(doubling_allocate(_planned(ready), free))
        return alloc

    def allocate_batch(self, b: JobBatch, total_gpus: int) -> np.ndarray:
        """:meth:`allocate` on arrays: one compiled call (``kernels.explore``) on a cache of the
        measured jobs' table rows kept between decisions (a row of a batch's ``rates`` list never
        changes); :meth:`_allocate_arrays` where that call declines. Same answer either way."""
        k = compiled()
        for _ in range(2):
            c = self._cache_for(b)
            out, code, tau, top = k.explore(
                np.ascontiguousarray(b.ids, dtype=np.int64), np.ascontiguousarray(b.remaining, dtype=np.float64),
                np.ascontiguousarray(b.rows, dtype=np.int64), np.ascontiguousarray(b.needs_exploration, dtype=bool),
                np.ascontiguousarray(b.exploring, dtype=bool), np.ascontiguousarray(b.tables, dtype=np.float64),
                int(total_gpus), int(self.explore_gpus), float(self._state.get("tau", 0.0)), *c)
            if code == k.EXPLORE_OK:
                self._state["tau"] = tau
                return out
            if code != k.EXPLORE_GROW:
                break
            self._grow_cache(b, top)
        return self._allocate_arrays(b, total_gpus)

    def _cache_for(self, b: JobBatch) -> tuple:
        """The row cache of ``kernels.explore`` (slot by id, slots, rows, their bounds, scratch),
        emptied when the batches bring another list of rates (a list the simulator only appends to)."""
        c = self._cache
        if c is None or c["rates"] is not b.rates or len(b.rates) < c["n_rates"] or (
                c["n_rates"] and b.rates[c["n_rates"] - 1] is not c["last"]):
            c = self._cache = {"rates": b.rates, "arrays": self._cache_arrays(1024, 64, b.tables.shape[1])}
        c["n_rates"], c["last"] = len(b.rates), (b.rates[-1] if len(b.rates) else None)
        return c["arrays"]

    @staticmethod
    def _cache_arrays(ids: int, cap: int, width: int) -> tuple:
        slots = np.zeros((3, cap), dtype=np.int64)
        slots[0] = -1
        by_id = np.full(ids, -1, dtype=np.int64)
        return by_id, slots, np.zeros((width, cap)), np.zeros((3, cap)), np.zeros((width, cap))

    def _grow_cache(self, b: JobBatch, top: int) -> None:
        """A cache for ids up to ``top`` and every job of ``b`` (the slots start empty again)."""
        by_id, slots = self._cache["arrays"][:2]
        cap = max(slots.shape[1], b.ids.size + b.ids.size // 8 + 64)
        self._cache["arrays"] = self._cache_arrays(max(by_id.size, 2 * top + 2), cap, b.tables.shape[1])

    def _allocate_arrays(self, b: JobBatch, total_gpus: int) -> np.ndarray:
        hold = self.explore_gpus
        out = np.zeros(b.ids.size, dtype=np.int64)
        flagged = np.flatnonzero(b.exploring | b.needs_exploration)
        take = flagged[: total_gpus // hold]  # explorers in arrival order while >= hold GPUs are free
        out[take] = hold
        ready = np.flatnonzero(~(b.exploring | b.needs_exploration))
        out[ready] = doubling_batch(b, ready, total_gpus - take.size * hold, state=self._state)
        return out


class ResizeAware:
    """Another policy's answer, less the grows that do not pay for their resize.

    A running job that the inner policy grows from w to w' is grown only if the work it gains over
    the horizon, ``(f(w') - f(w)) · min(H, Q/f(w'))``, exceeds the work the resize costs it,
    ``f(w') · c`` (c: the resize cost in seconds, a model in the simulator; the live scheduler can
    pass each job's measured one through ``costs``). Vetoed grows leave their GPUs free until the next
    decision; shrinks, preemptions and starts are kept as the inner policy gave them (they are what
    admits new jobs). H defaults to 10 c, with each job's own c (not tuned: a fixed rule, so nothing
    to hold out). Units: whatever the views use (samples and samples/s in the simulator, steps and
    steps/s live); the test compares work with work.
    """

    explores = False

    def __init__(self, inner, resize_cost_s: float, horizon_s: float | None = None,
                 costs: Mapping[int, float] | None = None):
        if resize_cost_s < 0:
            raise ConfigError(f"resize cost must be >= 0 s, got {resize_cost_s}")
        self.inner = inner
        self.name = f"{inner.name}-rc"
        self.resize_cost_s = resize_cost_s
        self._horizon_fixed = horizon_s
        self.horizon_s = 10.0 * resize_cost_s if horizon_s is None else horizon_s
        self.costs = dict(costs or {})  # job id -> measured seconds (the live scheduler refreshes it)
        self.vetoed = 0
        # the last decision's vetoed grows: (job id, held, asked, work gained over H, work the resize costs)
        self.last_vetoed: list[tuple[int, int, int, float, float]] = []
        # allocate_batch's rates: rtab[row, w] = b.rates[row](w) (NaN: not looked up yet)
        self._rtab = np.full((0, 1), np.nan)
        self._rtab_of = None  # the batches' list of rates the table is for
        self._rtab_n, self._rtab_last = 0, None
        if not hasattr(inner, "allocate_batch"):
            self.allocate_batch = None  # the simulator then asks allocate (see Simulator.batch)

    def allocate(self, jobs: Sequence[JobView], total_gpus: int, current: Mapping[int, int]) -> dict[int, int]:
        return self._gate(jobs, self.inner.allocate(jobs, total_gpus, current))

    def allocate_batch(self, b: JobBatch, total_gpus: int) -> np.ndarray:
        """:meth:`allocate` on arrays: the inner policy's ``allocate_batch``, then the gate on the
        grows alone (a few jobs per decision), so the simulator's array path serves ``NAME-rc`` too."""
        new = np.array(self.inner.allocate_batch(b, total_gpus), dtype=np.int64)
        if self.costs:  # per-job costs (the live scheduler's): the per-job path
            grow = np.flatnonzero((b.current > 0) & (new > b.current) & (b.rows >= 0))
            if grow.size:
                views = [JobView(int(b.ids[i]), float(b.remaining[i]), b.rates[b.rows[i]], int(b.current[i]))
                         for i in grow]
                kept = self._gate(views, {v.id: int(new[i]) for v, i in zip(views, grow)})
                new[grow] = [kept[v.id] for v in views]
            return new
        c = float(self.resize_cost_s)
        horizon = 10.0 * c if self._horizon_fixed is None else float(self._horizon_fixed)
        rtab = self._rate_table(b, total_gpus)
        args = (np.ascontiguousarray(b.current, dtype=np.int64), new, np.ascontiguousarray(b.rows, dtype=np.int64),
                np.ascontiguousarray(b.remaining, dtype=np.float64), rtab, c, horizon)
        grown, pos, asked, gains, costs, missing = compiled().gate(*args)
        if missing.size:  # rates not looked up yet: fill them, decide again
            for r, w in missing.tolist():
                rtab[r, w] = b.rates[r](w)
            grown, pos, asked, gains, costs, missing = compiled().gate(*args)
        if grown:
            self.last_vetoed = [(int(b.ids[i]), int(b.current[i]), w1, g, fc) for i, w1, g, fc in
                                zip(pos.tolist(), asked.tolist(), gains.tolist(), costs.tolist())]
            self.vetoed += pos.size
        return new

    def _rate_table(self, b: JobBatch, total_gpus: int) -> np.ndarray:
        """``rtab[row, w]``: ``b.rates[row](w)`` for w <= total_gpus, NaN until looked up; kept
        while the batches bring the same list of rates (the simulator appends to it)."""
        rates = b.rates
        if self._rtab_of is not rates or self._rtab.shape[1] <= total_gpus or (
                self._rtab_n and rates[self._rtab_n - 1] is not self._rtab_last):
            self._rtab_of, self._rtab_n = rates, 0
            self._rtab = np.full((0, total_gpus + 1), np.nan)
        if len(rates) > self._rtab.shape[0]:
            grown = np.full((max(2 * self._rtab.shape[0], len(rates)), self._rtab.shape[1]), np.nan)
            grown[: self._rtab.shape[0]] = self._rtab
            self._rtab = grown
        if len(rates) != self._rtab_n:
            self._rtab_n, self._rtab_last = len(rates), rates[-1]
        return self._rtab

    def _gate(self, jobs: Sequence[JobView], new: dict[int, int]) -> dict[int, int]:
        """``new`` less the grows of ``jobs`` that do not pay for their resize (counted in ``vetoed``)."""
        self.last_vetoed = []
        for j in jobs:
            w0, w1 = j.current, new.get(j.id, 0)
            if w0 > 0 and w1 > w0 and j.rate is not None:
                c = self.costs.get(j.id, self.resize_cost_s)
                horizon = 10.0 * c if self._horizon_fixed is None else self._horizon_fixed
                f0, f1 = j.rate(w0), j.rate(w1)
                gain = (f1 - f0) * min(horizon, j.remaining / f1)
                if gain <= f1 * c:
                    new[j.id] = w0
                    self.vetoed += 1
                    self.last_vetoed.append((j.id, w0, w1, gain, f1 * c))
        return new


POLICIES = {"eight": Eight, "precompute": Precompute, "exploratory": Exploratory, "optimus": Optimus,
            "srtf": SRTF}
