"""Eq. 5: the speed of a ring-allreduce job as a function of its number of workers.

The paper writes it with m its minibatch:

    f(w) = 1 / (t0·m/w + t1·(w-1) + t2·(w-1)·n/w + t3)        [steps/s], all t >= 0

1/f(w) is the time of one step: compute (t0 per sample of the minibatch a worker processes),
allreduce latency (t1 per ring hop, 2(w-1) hops folded into t1), allreduce bandwidth (t2 per
parameter, each worker sends and receives 2(w-1)/w of the n parameters) and a constant t3.

What the code computes. elastic-ring trains with a FIXED PER-WORKER batch b (128 in the paper), so
the global minibatch at w workers is b·w and the samples a worker processes per step are b at
every w. The code therefore uses the per-worker batch b itself, never m/w:

* :func:`fit_speed` takes ``batch_per_worker`` = b and fits by NNLS on the features
  ``[b, w-1, (w-1)·n/w, 1]``.
* :class:`SpeedModel` stores ``m = b`` and evaluates ``1/f(w) = t0·m + t1·(w-1) + t2·n·(w-1)/w + t3``
  (:meth:`SpeedModel.step_time`, the one place this formula is written).
* The first feature, b, is the same for every measurement of a profile, so it is collinear with
  the constant feature of t3: the fit's *predictions* are unique, but only ``t0·b + t3`` is
  identified, not t0 and t3 apart (NNLS returns one valid non-negative split). Do not read t0 and
  t3 separately.

Speed in samples/s (what the scheduler and the simulator count, with work in samples) is
``m · w · f(w)``: :meth:`SpeedModel.samples_per_s`; both take a Python number (and return a float,
fast: the simulator calls them per GPU count) or a numpy array (vectorised).

A fit needs at least as many distinct worker counts as parameters (4); fewer is refused with
:class:`FitError` (a :class:`~elastic_ring.errors.UserError`: one line, exit status 2).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from elastic_ring.errors import UserError

N_PARAMS = 4  # t0, t1, t2, t3


def _is_number(w: Any) -> bool:
    return isinstance(w, (int, float)) and not isinstance(w, bool) and w > 0


class FitError(UserError):
    """A model fit that cannot be made from the data given (too few points, bad values)."""


class SpeedModel(NamedTuple):
    """Eq. 5 parameters. ``t*`` in seconds (all >= 0), ``m`` the per-worker batch b the fit used
    (see the module docstring), ``n`` the model size in parameters."""

    t0: float
    t1: float
    t2: float
    t3: float
    m: float
    n: float

    def _eq5(self, w: Any) -> Any:
        # Eq. 5's step time; w a Python number or a float array (the same IEEE operations either way).
        return self.t0 * self.m + self.t1 * (w - 1) + self.t2 * self.n * (w - 1) / w + self.t3

    def step_time(self, w: Any) -> np.ndarray | float:
        """Seconds per step at ``w`` workers, ``1/f(w)``: a float for a number, else an array."""
        if _is_number(w):
            return float(self._eq5(w))
        out = self._eq5(np.asarray(w, dtype=float))
        return out if out.ndim else float(out)

    def predict(self, w: Any) -> np.ndarray | float:
        """Steps/s at ``w`` workers, ``f(w)``; inf where the step time is 0."""
        if _is_number(w):
            st = self._eq5(w)
            return 1.0 / st if st != 0 else math.inf
        st = np.asarray(self.step_time(w), dtype=float)
        with np.errstate(divide="ignore"):
            out = 1.0 / st
        return out if out.ndim else float(out)

    def samples_per_s(self, w: Any) -> np.ndarray | float:
        """Samples/s at ``w`` workers: ``m · w · f(w)`` (fixed per-worker batch m); inf where the
        step time is 0."""
        if _is_number(w):
            st = self._eq5(w)
            return self.m * w / st if st != 0 else math.inf
        w = np.asarray(w, dtype=float)
        st = np.asarray(self.step_time(w), dtype=float)
        with np.errstate(divide="ignore"):
            out = self.m * w / st
        return out if out.ndim else float(out)

    def to_dict(self) -> dict[str, float]:
        return {k: float(v) for k, v in self._asdict().items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SpeedModel":
        try:
            vals = {k: float(d[k]) for k in cls._fields}
        except (KeyError, TypeError, ValueError) as e:
            raise FitError(f"speed model needs numeric fields {', '.join(cls._fields)}: {e}") from None
        if any(not np.isfinite(v) or v < 0 for v in vals.values()):
            raise FitError(f"speed model fields must be finite and >= 0, got {vals}")
        return cls(**vals)


class SpeedFit(NamedTuple):
    """A fitted model and how well it fits: residuals are measured - predicted, in steps/s."""

    model: SpeedModel
    residuals: np.ndarray
    rel_residuals: np.ndarray
    rmse: float


def _features(w: np.ndarray, b: float, n: float) -> np.ndarray:
    X = np.empty((w.size, N_PARAMS))
    X[:, 0] = b
    X[:, 1] = w - 1.0
    X[:, 2] = (w - 1.0) * n / w
    X[:, 3] = 1.0
    return X


def _scaled_features(w: np.ndarray, f: np.ndarray, b: float, n: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The NNLS problem of Eq. 5: the features scaled by their column norms (a norm of 0 taken as
    1), the targets 1/f, and the norms."""
    X = _features(w, b, n)
    scale = np.sqrt(np.add.reduce(X * X, axis=0))  # np.linalg.norm(X, axis=0): its operations
    scale[scale == 0] = 1.0
    return X / scale, 1.0 / f, scale


def nnls_model(w: np.ndarray, f: np.ndarray, batch_per_worker: float, n_params: float,
               scaled=_scaled_features) -> SpeedModel:
    """Eq. 5 by NNLS on 1/f = [b, w-1, (w-1)·n/w, 1] · t, columns scaled for conditioning: the
    model alone, on values :func:`fit_speed` has checked (float arrays, w >= 1, f > 0, 4 or more
    distinct w; the simulator's exploration fit calls it directly, without the residuals, with a
    compiled ``scaled``: :func:`_scaled_features`'s operations)."""
    from scipy.optimize import nnls

    Xs, y, scale = scaled(w, f, float(batch_per_worker), float(n_params))
    coef, _ = nnls(Xs, y)
    t0, t1, t2, t3 = np.maximum(coef / scale, 0.0).tolist()
    return SpeedModel(t0, t1, t2, t3, float(batch_per_worker), float(n_params))


def fit_speed(workers: Any, steps_per_s: Any, batch_per_worker: float, n_params: float) -> SpeedFit:
    """Fit Eq. 5 by NNLS on 1/f = [b, w-1, (w-1)·n/w, 1] · t (columns scaled for conditioning).

    Args:
        workers: worker count of each measurement (repeats allowed).
        steps_per_s: measured speed of each measurement.
        batch_per_worker: the per-worker batch b (so m_w / w = b).
        n_params: model size n.

    Raises:
        FitError: fewer than 4 distinct worker counts, or non-positive / non-finite values.
    """
    w = np.asarray(workers, dtype=float).ravel()
    f = np.asarray(steps_per_s, dtype=float).ravel()
    if w.shape != f.shape:
        raise FitError(f"workers and steps_per_s differ in length ({w.size} vs {f.size})")
    if not (np.all(np.isfinite(w)) and np.all(np.isfinite(f))) or np.any(w < 1) or np.any(f <= 0):
        raise FitError("speed fit needs worker counts >= 1 and finite speeds > 0")
    if batch_per_worker <= 0 or n_params <= 0:
        raise FitError(f"batch_per_worker and n_params must be > 0, got {batch_per_worker}, {n_params}")
    distinct = np.unique(w).size
    if distinct < N_PARAMS:
        raise FitError(f"speed fit (Eq. 5) has {N_PARAMS} parameters and needs measurements at >= "
                       f"{N_PARAMS} distinct worker counts, got {distinct} ({sorted(set(w.astype(int).tolist()))})")
    model = nnls_model(w, f, batch_per_worker, n_params)
    pred = np.asarray(model.predict(w), dtype=float)
    res = f - pred
    return SpeedFit(model, res, res / f, float(np.sqrt(np.mean(res ** 2))))


def load_profile(path: str | Path) -> tuple[SpeedModel, dict[str, Any]]:
    """Read a ``profile.json`` (as ``elastic-ring profile`` writes it) -> (speed model, the dict).

    Uses the file's ``speed_model`` when present; otherwise fits Eq. 5 to its ``points``. A profile
    written before rates were work over time (points whose ``rate`` is not ``work_over_time`` but
    that keep their steady windows, each with steps and seconds) is read as work over time: each
    point's steps/s becomes its windows' steps / their seconds (the median of window rates it holds
    overstates a job that shares its cores) and Eq. 5 is refitted to those; the returned
    dict carries the corrected points.

    Raises:
        FitError: missing file, bad JSON, or missing / bad fields.
    """
    p = Path(path)
    try:
        d = json.loads(p.read_text())
    except FileNotFoundError:
        raise FitError(f"profile not found: {p}") from None
    except (OSError, json.JSONDecodeError) as e:
        raise FitError(f"cannot read profile {p}: {e}") from None
    if not isinstance(d, dict):
        raise FitError(f"profile {p} is not a JSON object")
    if _to_work_over_time(d):
        d["speed_model"] = None  # fitted to medians of window rates: refit below
    if isinstance(d.get("speed_model"), dict):
        return SpeedModel.from_dict(d["speed_model"]), d
    try:
        pts = d["points"]
        w = [float(x["workers"]) for x in pts]
        f = [float(x["steps_per_s"]) for x in pts]
        b = float(d["batch_per_worker"])
        n = float(d["n_params"])
    except (KeyError, TypeError, ValueError) as e:
        raise FitError(f"profile {p} needs points[].workers, points[].steps_per_s, batch_per_worker, "
                       f"n_params: missing or bad {e}") from None
    return fit_speed(w, f, b, n).model, d


def _to_work_over_time(d: dict[str, Any]) -> bool:
    """Rewrite, in place, the points of an older profile as work over time (see :func:`load_profile`).
    Returns True when any point changed."""
    changed = False
    pts = d.get("points")
    for pt in pts if isinstance(pts, list) else ():
        if not isinstance(pt, dict) or pt.get("rate") == "work_over_time":
            continue
        try:
            wins = [(float(x["steps"]), float(x["seconds"]), float(x.get("images_per_s", 0.0)))
                    for x in pt.get("windows") or []]
        except (KeyError, TypeError, ValueError):
            continue
        secs = sum(t for _, t, _ in wins)
        if not wins or not secs > 0:
            continue
        pt["steps_per_s_median"] = pt.get("steps_per_s")
        pt["steps_per_s"] = sum(n for n, _, _ in wins) / secs
        pt["images_per_s"] = sum(i * t for _, t, i in wins) / secs
        pt["rate"] = "work_over_time"
        changed = True
    return changed


# Eq. 5's terms that a fit from few worker counts keeps, in the order they are admitted: the
# constant (t0·b + t3, one parameter: the two are never identified apart), the ring bandwidth term
# (t2, (w-1)·n/w) and the ring latency term (t1, w-1).
_FEW_TERMS = ("t3", "t2", "t1")


def fit_speed_few(workers: Any, steps_per_s: Any, batch_per_worker: float, n_params: float) -> tuple[SpeedFit, str]:
    """Eq. 5 from as many distinct worker counts as there are (an online fit on a small node).

    With >= 4 distinct counts this is :func:`fit_speed` (method ``"eq5"``). With fewer it fits, by
    NNLS, only as many of Eq. 5's terms as there are counts, the others held at 0 (method
    ``"eq5-k-terms"``): 1 count -> the constant alone (no speed-up assumed beyond what was
    measured), 2 -> constant + bandwidth term, 3 -> constant + bandwidth + latency. Since ``t0·b``
    and ``t3`` are one parameter in every prediction, 3 counts already determine Eq. 5's
    predictions fully; the 4-count rule of :func:`fit_speed` is about t0 and t3 apart.

    Returns:
        (the fit, the method used).

    Raises:
        FitError: no measurement, or non-positive / non-finite values.
    """
    from scipy.optimize import nnls

    w = np.asarray(workers, dtype=float).ravel()
    f = np.asarray(steps_per_s, dtype=float).ravel()
    if w.size == 0 or w.shape != f.shape:
        raise FitError(f"speed fit needs one speed per worker count, got {w.size} counts and {f.size} speeds")
    if not (np.all(np.isfinite(w)) and np.all(np.isfinite(f))) or np.any(w < 1) or np.any(f <= 0):
        raise FitError("speed fit needs worker counts >= 1 and finite speeds > 0")
    if batch_per_worker <= 0 or n_params <= 0:
        raise FitError(f"batch_per_worker and n_params must be > 0, got {batch_per_worker}, {n_params}")
    k = np.unique(w).size
    if k >= N_PARAMS:
        return fit_speed(w, f, batch_per_worker, n_params), "eq5"
    b, n = float(batch_per_worker), float(n_params)
    cols = {"t3": np.ones_like(w), "t2": (w - 1.0) * n / w, "t1": w - 1.0}
    terms = _FEW_TERMS[:k]
    X = np.column_stack([cols[t] for t in terms])
    scale = np.linalg.norm(X, axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(X / scale, 1.0 / f)
    t = dict.fromkeys(("t0", "t1", "t2", "t3"), 0.0)
    t.update({name: float(max(c, 0.0)) for name, c in zip(terms, coef / scale)})
    model = SpeedModel(t["t0"], t["t1"], t["t2"], t["t3"], b, n)
    pred = np.asarray(model.predict(w), dtype=float)
    res = f - pred
    return SpeedFit(model, res, res / f, float(np.sqrt(np.mean(res ** 2)))), f"eq5-{k}-terms"
