"""Event records: one frozen dataclass per kind, one JSON object per line in ``events.jsonl``.

Every event carries ``kind`` (its type name) and ``time`` (Unix seconds, wall clock). Writers
append whole lines with a single ``write`` and flush, so a crash leaves at most one truncated last
line, which :func:`read_events` skips. Other subsystems (the parameter server) define their own
kinds with :func:`register` and use the same writer and reader.

Reading back goes through the same registry: :func:`read_events` (and :func:`as_event` for one
line) gives the typed record of each line's kind, so readers test ``isinstance(e, Launch)`` and
read ``e.world_size``. A run folder written by an older or newer version still reads: a field the
record does not declare is kept in ``extra``, a declared field the line lacks reads as None (its
default, when it has one), and a kind nobody registered comes back as :class:`UnknownEvent`.
Records also answer ``e["field"]`` and ``e.get("field")``, as the dicts they were before, for the
callers not yet converted; new code reads attributes.

Kinds of ``elastic-ring train`` (in the order a run emits them)::

    launch -> first_step -> throughput* -> resize_requested -> checkpoint_written -> segment_end
      -> workers_exited -> relaunched -> first_step_after_resize -> resize_overhead
      -> throughput* ... -> evaluation -> finished        (error at any point)

and after a worker's death: (``stalled`` when the watchdog found it hung) ``restart`` (cause, first failed rank, steps to redo) -> launch ->
first_step -> ``recovered`` (time lost). Each resize and restart the controller goes on with is also
one ``membership_change`` (its cause and where the next ring's state comes from).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Iterator, Mapping

_REGISTRY: dict[str, type["Event"]] = {}


def register(cls: type["Event"]) -> type["Event"]:
    """Class decorator: declare an event kind (its name must be unique across subsystems)."""
    other = _REGISTRY.get(cls.kind)
    if other is not None and other.__qualname__ != cls.__qualname__:
        raise ValueError(f"event kind {cls.kind!r} is declared twice ({other.__qualname__}, {cls.__qualname__})")
    _REGISTRY[cls.kind] = cls
    return cls


@dataclass(frozen=True)
class Event:
    """The base of every kind: ``time`` (Unix seconds) and ``extra``, the fields of a line read
    back that this version's record does not declare (empty for a record made here)."""

    kind: ClassVar[str] = "event"
    time: float = field(default_factory=time.time, kw_only=True)
    extra: dict[str, Any] = field(default_factory=dict, kw_only=True, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of the line: ``kind``, ``time``, the declared fields, then ``extra``."""
        d = dataclasses.asdict(self)
        extra = d.pop("extra")
        return {"kind": self.kind, **d, **extra}

    @classmethod
    def _view_fields(cls) -> frozenset[str]:
        return _declared(cls)

    # the dict view: what reading the line as a dict gave (callers not yet converted)
    def __getitem__(self, key: str) -> Any:
        if key == "kind":
            return self.kind
        if key in self._view_fields():
            return getattr(self, key)
        return self.extra[key]

    def get(self, key: str, default: Any = None) -> Any:
        try:
            return self[key]
        except KeyError:
            return default

    def __contains__(self, key: object) -> bool:
        return key == "kind" or key in self._view_fields() or key in self.extra

    def keys(self) -> list[str]:
        return list(self.to_dict())

    def items(self) -> list[tuple[str, Any]]:
        return list(self.to_dict().items())

    def values(self) -> list[Any]:
        return list(self.to_dict().values())

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())


@functools.cache
def _declared(cls: type[Event]) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls) if f.name != "extra")


@dataclass(frozen=True)
class UnknownEvent(Event):
    """A line of a kind not registered in this process (a newer version's, or a subsystem's whose
    module was not imported): its kind in ``name``, its fields in ``extra``."""

    name: str = "?"

    @property
    def kind(self) -> str:  # type: ignore[override]
        return self.name

    @classmethod
    def _view_fields(cls) -> frozenset[str]:
        return frozenset({"time"})

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.name, "time": self.time, **self.extra}


@register
@dataclass(frozen=True)
class Launch(Event):
    kind: ClassVar[str] = "launch"
    segment: int
    world_size: int
    start_step: int
    stop_step: int
    command: list[str]
    device: str
    prelaunched_s: float = 0.0  # processes started this long before the go (pre-launch)
    session_start: bool = False  # the first launch of a controller (a new run, or a --resume)


@register
@dataclass(frozen=True)
class FirstStep(Event):
    kind: ClassVar[str] = "first_step"
    segment: int
    world_size: int
    step: int
    since_launch_s: float  # worker's own measure: the launcher's start (else its process's) to first step done
    lr: float
    phases: dict[str, float] = field(default_factory=dict)  # seconds per start-up phase (they sum to it)
    # after a restore at another world size: the LR rule applied ("linear", "sqrt", "none",
    # "auto:<rule>" for the script's own, "on_resize", "adasum") and the LR it left in the
    # optimizer (``lr`` differs where the script then set its own)
    rule: str | None = None
    lr_rule: float | None = None


@register
@dataclass(frozen=True)
class Throughput(Event):
    kind: ClassVar[str] = "throughput"
    segment: int
    world_size: int
    step: int  # last step of the window
    steps: int
    seconds: float
    images_per_s: float
    steps_per_s: float
    loss: float
    lr: float
    epoch: int
    telemetry: dict[str, Any] = field(default_factory=dict)


@register
@dataclass(frozen=True)
class ResizeRequested(Event):
    kind: ClassVar[str] = "resize_requested"
    from_workers: int
    to_workers: int
    source: str  # "schedule" | "live" | "policy" (the cluster's scheduler) | "joiner" (a failed one's place: --survive)
    at_step: int | None = None


@register
@dataclass(frozen=True)
class CheckpointWritten(Event):
    kind: ClassVar[str] = "checkpoint_written"
    step: int
    path: str
    seconds: float
    bytes: int
    world_size: int
    lr: float
    stall_s: float = 0.0  # time the training thread spent on it (the copy off the device, waits)
    background: bool = False  # a periodic checkpoint written while training went on


@register
@dataclass(frozen=True)
class SegmentEnd(Event):
    kind: ClassVar[str] = "segment_end"
    segment: int
    world_size: int
    step: int
    reason: str  # "scheduled" | "requested" | "finished"
    lr: float
    stop_decided_at: float  # wall time the ranks agreed to stop (after the last step)


@register
@dataclass(frozen=True)
class WorkersExited(Event):
    kind: ClassVar[str] = "workers_exited"
    segment: int
    world_size: int
    returncode: int


@register
@dataclass(frozen=True)
class Relaunched(Event):
    kind: ClassVar[str] = "relaunched"
    segment: int
    from_workers: int
    to_workers: int
    step: int  # last completed step; training continues at step + 1
    lr_last: float
    lr_new: float  # the LR the first step after the resize ran with (built-in model: Eq. 7 of lr_last)
    rule: str | None = None  # a script's: the LR rule applied (FirstStep.rule)
    lr_rule: float | None = None  # a script's: the LR that rule gave (lr_new differs: the script set it)


@register
@dataclass(frozen=True)
class FirstStepAfterResize(Event):
    kind: ClassVar[str] = "first_step_after_resize"
    segment: int
    world_size: int
    step: int
    lr: float
    since_launch_s: float
    # a new worker in a failed one's place (--survive): the failure seen -> this step (the job back at
    # its size), and how the joiner got the state ("broadcast": from a live peer, not from disk)
    since_failure_s: float | None = None
    joiner: str | None = None


@register
@dataclass(frozen=True)
class ResizeOverhead(Event):
    """The breakdown of one resize, all in seconds.

    stop_latency_s: request to all workers exited (for a scheduled resize the request is the moment
        the ranks finish the resize step).
    checkpoint_s: the checkpoint write (included in stop_latency_s).
    relaunch_to_first_step_s: horovodrun started again to the first step at the new size done.
    total_lost_s: request to first step after the resize done, minus one step at the new size's
        steady-state step time: the time not spent training, against not resizing.
    """

    kind: ClassVar[str] = "resize_overhead"
    from_workers: int
    to_workers: int
    step: int
    stop_latency_s: float
    checkpoint_s: float
    relaunch_to_first_step_s: float
    total_lost_s: float
    steady_step_s: float


@register
@dataclass(frozen=True)
class Evaluation(Event):
    kind: ClassVar[str] = "evaluation"
    step: int
    test_loss: float
    test_accuracy: float
    samples: int


@register
@dataclass(frozen=True)
class Finished(Event):
    """The end of the schedule. wall_s: the time the run ran, from its first launch to the end
    without the time between a stop (Ctrl-C, a dead controller) and its resume; elapsed_s: from
    its first launch to the end, that time included."""

    kind: ClassVar[str] = "finished"
    step: int
    wall_s: float
    train_loss: float | None
    test_accuracy: float | None
    test_loss: float | None
    elapsed_s: float | None = None


@register
@dataclass(frozen=True)
class Restart(Event):
    """A segment failed; the controller restarts the workers from the last checkpoint (or gives
    up: ``gave_up``), or the survivors go on from a step they hold in memory (``path`` "memory";
    ``from_step`` is that step). ``time`` is when the failure was detected."""

    kind: ClassVar[str] = "restart"
    attempt: int  # consecutive failures so far, this one included
    cause: str
    rank: int | None  # the rank that failed first (the others die of its absence)
    returncode: int | None
    segment: int
    world_size: int
    from_step: int  # the checkpoint the restart resumes from (0: none)
    failed_at_step: int  # the last step known done before the failure
    steps_redone: int
    new_world_size: int
    gave_up: bool = False
    node: str | None = None  # where the first failure happened, when the backend knows (Ray)
    path: str = "disk"  # "memory": the survivors went on from the step they hold in memory (--survive)
    memory_refused: str | None = None  # under --survive, why the survivors did not go on from memory


@register
@dataclass(frozen=True)
class MembershipChanged(Event):
    """The controller acted on a change of the job's members (``controller.membership``): its cause
    (schedule, live, joiner, failure, stall, lost_host), the step the state that goes on is at,
    the workers before and after, and where the state comes from (memory, peer, checkpoint).
    ``time`` is when the change was asked or the failure seen; ``segment`` the one that ended."""

    kind: ClassVar[str] = "membership_change"
    cause: str
    step: int
    members_before: int
    members_after: int
    state_source: str
    segment: int


@register
@dataclass(frozen=True)
class Stalled(Event):
    """The stall watchdog found a job making no step (``controller.watchdog``); a ``restart``
    follows. ``idle_s``: controller time since the last step it saw (or the launch)."""

    kind: ClassVar[str] = "stalled"
    segment: int
    last_step: int
    idle_s: float
    allowed_s: float
    ranks: list[int]  # blamed (empty: none stands out)
    why: str


@register
@dataclass(frozen=True)
class Recovered(Event):
    """The first step after a restart.

    detect_to_first_step_s: failure detected to the first step done again.
    time_lost_s: last progress before the failure to the first step after it, plus the steps to
        redo at the latest steady step time: the time not spent on new steps.
    """

    kind: ClassVar[str] = "recovered"
    attempt: int
    segment: int
    world_size: int
    step: int
    from_step: int
    steps_redone: int
    detect_to_first_step_s: float
    time_lost_s: float
    path: str = "disk"  # "memory": the survivors went on from the step they hold in memory (--survive)


@register
@dataclass(frozen=True)
class ErrorEvent(Event):
    kind: ClassVar[str] = "error"
    message: str
    rank: int | None = None
    segment: int | None = None


@register
@dataclass(frozen=True)
class HostsChanged(Event):
    """Host discovery (``--host-discovery-script``) changed the usable hosts: ``diff`` what changed
    (``+b:1 -a:2 c:1->4``), ``hosts`` the usable hosts now (``a:2,b:1``, in rank order), ``slots``
    their slots, ``target`` the size the job goes to (None: below ``--min-workers``, it waits)."""

    kind: ClassVar[str] = "hosts_changed"
    diff: str
    hosts: str
    slots: int
    target: int | None = None
    segment: int | None = None


@register
@dataclass(frozen=True)
class SurviveChoice(Event):
    """Whether the run keeps survivors after a failure (``controller.survive_choice``): ``on``,
    ``why`` (the line's reason), ``ratio`` (the dearest rank's state copy over its step, where
    measured: the default's), ``forced`` (``--survive`` or ``--no-survive``). None for ``on``:
    measuring, the word comes later (a second event)."""

    kind: ClassVar[str] = "survive_choice"
    on: bool | None
    why: str
    ratio: float | None = None
    forced: bool = False


@register
@dataclass(frozen=True)
class Notice(Event):
    """Something a worker decided that the user must know, not a failure (e.g. the restored
    position taken over a script's own resume)."""
    kind: ClassVar[str] = "notice"
    message: str
    rank: int | None = None
    segment: int | None = None


@register
@dataclass(frozen=True)
class PreemptNotice(Event):
    """A worker got a SIGTERM with notice (a preemption: Kubernetes, a spot reclaim, a scheduler):
    it goes on to the next agreed step while the controller shrinks the job off its host
    (``--host-discovery-script`` runs; docs/hosts.md); a second SIGTERM ends it."""

    kind: ClassVar[str] = "preempt_notice"
    rank: int | None = None
    segment: int | None = None
    pid: int = 0
    host: str = ""  # the host's name in the launcher's host list (horovodrun's -H), else its hostname


class EventLog:
    """Append-only JSON-lines writer."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, event: Event | dict[str, Any]) -> None:
        d = event.to_dict() if isinstance(event, Event) else dict(event)
        line = json.dumps(d, separators=(",", ":"), default=_json_default) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


def _json_default(o: Any) -> Any:
    if isinstance(o, Event):
        return o.to_dict()
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, tuple)):
        return list(o)
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def iter_event_dicts(path: str | Path) -> Iterator[dict[str, Any]]:
    p = Path(path)
    if not p.exists():
        return
    with p.open() as f:
        for line in f:
            if not line.endswith("\n"):
                break  # a truncated last line of a crashed writer
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def as_event(d: Mapping[str, Any] | Event) -> Event:
    """The typed record of one event line (see the module docstring for what an older or newer
    line reads as); a record is returned as it is."""
    if isinstance(d, Event):
        return d
    kind = d.get("kind")
    cls = _REGISTRY.get(kind) if isinstance(kind, str) else None
    if cls is None:
        rest = {k: v for k, v in d.items() if k not in ("kind", "time")}
        return UnknownEvent(name=str(kind), time=d.get("time"), extra=rest)
    kw: dict[str, Any] = {}
    declared = set()
    for f in dataclasses.fields(cls):
        if not f.init or f.name == "extra":
            continue
        declared.add(f.name)
        if f.name in d:
            kw[f.name] = d[f.name]
        elif f.name == "time" or (f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING):
            kw[f.name] = None  # not written by the version that wrote the line
    extra = {k: v for k, v in d.items() if k != "kind" and k not in declared}
    return cls(**kw, extra=extra)


def read_events(path: str | Path, kind: str | type[Event] | None = None) -> list[Event]:
    """All events of a file as typed records (:func:`as_event`), in order; with ``kind`` (a record
    class, or a kind's name) only those of that kind."""
    name = kind if isinstance(kind, str) or kind is None else kind.kind
    return [as_event(d) for d in iter_event_dicts(path) if name is None or d.get("kind") == name]
