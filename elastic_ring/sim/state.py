"""The simulator's per-job state as arrays, and the compiled steps that work on it.

One column per job (its arrival index ``p``), one row per field: ``F`` (float64) holds the work,
the work done, the time progress was last accounted to, the restart time after a pause, the true
speed and the completion time; ``I`` (int64) the GPUs held and trained on, the state, the resizes,
the row of the true-speed table, the planner's row, the id and whether the job is explored.
``act[:n]`` lists the active jobs' columns in arrival order.

While the engine decides on arrays these are the source of truth: a decision's changes are applied
here in one compiled call, with the same floating-point operations per job as
:meth:`~elastic_ring.sim.job.SimJob.advance`, ``Simulator._apply`` and ``_set_training`` (so the
results are bit-identical to the per-job code); the completion time of every job is kept here, and
the next completion is the minimum over the active jobs.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# rows of F
WORK, DONE_W, ADV, PAUSE, SPEED, TC = range(6)
N_F = 6
# rows of I
HELD, TRAIN, STATE, RESIZES, WROW, ROW, ID, EXPLORED = range(8)
N_I = 8
# values of I[STATE]
QUEUED, RUNNING, EXPLORING, DONE = range(4)

# apply_batch's answer codes
OK, BAD, OVER, CHANGED_EXPLORING, UNEXPLORED_SIZE = range(5)


def new_state(ids, arrivals, works, wrows, rows, explored: bool) -> tuple[np.ndarray, np.ndarray]:
    """F and I for jobs not yet arrived (nothing done, no GPUs, never completing)."""
    n = len(ids)
    F = np.zeros((N_F, n))
    F[WORK] = works
    F[ADV] = arrivals
    F[TC] = np.inf
    I = np.zeros((N_I, n), dtype=np.int64)
    I[WROW] = wrows
    I[ROW] = rows
    I[ID] = ids
    I[EXPLORED] = 1 if explored else 0
    I[STATE] = QUEUED
    return F, I


@njit(cache=True)
def next_completion(act, n, F):
    """The earliest completion time of the active jobs (inf when none trains)."""
    t = np.inf
    for i in range(n):
        c = F[TC, act[i]]
        if c < t:
            t = c
    return t


@njit(cache=True)
def pop_completed(act, n, F, t):
    """Remove from ``act[:n]`` (keeping the order) every job completing at ``t``; returns the new
    count and the removed columns."""
    out = np.empty(n, dtype=np.int64)
    k = 0
    m = 0
    for i in range(n):
        p = act[i]
        if F[TC, p] == t:
            out[k] = p
            k += 1
        else:
            act[m] = p
            m += 1
    return m, out[:k]


@njit(cache=True)
def batch_arrays(act, n, F, I, now):
    """What a decision hands the policy, in ``act`` order: remaining work (``SimJob.remaining_at``'s
    operations), ids, GPUs held, planner rows, needs exploration, exploring."""
    q = np.empty(n)
    ids = np.empty(n, dtype=np.int64)
    held = np.empty(n, dtype=np.int64)
    rows = np.empty(n, dtype=np.int64)
    needs = np.empty(n, dtype=np.bool_)
    expl = np.empty(n, dtype=np.bool_)
    for i in range(n):
        p = act[i]
        sp = F[SPEED, p]
        left = F[WORK, p] - F[DONE_W, p]
        if sp <= 0:
            q[i] = left
        else:
            a, b = F[ADV, p], F[PAUSE, p]
            start = a if a > b else b
            r = left - (sp * (now - start) if now > start else 0.0)
            q[i] = r if r > 0.0 else 0.0
        ids[i] = I[ID, p]
        held[i] = I[HELD, p]
        rows[i] = I[ROW, p]
        ex = I[STATE, p] == EXPLORING
        expl[i] = ex
        needs[i] = I[EXPLORED, p] == 0 and not ex
    return q, ids, held, rows, needs, expl


@njit(cache=True)
def _launch_cost(w, base, per):
    if per == 0.0:
        return base
    return base + per * (w - 1)


@njit(cache=True)
def _advance(p, now, F):
    """:meth:`~elastic_ring.sim.job.SimJob.advance` of column ``p`` to ``now``."""
    sp = F[SPEED, p]
    if sp > 0:
        a, b = F[ADV, p], F[PAUSE, p]
        start = a if a > b else b
        if now > start:
            x = F[DONE_W, p] + sp * (now - start)
            work = F[WORK, p]
            F[DONE_W, p] = x if x < work else work
    F[ADV, p] = now


@njit(cache=True)
def _train(p, w, now, F, I, tab):
    """``Simulator._set_training(w, now)`` of column ``p``: new speed, new completion time."""
    I[TRAIN, p] = w
    sp = tab[I[WROW, p], w] if w > 0 else 0.0
    F[SPEED, p] = sp
    if sp > 0:
        pause = F[PAUSE, p]
        start = now if now > pause else pause
        F[TC, p] = start + (F[WORK, p] - F[DONE_W, p]) / sp
    else:
        F[TC, p] = np.inf


@njit(cache=True)
def _apply_one(p, w, now, F, I, tab, resize_oh, start_oh, per):
    """``Simulator._apply`` of an explored job (no hand-over, own launch cost only): returns
    (change of GPUs in use, resizes counted)."""
    _advance(p, now, F)
    h = I[HELD, p]
    nres = 0
    if h > 0:
        I[RESIZES, p] += 1
        nres = 1
        if w > 0:
            F[PAUSE, p] = now + _launch_cost(w, resize_oh, per)
    elif w > 0:
        F[PAUSE, p] = now + _launch_cost(w, start_oh if F[DONE_W, p] == 0 else resize_oh, per)
    I[STATE, p] = RUNNING if w > 0 else QUEUED
    I[HELD, p] = w
    _train(p, w, now, F, I, tab)
    return w - h, nres


@njit(cache=True)
def next_phase(p, w, now, F, I, tab, resize_oh, per):
    """``Simulator._end_phase``'s step of an exploring job (column ``p``) to its next phase, on
    ``w`` GPUs from ``now`` (own launch cost only): it advances, counts a resize, pauses for the
    relaunch and trains on w. Returns its speed, the end of its pause, and its completion time
    before and after."""
    before = F[TC, p]
    _advance(p, now, F)
    I[RESIZES, p] += 1
    F[PAUSE, p] = now + _launch_cost(w, resize_oh, per)
    _train(p, w, now, F, I, tab)
    return F[SPEED, p], F[PAUSE, p], before, F[TC, p]


@njit(cache=True)
def _check(act, n, new, I, gpus, explores, hold):
    """The checks of a decision, in the order the per-job code makes them: (code, index, value)."""
    total = 0
    for i in range(n):
        if new[i] < 0:
            return BAD, i, 0
        total += new[i]
    if total > gpus:
        return OVER, 0, total
    if explores:
        for i in range(n):
            p = act[i]
            w, h = new[i], I[HELD, p]
            ex = I[STATE, p] == EXPLORING
            if w != h and (w > h or ex):
                if ex:
                    return CHANGED_EXPLORING, i, w
                if I[EXPLORED, p] == 0 and w != hold:
                    return UNEXPLORED_SIZE, i, w
    return OK, 0, 0


@njit(cache=True)
def apply_batch(act, n, new, F, I, tab, now, gpus, explores, hold, resize_oh, start_oh, per):
    """Check and apply a decision ``new`` (GPUs per job of ``act[:n]``): shrinks and grows, as
    ``Simulator._decide`` (which applies the shrinks first: each change touches its own job's
    column alone, so one pass in ``act`` order gives the same arrays). Jobs that start exploring
    are left to the caller (returned, in order). Returns (code, index, value, change of GPUs in
    use, resizes, next completion time over the active jobs, the columns that start exploring)."""
    code, idx, val = _check(act, n, new, I, gpus, explores, hold)
    starts = np.empty(0, dtype=np.int64)
    if code != OK:
        return code, idx, val, 0, 0, np.inf, starts
    dg = 0
    nres = 0
    starts = np.empty(n, dtype=np.int64)
    k = 0
    t = np.inf
    for i in range(n):
        p = act[i]
        w, h = new[i], I[HELD, p]
        # a shrink never touches an exploring job, nor one not explored (they hold 0); a grow of
        # an exploring job was refused by _check
        if (w < h and I[STATE, p] != EXPLORING) or w > h:
            if w > h and I[EXPLORED, p] == 0:
                starts[k] = p
                k += 1
            else:
                d, r = _apply_one(p, w, now, F, I, tab, resize_oh, start_oh, per)
                dg += d
                nres += r
        c = F[TC, p]
        if c < t:
            t = c
    return OK, 0, 0, dg, nres, t, starts[:k]


def speed_table(rates, gpus: int) -> np.ndarray:
    """``tab[r, w]``: true samples/s of rate ``r`` at ``w`` GPUs (``rates[r](w)``, the same numbers
    the per-job code uses), 0 at w = 0."""
    tab = np.zeros((len(rates), gpus + 1))
    for r, rate in enumerate(rates):
        tab[r, 1:] = [rate(w) for w in range(1, gpus + 1)]
    return tab
