"""Compiled (numba) kernels of the policies' array decisions: the same answers as the heaps of
:mod:`elastic_ring.sched.policies`, bit for bit, without a Python step per doubling or per GPU.

At cluster scale (16,384 GPUs, ~1,500 active jobs) a decision makes thousands of doublings (Eq. 6)
or unit steps (Optimus); as NumPy calls on arrays of the active jobs most of the time goes to
per-call overhead. Here each decision is a few compiled loops (timings: docs/reports/simulate.md). No ``fastmath``: every gain is the
heap's floating-point operations in the heap's order, so the comparisons (and the ties) are the same.

Doubling (:func:`doubling`). Level k of a job takes it from 2^k to 2^(k+1) GPUs (cost 2^k), gain
``(q·d_k)/2^k`` (``d_k`` a :func:`~elastic_ring.sched.fast.gain_table` entry; the product by the
exact power of two 2^-k is the same number as the heap's quotient). When no job's gains grow with
its level (checked on every cell; otherwise the caller runs the heap) the heap takes the doublings
in the order (gain descending, job ascending, level ascending), each iff its cost fits in the GPUs
left (a job whose doubling does not fit never fits later: free GPUs only shrink). So:

1. a threshold ``hi`` is searched (from the last decision's, ``tau0``) such that the doublings
   gaining more than ``hi`` fit together: all are taken at once, no order needed;
2. the rest by the heap's own greedy, a binary heap of each job's next doubling, first those above
   ``lo`` (a threshold below which the doublings could use every GPU left), then the others.

Unit steps (:func:`unit_steps`): one GPU per step, gain ``q·u_w``; the greedy takes the ``free``
largest positive gains in (gain descending, job ascending) order. Per threshold, each job's count
of steps above it is found with the jobs sorted by q within their table (counts fall with q: one
pointer walks the table down); the threshold is bracketed and narrowed to a few candidates, which
are sorted exactly (gain, then job) and the first ``free`` taken.

Gate (:func:`gate`): :class:`~elastic_ring.sched.policies.ResizeAware`'s test on the grown jobs,
the same operations as ``ResizeAware._gate``, one pass over the batch.

SRTF and Optimus rank the jobs (:func:`ordered`): the last decision's order, by job id, finished by
an insertion sort (two decisions' orders differ by a few swaps and the jobs that came or went).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

# doubling: the first bracket step of the threshold search (it squares while it misses)
_STEP = 1.03
# doubling: refine the bracket (lo, hi] until hi/lo is at most this
_RATIO = 1.05
# unit steps: narrow the bracket until at most this many candidate steps are left (then sorted)
_CANDIDATES = 64
# explore: job ids at or above this are not cached (its slot-by-id array would be too large)
_ID_MAX = 1 << 26
# explore: bounds that keep a sure row's gains finite and normal (see _slot_gains)
_HUGE, _TINY = 2.0 ** 1000, 2.0 ** -990


@njit(cache=True)
def _gain_cells(q, rows, tables, L):
    """``g[k, j] = (q_j·d_jk)·2^-k`` (level-major) and whether the greedy order is a sort: every
    gain finite (``x - x == 0``), none above the same job's previous level's when positive."""
    n = q.size
    g = np.empty((L, n))
    one = True
    for j in range(n):
        if rows[j] != rows[0]:
            one = False
            break
    bad = False
    if one:  # one table: level by level
        for k in range(L):
            s = 1.0 / (1 << k)
            dk = tables[rows[0], k]
            cur, prev = g[k], g[max(k - 1, 0)]
            for j in range(n):
                x = (q[j] * dk) * s
                cur[j] = x
                bad |= ((x - x) != 0.0) | ((x > prev[j]) & (x > 0.0))
        return g, not bad
    inv = np.empty(L)
    for k in range(L):
        inv[k] = 1.0 / (1 << k)
    for j in range(n):  # a row per job: each job's row in order
        d = tables[rows[j]]
        x = q[j] * d[0]
        g[0, j] = x
        bad |= (x - x) != 0.0
        for k in range(1, L):
            y = (q[j] * d[k]) * inv[k]
            g[k, j] = y
            bad |= ((y - y) != 0.0) | ((y > x) & (y > 0.0))
            x = y
    return g, not bad


@njit(cache=True)
def _cost_above(g, tau, lf):
    """GPUs the doublings at levels < ``lf`` gaining more than ``tau`` (>= 0) cost together. A
    level with none stops the count: no job's gain grows with the level where it is positive
    (checked before), so no higher level has one either."""
    c = 0
    for k in range(lf):
        m = 0
        row = g[k]
        for j in range(row.size):
            if row[j] > tau:
                m += 1
        if m == 0:
            break
        c += m << k
    return c


@njit(cache=True)
def _live(free, L):
    lf = 0
    while lf < L and (1 << lf) <= free:
        lf += 1
    return lf


@njit(cache=True)
def _bracket(g, free, L, top, tau0):
    """(lo, hi): the doublings above ``hi`` fit in ``free``, those above ``lo`` do not, hi/lo small.
    Searched from ``tau0`` in steps that start at 3% and square."""
    tau = tau0 if (tau0 > 0.0 and tau0 < top) else top / 2.0
    step = _STEP
    if _cost_above(g, tau, L) <= free:
        hi = tau
        while True:
            lo = hi / step
            if _cost_above(g, lo, L) > free:
                break
            hi = lo
            step *= step
    else:
        lo = tau
        while True:
            hi = lo * step
            if hi >= top:
                hi = top
                break
            if _cost_above(g, hi, L) <= free:
                break
            lo = hi
            step *= step
    while hi > lo * _RATIO:
        mid = math.sqrt(lo * hi)
        if not (lo < mid < hi):
            break
        if _cost_above(g, mid, L) <= free:
            hi = mid
        else:
            lo = mid
    return lo, hi


@njit(cache=True)
def _before(ga, ja, gb, jb):
    """The heap's order: larger gain first, then the lower job index."""
    return ga > gb or (ga == gb and ja < jb)


@njit(cache=True)
def _sift_down(hg, hj, size, i):
    x, y = hg[i], hj[i]
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size and _before(hg[c + 1], hj[c + 1], hg[c], hj[c]):
            c += 1
        if not _before(hg[c], hj[c], x, y):
            break
        hg[i], hj[i] = hg[c], hj[c]
        i = c
    hg[i], hj[i] = x, y


@njit(cache=True)
def _heap_greedy(g, col, levels, free, L, lo):
    """The heap's greedy from the current ``levels``: each job's next doubling above ``lo`` in a
    binary heap; pop the best, take it iff it fits, push the job's next one. Job j's gains are
    column ``col[j]`` of ``g``. Returns GPUs left."""
    n = levels.size
    hg = np.empty(n)
    hj = np.empty(n, dtype=np.int64)
    size = 0
    lf = _live(free, L)
    for j in range(n):
        k = levels[j]
        if k < lf and g[k, col[j]] > lo:
            hg[size], hj[size] = g[k, col[j]], j
            size += 1
    root = size - size  # an int64 variable, not a literal 0: one compiled _sift_down
    for i in range(size // 2 - 1, -1, -1):
        _sift_down(hg, hj, size, i)
    while size > 0 and free > 0:
        j = hj[0]
        k = levels[j]
        if (1 << k) <= free:
            free -= 1 << k
            levels[j] = k + 1
            k += 1
            if k < L and (1 << k) <= free and g[k, col[j]] > lo:
                hg[0] = g[k, col[j]]
                _sift_down(hg, hj, size, root)
                continue
        size -= 1  # the job is done (or does not fit): drop it
        if size > 0:
            hg[0], hj[0] = hg[size], hj[size]
            _sift_down(hg, hj, size, root)
    return free


@njit(cache=True)
def doubling(q, rows, tables, free, tau0):
    """Doublings per job (each starts at 1 GPU, ``free`` GPUs to give) for jobs ``q`` (remaining
    work times weight, priority order) with gain table rows ``tables[rows]``.

    Returns (levels, ok, tau): ok False when a gain is not finite or grows with the level (the
    caller then runs the heap); tau: the threshold to start the next decision's search from.
    """
    n = q.size
    L = _live(free, tables.shape[1])
    if n == 0 or L == 0:
        return np.zeros(n, dtype=np.int64), True, tau0
    g, ok = _gain_cells(q, rows, tables, L)
    if not ok:
        return np.zeros(n, dtype=np.int64), False, tau0
    levels, tau = _double_cells(g, np.arange(n), free, L, tau0)
    return levels, True, tau


@njit(cache=True)
def _double_cells(g, col, free, L, tau0):
    """:func:`doubling` from its gain cells: job j's gains are column ``col[j]`` of ``g``
    (level-major; other columns only gains <= 0, which never count). Returns (levels, tau)."""
    n, m = col.size, g.shape[1]
    lev = np.zeros(m, dtype=np.int64)  # per column, then per job
    levels = np.empty(n, dtype=np.int64)
    if _cost_above(g, 0.0, L) <= free:  # every positive doubling fits
        for k in range(L):
            row = g[k]
            m_k = 0
            for c in range(m):
                above = row[c] > 0.0
                lev[c] += above
                m_k += above
            if m_k == 0:  # none higher either (see _cost_above)
                break
        for j in range(n):
            levels[j] = lev[col[j]]
        return levels, tau0
    top = 0.0
    for c in range(m):
        top = max(top, g[0, c])
    lo, hi = _bracket(g, free, L, top, tau0)
    for k in range(L):  # everything above hi fits: taken at once
        row = g[k]
        m_k = 0
        for c in range(m):
            above = row[c] > hi
            lev[c] += above
            m_k += above
        if m_k == 0:
            break
        free -= m_k << k
    for j in range(n):
        levels[j] = lev[col[j]]
    free = _heap_greedy(g, col, levels, free, L, lo)
    if free > 0 and lo > 0.0:
        _heap_greedy(g, col, levels, free, L, 0.0)
    return levels, hi


@njit(cache=True)
def _unit_counts(tau, qs, starts, rs, utab, ulen, out):
    """Per job, its unit steps with ``q·u_w > tau``; the total. The jobs in sorted order: ``qs``
    ascending within each table's group (``starts``: the groups' bounds, ``rs``: their tables);
    walked from the largest q down, the counts only fall, so one pointer moves down the table."""
    total = 0
    for gi in range(starts.size - 1):
        a, b = starts[gi], starts[gi + 1]
        if a == b:
            continue
        r = rs[b - 1]
        u = utab[r]
        # the largest q by binary search: its count is the first w with q·u_w <= tau
        x = qs[b - 1]
        lo, hi = 0, ulen[r]
        while lo < hi:
            mid = (lo + hi) // 2
            if x * u[mid] > tau:
                lo = mid + 1
            else:
                hi = mid
        p = lo
        for i in range(b - 1, a - 1, -1):
            x = qs[i]
            while p > 0 and not (x * u[p - 1] > tau):
                p -= 1
            out[i] = p
            total += p
    return total


@njit(cache=True)
def unit_steps(q, order, starts, rows, utab, ulen, free, tau0):
    """GPUs added per job by the unit-step greedy: the ``free`` largest positive ``q_j·u_w`` in
    (gain descending, job ascending) order, each job's steps w = 1, 2, ... (``utab[rows[j]]``,
    ``ulen``: each table's strictly falling positive part). ``order``: the jobs by ascending q
    within each table's group (``starts``). Returns (steps, tau for the next call)."""
    n = q.size
    qs = np.empty(n)
    rs = np.empty(n, dtype=np.int64)
    for i in range(n):
        qs[i], rs[i] = q[order[i]], rows[order[i]]
    c_hi = np.zeros(n, dtype=np.int64)  # counts per sorted position
    total = _unit_counts(0.0, qs, starts, rs, utab, ulen, c_hi)
    add = np.empty(n, dtype=np.int64)
    if total <= free:  # every positive step fits
        for i in range(n):
            add[order[i]] = c_hi[i]
        return add, tau0
    c_lo = c_hi.copy()  # counts above lo = 0: more than free
    lo, n_lo, hi, n_hi = _unit_bracket(qs, starts, rs, utab, ulen, free, tau0, total, c_lo, c_hi)
    lo_j = np.empty(n, dtype=np.int64)
    for i in range(n):
        add[order[i]] = c_hi[i]
        lo_j[order[i]] = c_lo[i]
    return _unit_take(q, rows, utab, lo_j, add, free - n_hi), hi


@njit(cache=True)
def _copy(dst, src):
    for i in range(src.size):
        dst[i] = src[i]


@njit(cache=True)
def _unit_bracket(qs, starts, rs, utab, ulen, free, tau0, total, c_lo, c_hi):
    """(lo, count above lo, hi, count above hi): at most ``free`` steps gain more than hi, more
    than ``free`` more than lo, and few between (``c_lo``, ``c_hi``: the counts, filled in).
    Searched from ``tau0`` in steps that start at 1% and square, then narrowed by halving."""
    n = qs.size
    top = 0.0
    for gi in range(starts.size - 1):
        if starts[gi + 1] > starts[gi] and ulen[rs[starts[gi + 1] - 1]] > 0:
            top = max(top, qs[starts[gi + 1] - 1] * utab[rs[starts[gi + 1] - 1], 0])
    lo, n_lo = 0.0, total
    hi, n_hi = top, 0
    tau = tau0 if (tau0 > 0.0 and tau0 < top) else top / 2.0
    step = 1.01
    c = np.empty(n, dtype=np.int64)
    t = _unit_counts(tau, qs, starts, rs, utab, ulen, c)
    if t <= free:
        hi, n_hi = tau, t
        _copy(c_hi, c)
        while True:
            x = hi / step
            t = _unit_counts(x, qs, starts, rs, utab, ulen, c)
            if t > free:
                lo, n_lo = x, t
                _copy(c_lo, c)
                break
            hi, n_hi = x, t
            _copy(c_hi, c)
            step *= step
    else:
        lo, n_lo = tau, t
        _copy(c_lo, c)
        c_hi.fill(0)
        while True:
            x = lo * step
            if x >= top:
                break
            t = _unit_counts(x, qs, starts, rs, utab, ulen, c)
            if t <= free:
                hi, n_hi = x, t
                _copy(c_hi, c)
                break
            lo, n_lo = x, t
            _copy(c_lo, c)
            step *= step
    while n_lo - n_hi > _CANDIDATES:
        mid = math.sqrt(lo * hi) if lo > 0.0 else hi * 1e-3
        if not (lo < mid < hi):
            break
        t = _unit_counts(mid, qs, starts, rs, utab, ulen, c)
        if t <= free:
            hi, n_hi = mid, t
            _copy(c_hi, c)
        else:
            lo, n_lo = mid, t
            _copy(c_lo, c)
    return lo, n_lo, hi, n_hi


@njit(cache=True)
def _unit_take(q, rows, utab, c_lo, c_hi, need):
    """``c_hi`` plus the ``need`` best candidate steps (those between the two counts), in the
    heap's order: gain descending, then job ascending (a stable sort of the job-ordered list)."""
    m = 0
    for j in range(q.size):
        m += c_lo[j] - c_hi[j]
    gains = np.empty(m)
    jobs = np.empty(m, dtype=np.int64)
    i = 0
    for j in range(q.size):
        u = utab[rows[j]]
        for w in range(c_hi[j], c_lo[j]):
            gains[i] = -(q[j] * u[w])  # ascending: the largest gain first
            jobs[i] = j
            i += 1
    order = _sort_by(gains, jobs)  # jobs ascending: equal gains by job
    out = c_hi.copy()
    for i in range(min(need, m)):
        out[jobs[order[i]]] += 1
    return out


@njit(cache=True)
def gate(current, new, rows, remaining, rtab, cost, horizon):
    """ResizeAware's test on the grown jobs (held > 0, ``new`` more, a speed model): the work
    gained over the horizon, ``(f1 - f0)·min(H, Q/f1)``, against the work the resize costs,
    ``f1·c`` (``rtab[row, w]``: the rate at w GPUs, NaN where not computed yet). A grow that does
    not pay is set back in ``new``. Returns (grown count, vetoed positions, the GPUs they were
    given, their gains, their ``f1·c``, missing rates as (row, w) pairs: when any, nothing is
    changed; fill them and call again)."""
    n = current.size
    grown = 0
    miss = 0
    for i in range(n):
        if current[i] > 0 and new[i] > current[i] and rows[i] >= 0:
            grown += 1
            miss += math.isnan(rtab[rows[i], current[i]]) + math.isnan(rtab[rows[i], new[i]])
    missing = np.empty((miss, 2), dtype=np.int64)
    if miss:
        m = 0
        for i in range(n):
            if current[i] > 0 and new[i] > current[i] and rows[i] >= 0:
                for w in (current[i], new[i]):
                    if math.isnan(rtab[rows[i], w]):
                        missing[m, 0], missing[m, 1] = rows[i], w
                        m += 1
        return grown, np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), np.empty(0), np.empty(0), missing
    pos = np.empty(grown, dtype=np.int64)
    asked = np.empty(grown, dtype=np.int64)
    gains = np.empty(grown)
    costs = np.empty(grown)
    v = 0
    for i in range(n):
        if current[i] > 0 and new[i] > current[i] and rows[i] >= 0:
            f0, f1 = rtab[rows[i], current[i]], rtab[rows[i], new[i]]
            x = remaining[i] / f1
            gain = (f1 - f0) * (x if x < horizon else horizon)  # Python's min(H, x): H unless x < H
            if gain <= f1 * cost:
                pos[v], asked[v], gains[v], costs[v] = i, new[i], gain, f1 * cost
                new[i] = current[i]
                v += 1
    return grown, pos[:v], asked[:v], gains[:v], costs[:v], missing


@njit(cache=True)
def _key_before(ka, ia, kb, ib):
    return ka < kb or (ka == kb and ia < ib)


@njit(cache=True)
def _sort_by(keys, ties):
    """Positions sorted by (key ascending, tie ascending): a bottom-up merge sort."""
    n = keys.size
    a = np.arange(n)
    b = np.empty(n, dtype=np.int64)
    width = 1
    while width < n:
        for lo in range(0, n, 2 * width):
            mid, hi = min(lo + width, n), min(lo + 2 * width, n)
            i, j = lo, mid
            for t in range(lo, hi):
                if i < mid and (j >= hi or not _key_before(keys[a[j]], ties[a[j]], keys[a[i]], ties[a[i]])):
                    b[t] = a[i]
                    i += 1
                else:
                    b[t] = a[j]
                    j += 1
        a, b = b, a
        width *= 2
    return a


@njit(cache=True)
def ordered(keys, ids, prev, slot):
    """Positions sorted by (key ascending, id ascending), started from ``prev`` (the ids in the
    last call's order: the order changes little between two decisions) and finished by an
    insertion sort; a full sort when it would move too much. ``slot``: scratch indexed by job id
    (ids not below its size get the full sort). Returns (order, largest id)."""
    n = keys.size
    order = np.empty(n, dtype=np.int64)
    top, low = -1, 0
    for p in range(n):
        top = max(top, ids[p])
        low = min(low, ids[p])
    m = 0
    if n and top < slot.size and low >= 0:
        for p in range(n):
            slot[ids[p]] = p
        seen = np.zeros(n, dtype=np.bool_)
        for t in range(prev.size):
            i = prev[t]
            if 0 <= i < slot.size:
                p = slot[i]
                if 0 <= p < n and ids[p] == i and not seen[p]:
                    seen[p] = True
                    order[m] = p
                    m += 1
        for p in range(n):  # new jobs, in arrival order
            if not seen[p]:
                order[m] = p
                m += 1
        budget = 16 * n + 64
        for a in range(1, n):
            p = order[a]
            k, i = keys[p], ids[p]
            b = a - 1
            while b >= 0 and _key_before(k, i, keys[order[b]], ids[order[b]]):
                order[b + 1] = order[b]
                b -= 1
                budget -= 1
            order[b + 1] = p
            if budget < 0:
                break
        if budget >= 0:
            return order, top
    order = _sort_by(keys, ids)
    return order, top


@njit(cache=True)
def srtf(remaining, rate1, rows, ids, weights, tables, total_gpus, tau0, prev, slot):
    """SRTF's decision: the jobs ranked by predicted time alone ``Q/f(1)`` (ties: lower id),
    the first ``total_gpus`` admitted at 1 GPU, Eq. 6 doubling with each job's Q times its rank's
    weight (``weights[r]``). Returns (GPUs per job, order, status, tau, ids in order, largest
    id); status 1: a gain is not finite or grows with the level (the caller runs the heap on
    ``order``), 2: a time is NaN (no order: the caller ranks the jobs itself)."""
    n = remaining.size
    keys = np.empty(n)
    out = np.zeros(n, dtype=np.int64)
    for i in range(n):
        keys[i] = remaining[i] / rate1[rows[i]]
        if math.isnan(keys[i]):
            return out, ids, 2, tau0, ids, -1
    order, top = ordered(keys, ids, prev, slot)
    m = min(n, total_gpus)
    q = np.empty(m)
    r = np.empty(m, dtype=np.int64)
    for t in range(m):
        q[t] = remaining[order[t]] * weights[t]
        r[t] = rows[order[t]]
    levels, ok, tau = doubling(q, r, tables, total_gpus - m, tau0)
    for t in range(m):
        out[order[t]] = 1 << levels[t]
    by_id = np.empty(n, dtype=np.int64)
    for t in range(n):
        by_id[t] = ids[order[t]]
    return out, order, 0 if ok else 1, tau, by_id, top


@njit(cache=True)
def unit_steps_one(q, ids, rows, utab, ulen, free, tau0, prev, slot):
    """:func:`unit_steps` for jobs that share one table, ordered by :func:`ordered` from the last
    call's order (``prev``). Returns (steps, tau, ids in order, largest id)."""
    order, top = ordered(q, ids, prev, slot)
    starts = np.array([0, q.size], dtype=np.int64)
    add, tau = unit_steps(q, order, starts, rows, utab, ulen, free, tau0)
    by_id = np.empty(q.size, dtype=np.int64)
    for t in range(q.size):
        by_id[t] = ids[order[t]]
    return add, tau, by_id, top


# explore's answer codes: decided; the caller decides another way (the doubling's heap, fewer
# GPUs than ready jobs, a job without a speed model, ids the cache cannot hold); grow the cache
EXPLORE_OK, EXPLORE_OTHER, EXPLORE_GROW = range(3)


@njit(cache=True)
def _explore_slots(ids, rows, ready, n, tables, by_id, slots, E, M):
    """Give each ready job (``ready[:n]``) its cache slot, whose column of ``E`` (level-major)
    holds its table row; a job new to the cache (or whose row changed) is copied in (with its
    bounds in ``M``: :func:`_row_bounds`), a slot whose job is gone is emptied (zeros).
    ``slots``: per slot its job id (-1: empty), row, seen flag.
    Returns the slots per ready job, or an empty array when two jobs share an id."""
    cap = slots.shape[1]
    sl = np.empty(n, dtype=np.int64)
    slots[2].fill(0)
    for j in range(n):
        i = ready[j]
        s = by_id[ids[i]]
        if s >= 0 and slots[0, s] == ids[i] and slots[1, s] == rows[i]:
            if slots[2, s]:
                return sl[:0]
            slots[2, s] = 1
            sl[j] = s
        else:
            sl[j] = -1
    for s in range(cap):  # jobs gone: their slots emptied
        if slots[0, s] >= 0 and not slots[2, s]:
            slots[0, s] = -1
            for k in range(E.shape[0]):
                E[k, s] = 0.0
    p = 0
    for j in range(n):  # jobs new to the cache: the first empty slots
        if sl[j] < 0:
            i = ready[j]
            while slots[0, p] >= 0:
                p += 1
            slots[0, p], slots[1, p], slots[2, p] = ids[i], rows[i], 1
            by_id[ids[i]] = p
            for k in range(E.shape[0]):
                E[k, p] = tables[rows[i], k]
            _row_bounds(E, p, M)
            sl[j] = p
    return sl


@njit(cache=True)
def _row_bounds(E, p, M):
    """``M[:, p]`` for the row in column p of ``E``: whether it is sure (finite, |d_k| <= 2^1000,
    ``d_k <= 2·d_(k-1)`` at every level: per-GPU gains ``d_k/2^k`` that do not grow), its largest
    |d_k| and its smallest positive d_k (see :func:`_slot_gains`)."""
    sure, big, small = 1.0, 0.0, np.inf
    for k in range(E.shape[0]):
        d = E[k, p]
        if not (abs(d) <= _HUGE) or (k > 0 and not (d <= 2.0 * E[k - 1, p])):
            sure = 0.0
        big = max(big, abs(d))
        if d > 0.0:
            small = min(small, d)
    M[0, p], M[1, p], M[2, p] = sure, big, small


@njit(cache=True)
def _slot_gains(q, ready, sl, E, M, G, L):
    """``G[k, s] = (q_j·d_jk)·2^-k`` for the job j in slot s (0 in empty slots) and whether the
    greedy order is a sort: :func:`_gain_cells`'s operations and checks, on the cache (level by
    level, each a loop the compiler vectorises)."""
    cap = G.shape[1]
    qs = np.zeros(cap)
    sure = True
    for j in range(sl.size):
        c = sl[j]
        x = q[ready[j]]
        qs[c] = x
        # (q·d_k)·2^-k cannot be infinite, nor above the previous level's where positive, for a
        # sure row and 0 <= q with q·max|d| <= 2^1000 and q·(smallest d > 0) >= 2^-990 (no
        # overflow; every positive q·d_(k-1) normal, so rounding 2·q·d_(k-1) is twice rounding
        # it, and monotone rounding keeps d_k <= 2·d_(k-1) for the computed gains)
        sure &= M[0, c] == 1.0 and 0.0 <= x <= _HUGE and x * M[1, c] <= _HUGE and (
            x == 0.0 or x * M[2, c] >= _TINY)
    for k in range(L):
        s = 1.0 / (1 << k)
        e, cur = E[k], G[k]
        for c in range(cap):
            cur[c] = (qs[c] * e[c]) * s
    if sure:
        return True
    bad = 0
    for c in range(cap):
        x = G[0, c]
        bad += (x - x) != 0.0
    for k in range(1, L):
        cur, prev = G[k], G[k - 1]
        for c in range(cap):
            x = cur[c]
            bad += ((x - x) != 0.0) | ((x > prev[c]) & (x > 0.0))
    return bad == 0


@njit(cache=True)
def explore(ids, q, rows, needs, exploring, tables, total_gpus, hold, tau0, by_id, slots, E, M, G):
    """Exploratory's decision: explorers (exploring or needing exploration) ``hold`` GPUs each in
    arrival order while that many are free; the other jobs share the rest by Eq. 6 doubling on
    their own tables (:func:`doubling`'s answer), computed on a cache of their table rows kept
    between decisions (``by_id``: slot per job id; ``slots``, ``E``, ``M``: see
    :func:`_explore_slots`; ``G``: scratch gains, E's shape). Returns (GPUs per job, code, tau, largest id)."""
    n_all = ids.size
    out = np.zeros(n_all, dtype=np.int64)
    ready = np.empty(n_all, dtype=np.int64)
    n, taken, top, low = 0, 0, -1, 0
    for i in range(n_all):
        if exploring[i] or needs[i]:
            if (taken + 1) * hold <= total_gpus:
                out[i] = hold
                taken += 1
        else:
            ready[n] = i
            n += 1
            top, low = max(top, ids[i]), min(low, ids[i])
            if rows[i] < 0:
                return out, EXPLORE_OTHER, tau0, top
    free = total_gpus - taken * hold - n
    if n == 0:
        return out, EXPLORE_OK, tau0, top
    if free < 0 or low < 0 or top >= _ID_MAX:
        return out, EXPLORE_OTHER, tau0, top
    if top >= by_id.size or n > slots.shape[1] or E.shape[0] != tables.shape[1]:
        return out, EXPLORE_GROW, tau0, top
    L = _live(free, tables.shape[1])
    if L == 0:
        for j in range(n):
            out[ready[j]] = 1
        return out, EXPLORE_OK, tau0, top
    sl = _explore_slots(ids, rows, ready, n, tables, by_id, slots, E, M)
    if sl.size < n or not _slot_gains(q, ready, sl, E, M, G, L):
        return out, EXPLORE_OTHER, tau0, top
    levels, tau = _double_cells(G, sl, free, L, tau0)
    for j in range(n):
        out[ready[j]] = 1 << levels[j]
    return out, EXPLORE_OK, tau, top
