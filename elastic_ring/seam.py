"""The controller's word to its workers, typed: what a worker is told between its launch and its
exit, and the files of the run folder both sides share for it (torch-free, as :mod:`elastic_ring.protocol`).

- :class:`Start`: a worker's launch (the worker entry's command line): its segment, stop step, owner
  and go file;
- :class:`Action`: the in-place action (``control/inplace-<seg>.json``, :func:`action_file`), the
  controller's word to paused in-place workers at the end of a segment (``--relaunch inplace``,
  the Ray backend): exit, or resize to a new ring (its segment, stop step, members' environments,
  the survivors' rollback step, the joiners' go records of one written ahead);
- :class:`Go`: the go record of a pre-launched worker or a warm spare (``control/go-<seg>``,
  :func:`elastic_ring.protocol.go_file`, or a spare's own file): its stop step, and a spare's place;
- the survivor records (``control/survivor-<member>.json``, :func:`survivor_file`) in which the
  survivors of a failure (``--survive``) say which steps they hold in memory, and the rule that
  decides from them whether they go on (:func:`agreement`).

Each record is written by ``to_json`` and read by ``from_json`` (a :class:`Start`: ``args`` and
``from_args``), here only. A record carries the
``version`` of its format: one without (written before the version was) is version 1, which is
the same format; a record of a version this elastic-ring does not know is refused with one line
(:class:`SeamError`), not half understood.

The stop step a worker runs to comes from here alone: its launch's :class:`Start`, a pre-launched
worker's :class:`Go`, a ring re-formed in place's :class:`Action`. The run's settings (``run.json``'s
``worker`` entry) join the :class:`Start` in :class:`elastic_ring.protocol.LaunchInfo`; the variables
a launcher sets are read by :mod:`elastic_ring.env`.
"""

from __future__ import annotations

import argparse
import enum
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elastic_ring import protocol

VERSION = 1  # the format written; records without a version are version 1 (the same keys)
AT_NEXT_STOP = 0  # an action's at_step: written ahead for the segment's next stop, whichever step it lands at


class SeamError(ValueError):
    """A record of the controller's word in a format this elastic-ring does not read."""


def _check_version(d: dict[str, Any], what: str) -> int:
    v = d.get("version", 1)
    if v != VERSION:
        raise SeamError(f"{what} has format version {v!r}; this elastic-ring reads version {VERSION} "
                        f"(the controller and its workers run different elastic-ring versions)")
    return v


# ---------------------------------------------------------------------- a segment's launch
@dataclass(frozen=True)
class Start:
    """The controller's word to a worker process at its launch: the ``segment`` it runs and the step
    it stops at (``stop_at``; a pre-launched worker's comes again with its :class:`Go`, a ring
    re-formed in place gets its next one from an :class:`Action`), the controller that owns it
    (``owner``, ``controller_pid``, ``controller_host``) and the go file a pre-launched worker or a
    warm spare waits for (``go_file``; a spare's ``segment`` is -1: its own comes with its go).

    It travels on the worker entry's command line, which every launcher hands each process it starts
    (horovodrun, Horovod Elastic's driver, the local launcher, a Ray actor's ``run``): :meth:`args`
    writes it, :meth:`from_args` reads it back (after :meth:`add_arguments`), here only; the entry
    hands it to the worker library in the process (``worker.session``), not through the environment.
    Arguments without ``--seam-version`` are version 1 (the same arguments)."""

    segment: int
    stop_at: int
    owner: str = ""
    go_file: Path | None = None
    controller_pid: int = 0
    controller_host: str = ""
    version: int = VERSION

    def args(self) -> list[str]:
        """The worker entry's arguments that carry it."""
        out = ["--segment", str(self.segment), "--stop-at", str(self.stop_at), "--owner", self.owner,
               "--controller-pid", str(self.controller_pid), "--controller-host", self.controller_host]
        if self.go_file is not None:
            out += ["--go-file", str(self.go_file)]
        if self.version != 1:
            out += ["--seam-version", str(self.version)]
        return out

    @staticmethod
    def add_arguments(parser: Any) -> None:
        """Its arguments, on the worker entry's ``argparse`` parser."""
        parser.add_argument("--segment", required=True, type=int)
        parser.add_argument("--stop-at", required=True, type=int)
        parser.add_argument("--owner", default="")
        parser.add_argument("--go-file", type=Path, default=None)
        parser.add_argument("--controller-pid", type=int, default=0)
        parser.add_argument("--controller-host", default="")
        parser.add_argument("--seam-version", type=int, default=1, help=argparse.SUPPRESS)

    @classmethod
    def from_args(cls, ns: Any) -> "Start":
        """The record the parsed arguments ``ns`` carry.

        Raises:
            SeamError: a version this elastic-ring does not read.
        """
        _check_version({"version": ns.seam_version}, "a worker's launch arguments")
        return cls(ns.segment, ns.stop_at, ns.owner, ns.go_file, ns.controller_pid, ns.controller_host)


# ---------------------------------------------------------------------- go records
@dataclass(frozen=True)
class Go:
    """The go of a pre-launched worker (its segment's ``stop_at``; written when the controller
    releases it) or of a warm joiner, which also brings its place in the ring: the slot's Horovod
    (or torchrun) ``env`` and the segment of the pid record it writes then (``pid_segment``)."""

    stop_at: int
    time: float = 0.0
    env: dict[str, str] | None = None
    pid_segment: int | None = None
    version: int = VERSION

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"stop_at": self.stop_at, "time": self.time}
        if self.env is not None:
            d["env"] = dict(self.env)
        if self.pid_segment is not None:
            d["pid_segment"] = self.pid_segment
        d["version"] = self.version
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Go":
        _check_version(d, "a go record")
        env = d.get("env")
        return cls(int(d["stop_at"]), float(d.get("time", 0.0)),
                   {k: str(v) for k, v in env.items()} if env else None,
                   int(d["pid_segment"]) if d.get("pid_segment") is not None else None)


def write_go(path: Path, go: Go) -> None:
    """Release the worker waiting for ``path`` (atomically)."""
    protocol.write_json_atomic(Path(path), go.to_json())


def read_go(path: Path) -> Go | None:
    """The go record at ``path``, or None while there is none (or it is being written)."""
    rec = protocol.read_json(path)
    return Go.from_json(rec) if isinstance(rec, dict) and "stop_at" in rec else None


# ---------------------------------------------------------------------- in-place actions
class ActionKind(str, enum.Enum):
    RESIZE = "resize"  # re-form the ring (``world`` members) and run segment ``segment`` up to ``stop_at``
    EXIT = "exit"  # checkpoint and leave (a Ctrl-C)


@dataclass(frozen=True)
class Action:
    """The controller's word to paused in-place workers at the end of a segment (see the module
    docstring). A resize names the new ring's size (``world``, the file's ``to``), ``segment`` and
    ``stop_at``, and what the backend adds: each member's environment (``members``: member name ->
    its variables), the discovery file's change it refers to (``hosts_written``, Horovod Elastic),
    the step the survivors of a failure roll back to (``rollback_to``). One written *ahead* (before
    the pause, for a scheduled resize) names the step it applies at (``at_step``) and its joiners'
    go records (``go_files``: path -> :class:`Go`): rank 0 takes it only at a scheduled stop at
    that step, by renaming the file (:func:`take_ahead_action`); one written ahead of a stop asked
    while the segment trains (a shrink: a host dropped or drained) names :data:`AT_NEXT_STOP`, and
    rank 0 takes it at whichever step that stop lands."""

    kind: ActionKind
    time: float = 0.0
    world: int | None = None
    segment: int | None = None
    stop_at: int | None = None
    members: dict[str, dict[str, str]] | None = None
    at_step: int | None = None
    go_files: dict[str, Go] = field(default_factory=dict)
    hosts_written: float | None = None
    rollback_to: int | None = None
    version: int = VERSION

    @classmethod
    def resize(cls, launch: Any, t: float, **extra: Any) -> "Action":
        """The resize to ``launch`` (a :class:`~elastic_ring.controller.backends.api.SegmentLaunch`:
        its ``world``, ``segment``, ``stop_at``) decided at ``t``, with the backend's ``extra``."""
        return cls(ActionKind.RESIZE, t, launch.world, launch.segment, launch.stop_at, **extra)

    @classmethod
    def exit(cls, t: float) -> "Action":
        return cls(ActionKind.EXIT, t)

    @property
    def is_resize(self) -> bool:
        return self.kind is ActionKind.RESIZE

    @property
    def is_exit(self) -> bool:
        return self.kind is ActionKind.EXIT

    @property
    def ahead(self) -> bool:
        """Written ahead of the pause (a scheduled resize): taken only by a rename."""
        return self.at_step is not None

    def member_env(self, member: str) -> dict[str, str] | None:
        """The environment the new ring gives ``member``; None: it is left out (it retires)."""
        return (self.members or {}).get(member)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"action": self.kind.value}
        if self.is_resize:
            d.update(to=self.world, segment=self.segment, stop_at=self.stop_at)
        d["time"] = self.time
        for k in ("members", "at_step", "hosts_written", "rollback_to"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        if self.go_files:
            d["go_files"] = {p: g.to_json() for p, g in self.go_files.items()}
        d["version"] = self.version
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Action":
        """The action a file holds (also one written before records had a version).

        Raises:
            SeamError: a version this elastic-ring does not read, or no known ``action``.
        """
        _check_version(d, "an in-place action")
        try:
            kind = ActionKind(d.get("action"))
        except ValueError:
            raise SeamError(f"an in-place action of unknown kind {d.get('action')!r}") from None

        def num(k: str, t: type) -> Any:
            return t(d[k]) if d.get(k) is not None else None

        return cls(kind, float(d.get("time", 0.0)), num("to", int), num("segment", int), num("stop_at", int),
                   d.get("members"), num("at_step", int),
                   {p: Go.from_json(g) for p, g in (d.get("go_files") or {}).items()},
                   num("hosts_written", float), num("rollback_to", int))


def action_file(run_dir: Path, segment: int) -> Path:
    """The controller's word to paused in-place workers at the end of ``segment`` (:class:`Action`)."""
    return protocol.control_dir(Path(run_dir)) / f"inplace-{segment}.json"


def taken_action_file(run_dir: Path, segment: int) -> Path:
    """Where rank 0 moves an action written ahead when it takes it."""
    return protocol.control_dir(Path(run_dir)) / f"inplace-{segment}.taken.json"


def withdrawn_action_file(run_dir: Path, segment: int) -> Path:
    """Where the controller moves an action written ahead when it withdraws it."""
    return protocol.control_dir(Path(run_dir)) / f"inplace-{segment}.withdrawn.json"


def write_action(run_dir: Path, segment: int, action: Action) -> None:
    """Write the controller's word for the end of ``segment`` (atomically)."""
    protocol.write_json_atomic(action_file(run_dir, segment), action.to_json())


def read_action(run_dir: Path, segment: int) -> Action | None:
    """The controller's word for the end of ``segment``, or None while there is none.

    Raises:
        SeamError: it is in a format this elastic-ring does not read.
    """
    rec = protocol.read_json(action_file(run_dir, segment))
    return Action.from_json(rec) if isinstance(rec, dict) else None


def write_resize_action(run_dir: Path, segment: int, launch: Any, t: float, **extra: Any) -> None:
    """Write the resize to ``launch`` for the end of ``segment`` (:meth:`Action.resize`)."""
    write_action(run_dir, segment, Action.resize(launch, t, **extra))


def write_exit_action(run_dir: Path, segment: int, t: float) -> None:
    """Ask the paused workers of ``segment`` to checkpoint and leave."""
    write_action(run_dir, segment, Action.exit(t))


def _rename_if_there(src: Path, dst: Path) -> bool:
    """``src`` renamed to ``dst``: True, or False when ``src`` is gone (the other side renamed it
    first). One rename of one file: one winner."""
    try:
        os.rename(src, dst)
    except FileNotFoundError:
        return False
    return True


def withdraw_action_ahead(run_dir: Path, segment: int) -> bool:
    """Withdraw the in-place action the controller wrote ahead for ``segment`` (renamed aside, so
    rank 0 never takes it): True when withdrawn, False when rank 0 has taken it already (the file
    is gone)."""
    return _rename_if_there(action_file(run_dir, segment), withdrawn_action_file(run_dir, segment))


def take_ahead_action(run_dir: Path, segment: int) -> bool:
    """Rank 0 takes the action written ahead for ``segment`` (True), unless the controller
    withdrew it first (the file is gone: False)."""
    return _rename_if_there(action_file(run_dir, segment), taken_action_file(run_dir, segment))


# ---------------------------------------------------------------------- survivor records
MAX_COST = 0.02  # the survive default keeps survivors where the copy costs at most this fraction of a step


def cost_file(run_dir: Any, member: str) -> Any:
    """Where a rank writes what its survive copy costs against its step (``worker.survive.CostMeter``)."""
    return protocol.control_dir(run_dir) / f"survive-cost-{member}.json"


def choice_file(run_dir: Any) -> Any:
    """Where the controller writes its word on the survive default's measurement: ``{"on": bool, ...}``."""
    return protocol.control_dir(run_dir) / "survive.json"


def survivor_file(run_dir: Path, member: str) -> Path:
    """Where a survivor says which steps it holds (``{"member", "rank", "held", "pid", "time",
    "segment", "step", "error", "digests"}``, a sharded model's with ``"shards"``: ``{"world",
    "ranks"}``, whose shards its copies hold: :func:`elastic_ring.worker.survive.rollback_word`)."""
    return protocol.control_dir(Path(run_dir)) / f"survivor-{member}.json"


def common_step(held: list[list[int]]) -> int | None:
    """The step every survivor can roll back to: the largest one in every survivor's list of held
    steps; None when there is no survivor or no step they all hold (the disk checkpoint then)."""
    if not held:
        return None
    common = set(held[0]).intersection(*map(set, held[1:]))
    return max(common) if common else None


def agreement(records: list[dict[str, Any]], silent: int = 0, gone: int = 1) -> tuple[int | None, str | None]:
    """Whether the survivors whose records (:func:`survivor_file`) are ``records`` go on from memory:
    ``(step, None)``, the step they roll back to, or ``(None, why not)``, the restart's
    ``memory_refused``. ``silent`` workers neither spoke nor are gone, ``gone`` workers are. The
    step is :func:`common_step` of what they hold, where every survivor that gave a fingerprint of
    that step's copy (:func:`elastic_ring.worker.survive.state_digest`) gave the same one: a
    survivor whose state is not the others' is broken, and which one is right is not known; and
    where they hold a sharded model's replicas (``shards``), where they hold every rank's shards."""
    if silent:
        return None, f"{silent} worker(s) neither said which steps they hold nor were gone within the wait"
    if not records:
        return None, "no survivor is left"
    if not gone:
        return None, "no worker is gone"
    step = common_step([list(r.get("held") or []) for r in records])
    if step is None:
        held = "; ".join(str(sorted(r.get("held") or [])) for r in records)
        return None, f"the survivors hold no step in common (they hold {held})"
    prints = {r["digests"].get(str(step)) for r in records if isinstance(r.get("digests"), dict)}
    prints.discard(None)
    if len(prints) > 1:
        return None, f"the survivors' copies of step {step} differ (one's state is not the others')"
    shards = [r["shards"] for r in records if isinstance(r.get("shards"), dict)]
    if shards:  # a sharded model's replicas (worker.sharded.Replica): every old rank's shards held by one
        world = max(int(x.get("world") or 0) for x in shards)
        missing = sorted(set(range(world)) - {int(k) for x in shards for k in x.get("ranks") or ()})
        if missing:
            return None, (f"the survivors hold no copy of the shards of rank(s) {missing} of {world} (a sharded "
                          "model: more than one failure)")
    return step, None


def agreed_step(records: list[dict[str, Any]]) -> int | None:
    """The step survivors with these records roll back to, or None (:func:`agreement`)."""
    return agreement(records)[0]
