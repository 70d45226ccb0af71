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

import enum
import math
from dataclasses import dataclass
from typing import Any, Literal, Mapping, Protocol, Sequence, get_args

from pydantic import Field, field_validator, model_validator

from elastic_ring.config.api import Dataset, ResNetDepth
from elastic_ring.config.base import Bool, ConfigModel, Float, FloatTuple, Int, Str, build
from elastic_ring.errors import ConfigError, UserError

Sync = Literal["bsp", "asp", "ssp", "dssp", "dssp-exact"]
SYNCS = get_args(Sync)


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
            raise PSInputError(f"unknown sync {sync!r} (choose {', '.join(SYNCS)})")
        if sync in ("bsp", "asp"):
            if staleness not in (None, ""):
                raise PSInputError(f"staleness does not apply to {sync}")
            return SyncPolicy(sync, 0 if sync == "bsp" else math.inf,
                              0 if sync == "bsp" else math.inf)
        if sync == "ssp":
            s = 3 if staleness in (None, "") else staleness
            if isinstance(s, str) and ":" in s:
                raise PSInputError(f"ssp takes one threshold, got staleness {s!r} (a range is for dssp)")
            try:
                v = int(str(s))
            except ValueError:
                raise PSInputError(f"staleness for ssp must be an integer >= 0, got {s!r}") from None
            if v < 0:
                raise PSInputError(f"staleness for ssp must be >= 0, got {v}")
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
            raise PSInputError(f"staleness for {sync} must be a range lo:hi such as 3:15, got {raw!r}") from None
        if lo < 0 or hi < lo:
            raise PSInputError(f"staleness range for {sync} needs 0 <= lo <= hi, got {lo}:{hi}")
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


class PSConfig(ConfigModel):
    """Blueprint of one parameter-server run (validated; nothing about runtime state).

    Loaded like every config (:mod:`elastic_ring.config.base`): ``load(PSConfig, path, sets)``.

    Attributes:
        sync, staleness: the paradigm (see :meth:`SyncPolicy.parse`); staleness ``"3"`` / ``"3:15"``
            (a YAML number or list ``[3, 15]`` is read as such).
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

    sync: Sync = "asp"
    staleness: Str = ""
    workers: Int = Field(2, ge=1)
    slowdown: FloatTuple = ()
    noise: Float = Field(0.0, ge=0, le=2)
    base_step_s: Float = Field(0.0, ge=0)
    depth: ResNetDepth = 8
    width: Int = Field(8, ge=1)
    dataset: Dataset = "digits"
    data_dir: Str = "data"
    synthetic_size: Int = Field(2048, ge=1)
    batch_size: Int = Field(32, ge=1)
    augment: Bool = False
    lr: Float = Field(0.05, gt=0)
    momentum: Float = Field(0.9, ge=0, lt=1)
    weight_decay: Float = Field(1e-4, ge=0)
    seed: Int = 0
    time_budget_s: Float = Field(60.0, ge=0)
    max_pushes: Int = Field(0, ge=0)
    stop_accuracy: Float = Field(0.0, ge=0, le=1)
    eval_every_s: Float = Field(1.0, ge=0)
    eval_every_updates: Int = Field(0, ge=0)
    max_test_samples: Int = Field(0, ge=0)
    eval_deferred: Bool = False
    clock: Literal["wall", "virtual"] = "wall"
    model: Literal["resnet", "mlp"] = "resnet"

    @field_validator("sync", mode="before")
    @classmethod
    def _lower(cls, v: Any) -> Any:
        return v.lower() if isinstance(v, str) else v

    @field_validator("staleness", mode="before")
    @classmethod
    def _staleness(cls, v: Any) -> Any:
        if v is None:
            return ""
        if isinstance(v, (list, tuple)):
            return ":".join(str(x) for x in v)
        return v

    @field_validator("slowdown")
    @classmethod
    def _factors(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if any(not (f >= 1.0 and math.isfinite(f)) for f in v):
            raise ValueError(f"factors must be finite and >= 1.0, got {list(v)}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "PSConfig":
        try:
            self.policy  # validates sync and staleness together
        except PSInputError as e:
            raise ValueError(str(e)) from None
        if self.slowdown and len(self.slowdown) != self.workers:
            raise ValueError(f"slowdown has {len(self.slowdown)} factor(s) for {self.workers} worker(s)")
        if not (self.time_budget_s or self.max_pushes or self.stop_accuracy):
            raise ValueError("no stop condition: set time_budget_s, max_pushes or stop_accuracy")
        if not (self.eval_every_s or self.eval_every_updates):
            raise ValueError("set eval_every_s or eval_every_updates")
        if self.clock == "virtual" and not self.base_step_s:
            raise ValueError("clock virtual needs base_step_s > 0 (the emulated step length)")
        if self.eval_deferred and self.stop_accuracy:
            raise ValueError("stop_accuracy needs evaluation during the run (eval_deferred: false)")
        return self

    @property
    def policy(self) -> SyncPolicy:
        return SyncPolicy.parse(self.sync, self.staleness or None)

    @property
    def slowdowns(self) -> tuple[float, ...]:
        return self.slowdown or (1.0,) * self.workers

    def to_dict(self) -> dict[str, Any]:
        """JSON-able values with ``slowdown`` spelled out per worker (``ps_config.json``)."""
        return super().to_dict() | {"slowdown": list(self.slowdowns)}


def config_from_dict(values: Mapping[str, Any], source: str = "config") -> PSConfig:
    """``build(PSConfig, values, source)``: a PSConfig from a mapping (``ps_config.json``).

    Raises:
        ConfigError: unknown key, wrong type or invalid value, in one line.
    """
    return build(PSConfig, values, source)


def build_config(config: str | None, sets: tuple[str, ...], **flags):
    """A job's settings: the YAML file ``config``, then ``--set key=value`` (``sets``), then the
    command's own flags (``None``: not given). Raises a UserError (a ConfigError) naming the problem."""
    from elastic_ring.config.base import load, parse_overrides, read_yaml

    if config and {"paradigms", "seeds", "targets", "out", "base", "heterogeneity", "references"} & set(read_yaml(config)):
        raise ConfigError(f"{config} looks like an experiment design; use `elastic-ring ps experiment --config`")
    if flags.get("sync") is not None and flags.get("staleness") is None:
        flags["staleness"] = ""  # a file's staleness belongs to the file's sync
    return load(PSConfig, config, parse_overrides(sets) | {k: v for k, v in flags.items() if v is not None})
