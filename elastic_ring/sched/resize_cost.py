"""What a resize costs each job: measured live from its ``resize_overhead`` events, a model until then.

The ``-rc`` policies (:class:`~elastic_ring.sched.policies.ResizeAware`) grow a running job only when
the work gained over a horizon exceeds the work its resize costs. In the simulator the cost is the
model's constant (``SimConfig.resize_overhead_s``); live, :class:`ResizeCosts` gives each job

1. the median of its own measured costs (``total_lost_s`` of its ``resize_overhead`` events: request
   to first step at the new size, less one steady step) once it has one;
2. else the median of every job's measured costs so far (the same machine, the same launcher);
3. else the default: :data:`~elastic_ring.sched.api.DEFAULT_RESIZE_OVERHEAD_S` (3.5 s, measured on
   2 CPU cores by ``scripts/bench_resize.py``) on CPU slots, :data:`GPU_RESIZE_COST_S` (the paper's
   ~10 s) on GPUs.

A median, not a mean: one resize that waited for a slow checkpoint or a loaded machine should not
make every later grow look unprofitable.
"""

from __future__ import annotations

import math
import statistics
from typing import Iterable

from elastic_ring.errors import ConfigError
from elastic_ring.sched.api import DEFAULT_RESIZE_OVERHEAD_S

GPU_RESIZE_COST_S = 10.0  # the paper's stop + checkpoint + restart on GPUs (CUDA start-up included)


def default_resize_cost(device: str) -> float:
    """The model used before anything is measured: 3.5 s on CPU slots, 10 s on GPUs."""
    return GPU_RESIZE_COST_S if device == "cuda" else DEFAULT_RESIZE_OVERHEAD_S


class ResizeCosts:
    """Per-job resize costs in seconds, from measurements with a fallback (see the module docstring).

    Raises:
        ConfigError: a default that is not a finite number >= 0.
    """

    def __init__(self, default_s: float = DEFAULT_RESIZE_OVERHEAD_S) -> None:
        if not (math.isfinite(default_s) and default_s >= 0):
            raise ConfigError(f"default resize cost must be a finite number >= 0 s, got {default_s}")
        self.default_s = default_s
        self._by_job: dict[int, list[float]] = {}

    def add(self, job_id: int, lost_s: float) -> bool:
        """Record one measured resize of ``job_id``; a value that is not finite or < 0 is ignored
        (returns False)."""
        try:
            v = float(lost_s)
        except (TypeError, ValueError):
            return False
        if not (math.isfinite(v) and v >= 0):
            return False
        self._by_job.setdefault(job_id, []).append(v)
        return True

    def measured(self, job_id: int) -> list[float]:
        return list(self._by_job.get(job_id, ()))

    def cost(self, job_id: int) -> tuple[float, str]:
        """(seconds, source): source is ``job`` (its own median), ``cluster`` (all jobs' median) or
        ``default``."""
        own = self._by_job.get(job_id)
        if own:
            return statistics.median(own), "job"
        every = [v for vs in self._by_job.values() for v in vs]
        if every:
            return statistics.median(every), "cluster"
        return self.default_s, "default"

    def table(self, job_ids: Iterable[int]) -> dict[int, float]:
        """Seconds per job id (what :class:`~elastic_ring.sched.policies.ResizeAware` takes as ``costs``)."""
        return {j: self.cost(j)[0] for j in job_ids}
