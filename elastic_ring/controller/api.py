"""Value types of the controller: the run's blueprint (``RunSpec``), its resize ``Plan`` and its
lifecycle (``RunState``: the one vocabulary of a run's state).

``RunState`` is what the controller is in, writes to ``controller.json`` (``state``) and what
`status`, `runs`, `resize`, `jobs` and the cluster's web page say of a run; its transitions (one
monitor loop in ``Controller.run`` acts on them; ``TRANSITIONS`` is the table the controller
enforces)::

    STARTING -> RUNNING                        (the first launch's workers made their first step)
    RUNNING -> RESIZING -> RUNNING             (a resize: from its decision, through the stop and
                                                the launch or the re-form in place, to the first
                                                step at the new size)
    STARTING | RUNNING | RESIZING | RESTARTING -> RESTARTING -> RUNNING
                                               (a worker died: from the last checkpoint, or its
                                                survivors from memory; --max-restarts)
    STARTING | RUNNING | RESIZING | RESTARTING -> STOPPING   (Ctrl-C / SIGTERM: the workers checkpoint)
    any live state -> FINISHED | FAILED | STOPPED            (the schedule's end; restarts
                                                exhausted; stopped on purpose or preempted)

``LAUNCHING`` are the states of a launch until its workers' first step (``starting``,
``resizing``, ``restarting``). ``crashed`` is the reader's word for a live state whose controller
is gone (``controller.status``); the controller never writes it. A ``controller.json``, or a
``summary.json``, of an older elastic-ring, whose ``state`` was one of ``pending``, ``launching``,
``succeeded`` or ``interrupted`` (and, later, its user's word in a ``phase`` key), reads as the
state it meant: :meth:`RunState.read`, :meth:`RunState.of_record`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from elastic_ring.controller.membership import Cause
from elastic_ring.errors import UserError


class RunState(str, Enum):
    STARTING = "starting"  # the run's first launch (also: its folder being made), until the first step
    RUNNING = "running"  # workers stepping
    RESIZING = "resizing"  # from a resize's decision to the first step at the new size
    RESTARTING = "restarting"  # failed workers restarted (from the checkpoint, or in memory) until they step
    STOPPING = "stopping"  # asked to stop (Ctrl-C): the workers checkpoint and exit
    FINISHED = "finished"  # the schedule's last step is done
    FAILED = "failed"  # the controller gave up (restarts exhausted, or an error not worth a retry)
    STOPPED = "stopped"  # stopped on purpose (Ctrl-C, SIGTERM, the last worker preempted), or aborted
    CRASHED = "crashed"  # (the reader's) a live state whose controller is gone

    @property
    def live(self) -> bool:
        return self in LIVE

    @classmethod
    def read(cls, word: Any) -> "RunState | None":
        """The state ``word`` names, an older elastic-ring's words included; None: not a state."""
        try:
            return cls(_OLD_WORDS.get(word, word))
        except ValueError:
            return None

    @classmethod
    def of_record(cls, rec: dict[str, Any]) -> "RunState | None":
        """The state of a ``controller.json`` record: its ``state``; one written while the state a
        user saw was kept beside it (a ``phase`` key) by that ``phase``."""
        return cls.read(rec.get("phase")) or cls.read(rec.get("state"))


# the words of controller.json's and summary.json's "state" before the one vocabulary
_OLD_WORDS = {"pending": "starting", "launching": "starting", "succeeded": "finished", "interrupted": "stopped"}

_S = RunState
LIVE = frozenset({_S.STARTING, _S.RUNNING, _S.RESIZING, _S.RESTARTING, _S.STOPPING})
LAUNCHING = frozenset({_S.STARTING, _S.RESIZING, _S.RESTARTING})  # a launch, until its workers' first step
TERMINAL = frozenset({_S.FINISHED, _S.FAILED, _S.STOPPED})
_ENDS = TERMINAL | {_S.STOPPING, _S.RESTARTING}
TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    _S.STARTING: frozenset({_S.RUNNING, _S.RESIZING} | _ENDS),
    _S.RUNNING: frozenset({_S.RESIZING} | _ENDS),
    _S.RESIZING: frozenset({_S.RUNNING, _S.RESIZING} | _ENDS),
    _S.RESTARTING: frozenset({_S.RUNNING, _S.RESIZING} | _ENDS),
    _S.STOPPING: TERMINAL,
    _S.FINISHED: frozenset(),
    _S.FAILED: frozenset(),
    _S.STOPPED: frozenset(),
    _S.CRASHED: frozenset(),
}


class IllegalTransition(RuntimeError):
    """A bug: the controller tried a state change that ``TRANSITIONS`` does not allow."""


def check_transition(old: RunState, new: RunState) -> None:
    if new not in TRANSITIONS[old]:
        raise IllegalTransition(f"run state {old.value} -> {new.value} is not allowed")


@dataclass(frozen=True)
class Resize:
    step: int  # resize after this step completes
    to: int


@dataclass(frozen=True)
class RunSpec:
    """Where and how a run executes (the training recipe itself is the TrainConfig)."""

    run_dir: Path
    workers: int
    schedule: tuple[Resize, ...]
    slots: int
    device: str  # "cpu" | "cuda"
    total_steps: int
    hosts: str | None = None  # "h1:8,h2:8"
    hostfile: str | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    script: str | None = None  # the user's script (None: the built-in ResNet worker)
    script_args: tuple[str, ...] = ()
    checkpoint_every: int = 0  # steps between periodic background checkpoints (0: off)
    checkpoint_every_s: float = 0.0  # seconds between periodic background checkpoints (0: off)
    keep: int = 2  # checkpoints kept
    collective: str = "horovod"  # or "torch" (torch.distributed: the local launcher, no horovodrun)
    cwd: str = ""  # the folder the script's workers run in: where `train` was run ("": this process's)
    lr_scaling: str | None = None  # a script's LR rule at a resize (worker.lr; "auto"); None: the config's
    global_batch: int = 0  # a script's constant global batch (lr_scaling constant-batch)

    def validate(self) -> None:
        """Raises UserError for any request that cannot run (before anything starts)."""
        if self.workers < 1:
            raise UserError(f"--workers must be >= 1, got {self.workers}")
        if self.checkpoint_every < 0 or self.checkpoint_every_s < 0:
            raise UserError("--checkpoint-every and --checkpoint-every-s must be >= 0")
        if self.keep < 1:
            raise UserError(f"--keep must be >= 1, got {self.keep}")
        if self.workers > self.slots:
            raise UserError(f"--workers {self.workers} is more than the {self.slots} slot(s) available"
                            f"{' (declare more with --slots)' if self.device == 'cpu' else ''}")
        prev_step, prev_w = 0, self.workers
        for r in self.schedule:
            if r.to < 1:
                raise UserError(f"cannot resize to {r.to} workers (at step {r.step}): must be >= 1")
            if r.to > self.slots:
                raise UserError(f"cannot resize to {r.to} workers at step {r.step}: only "
                                f"{self.slots} slot(s) available")
            if r.step < 1:
                raise UserError(f"resize step must be >= 1, got {r.step}")
            if r.step >= self.total_steps:
                raise UserError(f"resize at step {r.step} is not before the last step "
                                f"({self.total_steps})")
            if r.step <= prev_step:
                raise UserError(f"resize schedule must have increasing steps ({prev_step} then {r.step})")
            if r.to == prev_w:
                raise UserError(f"resize at step {r.step} to {r.to} workers: the job already has {r.to}")
            prev_step, prev_w = r.step, r.to


@dataclass
class Plan:
    """The world size at every step: the initial size, then each resize ``(step, to, source)``
    (scheduled, live, or a restart on fewer slots), sorted by step; a later entry at the same step
    replaces an earlier one. Persisted in ``RUN_DIR/plan.json`` so a resume, after any history,
    starts at the size the run was at or was going to, and keeps the resizes still ahead.
    """

    initial: int
    changes: list[tuple[int, int, str]] = field(default_factory=list)

    @classmethod
    def from_spec(cls, workers: int, schedule: tuple[Resize, ...]) -> "Plan":
        return cls(workers, [(r.step, r.to, "schedule") for r in schedule])

    def add(self, step: int, to: int, source: str) -> None:
        self.changes = sorted([c for c in self.changes if c[0] != step] + [(step, to, source)])

    def replace_after(self, step: int, schedule: tuple[Resize, ...], source: str = "schedule") -> None:
        self.changes = [c for c in self.changes if c[0] <= step] + [(r.step, r.to, source) for r in schedule]
        self.changes.sort()

    def world_after(self, step: int) -> int:
        """Workers that run step ``step + 1``."""
        w = self.initial
        for s, to, _ in self.changes:
            if s <= step:
                w = to
        return w

    def resizes_after(self, step: int) -> tuple[Resize, ...]:
        """The resizes still ahead of ``step`` that change the size (no-ops dropped). A change the
        hosts made (source ``hosts``: discovery's slots changed) is history, not a schedule: it says
        what the hosts were when the run last passed that step, so a restart from an earlier
        checkpoint does not stop there again (the hosts as they are now size the ring: a grow onto
        a host still in its cooldown, capped to the ring's own size, left paused in-place workers
        waiting for a host change that never came)."""
        out, w = [], self.world_after(step)
        for s, to, source in self.changes:
            if s > step and to != w and source != Cause.HOSTS:
                out.append(Resize(s, to))
                w = to
        return tuple(out)

    def next_stop(self, step: int, total_steps: int) -> int:
        """The step the segment after ``step`` stops at: the next resize, else the end."""
        ahead = self.resizes_after(step)
        return ahead[0].step if ahead else total_steps

    def resize_at(self, step: int) -> Resize | None:
        """The resize that takes effect after ``step``, if one does."""
        ahead = self.resizes_after(step - 1)
        return ahead[0] if ahead and ahead[0].step == step else None

    def to_dict(self) -> dict:
        return {"initial": self.initial, "changes": [list(c) for c in self.changes]}

    @classmethod
    def from_dict(cls, d: dict) -> "Plan":
        return cls(int(d["initial"]), [(int(s), int(t), str(src)) for s, t, src in d.get("changes", [])])


_SCHED = re.compile(r"^\s*(\d+)\s*:\s*(-?\d+)\s*$")


def parse_schedule(text: str) -> tuple[Resize, ...]:
    """``"5000:8,10000:4"`` -> (Resize(5000, 8), Resize(10000, 4))."""
    out = []
    for part in text.split(","):
        if not part.strip():
            continue
        m = _SCHED.match(part)
        if not m:
            raise UserError(f"--schedule expects STEP:WORKERS[,STEP:WORKERS...], got {part.strip()!r}")
        out.append(Resize(int(m.group(1)), int(m.group(2))))
    if not out:
        raise UserError("--schedule is empty")
    return tuple(out)


def parse_hosts(text: str) -> list[tuple[str, int]]:
    """``"h1:8,h2:8"`` -> [("h1", 8), ("h2", 8)]. Every host needs its ``:SLOTS``: horovodrun -H
    refuses a bare name (``Invalid host input``), so it is refused here, before the run starts."""
    hosts = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, slots = part.partition(":")
        if not sep:
            raise UserError(f"--hosts expects HOST:SLOTS[,HOST:SLOTS...], got {part!r} (no :SLOTS; "
                            f"e.g. {part}:1)")
        try:
            n = int(slots)
        except ValueError:
            raise UserError(f"--hosts expects HOST:SLOTS[,HOST:SLOTS...], got {part!r}") from None
        if not name or n < 1:
            raise UserError(f"--hosts expects HOST:SLOTS with SLOTS >= 1, got {part!r}")
        hosts.append((name, n))
    if not hosts:
        raise UserError("--hosts is empty")
    return hosts


def parse_hostfile(path: str) -> list[tuple[str, int]]:
    """A horovodrun/MPI hostfile: ``host slots=N`` per line (``#`` comments)."""
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise UserError(f"cannot read hostfile {path}: {e.strerror or e}") from None
    hosts = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        n = 1
        for p in parts[1:]:
            if p.startswith("slots="):
                try:
                    n = int(p.split("=", 1)[1])
                except ValueError:
                    raise UserError(f"hostfile {path}: bad slots in {line!r}") from None
        hosts.append((parts[0], n))
    if not hosts:
        raise UserError(f"hostfile {path} lists no hosts")
    return hosts
