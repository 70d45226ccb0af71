"""Heartbeat files: one fixed-width line ``STEP PHASE TIME`` per rank, rewritten in place.

The worker library writes them (:class:`Heartbeat`, one ``pwrite`` per step); the controller's
stall watchdog (:mod:`elastic_ring.controller.watchdog`) reads them (:func:`read_beats`). The
format lives here, beside :mod:`elastic_ring.protocol`, so that neither side imports the other.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from elastic_ring import protocol

BEAT_WIDTH = 48  # bytes of one heartbeat record (fixed, so a rewrite in place is never torn short)


# ---------------------------------------------------------------------- writing (worker side)
def beat_dir(run_dir: Path) -> Path:
    return protocol.control_dir(run_dir) / "beats"


def beat_file(run_dir: Path, segment: int, rank: int) -> Path:
    return beat_dir(run_dir) / f"seg{segment:03d}-rank{rank}"


def format_beat(step: int, phase: str, t: float) -> bytes:
    line = f"{step} {phase} {t:.3f}"
    return line.ljust(BEAT_WIDTH - 1).encode()[:BEAT_WIDTH - 1] + b"\n"


class Heartbeat:
    """One rank's heartbeat file, kept open; :meth:`beat` costs one ``pwrite``."""

    def __init__(self, run_dir: Path, segment: int, rank: int) -> None:
        path = beat_file(run_dir, segment, rank)
        self._fd: int | None = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        except OSError:
            self._fd = None  # no heartbeat: the watchdog still has its timeout and /proc

    def beat(self, step: int, phase: str, t: float) -> None:
        if self._fd is None:
            return
        try:
            os.pwrite(self._fd, format_beat(step, phase, t), 0)
        except OSError:
            pass

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# ---------------------------------------------------------------------- reading (controller side)
@dataclass(frozen=True)
class Beat:
    rank: int
    step: int
    phase: str


def parse_beat(rank: int, raw: bytes) -> Beat | None:
    parts = raw.decode(errors="replace").split()
    if len(parts) < 2:
        return None
    try:
        return Beat(rank, int(parts[0]), parts[1])
    except ValueError:
        return None


def read_beats(run_dir: Path, segment: int) -> list[Beat]:
    out = []
    for f in beat_dir(run_dir).glob(f"seg{segment:03d}-rank*"):
        try:
            rank = int(f.name.rsplit("rank", 1)[1])
            b = parse_beat(rank, f.read_bytes()[:BEAT_WIDTH])
        except (OSError, ValueError):
            continue
        if b is not None:
            out.append(b)
    return sorted(out, key=lambda b: b.rank)
