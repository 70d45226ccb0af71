"""Eq. 1: the training-loss curve of a job (the Optimus form), used to predict remaining steps.

    l(k) = 1 / (b0·k + b1) + b2,     b0, b1, b2 >= 0

:func:`fit_convergence` fits it with every coefficient non-negative: for each candidate floor b2 on
a grid over [0, min(loss)), ``1/(l - b2) = b0·k + b1`` is linear, so NNLS gives (b0, b1); the
candidate with the smallest squared error in loss space is then refined by bounded least squares
(scipy ``least_squares``, bounds b >= 0, b2 < min(loss)), and the better of the two is kept.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

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


def fit_convergence(steps: Any, losses: Any, grid: int = 200) -> ConvergenceModel:
    """Fit Eq. 1 to (step, loss) points with b0, b1, b2 >= 0.

    Raises:
        FitError: fewer than 3 points (3 parameters), or non-finite / non-positive losses.
    """
    from scipy.optimize import least_squares

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
    with p.open() as fh:
        for line in fh:
            try:
                d = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(d, dict) and d.get("kind") == "throughput" and "step" in d and "loss" in d:
                try:
                    steps.append(float(d["step"]))
                    losses.append(float(d["loss"]))
                except (TypeError, ValueError):
                    continue
    return np.asarray(steps, dtype=float), np.asarray(losses, dtype=float)
