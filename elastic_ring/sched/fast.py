"""The policies' array decisions (the simulator's hot path at cluster scale): gain tables, their
checks, and the entry points of the compiled kernels of :mod:`elastic_ring.sched.kernels`, which
give the same allocations as the heaps of :mod:`elastic_ring.sched.policies` (``doubling_allocate``,
``unit_greedy_allocate``), bit for bit.

Eq. 6 doubling: a job's doublings are levels k = 0, 1, 2, ... (level k takes it from 2^k to
2^(k+1) GPUs, cost 2^k GPUs, gain ``(q·d_k)/2^k`` with ``d_k = 1/f(2^k) - 1/f(2^(k+1))``, the
heap's ``_gain_double``). :func:`doubling_rows` returns None when a gain is not finite or grows
with the level (the greedy order is then not a sort); the caller runs the heap.

Unit steps (Optimus): ``u_w = 1/f(w) - 1/f(w+1)``; :func:`unit_table` returns None when its
positive part does not fall strictly (the caller runs the heap).

The kernels are imported on first use (numba's import costs ~0.3 s). On a fresh install their
compilation costs about 20 s of CPU once (2-core x86); ``cache=True`` keeps the compiled code beside
the module, and set-up compiles it ahead (:mod:`elastic_ring.sim.warm`).
"""

from __future__ import annotations

import numpy as np


def compiled():
    """:mod:`elastic_ring.sched.kernels`, imported on first use (numba's import costs ~0.3 s)."""
    from elastic_ring.sched import kernels

    return kernels


def gain_table(rate, max_gpus: int) -> np.ndarray:
    """``d_k = 1/f(2^k) - 1/f(2^(k+1))`` for every level whose doubling fits in ``max_gpus``."""
    inv = [1.0 / rate(1)]  # 1/f at 1, 2, 4, ...: each rate called once (the same numbers as twice)
    w = 1
    while 2 * w <= max(max_gpus, 2):
        inv.append(1.0 / rate(2 * w))
        w *= 2
    return np.array([inv[k] - inv[k + 1] for k in range(len(inv) - 1)], dtype=float)


def rows_monotone(d: np.ndarray) -> np.ndarray:
    """Per table row: its per-GPU gains ``d_k/2^k`` fall by more than rounding can undo (a margin
    of 1e-12), so ``(q·d_k)/2^k`` cannot increase with k for any q >= 0 (``JobBatch.monotone``;
    the doubling kernel checks every gain it computes anyway)."""
    if d.shape[1] < 2:
        return np.ones(d.shape[0], dtype=bool)
    e = d / (1 << np.arange(d.shape[1])).astype(float)
    return np.all(np.isfinite(e), axis=1) & np.all(e[:, 1:] * (1 + 1e-12) < e[:, :-1], axis=1)


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


def doubling_rows(q: np.ndarray, rows: np.ndarray, tables: np.ndarray, free: int,
                  state: dict | None = None) -> np.ndarray | None:
    """Doublings per job (``alloc = 2**levels``) for jobs that each start at 1 GPU with ``free``
    GPUs left: q (n,) remaining work (times the job's weight) in priority order, job j's gain
    table ``tables[rows[j]]`` (:func:`gain_table` rows, at least as many levels as fit in
    ``free``). ``state``: the policy's, keeps the threshold for the next call's search (it only
    changes how the work is split, never the answer). None: use the heap."""
    n = q.shape[0]
    if n == 0 or free <= 0:
        return np.zeros(n, dtype=np.int64)
    tau0 = float(state.get("tau", 0.0)) if state else 0.0
    levels, ok, tau = compiled().doubling(np.ascontiguousarray(q, dtype=np.float64),
                                          np.ascontiguousarray(rows, dtype=np.int64),
                                          np.ascontiguousarray(tables, dtype=np.float64), int(free), tau0)
    if not ok:
        return None
    if state is not None:
        state["tau"] = tau
    return levels


def doubling_levels(q: np.ndarray, d: np.ndarray, free: int, state: dict | None = None) -> np.ndarray | None:
    """:func:`doubling_rows` with ``d`` (n, L): one table row per job, or (1, L): one for all."""
    n = q.shape[0]
    rows = np.zeros(n, dtype=np.int64) if d.shape[0] == 1 else np.arange(n, dtype=np.int64)
    return doubling_rows(q, rows, d, free, state)


def stack_unit_tables(tables) -> tuple[np.ndarray, np.ndarray]:
    """:func:`unit_table` results (a list, one per row) as one zero-padded array and their lengths."""
    ulen = np.array([0 if t is None else t.size for t in tables], dtype=np.int64)
    utab = np.zeros((len(tables), max(1, int(ulen.max(initial=0)))))
    for r, t in enumerate(tables):
        if t is not None:
            utab[r, : t.size] = t
    return utab, ulen


def unit_steps_rows(q: np.ndarray, rows: np.ndarray, utab: np.ndarray, ulen: np.ndarray, free: int,
                    state: dict | None = None) -> np.ndarray:
    """GPUs added per job by the unit-step greedy (each job starts at 1, ``free`` GPUs to give),
    the same answer as the heap of ``unit_greedy_allocate``: job j's steps ``utab[rows[j]]`` (the
    first ``ulen[rows[j]]`` entries, from :func:`unit_table`, stacked by :func:`stack_unit_tables`);
    q must be finite."""
    n = q.size
    if n == 0 or free <= 0:
        return np.zeros(n, dtype=np.int64)
    q = np.ascontiguousarray(q, dtype=np.float64)
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    if rows.size and bool((rows == rows[0]).all()):
        order = np.argsort(q)
        starts = np.array([0, n], dtype=np.int64)
    else:  # by table, then by q: each table's jobs a run in ascending q
        order = np.lexsort((q, rows))
        starts = np.concatenate(([0], np.cumsum(np.bincount(rows, minlength=utab.shape[0])))).astype(np.int64)
    tau0 = float(state.get("tau", 0.0)) if state else 0.0
    add, tau = compiled().unit_steps(q, order.astype(np.int64), starts, rows, utab, ulen, int(free), tau0)
    if state is not None:
        state["tau"] = tau
    return add


def unit_steps(q: np.ndarray, rows: np.ndarray, tables: list[np.ndarray], free: int,
               state: dict | None = None) -> np.ndarray:
    """:func:`unit_steps_rows` with ``tables`` a list (one :func:`unit_table` result per row)."""
    utab, ulen = stack_unit_tables(tables)
    return unit_steps_rows(q, rows, utab, ulen, free, state)
