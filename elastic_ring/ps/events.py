"""Event kinds of ``elastic-ring ps`` (same JSON-lines format and writer as ``train``).

Order in a run's ``events.jsonl`` (all written by the server, rank 0)::

    ps_launch -> (ps_push [ps_controller] [ps_hold] [ps_release]* | ps_accuracy)*
              -> ps_accuracy* (eval_deferred: every evaluation, after the run)
              -> ps_worker_summary (one per worker) -> ps_finished          (error at any point)

The records are keyword-only (``PSHold(t=..., worker=..., push=..., gap=...)``), so a field added
or reordered cannot shift the others' values. Times: ``t`` is seconds since the server started
serving (after every rank loaded its data and model); ``time`` is the Unix wall clock of the
write, as in every event.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from elastic_ring.events.api import Event, register


@register
@dataclass(frozen=True, kw_only=True)
class PSLaunch(Event):
    kind: ClassVar[str] = "ps_launch"
    sync: str
    label: str
    lower: float
    upper: float
    controller: str | None
    workers: int
    slowdown: list[float]
    config: dict[str, Any]
    parameters: int


@register
@dataclass(frozen=True, kw_only=True)
class PSPush(Event):
    """One applied gradient. staleness = version_applied - version_pulled."""

    kind: ClassVar[str] = "ps_push"
    t: float
    worker: int
    push: int  # t_p after this push
    t_min: int
    gap: int
    action: str  # ok_allowance | ok_within | ok_controller | hold
    allowance_left: int
    version_pulled: int
    version_applied: int  # server version the gradient was applied to (before the update)
    staleness: int
    loss: float
    compute_s: float
    sleep_s: float
    target_s: float = 0.0  # the padded step length (base_step_s * slowdown * noise factor; 0: no base)


@register
@dataclass(frozen=True, kw_only=True)
class PSController(Event):
    kind: ClassVar[str] = "ps_controller"
    t: float
    worker: int
    controller: str
    t_p: int
    t_slowest: int
    r: int
    r_cap: int
    reason: str
    objective: list[float] = field(default_factory=list)
    a_p: float | None = None
    i_p: float | None = None
    a_s: float | None = None
    i_s: float | None = None


@register
@dataclass(frozen=True, kw_only=True)
class PSHold(Event):
    kind: ClassVar[str] = "ps_hold"
    t: float
    worker: int
    push: int
    gap: int


@register
@dataclass(frozen=True, kw_only=True)
class PSRelease(Event):
    """A held worker sent OK; ``gap`` is its gap at release (the bound the paradigm promises)."""

    kind: ClassVar[str] = "ps_release"
    t: float
    worker: int
    held_s: float
    gap: int
    by: int  # the worker whose push released it


@register
@dataclass(frozen=True, kw_only=True)
class PSAccuracy(Event):
    kind: ClassVar[str] = "ps_accuracy"
    t: float
    version: int
    test_accuracy: float
    test_loss: float
    pushes: dict[str, int]
    eval_s: float


@register
@dataclass(frozen=True, kw_only=True)
class PSWorkerSummary(Event):
    """Per worker. blocked_s: the worker's own time from sending a push to getting OK (transfer,
    apply and hold); held_s: the server's hold time alone. overruns: steps whose compute exceeded
    the padded target (their length depended on the machine's load)."""

    kind: ClassVar[str] = "ps_worker_summary"
    worker: int
    slowdown: float
    pushes: int
    compute_s: float
    sleep_s: float
    blocked_s: float
    held_s: float
    wall_s: float
    max_staleness: int
    mean_staleness: float
    overruns: int = 0
    max_compute_s: float = 0.0


@register
@dataclass(frozen=True, kw_only=True)
class PSFinished(Event):
    kind: ClassVar[str] = "ps_finished"
    reason: str  # "time_budget" | "max_pushes" | "stop_accuracy"
    wall_s: float
    version: int
    pushes: dict[str, int]
    max_release_gap: int
    max_push_gap: int
    max_staleness: int
    release_bound: float | None  # None: unbounded (asp, paper dssp)
    test_accuracy: float | None
    best_accuracy: float | None
    clock: str = "wall"  # wall: t and wall_s are real seconds; virtual: emulated seconds
    real_s: float | None = None  # real seconds the serving took (either clock)
