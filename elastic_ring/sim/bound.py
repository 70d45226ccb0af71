"""Lower bounds on the average JCT of any policy: how much better than Eight a policy could do at all.

Every bound uses the true remaining work (an oracle) and free resizes (it holds for any resize cost:
a paused job only slows), and allows every schedule the simulator can run (integer GPU counts, a
job's rate ``f_j(w)`` at ``w`` GPUs); so Eight's average JCT divided by a bound is an upper bound on
any policy's gain.

:func:`srpt_bound`  Preemptive SRPT on one server as fast as the whole cluster with LINEAR speed-up
                    from one GPU: every job's rate at w GPUs is at most ``w·f(1)`` (the curves are
                    concave: ``f(w)/w`` never grows), so the cluster never processes more than ``G``
                    one-GPU-seconds of work per second, and SRPT minimises the average response time
                    of a single server (Schrage 1968) — any split of that capacity between jobs does
                    no better. A job's size is its work in one-GPU seconds, ``work / f(1)``.
:func:`alone_bound` Every job alone on the whole cluster from its arrival: ``work / R`` with
                    ``R = max_{w<=G} f(w)``.
:func:`curve_bound` Keeps the concave curve: a time-indexed relaxation of the optimal schedule with
                    arrivals, solved as an LP, then the Lagrangian bound (below) at the LP's prices.

The curve bound, proof sketch. Job ``j``: arrival ``a_j``, work ``W_j`` samples, top rate
``R_j = max_{w<=G} f_j(w)``; in a schedule its rate is ``r_j(t) <= R_j``, 0 before ``a_j``.

1. Mean busy time. ``M_j = (1/W_j)∫ t r_j(t) dt``. Given its completion ``C_j``, ``M_j`` is largest
   when the work is packed at the end at rate ``R_j``, where it is ``C_j - W_j/(2R_j)``; so
   ``C_j >= M_j + W_j/(2R_j)`` and  avg JCT >= (1/n)·[Σ_j M_j + Σ_j (W_j/(2R_j) - a_j)].
2. Rate envelope. ``fhat_j`` (:func:`rate_envelope`) is the least concave non-decreasing function on
   [0, G] with ``fhat_j(0) = 0`` and ``fhat_j >= f_j`` at the integers; ``g_j`` is the lower envelope
   of some of its supporting lines plus the flat line at ``R_j`` (:data:`SUPPORT`), so
   ``g_j >= fhat_j`` on [0, G]. A job may hold GPUs it does not train on (exploration): its rate at
   ``w`` held GPUs is then still at most ``fhat_j(w)`` (non-decreasing), and so is its rate 0 while a
   resize or start overhead pauses it: the bound holds for any overhead, zero being its tightest case.
3. Intervals. Cut time at every arrival and every ``step_s`` (interval ``t``: start ``s_t``, length
   ``Δ_t``). In interval ``t``, let ``ω_jt`` be job ``j``'s average GPU count and ``y_jt`` its work:
   by Jensen, ``y_jt = ∫ f_j(w(t)) dt <= Δ_t·fhat_j(ω_jt) <= Δ_t·g_j(ω_jt)``, and
   ``Σ_j Δ_t·ω_jt <= G·Δ_t``. Write ``g_j`` by its segments (rate increments ``c_k`` costing ``γ_k``
   GPUs per unit rate, ``γ_k`` increasing): filling them in order up to ``y_jt`` uses at most
   ``Δ_t·ω_jt`` GPU-seconds. Within the interval the rate is at most ``R_j``, so
   ``∫_interval t r dt >= s_t·y + y²/(2R_j) >= Σ_k x_k·(s_t + Δ_t·Σ_{i<k} c_i / R_j)`` for the
   in-order fill ``x_k`` (the integrand ``s_t + u/R_j`` at the lowest ``u`` of segment ``k``).
4. The LP. Variables: the share of ``W_j`` in each (interval, segment), at most ``Δ_t·c_k/W_j``;
   each job's shares sum to 1; each interval's GPU-seconds ``Σ x·W_j·γ_k <= G·Δ_t``; cost as in 3.
   Work after job ``j``'s window end ``E_j`` (a relaxation of the horizon) takes one column with no
   GPU use and cost ``E_j`` (all later work costs at least ``E_j``). Every real schedule maps to a
   feasible point of cost ``<= Σ_j M_j``, so the LP minimum is a lower bound on ``Σ_j M_j``
   (windows only change how weak it is; the LP reports the work it put after them).
5. Certificate. The solver's duals, clipped to a dual-feasible point (capacity prices <= 0, each
   job's price <= its ``E_j``), give by weak duality ``Σ μ_j + Σ λ_t·G·Δ_t + Σ min(0, reduced
   cost)·upper bound`` <= the LP minimum: that value, not the solver's primal objective, is the bound.

6. The Lagrangian bound (:func:`lagrangian_bound`) keeps true completion times. Price each
   GPU-second of interval ``t`` at ``p_t >= 0``. For any schedule, Σ_j (C_j - a_j) >=
   Σ_j [C_j - a_j + Σ_t p_t·(GPU-seconds of j in t)] - Σ_t p_t·G·Δ_t, and each job's bracket is
   at least the least, over its completion interval ``τ``, of ``s_τ - a_j`` + ``y_τ/R_j`` (its work
   in ``τ`` takes that long) + the priced GPU-seconds of its work (3's in-order fill; in ``τ`` over
   the whole interval, which needs no more GPU-seconds: ``L·φ(y/L)`` falls with ``L`` for convex ``φ``
   with ``φ(0) = 0``): a fractional knapsack, the cheapest pieces first (:func:`_job_value`); a
   completion after the job's window end ``E_j`` costs at least ``E_j - a_j``. Any prices give a
   bound; :func:`improve_prices` raises it by projected subgradient steps. A job that spreads its
   work thin pays for it in ``C_j`` here, where the mean-busy-time LP only charges ``W_j/(2R_j)``.

Refining a grid (nested: steps dividing 3600 s, the same windows) only raises the LP value; and
spreading each interval's LP work evenly over it is a fluid schedule of cost at most ``Δ/2`` more,
so the limit of the refinement (the fluid relaxation with ``g``) is at most the value at step
``Δ`` plus ``Δ/2`` in the average.

None is achievable in general (the curve bound relaxes integrality within an interval and the
relations between intervals); the gap between a policy and a bound is what the speed-up curve, the
remaining-work prediction and the policy cost together.
"""

from __future__ import annotations

import heapq
import time
from typing import Mapping, NamedTuple, Sequence

import numpy as np

from elastic_ring.errors import ElasticRingError
from elastic_ring.perfmodel.speed import SpeedModel
from elastic_ring.sim.api import JobSpec

WINDOW_UNIT_S = 3600.0  # the curve bound's job windows end on whole hours
# GPU counts w whose piece [w-1, w] of a job's rate envelope the curve bound keeps as a supporting line.
SUPPORT = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 56, 64)


class BoundError(ElasticRingError):
    """The LP of the curve bound was not solved (infeasible, unbounded or the solver failed)."""


def srpt_bound(jobs: Sequence[JobSpec], gpus: int, models: Mapping[str, SpeedModel]) -> np.ndarray:
    """Per-job JCTs (s, in job id order) under preemptive SRPT on one server of ``gpus`` one-GPU
    seconds per second (module docstring)."""
    arrivals = sorted((j.arrival, j.work / models[j.workload].samples_per_s(1), j.id) for j in jobs)
    jct: dict[int, float] = {}
    heap: list[list[float]] = []  # [remaining one-GPU seconds, arrival, id]
    t, i, n = 0.0, 0, len(arrivals)
    while i < n or heap:
        if not heap:
            t = max(t, arrivals[i][0])
        while i < n and arrivals[i][0] <= t:
            a, size, jid = arrivals[i]
            heapq.heappush(heap, [size, a, jid])
            i += 1
        rem, a, jid = heap[0]
        t_done = t + rem / gpus
        t_next = arrivals[i][0] if i < n else float("inf")
        if t_done <= t_next:
            heapq.heappop(heap)
            t = t_done
            jct[int(jid)] = t - a
        else:
            heap[0][0] = rem - (t_next - t) * gpus  # the smallest stays the smallest: heap intact
            t = t_next
    return np.array([jct[j.id] for j in sorted(jobs, key=lambda j: j.id)])


def alone_bound(jobs: Sequence[JobSpec], gpus: int, models: Mapping[str, SpeedModel]) -> np.ndarray:
    """Per-job JCTs (s, in job id order) if every job ran at its top rate on at most ``gpus`` GPUs from
    its arrival."""
    top = {w: max(m.samples_per_s(k) for k in range(1, gpus + 1)) for w, m in models.items()}
    return np.array([j.work / top[j.workload] for j in sorted(jobs, key=lambda j: j.id)])


# --------------------------------------------------------------------------------------------------
# The bound that keeps the concave speed-up curve: a time-indexed relaxation, solved as an LP.


def rate_envelope(model: SpeedModel, gpus: int) -> tuple[np.ndarray, np.ndarray]:
    """Vertices (w, rate) of ``fhat``: the least concave, non-decreasing function on [0, gpus] with
    ``fhat(0) = 0`` and ``fhat(w) >= f(w)`` at every integer ``w`` (upper hull of the points
    (w, f(w)), w = 0..gpus, flat after its highest point)."""
    w = np.arange(gpus + 1, dtype=float)
    f = np.array([0.0] + [model.samples_per_s(k) for k in range(1, gpus + 1)])
    top = int(np.argmax(f))
    hull: list[int] = []
    for i in range(top + 1):  # monotone chain, upper hull of the points up to the highest one
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            if (f[b] - f[a]) * (i - a) <= (f[i] - f[a]) * (b - a):
                hull.pop()
            else:
                break
        hull.append(i)
    return w[hull], f[hull]


def _segments(model: SpeedModel, gpus: int, support: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Rate increments ``c_k`` (samples/s) and GPUs per unit of rate ``g_k`` of the segments of ``g``,
    the lower envelope of some supporting lines of ``fhat`` (those of its pieces over the intervals
    [w-1, w] for ``w`` in ``support``, the first piece and the flat line at the top rate): ``g >= fhat``
    on [0, gpus] (an outer approximation: the relaxation stays a relaxation)."""
    vw, vf = rate_envelope(model, gpus)
    slopes = np.diff(vf) / np.diff(vw)
    piece = {0, len(slopes) - 1} | {int(np.searchsorted(vw, w) - 1) for w in support if 1 <= w <= vw[-1]}
    lines = [(slopes[k], vf[k] - slopes[k] * vw[k]) for k in sorted(piece) if k >= 0]
    lines.append((0.0, float(vf[-1])))
    xs, ys = [0.0], [0.0]
    for (s1, b1), (s2, b2) in zip(lines, lines[1:]):
        if s1 - s2 <= 0:
            continue
        x = (b2 - b1) / (s1 - s2)
        if x > xs[-1]:
            xs.append(x)
            ys.append(s2 * x + b2)  # the last one is exactly the top rate (s2 = 0)
    c = np.diff(ys) * (1 + 1e-9)  # rounding of the intersections: err on the side of a larger g
    keep = c > 0
    return c[keep], (np.diff(xs) / np.where(keep, c, 1.0))[keep]


class CurveBound(NamedTuple):
    """:func:`curve_bound`'s answer. ``avg_jct_s``: the bound, the larger of ``lp_avg_jct_s`` (the
    LP's certified value: from a dual-feasible point, valid whatever the solver's tolerance) and
    ``lagrangian_avg_jct_s`` (the Lagrangian bound at the LP's prices: valid for any prices);
    ``primal_avg_jct_s``: the LP's primal objective (equal to its certified value up to the solver's
    tolerance); ``late_share``: the share of the work the LP put after the job windows (0: the
    windows did not bind)."""

    avg_jct_s: float
    lp_avg_jct_s: float
    lagrangian_avg_jct_s: float
    primal_avg_jct_s: float
    status: str
    intervals: int
    columns: int
    late_share: float
    solve_s: float


def _grid(jobs: Sequence[JobSpec], ends: np.ndarray, step_s: float) -> np.ndarray:
    """Interval starts: every arrival, every window end, and every multiple of ``step_s`` between."""
    a = np.array([j.arrival for j in jobs])
    ticks = np.arange(np.floor(a.min() / step_s), np.ceil(ends.max() / step_s) + 1) * step_s
    return np.unique(np.concatenate([a, ends, ticks[(ticks > a.min()) & (ticks < ends.max())]]))


def _columns(jobs: Sequence[JobSpec], gpus: int, models: Mapping[str, SpeedModel], starts: np.ndarray,
             ends: np.ndarray, support: Sequence[int]) -> dict[str, np.ndarray]:
    """The LP's columns: for job ``j``, interval ``t`` in its window and segment ``k`` of its ``g``, the
    share of its work done there (cost: the interval's start plus the part of the interval the
    segments below ``k`` fill at the top rate; bound: ``Δ_t·c_k / W_j``; GPU-seconds per share:
    ``W_j·g_k``); then one column per job for the work after its window (cost: the window's end)."""
    lens = np.diff(starts)
    segs = {w: _segments(m, gpus, support) for w, m in models.items()}
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("cost", "ub", "row_j", "row_t", "gpu_s")}
    for jn, j in enumerate(jobs):
        c, g = segs[j.workload]
        below = np.concatenate([[0.0], np.cumsum(c)[:-1]]) / c.sum()
        ts = np.arange(np.searchsorted(starts, j.arrival), np.searchsorted(starts, ends[jn]))
        shape = (len(ts), len(c))
        parts["cost"].append((starts[ts, None] + lens[ts, None] * below[None, :]).ravel())
        parts["ub"].append((lens[ts, None] * c[None, :] / j.work).ravel())
        parts["row_j"].append(np.full(shape[0] * shape[1], jn))
        parts["row_t"].append(np.broadcast_to(ts[:, None], shape).ravel())
        parts["gpu_s"].append(np.broadcast_to(j.work * g[None, :], shape).ravel())
    out = {k: np.concatenate(v) for k, v in parts.items()}
    out["late_cost"] = np.asarray(ends, dtype=float)
    return out


def _solve(cols: dict[str, np.ndarray], starts: np.ndarray,
           gpus: int) -> tuple[float, float, np.ndarray, str, np.ndarray]:
    """Solve the LP (HiGHS); return its certified lower bound (the dual value of a dual-feasible point
    made from the solver's duals), its primal objective, the late shares, the status and the prices
    of a GPU-second in each interval (the capacity duals, >= 0)."""
    import scipy.sparse as sp
    from scipy.optimize import linprog

    n_jobs, n_cols, n_t = len(cols["late_cost"]), len(cols["cost"]), len(starts) - 1
    cap = gpus * np.diff(starts)
    a_ub = sp.csr_matrix((cols["gpu_s"], (cols["row_t"], np.arange(n_cols))), shape=(n_t, n_cols + n_jobs))
    a_eq = sp.csr_matrix((np.ones(n_cols + n_jobs), (np.concatenate([cols["row_j"], np.arange(n_jobs)]),
                                                      np.arange(n_cols + n_jobs))), shape=(n_jobs, n_cols + n_jobs))
    ub = np.concatenate([cols["ub"], np.full(n_jobs, np.inf)])
    res = linprog(np.concatenate([cols["cost"], cols["late_cost"]]), A_ub=a_ub, b_ub=cap, A_eq=a_eq,
                  b_eq=np.ones(n_jobs), bounds=np.column_stack([np.zeros_like(ub), ub]), method="highs")
    if res.status != 0:
        raise BoundError(f"the LP of the curve bound was not solved: {res.message}")
    lam = np.minimum(res.ineqlin.marginals, 0.0)
    mu = np.minimum(res.eqlin.marginals, cols["late_cost"])  # late columns: reduced cost >= 0
    red = cols["cost"] - mu[cols["row_j"]] - lam[cols["row_t"]] * cols["gpu_s"]
    dual = float(mu.sum() + lam @ cap + np.minimum(red, 0.0) @ cols["ub"])
    return dual, float(res.fun), res.x[n_cols:], res.message, -lam


def _job_value(starts: np.ndarray, lens: np.ndarray, price: np.ndarray, seg: tuple[np.ndarray, np.ndarray],
               job: JobSpec, end: float) -> tuple[float, np.ndarray]:
    """A lower bound on ``C_j - a_j`` + the price of its GPU-seconds over every schedule of one job
    (module docstring, the Lagrangian bound): the least over its completion interval ``τ`` of
    ``s_τ - a_j`` + the cheapest ``W_j`` from the pieces (interval < ``τ``, segment) at ``price·γ_k``
    per sample and (``τ``, segment) at ``price·γ_k + 1/R_j``; ``end - a_j`` for completions after
    ``end``. Also the GPU-seconds per interval of the least (zero for the latter)."""
    c, g = seg
    n_t, k = len(starts), len(c)
    t_of = np.tile(np.repeat(np.arange(n_t), k), 2)
    cap = np.tile((lens[:, None] * c[None, :]).ravel(), 2)
    gam = np.tile(g, 2 * n_t)
    base = (price[:, None] * g[None, :]).ravel()
    cost = np.concatenate([base, base + 1.0 / c.sum()])
    last = np.repeat([False, True], n_t * k)
    o = np.argsort(cost, kind="stable")
    t_of, cap, cost, last, gam = t_of[o], cap[o], cost[o], last[o], gam[o]
    best, arg = end - job.arrival, None
    first = int(np.searchsorted(np.cumsum(lens * c.sum()), job.work * (1 - 1e-9)))  # earlier: too little time
    for lo in range(first, n_t, 32):  # 32 completion intervals at a time: (32, 2·n_t·k) arrays
        if starts[lo] - job.arrival >= best:
            break  # the rest complete later than the best already costs
        tau = np.arange(lo, min(n_t, lo + 32))[:, None]
        use = cap * np.where(last, t_of == tau, t_of < tau)
        cum = np.cumsum(use, axis=1)
        ok = cum[:, -1] >= job.work
        if not ok.any():
            continue
        idx = np.argmax(cum >= job.work, axis=1)
        rows = np.arange(len(idx))
        spent = np.cumsum(use * cost, axis=1)
        below_cap = np.where(idx > 0, cum[rows, idx - 1], 0.0)
        below_cost = np.where(idx > 0, spent[rows, idx - 1], 0.0)
        val = np.where(ok, starts[tau[:, 0]] - job.arrival + below_cost + (job.work - below_cap) * cost[idx], np.inf)
        r = int(np.argmin(val))
        if val[r] < best:
            amount = use[r, : idx[r] + 1].copy()
            amount[-1] = job.work - below_cap[r]
            best, arg = float(val[r]), (t_of[: idx[r] + 1], amount * gam[: idx[r] + 1])
    usage = np.zeros(n_t) if arg is None else np.bincount(arg[0], weights=arg[1], minlength=n_t)
    return best, usage


def lagrangian_bound(jobs: Sequence[JobSpec], gpus: int, models: Mapping[str, SpeedModel], starts: np.ndarray,
                     ends: np.ndarray, price: np.ndarray,
                     support: Sequence[int] = SUPPORT) -> tuple[float, np.ndarray]:
    """The Lagrangian bound on the average JCT (module docstring) at ``price[t] >= 0`` per GPU-second of
    interval ``t`` (intervals from ``starts``; job ``j`` (in id order) considered up to ``ends[j]``),
    and its subgradient (GPU-seconds used minus the capacity, per interval)."""
    if np.any(price < 0) or len(price) != len(starts) - 1:
        raise BoundError("need one price >= 0 per interval")
    jobs = sorted(jobs, key=lambda j: j.id)
    lens = np.diff(starts)
    segs = {w: _segments(m, gpus, support) for w, m in models.items()}
    total, used = 0.0, np.zeros(len(lens))
    for jn, j in enumerate(jobs):
        lo, hi = np.searchsorted(starts, j.arrival), np.searchsorted(starts, ends[jn])
        v, u = _job_value(starts[lo:hi], lens[lo:hi], price[lo:hi], segs[j.workload], j, float(ends[jn]))
        total += v
        used[lo:hi] += u
    return (total - float(price @ (gpus * lens))) / len(jobs), used - gpus * lens


def improve_prices(jobs: Sequence[JobSpec], gpus: int, models: Mapping[str, SpeedModel], starts: np.ndarray,
                   ends: np.ndarray, price: np.ndarray, target_avg_s: float, steps: int,
                   support: Sequence[int] = SUPPORT) -> tuple[float, list[float]]:
    """Projected subgradient ascent on the Lagrangian bound from ``price`` (Polyak steps toward
    ``target_avg_s``, an average JCT some schedule reaches, scaled by 1/4 and halved after two steps
    without gain).
    Returns the best bound met and the bound at every step (each one valid on its own)."""
    n, theta, trace = len(jobs), 0.25, []
    best, since = -np.inf, 0
    for _ in range(steps + 1):
        val, sub = lagrangian_bound(jobs, gpus, models, starts, ends, price, support)
        trace.append(val)
        if val > best:
            best, since = val, 0
        else:
            since += 1
            if since >= 2:
                theta, since = theta / 2, 0
        norm = float(sub @ sub)
        if norm == 0 or target_avg_s <= val:
            break
        price = np.maximum(0.0, price + theta * (target_avg_s - val) * n / norm * sub)
    return best, trace


def curve_bound(jobs: Sequence[JobSpec], gpus: int, models: Mapping[str, SpeedModel], step_s: float = 225.0,
                support: Sequence[int] = SUPPORT, window_s: float = 12 * 3600.0, rounds: int = 4,
                target_avg_s: float | None = None, price_steps: int = 0) -> CurveBound:
    """A lower bound on the average JCT of any schedule of ``jobs`` on ``gpus`` GPUs that keeps each
    job's concave speed-up curve (module docstring): the LP, then the Lagrangian bound at its prices.
    Intervals of at most ``step_s``, every arrival a breakpoint; job ``j``'s window ends at its
    arrival plus twice its run time at 8 GPUs plus ``window_s``, rounded up to a whole hour (so grids
    of ``step_s`` dividing 3600 s are nested), its length doubled (up to ``rounds`` solves) for the
    jobs the LP put work after it. With ``target_avg_s`` (an average JCT some schedule reaches) and
    ``price_steps`` > 0, the Lagrangian bound is then raised by that many subgradient steps
    (:func:`improve_prices`)."""
    if not (step_s > 0 and window_s >= 0 and rounds >= 1 and gpus >= 1 and jobs):
        raise BoundError("need jobs, gpus >= 1, step_s > 0, window_s >= 0 and rounds >= 1")
    jobs = sorted(jobs, key=lambda j: j.id)
    top = {w: float(rate_envelope(m, gpus)[1][-1]) for w, m in models.items()}
    a = np.array([j.arrival for j in jobs])
    tail = sum(j.work / (2 * top[j.workload]) for j in jobs) - a.sum()
    span = np.array([2 * j.work / models[j.workload].samples_per_s(8) for j in jobs]) + window_s
    t0, best, n = time.perf_counter(), None, len(jobs)
    for _ in range(rounds):
        ends = np.ceil((a + span) / WINDOW_UNIT_S) * WINDOW_UNIT_S
        starts = _grid(jobs, ends, step_s)
        cols = _columns(jobs, gpus, models, starts, ends, support)
        dual, primal, late, status, price = _solve(cols, starts, gpus)
        if best is None or dual > best[0]:
            best = (dual, primal, str(status), len(starts) - 1, len(cols["cost"]), float(late.mean()),
                    starts, ends, price)
        if not (late > 1e-9).any():
            break
        span = np.where(late > 1e-9, 2 * span, span)
    lp = float((best[0] + tail) / n)
    if target_avg_s is not None and price_steps > 0:
        lag = improve_prices(jobs, gpus, models, best[6], best[7], best[8], target_avg_s, price_steps, support)[0]
    else:
        lag = lagrangian_bound(jobs, gpus, models, best[6], best[7], best[8], support)[0]
    return CurveBound(max(lp, lag), lp, lag, float((best[1] + tail) / n), best[2], int(best[3]), int(best[4]),
                      best[5], time.perf_counter() - t0)
