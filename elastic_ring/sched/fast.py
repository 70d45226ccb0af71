"""Eq. 6 doubling on arrays: the same allocation as :func:`~elastic_ring.sched.policies.doubling_allocate`
without a Python step per doubling (the simulator's hot path at cluster scale).

The heap version pops one doubling at a time: on 16,384 GPUs a decision makes thousands of them,
and the simulator decides at every arrival and completion. Here a job's doublings are levels
k = 0, 1, 2, ... (level k takes it from 2^k to 2^(k+1) GPUs, cost 2^k GPUs, gain
``(q·d_k)/2^k`` with ``d_k = 1/f(2^k) - 1/f(2^(k+1))``, the same floating-point operations as the
heap's ``_gain_double``). When every job's gains do not increase with its level (true of every
Eq. 5 curve we use; checked at each call), the heap pops the doublings in the order of
(gain descending, job index ascending, level ascending), taking each that fits in the GPUs left and
dropping a job whose doubling does not fit (free GPUs only shrink). So:

1. the doublings whose gain is above a threshold tau_hi, when together they cost at most the free
   GPUs, are all taken at once (no failure can happen among them);
2. the rest are taken in chunks of decreasing gain, each sorted, by rounds: a cumulative sum of
   costs finds the first doubling that does not fit; everything before it is taken, its job is
   dropped, and the doublings that cost more than the GPUs left are filtered out. Each failure
   costs a smaller power of two than the last, so a chunk takes at most log2(G) + 1 rounds.

tau_hi is searched from the previous call's value (``state``), which only changes how the work is
split, never the answer. :func:`doubling_levels` returns None when the monotonicity check fails
(or a gain is not finite); the caller then runs the heap.
"""

from __future__ import annotations

import numpy as np

_MAX_PROBES = 64

def gain_table(rate, max_gpus: int) -> np.ndarray:
    """``d_k = 1/f(2^k) - 1/f(2^(k+1))`` for every level whose doubling fits in ``max_gpus``."""
    out = []
    w = 1
    while 2 * w <= max(max_gpus, 2):
        out.append(1.0 / rate(w) - 1.0 / rate(2 * w))
        w *= 2
    return np.array(out, dtype=float)


def rows_monotone(d: np.ndarray) -> np.ndarray:
    """Per table row: its per-GPU gains ``d_k/2^k`` fall by more than rounding can undo (a margin
    of 1e-12), so ``(q·d_k)/2^k`` cannot increase with k for any q >= 0 (the check
    :func:`doubling_levels` otherwise makes on every call)."""
    if d.shape[1] < 2:
        return np.ones(d.shape[0], dtype=bool)
    e = d / (1 << np.arange(d.shape[1])).astype(float)
    return np.all(np.isfinite(e), axis=1) & np.all(e[:, 1:] * (1 + 1e-12) < e[:, :-1], axis=1)


class _DenseGains:
    """Every job's gains at every level, ``g[k, j] = (q_j·d_jk)/2^k`` (one array, level-major)."""

    def __init__(self, q: np.ndarray, d: np.ndarray, L: int):
        # (q·d)/2^k, the heap's _gain_double (a product by 2^-k is the same number as a quotient by 2^k)
        self.g = d[:, :L].T * q
        self.g *= 1.0 / (1 << np.arange(L)).astype(float)[:, None]
        self.top = float(self.g[0].max())

    def counts(self, tau: float) -> np.ndarray:
        """Per level, how many jobs gain more than ``tau`` there."""
        return np.count_nonzero(self.g > tau, axis=1)

    def levels(self, tau: float) -> np.ndarray:
        """Per job, how many of its levels gain more than ``tau``."""
        return np.count_nonzero(self.g > tau, axis=0)

    def items(self, lo: float, hi: float, lm: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(job, level, gain) of the doublings at levels < ``lm`` with ``lo < gain <= hi``."""
        g = self.g[:lm]
        ck, cj = np.nonzero((g > lo) & (g <= hi))
        return cj, ck, g[ck, cj]


class _SortedGains:
    """The gains of jobs that share one gain table: ``(q·d_k)/2^k`` rises with q at every level,
    so the jobs above a threshold at level k are the top of the jobs sorted by q, found by a binary
    search (checked exactly at the edge) instead of a comparison per job and level."""

    def __init__(self, q: np.ndarray, d: np.ndarray, L: int):
        self.q, self.n = q, q.size
        self.order = np.argsort(q)
        self.qa = q[self.order]
        self.d = d[0, :L]
        self.w = (1 << np.arange(L)).astype(float)
        self.top = float((self.qa[-1] * self.d[0]) / self.w[0])
        # levels with a positive gain come first (the table passed rows_monotone); the others never
        # exceed a threshold > 0. q padded with -inf / +inf: the edge checks need no bounds.
        lp = int(np.count_nonzero(self.d > 0))
        self.dp, self.wp, self.x = self.d[:lp], self.w[:lp], self.w[:lp] / self.d[:lp]
        self.tail = np.full(L - lp, self.n, dtype=np.int64)
        self.qp = np.concatenate(([-np.inf], self.qa, [np.inf]))
        self._edges: dict[float, np.ndarray] = {}

    def edges(self, tau: float) -> np.ndarray:
        """Per level, the first position (in ascending q) whose gain exceeds ``tau``: a binary
        search on an estimate of the q at which the gain crosses ``tau``, then the exact gains on
        either side of the edge (the heap's operations), moved until they agree."""
        e = self._edges.get(tau)
        if e is not None:
            return e
        dp, wp, qp = self.dp, self.wp, self.qp
        e = np.searchsorted(self.qa, tau * self.x, side="right")
        for _ in range(8):
            down = (qp[e] * dp) / wp > tau  # the one below the edge is above tau: move down
            up = ~((qp[e + 1] * dp) / wp > tau)  # the one at the edge is not: move up
            if not (down.any() or up.any()):
                break
            e = e - down + up
        else:  # a long run of equal q at the edge: count it out
            e = np.array([self.n - np.count_nonzero((self.qa * dp[i]) / wp[i] > tau) for i in range(dp.size)],
                         dtype=np.int64)
        e = np.concatenate((e, self.tail))
        self._edges[tau] = e
        return e

    def counts(self, tau: float) -> np.ndarray:
        return self.n - self.edges(tau)

    def levels(self, tau: float) -> np.ndarray:
        at_rank = np.cumsum(np.bincount(self.edges(tau), minlength=self.n + 1))[: self.n]
        out = np.empty(self.n, dtype=np.int64)
        out[self.order] = at_rank
        return out

    def items(self, lo: float, hi: float, lm: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        a, b = self.edges(lo)[:lm], self.edges(hi)[:lm]
        c = b - a
        ck = np.repeat(np.arange(lm), c)
        ranks = np.arange(ck.size) - np.repeat(np.cumsum(c) - c, c) + np.repeat(a, c)
        cj = self.order[ranks]
        return cj, ck, (self.q[cj] * self.d[ck]) / self.w[ck]


def _gains(q: np.ndarray, d: np.ndarray, L: int, checked: bool):
    """The gain view for :func:`doubling_levels`, or None when the heap must run (a gain that is
    not finite, or one that grows with the level)."""
    if checked and np.isfinite(q).all() and (q >= 0).all():
        return _SortedGains(q, d, L) if d.shape[0] == 1 else _DenseGains(q, d, L)
    v = _DenseGains(q, d, L)
    g = v.g
    if not np.isfinite(g).all():
        return None
    if L > 1 and bool(np.any((g[1:] > g[:-1]) & (g[1:] > 0))):
        return None
    return v


def doubling_levels(q: np.ndarray, d: np.ndarray, free: int, state: dict | None = None,
                    checked: bool = False) -> np.ndarray | None:
    """Doublings per job (``alloc = 2**levels``) for jobs that each start at 1 GPU with ``free`` GPUs left.

    q: (n,) remaining work (times the job's weight), in priority order; d: (n, L) gain tables
    (:func:`gain_table` rows, at least as many levels as fit in ``free``), or (1, L): one table
    for every job. checked: every row of ``d`` passed :func:`rows_monotone` (the per-call check is
    skipped when q is finite and >= 0). None: use the heap.
    """
    n = q.shape[0]
    levels = np.zeros(n, dtype=np.int64)
    if n == 0 or free <= 0:
        return levels
    L = 0
    while L < d.shape[1] and (1 << L) <= free:
        L += 1
    if L == 0:
        return levels
    v = _gains(q, d, L, checked)
    if v is None:
        return None
    if not v.top > 0:
        return levels
    pow2 = 1 << np.arange(L + 1, dtype=np.int64)
    tau_hi, tau_lo, free = _thresholds(v, pow2, L, free, state, levels)
    for lo, hi in [(tau_lo, tau_hi)] + ([(0.0, tau_lo)] if tau_lo > 0 else []):
        if free <= 0:
            break
        free = _take_chunk(v, lo, hi, pow2, free, levels)
    return levels


def _thresholds(v, pow2: np.ndarray, L: int, free: int, state: dict | None,
                levels: np.ndarray) -> tuple[float, float, int]:
    """Take at once every doubling above tau_hi, the threshold above which they all fit (searched
    from the last call's, ``state``); tau_lo: the next chunk's lower edge, low enough that its
    doublings could use all the GPUs left. Returns (tau_hi, tau_lo, GPUs left)."""
    w = pow2[:L]
    top = v.top
    tau = (state or {}).get("tau", top / 2)
    if not (tau > 0 and np.isfinite(tau)):
        tau = top / 2
    cost = int(v.counts(tau) @ w)
    probes = 0
    while cost > free and probes < _MAX_PROBES:
        tau *= 2.0
        cost = int(v.counts(tau) @ w)
        probes += 1
    if cost > free:  # pathological spread of gains: nothing taken at once
        tau, cost = top, 0
    else:
        levels[:] = v.levels(tau)
    tau_hi = tau
    free -= cost
    tau_lo = tau_hi / 2.0
    probes = 0
    while probes < 8:
        if int(v.counts(tau_lo) @ w) - cost >= free:
            break
        tau_lo /= 2.0
        probes += 1
    else:
        tau_lo = 0.0
    if state is not None:
        state["tau"] = tau_hi / 1.5
    return tau_hi, tau_lo, free


def _take_chunk(v, lo: float, hi: float, pow2: np.ndarray, free: int, levels: np.ndarray) -> int:
    """The doublings with gain in (lo, hi], in the heap's order (gain descending, job, level), by
    rounds: a cumulative sum of costs finds the first that does not fit; everything before it is
    taken, and what costs more than the GPUs left is filtered out (the job that did not fit with
    it: its later doublings cost more). Returns the GPUs left."""
    cj, ck, g = v.items(lo, hi, int(np.count_nonzero(pow2[:-1] <= free)))
    if not cj.size:
        return free
    order = np.argsort(-g)
    gs = g[order]
    if gs.size > 1 and bool((gs[1:] == gs[:-1]).any()):  # equal gains: the heap takes the lower job first
        order = np.lexsort((ck, cj, -g))
    cj = cj[order]
    costs = pow2[ck[order]]
    taken = []
    while cj.size and free > 0:
        cs = np.cumsum(costs)
        f = int(np.searchsorted(cs, free, side="right"))
        if f:
            taken.append(cj[:f])
            free -= int(cs[f - 1])
        if f >= cj.size:
            break
        keep = costs[f + 1:] <= free
        cj, costs = cj[f + 1:][keep], costs[f + 1:][keep]
    if taken:
        levels += np.bincount(np.concatenate(taken), minlength=levels.size)
    return free


def unit_table(rate, max_gpus: int) -> np.ndarray | None:
    """``u_w = 1/f(w) - 1/f(w+1)`` for w = 1 .. max_gpus (index w-1), or None when the positive
    part does not fall strictly (by more than rounding, a 1e-12 margin) or turns positive again:
    then the unit-step greedy's order is not a sort and the caller runs its heap."""
    u = np.array([1.0 / rate(w) - 1.0 / rate(w + 1) for w in range(1, max(max_gpus, 1) + 1)])
    if not np.isfinite(u).all():
        return None
    p = int(np.argmax(u <= 0)) if (u <= 0).any() else u.size
    if (u[p:] > 0).any() or (p > 1 and not np.all(u[1:p] * (1 + 1e-12) < u[: p - 1])):
        return None
    return u[:p]


def distinct(rows: np.ndarray) -> np.ndarray:
    """``np.unique(rows)``, without its sort when every entry is the same (one workload)."""
    if rows.size and bool((rows == rows[0]).all()):
        return rows[:1].copy()
    return np.unique(rows)


class _UnitCounts:
    """Per job, how many of its unit steps have gain ``q·u_w > tau`` (exact products): a binary
    search per job on an estimate, then the exact products on either side of the edge. The jobs
    are grouped by table once per decision, and each threshold's answer is kept."""

    def __init__(self, q: np.ndarray, rows: np.ndarray, tables: list[np.ndarray]):
        self.n = q.size
        self.groups = []
        uniq = distinct(rows)
        for r in uniq:
            u = tables[r]
            if u.size == 0:
                continue
            sel = None if uniq.size == 1 else np.flatnonzero(rows == r)
            qs = q if sel is None else q[sel]
            with np.errstate(divide="ignore"):
                inv = np.where(qs > 0, 1.0 / qs, 0.0)  # 1/q: only the estimate; q <= 0 counts 0
            pad = np.concatenate(([np.inf], u, [-np.inf]))  # the edges need no bounds checks
            off = ~(qs > 0)
            self.groups.append((sel, np.where(off, 1.0, qs), inv, -u, pad, off))
        self._seen: dict[float, np.ndarray] = {}

    def __call__(self, tau: float) -> np.ndarray:
        c = self._seen.get(tau)
        if c is not None:
            return c
        c = np.zeros(self.n, dtype=np.int64)
        if not tau < np.inf:
            return c
        for sel, qs, inv, neg_u, pad, off in self.groups:
            k = np.searchsorted(neg_u, -(tau * inv), side="left").astype(np.int64)
            k[off] = 0
            for _ in range(8):  # exact fix-up of the rounding at the boundary
                dn = qs * pad[k] <= tau  # the step below the edge does not gain more than tau
                up = qs * pad[k + 1] > tau  # the step at the edge does
                dn &= ~off
                up &= ~off
                if not (dn.any() or up.any()):
                    break
                k = k - dn + up
            else:  # count them out
                u = pad[1:-1]
                k = np.array([0 if o else int(np.count_nonzero(x * u > tau)) for x, o in zip(qs.tolist(), off.tolist())],
                             dtype=np.int64)
            if sel is None:
                c = k
            else:
                c[sel] = k
        self._seen[tau] = c
        return c


def unit_steps(q: np.ndarray, rows: np.ndarray, tables: list[np.ndarray], free: int,
               state: dict | None = None) -> np.ndarray:
    """GPUs added per job by the unit-step greedy (each job starts at 1, ``free`` GPUs to give),
    the same answer as the heap of ``unit_greedy_allocate`` given tables from :func:`unit_table`:
    the greedy takes the ``free`` largest positive gains in (gain, position) order."""
    n = q.size
    if n == 0 or free <= 0:
        return np.zeros(n, dtype=np.int64)
    count = _UnitCounts(q, rows, tables)
    total = count(0.0)
    if int(total.sum()) <= free:
        return total
    tau = (state or {}).get("tau", 0.0)
    if not (tau > 0 and np.isfinite(tau)):
        tau = float(np.max(q * np.array([t[0] if t is not None and t.size else 0.0 for t in tables])[rows])) / 2
    # bracket the threshold, in steps that start small (the last decision's threshold is usually
    # close) and square: a narrow bracket leaves few candidates to narrow down
    step = 1.05
    if int(count(tau).sum()) <= free:
        hi, lo = tau, tau / step
        while lo > 0 and int(count(lo).sum()) <= free:
            step *= step
            hi, lo = lo, lo / step
    else:
        lo, hi = tau, tau * step
        while int(count(hi).sum()) > free:
            step *= step
            lo, hi = hi, hi * step
    c_hi = count(hi)
    c_lo = count(lo)
    for _ in range(60):  # narrow (lo, hi] to a few candidates per job
        if int(c_lo.sum() - c_hi.sum()) <= max(64, n) or not (lo > 0):
            break
        mid = float(np.sqrt(lo * hi))
        if not (lo < mid < hi):
            break
        c_mid = count(mid)
        if int(c_mid.sum()) <= free:
            hi, c_hi = mid, c_mid
        else:
            lo, c_lo = mid, c_mid
    if state is not None:
        state["tau"] = hi
    need = free - int(c_hi.sum())
    extra = c_lo - c_hi
    jj = np.repeat(np.arange(n), extra)
    starts = np.repeat(c_hi, extra)
    offs = np.arange(jj.size) - np.repeat(np.cumsum(extra) - extra, extra)
    ww = starts + offs
    u_at = np.empty(jj.size)
    for r in distinct(rows[jj]):
        m = rows[jj] == r
        u_at[m] = tables[r][ww[m]]
    vals = q[jj] * u_at
    order = np.lexsort((jj, -vals))[:need]
    return c_hi + np.bincount(jj[order], minlength=n)
