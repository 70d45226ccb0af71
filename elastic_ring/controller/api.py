"""Value types of the controller: the run's blueprint (``RunSpec``) and its lifecycle (``RunState``).

``RunState`` transitions (one monitor loop in ``Controller.run`` acts on them)::

    PENDING -> LAUNCHING -> RUNNING -> STOPPING -> LAUNCHING   (a resize: relaunch at the new size)
                                   \\-> SUCCEEDED                (end of the schedule)
    RUNNING | STOPPING -> FAILED                                (a worker failed)
    RUNNING | STOPPING -> INTERRUPTED                           (Ctrl-C / SIGTERM: checkpoint kept)
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
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


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

    def validate(self) -> None:
        """Raises UserError for any request that cannot run (before anything starts)."""
        if self.workers < 1:
            raise UserError(f"--gpus must be >= 1, got {self.workers}")
        if self.workers > self.slots:
            raise UserError(f"--gpus {self.workers} is more than the {self.slots} slot(s) available"
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
    """``"h1:8,h2:8"`` -> [("h1", 8), ("h2", 8)] (slots default to 1 when omitted)."""
    hosts = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, _, slots = part.partition(":")
        try:
            n = int(slots) if slots else 1
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
