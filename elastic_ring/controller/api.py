"""Value types of the controller: the run's blueprint (``RunSpec``), its resize ``Plan`` and its
lifecycle (``RunState``, and the ``Phase`` a user sees of it: :func:`phase_of`).

``RunState`` transitions (one monitor loop in ``Controller.run`` acts on them; ``TRANSITIONS`` is
the table the controller enforces)::

    PENDING -> LAUNCHING -> RUNNING -> STOPPING -> LAUNCHING | RUNNING   (a resize: relaunch, or
                                                                       release pre-launched workers)
                            RUNNING -> SUCCEEDED                       (end of the schedule)
    LAUNCHING | RUNNING | STOPPING -> RESTARTING -> LAUNCHING          (a worker died: from the last
                                                                       checkpoint, --max-restarts)
    LAUNCHING | RUNNING | STOPPING | RESTARTING -> FAILED               (restarts exhausted)
    LAUNCHING | RUNNING | STOPPING | RESTARTING -> INTERRUPTED          (Ctrl-C / SIGTERM)

What `status`, ``controller.json``'s ``phase``, `runs`, `jobs` and the cluster's web page say is
the ``Phase``: one word per state, where a launch is ``starting``, ``resizing`` or ``restarting``
until its workers' first step (``Controller._launch``), and a stop for a resize is ``resizing``.
:func:`phase_of` is the one mapping (also for a ``controller.json`` of before the ``phase`` key);
``crashed`` is the reader's word for a live phase whose controller is gone (``controller.status``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from elastic_ring.errors import UserError


class RunState(str, Enum):
    PENDING = "pending"
    LAUNCHING = "launching"
    RUNNING = "running"
    STOPPING = "stopping"
    RESTARTING = "restarting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


_S = RunState
TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    _S.PENDING: frozenset({_S.LAUNCHING, _S.FAILED, _S.INTERRUPTED}),
    _S.LAUNCHING: frozenset({_S.RUNNING, _S.RESTARTING, _S.FAILED, _S.INTERRUPTED}),
    _S.RUNNING: frozenset({_S.STOPPING, _S.SUCCEEDED, _S.RESTARTING, _S.FAILED, _S.INTERRUPTED}),
    _S.STOPPING: frozenset({_S.LAUNCHING, _S.RUNNING, _S.SUCCEEDED, _S.RESTARTING, _S.FAILED,
                            _S.INTERRUPTED}),
    _S.RESTARTING: frozenset({_S.LAUNCHING, _S.RESTARTING, _S.FAILED, _S.INTERRUPTED}),
    _S.SUCCEEDED: frozenset(),
    _S.FAILED: frozenset(),
    _S.INTERRUPTED: frozenset(),
}
TERMINAL = frozenset({_S.SUCCEEDED, _S.FAILED, _S.INTERRUPTED})


class Phase(str, Enum):
    STARTING = "starting"
    RUNNING = "running"
    RESIZING = "resizing"
    RESTARTING = "restarting"
    STOPPING = "stopping"
    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"
    CRASHED = "crashed"

    @property
    def live(self) -> bool:
        return self in LIVE


LIVE = frozenset({Phase.STARTING, Phase.RUNNING, Phase.RESIZING, Phase.RESTARTING, Phase.STOPPING})
LAUNCH_PHASES = frozenset({Phase.STARTING, Phase.RESIZING, Phase.RESTARTING})  # until a launch's first step
_ENDED = {_S.SUCCEEDED: Phase.FINISHED, _S.FAILED: Phase.FAILED, _S.INTERRUPTED: Phase.STOPPED}


def phase_of(state: RunState, launch: Phase | None, resizing: bool = False) -> Phase:
    """The phase a user sees of ``state``: ``launch`` (one of ``LAUNCH_PHASES``) until the launch's
    workers step, None once they do; ``resizing``: a stop is for a resize (a size is pending)."""
    if state in _ENDED:
        return _ENDED[state]
    if state is _S.RESTARTING:
        return Phase.RESTARTING
    if state is _S.STOPPING:
        return Phase.RESIZING if resizing else Phase.STOPPING
    return launch or Phase.RUNNING


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
        """The resizes still ahead of ``step`` that change the size (no-ops dropped)."""
        out, w = [], self.world_after(step)
        for s, to, _ in self.changes:
            if s > step and to != w:
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
