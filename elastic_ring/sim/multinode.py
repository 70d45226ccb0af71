"""A speed curve that steps at the node boundary: Eq. 5 with the ring's slowest link inter-node.

On one node (w <= ``gpus_per_node``) the step time is Eq. 5 with the intra-node constants. Once a
job spans nodes, every ring allreduce crosses the slower inter-node link, which then sets the
ring's per-hop latency and bandwidth terms:

    1/f(w) = t0·m + t1·(w-1) + t2·n·(w-1)/w + t3                    w <= gpus_per_node
    1/f(w) = t0·m + t1_inter·(w-1) + t2_inter·n·(w-1)/w + t3        w >  gpus_per_node

So going from 8 to 9 GPUs can cost throughput while 8 -> 16 gains (the paper's case for Eq. 6's
doubling over unit steps). Jobs are assumed to be packed onto whole nodes (the simulator does not
model placement): a job of <= 8 GPUs never spans two nodes.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from elastic_ring.errors import ConfigError
from elastic_ring.perfmodel.speed import SpeedModel


class NodeSteppedModel(NamedTuple):
    """Eq. 5 (``base``) on one node; the inter-node ring terms beyond ``gpus_per_node``.

    Duck-types :class:`~elastic_ring.perfmodel.speed.SpeedModel` for the simulator and policies
    (``step_time``, ``predict``, ``samples_per_s``, ``m``, ``n``)."""

    base: SpeedModel
    gpus_per_node: int
    t1_inter: float
    t2_inter: float

    @property
    def m(self) -> float:
        return self.base.m

    @property
    def n(self) -> float:
        return self.base.n

    def _scalar(self, w: float) -> float:
        b = self.base
        if w <= self.gpus_per_node:
            return b.t0 * b.m + b.t1 * (w - 1) + b.t2 * b.n * (w - 1) / w + b.t3
        return b.t0 * b.m + self.t1_inter * (w - 1) + self.t2_inter * b.n * (w - 1) / w + b.t3

    def step_time(self, w: Any) -> Any:
        if isinstance(w, (int, float)):
            return float(self._scalar(w))
        return np.array([self._scalar(float(x)) for x in np.asarray(w, dtype=float).ravel()]).reshape(np.shape(w))

    def predict(self, w: Any) -> Any:
        st = self.step_time(w)
        return 1.0 / st if isinstance(st, float) else 1.0 / np.asarray(st)

    def samples_per_s(self, w: Any) -> Any:
        if isinstance(w, (int, float)):
            return self.m * w / self._scalar(w)
        w = np.asarray(w, dtype=float)
        return self.m * w / np.asarray(self.step_time(w))

    @classmethod
    def from_dict(cls, base: SpeedModel, d: dict[str, Any]) -> "NodeSteppedModel":
        try:
            g, t1i, t2i = int(d["gpus_per_node"]), float(d["t1_inter"]), float(d["t2_inter"])
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(f"multi_node needs gpus_per_node, t1_inter, t2_inter: {e}") from None
        if g < 1 or not all(math.isfinite(x) and x >= 0 for x in (t1i, t2i)):
            raise ConfigError(f"multi_node: need gpus_per_node >= 1 and t1_inter, t2_inter >= 0, got {d}")
        return cls(base, g, t1i, t2i)
