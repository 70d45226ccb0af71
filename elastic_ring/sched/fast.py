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
