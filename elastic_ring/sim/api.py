"""Value types of the simulator: the blueprint (:class:`SimConfig`, :class:`JobSpec`), the job
lifecycle (:class:`JobState`) and the result (:class:`RunResult`).

Contention levels (our definition; the paper does not give its arrival rates). Offered load
rho = (arrival rate) x (mean GPU-hours a job needs at 8 GPUs) / (cluster GPUs), i.e. the load the
*Eight* policy sees. Jobs arrive as a Poisson process with rate ``rho * G / (8 * E[T8])`` where
T8, a job's run time alone on 8 GPUs, is drawn log-uniform in [``min_hours_at_8``,
``max_hours_at_8``] (0.25 h to 8 h by default, mean 2.24 h):

    low 0.5, moderate 0.9, high 1.2, extreme 2.0

At rho >= 1 Eight is overloaded (its queue grows for as long as jobs arrive); elastic policies can
still keep up because small allocations run at higher per-GPU efficiency.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

from elastic_ring.errors import ConfigError
from elastic_ring.sched.api import DEFAULT_RESIZE_OVERHEAD_S

CONTENTION: dict[str, float] = {"low": 0.5, "moderate": 0.9, "high": 1.2, "extreme": 2.0}


class JobState(str, Enum):
    """Lifecycle of a simulated job.

    QUEUED (arrived) -> EXPLORING (Exploratory only) -> RUNNING -> DONE.
    RUNNING <-> QUEUED when a policy takes all of a job's GPUs and later gives some back;
    EXPLORING -> DONE or RUNNING -> DONE when its work is finished. A job's GPU count may change
    while RUNNING (a resize).
    """

    QUEUED = "queued"
    EXPLORING = "exploring"
    RUNNING = "running"
    DONE = "done"


REMAINING = ("oracle", "eq1")
"""What policies are told of a job's remaining work Q: ``oracle`` the true Q; ``eq1`` the Eq. 1
prediction from the job's loss curve observed so far
(:func:`elastic_ring.perfmodel.convergence.predict_remaining`)."""


@dataclass(frozen=True)
class JobSpec:
    """One job: arrival time (s), work (samples), workload name (its true speed curve).

    ``curve`` (b0, b1, b2): the job's true loss curve, Eq. 1 with k counted in samples, and
    ``target_loss`` = the loss at ``work`` (the job stops when it reaches it); None: no curve
    (the planner is then told the true Q, as with ``remaining="oracle"``).
    """

    id: int
    arrival: float
    work: float
    workload: str
    curve: tuple[float, float, float] | None = None
    target_loss: float | None = None


@dataclass(frozen=True)
class SimConfig:
    """Blueprint of one simulation run (validated on construction)."""

    gpus: int = 64
    contention: float = CONTENTION["moderate"]
    jobs: int = 200
    seed: int = 0
    min_hours_at_8: float = 0.25
    max_hours_at_8: float = 8.0
    resize_overhead_s: float = DEFAULT_RESIZE_OVERHEAD_S
    # Seconds of a job's very first start without progress, slots held (0: the paper's simulator).
    # The live check (scripts/cluster_check_sim.py) sets the measured launch + shutdown time of a job.
    start_overhead_s: float = 0.0
    # Seconds more of a start or resize per worker of the new size beyond the first (0: the paper's
    # simulator). The live check fits it to the calibration's resizes (launching W processes).
    overhead_per_worker_s: float = 0.0
    # A resize of a job still launching begins when that launch is done, and GPUs given back by a
    # shrink or preemption are free only then, as live (False: the paper's instant hand-over).
    resize_after_launch: bool = False
    # overhead_per_worker_s counts the workers of every other job still launching then, too (the
    # launches of one CPU node share its cores). False: only the job's own workers.
    launches_share_node: bool = False
    explore_gpus: tuple[int, ...] = (1, 2, 4, 8)
    explore_phase_s: float = 150.0
    # > 0: a phase lasts its launch, then this much work (samples; steps in the live replay), as
    # the live scheduler measures a number of throughput windows; 0: explore_phase_s seconds.
    explore_phase_work: float = 0.0
    explore_noise: float = 0.02  # relative std of a measured speed during exploration
    workloads: tuple[str, ...] = field(default=("resnet110-cifar10",))
    # Remaining work told to the policies (REMAINING). The engine's default stays the oracle (the
    # recorded results); `elastic-ring simulate` defaults to eq1.
    remaining: str = "oracle"
    # eq1: relative std of the noise on an observed loss (multiplicative, Gaussian). Measured on
    # our CPU runs (results/table2_cpu/report.md): Eq. 1 rmse 0.16 on losses that fall to ~0.2,
    # and predictions from the first half of a curve off by 2.3-7x; we take 0.15 (assumed).
    loss_noise: float = 0.15
    loss_points: int = 20  # eq1: loss points spread evenly over the work done so far
    refit_growth: float = 1.1  # eq1: refit a job's curve when its work done grew by 10%

    def __post_init__(self) -> None:
        if self.gpus < 1:
            raise ConfigError(f"gpus must be >= 1, got {self.gpus}")
        if not (self.contention > 0 and math.isfinite(self.contention)):
            raise ConfigError(f"contention (offered load) must be > 0, got {self.contention}")
        if self.jobs < 1:
            raise ConfigError(f"jobs must be >= 1, got {self.jobs}")
        if not (0 < self.min_hours_at_8 <= self.max_hours_at_8):
            raise ConfigError("need 0 < min_hours_at_8 <= max_hours_at_8")
        if self.resize_overhead_s < 0:
            raise ConfigError(f"resize overhead must be >= 0 s, got {self.resize_overhead_s}")
        if not (self.start_overhead_s >= 0 and math.isfinite(self.start_overhead_s)):
            raise ConfigError(f"start overhead must be >= 0 s, got {self.start_overhead_s}")
        if not (self.overhead_per_worker_s >= 0 and math.isfinite(self.overhead_per_worker_s)):
            raise ConfigError(f"overhead per worker must be >= 0 s, got {self.overhead_per_worker_s}")
        if self.explore_phase_s <= self.resize_overhead_s:
            raise ConfigError("an exploration phase must last longer than one resize overhead")
        if not (self.explore_phase_work >= 0 and math.isfinite(self.explore_phase_work)):
            raise ConfigError(f"explore_phase_work must be >= 0, got {self.explore_phase_work}")
        if self.explore_noise < 0:
            raise ConfigError("explore_noise must be >= 0")
        if not self.workloads:
            raise ConfigError("at least one workload is needed")
        if self.remaining not in REMAINING:
            raise ConfigError(f"remaining must be one of {', '.join(REMAINING)}, got {self.remaining!r}")
        if self.loss_noise < 0 or self.loss_points < 3 or self.refit_growth <= 1:
            raise ConfigError("need loss_noise >= 0, loss_points >= 3 and refit_growth > 1")

    @property
    def mean_hours_at_8(self) -> float:
        lo, hi = self.min_hours_at_8, self.max_hours_at_8
        return lo if hi == lo else (hi - lo) / math.log(hi / lo)

    @property
    def arrival_rate(self) -> float:
        """Jobs per second giving offered load ``contention`` (see the module docstring)."""
        return self.contention * self.gpus / (8.0 * self.mean_hours_at_8 * 3600.0)


@dataclass(frozen=True)
class RunResult:
    """Outcome of one run. Times in seconds; ``utilisation`` = GPU-seconds held / (G x makespan)."""

    strategy: str
    seed: int
    jobs: int
    avg_jct_s: float
    p99_jct_s: float
    makespan_s: float
    utilisation: float
    resizes: int
    max_gpus_in_use: int
    completed: int
    jct_s: tuple[float, ...] = field(repr=False, default=())

    def summary(self) -> dict:
        return {"strategy": self.strategy, "seed": self.seed, "jobs": self.jobs,
                "avg_jct_h": self.avg_jct_s / 3600, "p99_jct_h": self.p99_jct_s / 3600,
                "makespan_h": self.makespan_s / 3600, "utilisation": self.utilisation,
                "resizes": self.resizes, "max_gpus_in_use": self.max_gpus_in_use,
                "completed": self.completed}
