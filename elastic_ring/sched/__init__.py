"""GPU allocation policies (Table 3): Eight, Precompute (Eq. 6 doubling), Exploratory, Optimus, and
our SRTF (shortest predicted remaining time first with rank-weighted doubling)."""

from elastic_ring.sched.api import DEFAULT_RESIZE_OVERHEAD_S, JobView, Policy, Rate, model_rate
from elastic_ring.sched.policies import (
    POLICIES, Eight, Exploratory, Optimus, Precompute, SRTF, doubling_allocate, doubling_allocate_naive,
    unit_greedy_allocate,
)
from elastic_ring.sched.registry import make_policy

__all__ = [
    "DEFAULT_RESIZE_OVERHEAD_S", "JobView", "Policy", "Rate", "model_rate", "POLICIES", "Eight",
    "Exploratory", "Optimus", "Precompute", "SRTF", "doubling_allocate", "doubling_allocate_naive",
    "make_policy", "unit_greedy_allocate",
]
