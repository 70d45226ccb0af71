"""The scheduling interface: a policy maps the active jobs to GPU counts.

    policy.allocate(jobs, total_gpus, current) -> {job_id: gpus}

``jobs`` are :class:`JobView` s in arrival order (FIFO priority), ``current`` the allocation in
force. A job missing from the answer gets 0 GPUs (it waits). The answer never sums to more than
``total_gpus``; the simulator checks.

Work and speed units. The paper's Eq. 6 ranks jobs by ``Q_j/f_j(w)``, the remaining time. With a
fixed per-worker batch (see :mod:`elastic_ring.perfmodel.speed`) a step at w workers processes
b·w samples, so remaining work is counted in *samples* and speed in *samples/s*
(``b·w·f(w)``); ``Q/f`` is then the remaining time, as the paper intends.

Every change of a running job's GPU count is a stop / checkpoint / restart that costs
``resize_overhead_s`` of no progress while the job holds its new GPUs.
"""

from __future__ import annotations

from typing import Callable, Mapping, NamedTuple, Protocol, Sequence, runtime_checkable

import numpy as np

from elastic_ring.perfmodel.speed import SpeedModel

# Seconds a job loses per resize: the median time lost with the overlapped relaunch (`train`'s CPU
# default) as scripts/bench_resize.py measured it on 2 CPU cores (results/bench_resize.json;
# docs/reports/resize.md). The paper reports ~10 s on GPUs (CUDA start-up adds to it);
# `simulate --resize-overhead 10` uses that.
DEFAULT_RESIZE_OVERHEAD_S = 3.5
# the policies with no resize-aware wrapper (no ``NAME-rc``): ``make_policy`` refuses one for them
NOT_RESIZE_AWARE = ("eight", "exploratory")

Rate = Callable[[int], float]
"""Speed of a job in samples/s as a function of its GPU count (w >= 1)."""


def model_rate(model: SpeedModel) -> Rate:
    """A cached scalar ``w -> samples/s`` of an Eq. 5 model, :meth:`SpeedModel.samples_per_s`
    (fast: the simulator and the policies call it per heap pop)."""
    cache: dict[int, float] = {}
    samples_per_s = model.samples_per_s

    def rate(w: int) -> float:
        r = cache.get(w)
        if r is None:
            r = cache[w] = samples_per_s(w)
        return r

    return rate


class JobView(NamedTuple):
    """What a policy sees of one job.

    id: the job's id.
    remaining: remaining work Q in samples (known to the planner: Precompute is an oracle on Q).
    rate: the planner's speed model, samples/s of GPU count; None while unknown (Exploratory).
    current: GPUs held now (0 = waiting).
    needs_exploration: Exploratory only: the job has not measured its speed yet.
    exploring: Exploratory only: the job is in its measuring phase (holds 8 GPUs).
    done: work done so far, in the units of ``remaining`` (exact, not predicted): the attained
        service that least-attained-service policies rank by.
    """

    id: int
    remaining: float
    rate: Rate | None
    current: int = 0
    needs_exploration: bool = False
    exploring: bool = False
    done: float = 0.0


class Policy(Protocol):
    name: str
    explores: bool  # True: new jobs measure their speed first (JobView.needs_exploration)

    def allocate(self, jobs: Sequence[JobView], total_gpus: int, current: Mapping[int, int]) -> dict[int, int]:
        """GPUs per job id; jobs left out wait. Must not exceed ``total_gpus`` in total."""
        ...


@runtime_checkable
class ExploringPolicy(Policy, Protocol):
    """A policy whose new jobs measure themselves first, each on ``explore_gpus`` slots."""

    explore_gpus: int


@runtime_checkable
class CostAwarePolicy(Policy, Protocol):
    """A policy that weighs what a resize costs (the ``-rc`` ones): ``resize_cost_s`` by default,
    ``costs`` (job id -> seconds, set before each decision) where a job's own cost was measured;
    ``last_vetoed`` lists the grows its last decision refused (job id, held, asked, work gained,
    work the resize costs)."""

    resize_cost_s: float
    costs: dict[int, float]
    last_vetoed: list[tuple[int, int, int, float, float]]


class JobBatch(NamedTuple):
    """The active jobs as arrays, in arrival order: what the simulator hands a policy's
    ``allocate_batch(batch, total_gpus) -> GPUs per job (int array, same order)`` when the policy
    has one (the same answer as ``allocate`` on the same jobs; the live scheduler calls ``allocate``).

    ids, remaining, current, needs_exploration, exploring: as in :class:`JobView`, one entry per job
        (remaining is None for a policy whose ``uses_remaining`` is False: FIFO Eight).
    rows: each job's row in ``tables`` / ``rates`` / ``rate1`` (-1: no speed model yet).
    tables: Eq. 6 gain tables (:func:`elastic_ring.sched.fast.gain_table`), one row per rate.
    rates: the Rate of each row; rate1: each row's rate at 1 GPU; monotone: see the field.
    """

    ids: np.ndarray
    remaining: np.ndarray | None
    current: np.ndarray
    rows: np.ndarray
    needs_exploration: np.ndarray
    exploring: np.ndarray
    tables: np.ndarray
    rates: Sequence[Rate]
    rate1: np.ndarray
    monotone: np.ndarray | None = None  # per row: passed fast.rows_monotone (None: unchecked)
