"""Eq. 1: the training-loss curve of a job (the Optimus form), used to predict remaining steps.

    l(k) = 1 / (b0·k + b1) + b2,     b0, b1, b2 >= 0

:func:`fit_convergence` fits it with every coefficient non-negative: for each candidate floor b2 on
a grid over [0, min(loss)), ``1/(l - b2) = b0·k + b1`` is linear, so NNLS gives (b0, b1); the
candidate with the smallest squared error in loss space is then refined by bounded least squares
(scipy ``least_squares``, bounds b >= 0, b2 < min(loss)), and the better of the two is kept.
``refine=False`` skips the refinement and solves every grid candidate at once in numpy (the
simulator refits each job's curve many times per run, and the bounded refinement is the costly part).

:func:`predict_remaining` is the scheduler's use of Eq. 1, the same for the live scheduler and the
simulator: fit the loss curve seen so far, and predict the work still needed to reach the job's
target loss (see its docstring for the rules when the fit cannot answer).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from elastic_ring.events.api import Throughput, read_events
from elastic_ring.perfmodel.speed import FitError


class ConvergenceModel(NamedTuple):
    b0: float
    b1: float
    b2: float

    def predict(self, k: Any) -> np.ndarray | float:
        """Loss after ``k`` steps (vectorised); inf where b0·k + b1 = 0."""
        k = np.asarray(k, dtype=float)
        with np.errstate(divide="ignore"):
            out = 1.0 / (self.b0 * k + self.b1) + self.b2
        return out if out.ndim else float(out)

    def steps_to_reach(self, target_loss: float) -> float:
        """Smallest k >= 0 with l(k) <= target; inf when the target is at or below the floor b2."""
        if target_loss <= self.b2:
            return float("inf")
        need = 1.0 / (target_loss - self.b2)  # b0·k + b1 must reach this
        if self.b1 >= need:
            return 0.0
        if self.b0 <= 0:
            return float("inf")
        return float((need - self.b1) / self.b0)

    def to_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in self._asdict().items()}


def _nnls_at(k: np.ndarray, l: np.ndarray, b2: float) -> tuple[ConvergenceModel, float]:
    from scipy.optimize import nnls

    z = 1.0 / (l - b2)
    A = np.column_stack([k, np.ones_like(k)])
    s = np.linalg.norm(A, axis=0)
    s[s == 0] = 1.0
    c, _ = nnls(A / s, z)
    c = np.maximum(c / s, 0.0)
    m = ConvergenceModel(float(c[0]), float(c[1]), float(b2))
    r = np.asarray(m.predict(k)) - l
    sse = float(np.sum(r ** 2)) if np.all(np.isfinite(r)) else float("inf")
    return m, sse


def _grid_fit(k: np.ndarray, l: np.ndarray, grid: int) -> ConvergenceModel:
    """Every floor candidate at once: least squares of ``1/(l - b2) = b0·k + b1`` per candidate,
    clamped to b0, b1 >= 0 (the one-parameter solution when the other would be negative), then the
    candidate with the smallest squared error in loss space."""
    b2 = np.linspace(0.0, float(l.min()), grid, endpoint=False)[:, None]  # (G, 1)
    z = 1.0 / (l[None, :] - b2)  # (G, N)
    n = k.size
    sk, skk = k.sum(), (k * k).sum()
    sz, skz = z.sum(axis=1), (z * k[None, :]).sum(axis=1)
    det = n * skk - sk * sk
    if det > 0:
        b0 = (n * skz - sk * sz) / det
        b1 = (sz - b0 * sk) / n
    else:
        b0, b1 = np.zeros_like(sz), sz / n
    neg0, neg1 = b0 < 0, b1 < 0
    b0 = np.where(neg0, 0.0, b0)
    b1 = np.where(neg0, sz / n, b1)
    b0 = np.where(neg1 & ~neg0, skz / skk if skk > 0 else 0.0, b0)
    b1 = np.where(neg1 & ~neg0, 0.0, b1)
    with np.errstate(divide="ignore", invalid="ignore"):
        pred = 1.0 / (b0[:, None] * k[None, :] + b1[:, None]) + b2
        sse = np.sum((pred - l[None, :]) ** 2, axis=1)
    sse = np.where(np.isfinite(sse), sse, np.inf)
    i = int(np.argmin(sse))
    return ConvergenceModel(float(b0[i]), float(b1[i]), float(b2[i, 0]))


def fit_convergence(steps: Any, losses: Any, grid: int = 200, refine: bool = True) -> ConvergenceModel:
    """Fit Eq. 1 to (step, loss) points with b0, b1, b2 >= 0.

    ``refine=False``: the vectorised grid search only (fast; see the module docstring).

    Raises:
        FitError: fewer than 3 points (3 parameters), or non-finite / non-positive losses.
    """
    k = np.asarray(steps, dtype=float).ravel()
    l = np.asarray(losses, dtype=float).ravel()
    if k.shape != l.shape:
        raise FitError(f"steps and losses differ in length ({k.size} vs {l.size})")
    ok = np.isfinite(k) & np.isfinite(l)
    k, l = k[ok], l[ok]
    if k.size < 3:
        raise FitError(f"convergence fit (Eq. 1) has 3 parameters and needs >= 3 finite points, got {k.size}")
    if np.any(l <= 0) or np.any(k < 0):
        raise FitError("convergence fit needs losses > 0 and steps >= 0")
    if not refine:
        return _grid_fit(k, l, grid)
    from scipy.optimize import least_squares

    lmin = float(l.min())
    best, best_sse = None, float("inf")
    for b2 in np.linspace(0.0, lmin, grid, endpoint=False):
        m, sse = _nnls_at(k, l, float(b2))
        if sse < best_sse:
            best, best_sse = m, sse
    assert best is not None
    ks = max(float(k.max()), 1.0)

    def resid(p: np.ndarray) -> np.ndarray:  # parameters scaled: b0·ks, b1, b2
        return 1.0 / (p[0] * k / ks + p[1]) + p[2] - l

    x0 = np.array([best.b0 * ks, max(best.b1, 1e-12), min(best.b2, lmin * (1 - 1e-9))])
    try:
        sol = least_squares(resid, x0, bounds=([0.0, 1e-12, 0.0], [np.inf, np.inf, lmin * (1 - 1e-9)]),
                            x_scale="jac", xtol=1e-14, ftol=1e-14, gtol=1e-14, max_nfev=2000)
        cand = ConvergenceModel(float(max(sol.x[0], 0) / ks), float(max(sol.x[1], 0)), float(max(sol.x[2], 0)))
        r = np.asarray(cand.predict(k)) - l
        sse = float(np.sum(r ** 2))
        if np.isfinite(sse) and sse < best_sse:
            best = cand
    except (ValueError, FloatingPointError):
        pass
    return best


def predict_remaining(done: float, points: Any, losses: Any, target_loss: float, prior: float,
                      min_points: int = 5, refine: bool = False) -> float:
    """Eq. 1's prediction of the work a job still needs to reach ``target_loss``.

    ``points`` are the amounts of work (steps or samples, the unit of the answer) at which the
    losses were observed, ``done`` the work done now. Rules when the curve cannot answer (stated,
    and the same live and in the simulator):

    * fewer than ``min_points`` points, or a fit that fails: ``prior`` (what the scheduler expects of
      a job it knows nothing about, e.g. the mean job size);
    * the target at or below the fitted floor (never reached): ``max(prior, done)``, i.e. assume
      the job needs at least as much again;
    * the fit says the target is already passed while the job still runs: ``0.05·done`` (a little).
    """
    try:
        if len(points) < min_points:
            return float(prior)
        m = fit_convergence(points, losses, grid=48, refine=refine)
    except FitError:
        return float(prior)
    total = m.steps_to_reach(target_loss)
    if not math.isfinite(total):
        return float(max(prior, done))
    return float(max(total - done, 0.05 * done))


def losses_from_events(events_jsonl_path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """(steps, losses) of the ``throughput`` events of a run's ``events.jsonl``, in file order.

    A truncated or unreadable line (a crash mid-write) is skipped.

    Raises:
        FitError: the file does not exist.
    """
    p = Path(events_jsonl_path)
    if not p.exists():
        raise FitError(f"events file not found: {p}")
    steps, losses = [], []
    for e in read_events(p, Throughput):
        try:
            step, loss = float(e.step), float(e.loss)
        except (TypeError, ValueError):  # not written (an older line) or not a number
            continue
        steps.append(step)
        losses.append(loss)
    return np.asarray(steps, dtype=float), np.asarray(losses, dtype=float)
