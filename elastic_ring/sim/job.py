"""One job's runtime state in the simulator (:class:`SimJob`) and the exploration's per-job steps
(the Eq. 5 fit of an explored job, the monotone check of its gain table), in scalar steps with the
floating-point operations of the library functions they stand for."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from elastic_ring.perfmodel.speed import N_PARAMS, SpeedModel, fit_speed_few, nnls_model
from elastic_ring.sched.api import Rate
from elastic_ring.sim.api import JobSpec, JobState


def _row_monotone(d: np.ndarray) -> bool:
    """:func:`~elastic_ring.sched.fast.rows_monotone` of one table row, in scalar steps (the same
    floating-point operations: ``d_k / 2^k``, then ``e_k·(1 + 1e-12) < e_(k-1)``)."""
    if len(d) < 2:
        return True
    prev = None
    ok = True
    for k, x in enumerate(d.tolist()):
        e = x / float(1 << k)
        if not math.isfinite(e):
            return False
        if prev is not None and not e * (1 + 1e-12) < prev:
            ok = False
        prev = e
    return ok


@njit(cache=True)
def _scaled_features(w, f, b, n):
    """:func:`elastic_ring.perfmodel.speed._scaled_features` compiled (an exploration's fit, once
    per job): the same floating-point operations in the same order (each column's sum of squares
    row by row, as NumPy's reduction over the first axis)."""
    k = w.size
    X = np.empty((k, 4))
    for i in range(k):
        X[i, 0] = b
        X[i, 1] = w[i] - 1.0
        X[i, 2] = (w[i] - 1.0) * n / w[i]
        X[i, 3] = 1.0
    scale = np.empty(4)
    for c in range(4):
        s = X[0, c] * X[0, c]
        for i in range(1, k):
            s = s + X[i, c] * X[i, c]
        scale[c] = math.sqrt(s)
        if scale[c] == 0:
            scale[c] = 1.0
    Xs = np.empty((k, 4))
    y = np.empty(k)
    for i in range(k):
        for c in range(4):
            Xs[i, c] = X[i, c] / scale[c]
        y[i] = 1.0 / f[i]
    return Xs, y, scale


def _fit_model(ws: list[int], fs: list[float], b: float, n: float) -> SpeedModel:
    """``fit_speed_few(ws, fs, b, n)[0].model`` without the fit's residuals: with 4 or more distinct
    worker counts, :func:`~elastic_ring.perfmodel.speed.nnls_model` (``fit_speed``'s model; an
    exploration's fit, once per job); otherwise, or on values it refuses, ``fit_speed_few`` itself."""
    if len(set(ws)) < N_PARAMS or b <= 0 or n <= 0 or not all(w >= 1 and math.isfinite(w) for w in ws) or \
            not all(f > 0 and math.isfinite(f) for f in fs):
        return fit_speed_few(ws, fs, b, n)[0].model
    return nnls_model(np.asarray(ws, dtype=float).ravel(), np.asarray(fs, dtype=float).ravel(), b, n,
                      scaled=_scaled_features)


class SimJob:
    """Runtime state of one job in the simulator (its blueprint is a :class:`JobSpec`).

    work_done: samples processed up to ``advanced_to`` (s).
    gpus_held: GPUs the job holds (8 while exploring); gpus_training: GPUs it trains on now (the
        current exploration phase's count while exploring, else ``gpus_held``).
    speed: true samples/s at ``gpus_training`` (0 when not training); no progress before
        ``paused_until`` (a resize or resume overhead).
    version: bumped at every change of ``gpus_training``; stamps COMPLETION events.
    true_model / true_rate: the speed curve the job really runs at, and its cached samples/s.
    plan_rate: the planner's samples/s (None while unexplored).
    phase: index of the current exploration phase (-1 when not exploring); measured: (workers,
        measured steps/s) of each phase so far.
    """

    __slots__ = ("id", "arrival", "work", "work_done", "advanced_to", "gpus_held", "gpus_training",
                 "speed", "true_model", "true_rate", "plan_rate", "paused_until", "version", "state",
                 "explored", "phase", "measured", "finished_at", "resizes", "curve", "target_loss",
                 "q_done", "q_total", "q_fits", "pos")

    def __init__(self, spec: JobSpec, true_model: SpeedModel, true_rate: Rate, plan_rate: Rate | None,
                 explored: bool):
        self.id, self.arrival, self.work = spec.id, spec.arrival, spec.work
        self.work_done = 0.0
        self.advanced_to = spec.arrival
        self.gpus_held = self.gpus_training = 0
        self.speed = 0.0
        self.true_model = true_model
        self.true_rate = true_rate
        self.plan_rate = plan_rate
        self.paused_until = 0.0
        self.version = 0
        self.state = JobState.QUEUED
        self.explored = explored
        self.phase = -1
        self.measured: list[tuple[int, float]] = []
        self.finished_at = float("nan")
        self.resizes = 0
        self.curve, self.target_loss = spec.curve, spec.target_loss
        self.q_done = 0.0  # work done at the last Eq. 1 fit
        self.q_total = float("nan")  # the total work that fit predicted
        self.q_fits = 0
        self.pos = -1  # arrival index: the job's entry in the simulator's arrays

    def advance(self, t: float) -> None:
        """Add the work done between ``advanced_to`` and ``t`` (none before ``paused_until``)."""
        if self.speed > 0:
            start = self.advanced_to if self.advanced_to > self.paused_until else self.paused_until
            if t > start:
                self.work_done = min(self.work, self.work_done + self.speed * (t - start))
        self.advanced_to = t

    def remaining_at(self, t: float) -> float:
        """Samples still to process at time ``t`` (without advancing)."""
        if self.speed <= 0:
            return self.work - self.work_done
        start = self.advanced_to if self.advanced_to > self.paused_until else self.paused_until
        return max(0.0, self.work - self.work_done - (self.speed * (t - start) if t > start else 0.0))
