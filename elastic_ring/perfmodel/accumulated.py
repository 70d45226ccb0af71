"""The speed of a job that keeps a constant global batch (``lr_scaling: constant-batch``): Eq. 5
with micro-batches.

Such a job trains every step on the same ``M`` micro-batches of the per-worker batch ``b`` (global
batch ``G = M·b``) at every worker count (:mod:`elastic_ring.worker.accumulate`): at ``w`` workers
the busiest worker computes ``ceil(M/w)`` micro-batches, summing their gradients, then the step's
one allreduce runs. The model (an assumption, stated here and in docs/simulate.md):

    t(w) = ceil(M/w) · T(1) + (T(w) - T(1))        [s per step, w <= M]

with ``T`` the plain Eq. 5 step of the same per-worker batch (:class:`~.speed.SpeedModel`, or a
:class:`~elastic_ring.sim.multinode.NodeSteppedModel`): ``T(1) = t0·b + t3`` is the per-micro-batch
compute (Eq. 5's compute term at batch b with its constant: a fit does not identify t0 and t3
apart, so the whole w-independent part is counted per micro-batch, which overstates ``t(w)`` by
``(ceil(M/w) - 1)·t3`` where t3 is really once per step), and ``T(w) - T(1)`` the communication
(``t1·(w-1) + t2·n·(w-1)/w``), once per step. At ``w == M`` (one micro-batch each) ``t(w)`` is
the plain step ``T(w)``, exactly. Speed in samples/s is ``M·b / t(w)``.

More workers than micro-batches cannot share the batch (``train`` refuses them): a job given
``w > M`` GPUs is modelled as training on ``M`` of them (its speed at ``M``, the rest idle), so a
policy gains nothing from giving it more.

The job's work in samples and its loss curve in samples are those of the same job under Eq. 7:
in this model a resize changes neither (no accuracy or convergence cost in the scheduler or the
simulator under either rule; under constant-batch this is what the training does, under Eq. 7 it
is the model's simplification), so the two rules differ in the speed curve alone.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from elastic_ring.errors import ConfigError

RULES = ("linear", "constant-batch")


class AccumulatedModel(NamedTuple):
    """The accumulated step of ``micro_batches`` micro-batches over a plain Eq. 5 model ``base``
    (see the module docstring). Duck-types :class:`~elastic_ring.perfmodel.speed.SpeedModel` for the
    simulator and the policies (``step_time``, ``predict``, ``samples_per_s``, ``m``, ``n``);
    ``m`` is the micro-batch (the per-worker batch b), ``predict`` in global steps/s."""

    base: Any
    micro_batches: int

    @property
    def m(self) -> float:
        return self.base.m

    @property
    def n(self) -> float:
        return self.base.n

    @property
    def global_batch(self) -> float:
        return self.micro_batches * self.base.m

    def _scalar(self, w: float) -> float:
        m = self.micro_batches
        w = min(w, m)
        k = math.ceil(m / w)
        plain = float(self.base.step_time(w))
        return plain if k == 1 else plain + (k - 1) * float(self.base.step_time(1))

    def step_time(self, w: Any) -> Any:
        """Seconds per (global) step at ``w`` workers: a float for a number, else an array."""
        if isinstance(w, (int, float)):
            return self._scalar(w)
        arr = np.asarray(w, dtype=float)
        return np.array([self._scalar(float(x)) for x in arr.ravel()]).reshape(arr.shape)

    def predict(self, w: Any) -> Any:
        """Global steps/s at ``w`` workers."""
        st = self.step_time(w)
        return 1.0 / st if isinstance(st, float) else 1.0 / np.asarray(st)

    def samples_per_s(self, w: Any) -> Any:
        """Samples/s at ``w`` workers: ``M·b / t(w)``."""
        st = self.step_time(w)
        return self.global_batch / st if isinstance(st, float) else self.global_batch / np.asarray(st)

    def plain_step_times(self, ws: list[int], step_times: list[float]) -> list[float]:
        """The plain Eq. 5 steps ``T(w)`` behind measured accumulated steps ``t(w)`` (the inverse of
        the model, for an exploration's fit): ``T(w) = t(w) - (ceil(M/w) - 1)·t(1)/M``, which needs a
        measurement at 1 worker (``T(1) = t(1)/M``); each kept > 0. Without one, ``ws`` at or above
        ``M`` are returned as they are and the others scaled by ``1/ceil(M/w)`` (no communication
        assumed)."""
        m = self.micro_batches
        one = [t for w, t in zip(ws, step_times) if w == 1]
        out = []
        for w, t in zip(ws, step_times):
            k = -(-m // min(int(w), m))
            if one:
                c = one[0] / m
                out.append(max(t - (k - 1) * c, 1e-12 * t))
            else:
                out.append(t / k)
        return out


def accumulated(model: Any, global_batch: float) -> AccumulatedModel:
    """``model`` (a plain Eq. 5 curve at per-worker batch ``model.m``) under a constant global batch
    of ``global_batch`` samples.

    Raises:
        ConfigError: a global batch that is not a whole multiple (>= 1) of the per-worker batch.
    """
    b = float(model.m)
    k = global_batch / b if b > 0 else float("nan")
    if not (math.isfinite(k) and k >= 1 and abs(k - round(k)) < 1e-9):
        raise ConfigError(f"constant-batch: the global batch {global_batch:g} is not a multiple (>= 1) of the "
                          f"workload's per-worker batch {b:g}")
    return AccumulatedModel(model, int(round(k)))
