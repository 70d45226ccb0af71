"""Interfaces and value types of the parameter server: the run blueprint, the sync policy, the
controller interface and the decisions the gate returns.

Vocabulary (arXiv 1908.11848, PAPERS.md section 2):

- ``t_p``: number of pushes worker p has made (its clock). ``t_min``: the slowest worker's count.
- gap: ``t_p - t_min``. A worker is *released* (sent OK, which carries the weights: the pull) or
  *held* after each push. Every paradigm is one threshold on the gap at release:

      paradigm     threshold at release            controller
      bsp          0                               none
      asp          unbounded                       none
      ssp s        s                               none
      dssp lo:hi   lo, plus allowances r_p         Algorithm 2 (``paper``), refilled (Algorithm 1)
      dssp-exact   lo, plus allowances r_p         argmin of the wait at the next check (no refill
                                                   assumed), capped so gap <= hi always

- staleness of an applied gradient: server version at apply time minus the version the worker
  pulled (versions count applied pushes; the server applies every push on its own, Algorithm 1).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

from elastic_ring.config.api import coerce_scalar
from elastic_ring.errors import ConfigError, UserError

SYNCS = ("bsp", "asp", "ssp", "dssp", "dssp-exact")
DATASETS = ("cifar10", "synthetic", "digits")


class PSInputError(UserError):
    """A bad ``elastic-ring ps`` argument (sync, staleness, workers, slowdown...)."""


class Action(str, enum.Enum):
    """What the gate did with one push.

    ``ok_allowance``: r_p > 0 was spent (Algorithm 1 line "if r_p > 0: r_p -= 1, send OK").
    ``ok_within``: gap <= threshold. ``ok_controller``: the controller granted r_p > 0.
    ``hold``: the worker waits for a later release.
    """

    OK_ALLOWANCE = "ok_allowance"
    OK_WITHIN = "ok_within"
    OK_CONTROLLER = "ok_controller"
    HOLD = "hold"

    @property
    def released(self) -> bool:
        return self is not Action.HOLD


@dataclass(frozen=True)
class SyncPolicy:
    """A paradigm as the gate sees it: a lower threshold, an upper one and a controller name.

    ``lower`` is the SSP threshold (BSP 0, ASP ``math.inf``); ``upper - lower`` is r_max; the
    controller is ``None`` (no allowances), ``"paper"`` (Algorithm 2) or ``"exact"``.
    """

    name: str
    lower: float
    upper: float
    controller: str | None = None

    @property
    def r_max(self) -> int:
        return 0 if math.isinf(self.upper) else int(self.upper - self.lower)

    @property
    def release_bound(self) -> float:
        """The largest gap at release this policy guarantees (``inf``: none).

        bsp 0, ssp s, asp inf, dssp-exact hi; the paper's dssp has no bound (the refill).
        """
        if self.controller == "paper":
            return math.inf
        if self.controller == "exact":
            return self.upper
        return self.lower

    @staticmethod
    def parse(sync: str, staleness: str | int | Sequence[int] | None = None) -> "SyncPolicy":
        """Build from the CLI's ``--sync`` and ``--staleness``.

        Raises:
            PSInputError: unknown sync, staleness given where it has no meaning, not an integer
                >= 0 for ssp, not ``lo:hi`` with 0 <= lo <= hi for dssp.
        """
        sync = str(sync).lower()
        if sync not in SYNCS:
            raise PSInputError(f"unknown --sync {sync!r} (choose {', '.join(SYNCS)})")
        if sync in ("bsp", "asp"):
            if staleness not in (None, ""):
                raise PSInputError(f"--staleness does not apply to {sync}")
            return SyncPolicy(sync, 0 if sync == "bsp" else math.inf,
                              0 if sync == "bsp" else math.inf)
        if sync == "ssp":
            s = 3 if staleness in (None, "") else staleness
            if isinstance(s, str) and ":" in s:
                raise PSInputError(f"ssp takes one threshold, got --staleness {s!r} (a range is for dssp)")
            try:
                v = int(str(s))
            except ValueError:
                raise PSInputError(f"--staleness for ssp must be an integer >= 0, got {s!r}") from None
            if v < 0:
                raise PSInputError(f"--staleness for ssp must be >= 0, got {v}")
            return SyncPolicy("ssp", v, v)
        raw = "3:15" if staleness in (None, "") else staleness
        if isinstance(raw, (list, tuple)):
            parts = [str(x) for x in raw]
        else:
            parts = str(raw).split(":")
        try:
            if len(parts) != 2:
                raise ValueError
            lo, hi = int(parts[0]), int(parts[1])
        except ValueError:
            raise PSInputError(f"--staleness for {sync} must be a range lo:hi such as 3:15, got {raw!r}") from None
        if lo < 0 or hi < lo:
            raise PSInputError(f"--staleness range for {sync} needs 0 <= lo <= hi, got {lo}:{hi}")
        return SyncPolicy(sync, lo, hi, "paper" if sync == "dssp" else "exact")

    def label(self) -> str:
        if self.name in ("bsp", "asp"):
            return self.name.upper()
        if self.name == "ssp":
            return f"SSP s={int(self.lower)}"
        ctl = "Alg. 2" if self.controller == "paper" else "exact+cap"
        return f"DSSP [{int(self.lower)},{int(self.upper)}] {ctl}"


@dataclass(frozen=True)
class PushRecord:
    """The latest two push times of a worker (Algorithm 2 keeps exactly these)."""

    count: int
    latest: float | None
    previous: float | None

    @property
    def interval(self) -> float | None:
        if self.latest is None or self.previous is None:
            return None
        return self.latest - self.previous


@dataclass(frozen=True)
class ControllerInput:
    """What a controller is asked at a decision: p is the fastest and its gap exceeds lower."""

    worker: int
    now: float
    t_p: int
    t_slowest: int
    lower: int
    upper: int
    fastest: PushRecord
    slowest: PushRecord


@dataclass(frozen=True)
class ControllerDecision:
    """The allowance r chosen, and why (logged as one ``ps_controller`` event)."""

    r: int
    r_cap: int  # largest r considered
    reason: str  # "argmin" | "no_interval"
    objective: tuple[float, ...] = ()  # per r in 0..r_cap: |Sim_s - Sim_p| (paper) or wait (exact)
    a_p: float | None = None
    i_p: float | None = None
    a_s: float | None = None
    i_s: float | None = None


class Controller(Protocol):
    """Algorithm 2's role: given p (the fastest, over the lower threshold), return r_p >= 0."""

    name: str

    def decide(self, inp: ControllerInput) -> ControllerDecision: ...


@dataclass(frozen=True)
class GateDecision:
    """The gate's answer to one push: the pusher's action and the other workers it releases."""

    worker: int
    t_p: int
    t_min: int
    gap: int
    action: Action
    allowance_left: int
    releases: tuple[int, ...] = ()
    controller: ControllerDecision | None = None


@dataclass(frozen=True)
class PSConfig:
    """Blueprint of one parameter-server run (validated; nothing about runtime state).

    Attributes:
        sync, staleness: the paradigm (see :meth:`SyncPolicy.parse`); staleness ``"3"`` / ``"3:15"``.
        workers: K worker ranks (ranks 1..K; rank 0 is the server).
        slowdown: per-worker factors; worker i's step lasts ``slowdown[i]`` times its base step.
        noise: coefficient of variation of the step time (Gaussian, seeded per worker, 0: none).
        base_step_s: floor of the base step (compute is padded to it by sleeping), so emulated
            speeds do not depend on CPU contention; 0: the measured compute time is the base.
        depth, width, dataset, batch_size: model and data (CIFAR ResNet 6n+2; digits/cifar10/synthetic).
        model: ``resnet`` (default) or ``mlp`` (one hidden layer of ``width`` units; depth unused).
        lr, momentum, weight_decay: SGD with momentum, applied by the server to every push.
        time_budget_s, max_pushes, stop_accuracy: stop conditions (first reached; 0: unused).
        eval_every_s, eval_every_updates: test accuracy on the server (first reached; 0: unused).
        eval_deferred: keep a copy of the weights at each evaluation point and evaluate them after
            the run, so the server never pauses for evaluation (the time axis then holds only
            training); needs ``stop_accuracy`` 0, since nothing is known about accuracy during the run.
        clock: ``wall`` (real seconds; speeds padded by sleeping) or ``virtual`` (the server emulates
            time: every step lasts exactly ``base_step_s * slowdown * (1 + noise * z)`` emulated
            seconds and pushes are handled in that order, whatever the machine's load).
    """

    sync: str = "asp"
    staleness: str = ""
    workers: int = 2
    slowdown: tuple[float, ...] = ()
    noise: float = 0.0
    base_step_s: float = 0.0
    depth: int = 8
    width: int = 8
    dataset: str = "digits"
    data_dir: str = "data"
    synthetic_size: int = 2048
    batch_size: int = 32
    augment: bool = False
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 1e-4
    seed: int = 0
    time_budget_s: float = 60.0
    max_pushes: int = 0
    stop_accuracy: float = 0.0
    eval_every_s: float = 1.0
    eval_every_updates: int = 0
    max_test_samples: int = 0
    eval_deferred: bool = False
    clock: str = "wall"
    model: str = "resnet"

    def __post_init__(self) -> None:
        policy = self.policy  # validates sync and staleness
        del policy
        if self.workers < 1:
            raise PSInputError(f"--workers must be >= 1, got {self.workers}")
        if self.slowdown and len(self.slowdown) != self.workers:
            raise PSInputError(f"--slowdown has {len(self.slowdown)} factor(s) for {self.workers} worker(s)")
        if any(not (f >= 1.0 and math.isfinite(f)) for f in self.slowdown):
            raise PSInputError(f"--slowdown factors must be finite and >= 1.0, got {list(self.slowdown)}")
        if not 0 <= self.noise <= 2:
            raise PSInputError(f"--noise must be in [0, 2], got {self.noise}")
        if self.depth < 8 or (self.depth - 2) % 6:
            raise ConfigError(f"invalid config: depth must be 6n+2 (8, 14, 20, ...), got {self.depth}")
        if self.dataset not in DATASETS:
            raise ConfigError(f"invalid config: dataset must be one of {', '.join(DATASETS)}, got {self.dataset!r}")
        for name in ("width", "batch_size", "synthetic_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"invalid config: {name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0 or not 0 <= self.momentum < 1 or self.weight_decay < 0:
            raise ConfigError("invalid config: need lr > 0, 0 <= momentum < 1, weight_decay >= 0")
        for name in ("time_budget_s", "eval_every_s", "base_step_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"invalid config: {name} must be >= 0, got {getattr(self, name)}")
        for name in ("max_pushes", "eval_every_updates", "max_test_samples"):
            if getattr(self, name) < 0:
                raise ConfigError(f"invalid config: {name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.stop_accuracy <= 1:
            raise ConfigError(f"invalid config: stop_accuracy must be in [0, 1], got {self.stop_accuracy}")
        if not (self.time_budget_s or self.max_pushes or self.stop_accuracy):
            raise PSInputError("no stop condition: set a time budget, max pushes or a stop accuracy")
        if not (self.eval_every_s or self.eval_every_updates):
            raise ConfigError("invalid config: set eval_every_s or eval_every_updates")
        if self.model not in ("resnet", "mlp"):
            raise ConfigError(f"invalid config: model must be resnet or mlp, got {self.model!r}")
        if self.clock not in ("wall", "virtual"):
            raise ConfigError(f"invalid config: clock must be wall or virtual, got {self.clock!r}")
        if self.clock == "virtual" and not self.base_step_s:
            raise ConfigError("invalid config: clock virtual needs base_step_s > 0 (the emulated step length)")
        if self.eval_deferred and self.stop_accuracy:
            raise ConfigError("invalid config: stop_accuracy needs evaluation during the run (eval_deferred: false)")

    @property
    def policy(self) -> SyncPolicy:
        return SyncPolicy.parse(self.sync, self.staleness or None)

    @property
    def slowdowns(self) -> tuple[float, ...]:
        return self.slowdown or (1.0,) * self.workers

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["slowdown"] = list(self.slowdowns)
        return d

    def replace(self, **changes: Any) -> "PSConfig":
        return config_from_dict(self.to_dict() | changes, source="overrides")


_FIELDS = {f.name: f for f in dataclasses.fields(PSConfig)}


def _coerce(name: str, value: Any, source: str) -> Any:
    default = _FIELDS[name].default
    try:
        if name == "slowdown":
            if isinstance(value, str):
                value = [v for v in value.split(",") if v.strip()]
            if isinstance(value, (int, float)):
                value = [value]
            return tuple(float(v) for v in value)
        if name == "staleness":
            if isinstance(value, (list, tuple)):
                return ":".join(str(int(v)) for v in value)
            return "" if value is None else str(value)
        return coerce_scalar(default, value)
    except (TypeError, ValueError):
        raise ConfigError(f"{source}: {name} has the wrong type: {value!r}") from None


def config_from_dict(values: Mapping[str, Any], source: str = "config") -> PSConfig:
    """Build a :class:`PSConfig`; unknown keys and wrong types are :class:`ConfigError`."""
    unknown = sorted(set(values) - set(_FIELDS))
    if unknown:
        raise ConfigError(f"{source}: unknown ps config key(s): {', '.join(unknown)}")
    return PSConfig(**{k: _coerce(k, v, source) for k, v in values.items()})
