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


def _cost_above(gm: np.ndarray, tau: float, pow2: np.ndarray) -> tuple[int, np.ndarray]:
    lv = (gm > tau).sum(axis=1)
    return int(pow2[lv].sum() - lv.size), lv


def rows_monotone(d: np.ndarray) -> np.ndarray:
    """Per table row: its per-GPU gains ``d_k/2^k`` fall by more than rounding can undo (a margin
    of 1e-12), so ``(q·d_k)/2^k`` cannot increase with k for any q >= 0 (the check
    :func:`doubling_levels` otherwise makes on every call)."""
    if d.shape[1] < 2:
        return np.ones(d.shape[0], dtype=bool)
    e = d / (1 << np.arange(d.shape[1])).astype(float)
    return np.all(np.isfinite(e), axis=1) & np.all(e[:, 1:] * (1 + 1e-12) < e[:, :-1], axis=1)


def doubling_levels(q: np.ndarray, d: np.ndarray, free: int, state: dict | None = None,
                    checked: bool = False) -> np.ndarray | None:
    """Doublings per job (``alloc = 2**levels``) for jobs that each start at 1 GPU with ``free`` GPUs left.

    q: (n,) remaining work (times the job's weight), in priority order; d: (n, L) gain tables
    (:func:`gain_table` rows, at least as many levels as fit in ``free``). checked: every row of
    ``d`` passed :func:`rows_monotone` (the per-call check is skipped when q is finite and >= 0).
    None: use the heap.
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
    w = (1 << np.arange(L)).astype(float)
    gm = (q[:, None] * d[:, :L]) / w
    if not (checked and np.isfinite(q).all() and (q >= 0).all()):
        if not np.isfinite(gm).all():
            return None
        if L > 1 and bool(np.any((gm[:, 1:] > gm[:, :-1]) & (gm[:, 1:] > 0))):
            return None
    top = float(gm[:, 0].max())
    if not top > 0:
        return levels
    pow2 = 1 << np.arange(L + 1, dtype=np.int64)
    tau = (state or {}).get("tau", top / 2)
    if not (tau > 0 and np.isfinite(tau)):
        tau = top / 2
    # 1. the threshold above which everything fits: raise tau until the doublings above it fit
    cost, lv = _cost_above(gm, tau, pow2)
    probes = 0
    while cost > free and probes < _MAX_PROBES:
        tau *= 2.0
        cost, lv = _cost_above(gm, tau, pow2)
        probes += 1
    if cost > free:  # pathological spread of gains: nothing taken at once
        tau, lv, cost = top, np.zeros(n, dtype=np.int64), 0
    tau_hi = tau
    levels[:] = lv
    free -= cost
    # the next chunk's lower edge: low enough that its doublings could use all the GPUs left
    tau_lo = tau_hi / 2.0
    probes = 0
    while probes < 8:
        c, _ = _cost_above(gm, tau_lo, pow2)
        if c - cost >= free:
            break
        tau_lo /= 2.0
        probes += 1
    else:
        tau_lo = 0.0
    if state is not None:
        state["tau"] = tau_hi / 1.5
    dropped = np.zeros(n, dtype=bool)
    kcol = np.arange(L)
    for lo, hi in [(tau_lo, tau_hi)] + ([(0.0, tau_lo)] if tau_lo > 0 else []):
        if free <= 0:
            break
        m = (gm > lo) & (gm <= hi) & (kcol >= levels[:, None]) & (pow2[:L] <= free)
        if dropped.any():
            m &= ~dropped[:, None]
        cj, ck = np.nonzero(m)
        if not cj.size:
            continue
        order = np.lexsort((ck, cj, -gm[cj, ck]))
        cj, ck = cj[order], ck[order]
        costs = pow2[ck]
        while cj.size and free > 0:
            cs = np.cumsum(costs)
            f = int(np.searchsorted(cs, free, side="right"))
            if f:
                levels += np.bincount(cj[:f], minlength=n)
                free -= int(cs[f - 1])
            if f >= cj.size:
                break
            dropped[cj[f]] = True
            cj, ck, costs = cj[f + 1:], ck[f + 1:], costs[f + 1:]
            keep = (costs <= free) & ~dropped[cj]
            cj, ck, costs = cj[keep], ck[keep], costs[keep]
    return levels


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


def _count_above(q: np.ndarray, rows: np.ndarray, tables: list[np.ndarray], tau: float) -> np.ndarray:
    """Per job, how many of its unit steps have gain ``q·u_w > tau`` (exact products)."""
    c = np.zeros(q.size, dtype=np.int64)
    for r in np.unique(rows):
        sel = np.flatnonzero(rows == r)
        u = tables[r]
        if u.size == 0:
            continue
        qs = q[sel]
        with np.errstate(divide="ignore", invalid="ignore"):
            k = np.searchsorted(-u, -(tau / qs), side="left").astype(np.int64)
        k[~(qs > 0)] = 0
        for _ in range(4):  # exact fix-up of the rounding at the boundary
            dn = (k > 0) & (qs * u[np.maximum(k - 1, 0)] <= tau)
            up = (k < u.size) & (qs * u[np.minimum(k, u.size - 1)] > tau)
            if not (dn.any() or up.any()):
                break
            k = k - dn + up
        c[sel] = k
    return c


def unit_steps(q: np.ndarray, rows: np.ndarray, tables: list[np.ndarray], free: int,
               state: dict | None = None) -> np.ndarray:
    """GPUs added per job by the unit-step greedy (each job starts at 1, ``free`` GPUs to give),
    the same answer as the heap of ``unit_greedy_allocate`` given tables from :func:`unit_table`:
    the greedy takes the ``free`` largest positive gains in (gain, position) order."""
    n = q.size
    if n == 0 or free <= 0:
        return np.zeros(n, dtype=np.int64)
    total = _count_above(q, rows, tables, 0.0)
    if int(total.sum()) <= free:
        return total
    tau = (state or {}).get("tau", 0.0)
    if not (tau > 0 and np.isfinite(tau)):
        tau = float(np.max(q * np.array([t[0] if t is not None and t.size else 0.0 for t in tables])[rows])) / 2
    hi_c = _count_above(q, rows, tables, tau)
    lo, hi = 0.0, np.inf
    if int(hi_c.sum()) <= free:
        hi = tau
        lo_t = tau / 2
        while lo_t > 0 and int(_count_above(q, rows, tables, lo_t).sum()) <= free:
            hi, lo_t = lo_t, lo_t / 2
        lo = lo_t
    else:
        lo = tau
        hi_t = tau * 2
        while int(_count_above(q, rows, tables, hi_t).sum()) > free:
            lo, hi_t = hi_t, hi_t * 2
        hi = hi_t
    c_hi = _count_above(q, rows, tables, hi)
    c_lo = _count_above(q, rows, tables, lo)
    for _ in range(60):  # narrow (lo, hi] to a few candidates per job
        if int(c_lo.sum() - c_hi.sum()) <= max(64, n) or not (lo > 0):
            break
        mid = float(np.sqrt(lo * hi))
        if not (lo < mid < hi):
            break
        c_mid = _count_above(q, rows, tables, mid)
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
    for r in np.unique(rows[jj]):
        m = rows[jj] == r
        u_at[m] = tables[r][ww[m]]
    vals = q[jj] * u_at
    order = np.lexsort((jj, -vals))[:need]
    return c_hi + np.bincount(jj[order], minlength=n)
