"""Replay of a measured job trace in the simulator (the simulator-against-live check).

A live trace is a list of jobs (arrival time in seconds from the first arrival, steps) and a
measured speed table (steps/s at each worker count). Work is counted in steps and speed in
steps/s (the live scheduler's units: a job's step budget does not depend on its worker count),
so the table is handed to the engine as a "model" whose ``samples_per_s`` is steps/s.

Exploratory is replayed as the live scheduler runs it on a node of S slots: an explorer holds the
largest power of two <= min(8, S) slots and is measured at 1, 2, 4, ... up to it; a phase lasts the
launch at that size plus ``explore_steps`` steps (the live scheduler's warm-up window and measured
windows; ``SimConfig.explore_phase_work``).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from elastic_ring.errors import ConfigError
from elastic_ring.sched.policies import Exploratory, make_policy
from elastic_ring.sim.api import JobSpec, RunResult, SimConfig
from elastic_ring.sim.engine import Simulator


class TableSpeed:
    """Measured steps/s by worker count; sizes between or beyond the measured ones take the
    nearest measured size at or below (a job never runs faster than measured)."""

    m = 1.0
    n = 1.0  # b = n = 1 in an exploration's fit, as the live scheduler's (predictions do not depend on them)

    def __init__(self, steps_per_s: Mapping[int, float]) -> None:
        if not steps_per_s or any(w < 1 or not (r > 0 and math.isfinite(r)) for w, r in steps_per_s.items()):
            raise ConfigError(f"a speed table needs worker counts >= 1 with speeds > 0, got {dict(steps_per_s)}")
        self.table = {int(w): float(r) for w, r in steps_per_s.items()}
        self._ws = sorted(self.table)

    def samples_per_s(self, w: int) -> float:
        below = [x for x in self._ws if x <= w]
        return self.table[below[-1] if below else self._ws[0]]

    predict = samples_per_s


class _Replay(Simulator):
    """The simulator, keeping the seconds each resize of a running job costs it (its launch at the
    new size, the resize overhead with the per-worker and shared-launch parts): what a live
    resize's ``total_lost_s`` is compared with."""

    def __init__(self, *a, lost: list | None = None, **kw) -> None:
        super().__init__(*a, **kw)
        self.lost = lost

    def _launch_cost(self, w, base, t0=None, j=None):  # noqa: ANN001 - the engine's signature
        c = super()._launch_cost(w, base, t0, j)
        if self.lost is not None and j is not None and j.gpus_held > 0 and base == self.config.resize_overhead_s:
            self.lost.append(c)
        return c


def explore_sizes(slots: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to the largest power of two <= min(8, ``slots``) (the live exploration)."""
    out = [1]
    while out[-1] * 2 <= min(8, slots):
        out.append(out[-1] * 2)
    return tuple(out)


def replay(jobs: Sequence[tuple[float, int]], policy: str, slots: int, speed: Mapping[int, float] | Sequence[Mapping[int, float]],
           start_overhead_s: float, resize_overhead_s: float, plan: Mapping[int, float] | None = None,
           overhead_per_worker_s: float = 0.0, explore_steps: int = 60,
           resize_after_launch: bool = True, resize_cost_s: float | None = None,
           launches_share_node: bool = True, lost: list | None = None) -> RunResult:
    """Simulate ``jobs`` ((arrival s, steps), in submission order) on ``slots`` under ``policy``.

    ``speed``: the true steps/s table of every job, or one per job. ``plan``: the table the
    planner sees (the live scheduler's profile; default: each job's true table). Remaining work is
    the oracle (steps left of the budget, as the live scheduler without a target loss). A start or
    resize to W workers costs its overhead + ``overhead_per_worker_s`` x (W - 1). With
    ``resize_after_launch`` (the live scheduler's hand-over) a resize of a job still launching
    begins when that launch is done and the slots it gives back are free only then; with
    ``launches_share_node`` the per-worker cost counts the workers of every launch in progress
    (the node's cores are shared by the launches side by side).
    ``NAME-rc`` policies are told ``resize_cost_s`` as the cost of a resize (default
    ``resize_overhead_s``). ``lost``: a list to append the seconds each resize cost to.
    """
    tables = list(speed) if isinstance(speed, (list, tuple)) else [speed] * len(jobs)
    if len(tables) != len(jobs):
        raise ConfigError("one speed table per job, or one for all")
    models = {f"job{i}": TableSpeed(t) for i, t in enumerate(tables)}
    plans = {k: TableSpeed(plan) for k in models} if plan is not None else None
    specs = [JobSpec(id=i, arrival=float(a), work=float(s), workload=f"job{i}") for i, (a, s) in enumerate(jobs)]
    sizes = explore_sizes(slots)
    cfg = SimConfig(gpus=slots, jobs=len(specs), resize_overhead_s=resize_overhead_s,
                    start_overhead_s=start_overhead_s, overhead_per_worker_s=overhead_per_worker_s,
                    resize_after_launch=resize_after_launch, launches_share_node=launches_share_node,
                    explore_gpus=sizes, explore_phase_work=float(explore_steps), remaining="oracle")
    pol = Exploratory(sizes[-1]) if policy == "exploratory" else make_policy(
        policy, resize_overhead_s if resize_cost_s is None else resize_cost_s)
    return _Replay(cfg, pol, models, plans, lost=lost).run(specs)
