"""Heartbeat files: one fixed-width line ``STEP PHASE TIME`` per rank, rewritten in place.

The worker library writes them (:class:`Heartbeat`, one ``pwrite``), off the training thread's
per-step path: the training thread only notes the step and phase it reached and when
(:meth:`Beats.mark`, one assignment), and a thread of its own writes the newest note every
:data:`BEAT_EVERY_S` when it changed (:class:`Beats`). The note is the training thread's, so a
worker whose training thread hangs keeps its last step and phase on disk however long the writer
runs: the controller's stall watchdog (:mod:`elastic_ring.controller.watchdog`), which reads them
(:func:`read_beats`) and counts only a change of step or phase as progress, still sees the hang.
The format lives here, beside :mod:`elastic_ring.protocol`, so that neither side imports the other.
"""

from __future__ import annotations

import os
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

from elastic_ring import protocol

BEAT_WIDTH = 48  # bytes of one heartbeat record (fixed, so a rewrite in place is never torn short)
BEAT_EVERY_S = 0.2  # the writer thread's period: the file lags the training thread by at most this


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


class Beats:
    """One worker's heartbeat, written by a thread of its own (see the module docstring).

    The training thread calls :meth:`mark` (the hot path: one tuple assigned, no lock, no system
    call) and, for the rare phases whose start must be on disk at once (a checkpoint, an
    evaluation, a pause, the segment's end), :meth:`write`, which also writes the note now. The
    thread (:meth:`start`, idempotent; :meth:`stop`) writes the newest note every ``every_s`` when
    it differs from the one written, to ``seg<n>-rank<r>`` of the note's segment and rank (both
    change at an in-place resize). ``opener(run_dir, segment, rank)``: the file (a
    :class:`Heartbeat`). The thread holds only a weak reference: a writer dropped without
    :meth:`stop` (a job that ended by an exception) ends its thread at the next period."""

    def __init__(self, run_dir: Path, every_s: float = BEAT_EVERY_S, opener=None) -> None:
        self.run_dir, self.every_s = run_dir, every_s
        self._opener = opener or Heartbeat
        self.note: tuple[int, int, int, str, float] | None = None  # (segment, rank, step, phase, time)
        self.written: tuple[int, int, int, str, float] | None = None  # the note on disk
        self._file = None
        self._key: tuple[int, int] | None = None
        self._lock = threading.Lock()  # one writer at a time: the thread, or write() on the training thread
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None

    def mark(self, segment: int, rank: int, step: int, phase: str, t: float) -> None:
        """The training thread reached ``step`` (the last one done) in ``phase`` at ``t``: noted
        for the writer thread, nothing written here."""
        self.note = (segment, rank, step, phase, t)

    def write(self, segment: int, rank: int, step: int, phase: str, t: float) -> None:
        """:meth:`mark`, and the note written now (on the calling thread)."""
        self.note = (segment, rank, step, phase, t)
        self.flush()

    def flush(self) -> None:
        """Write the newest note if it is not the one on disk (the thread's work, once)."""
        with self._lock:
            note = self.note
            if note is None or note == self.written:
                return
            key = note[:2]
            if self._file is None or self._key != key:
                if self._file is not None:
                    self._file.close()
                self._file, self._key = self._opener(self.run_dir, *key), key
            self._file.beat(note[2], note[3], note[4])
            self.written = note

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """The writer thread, unless it runs."""
        if self.running():
            return
        self._stop = threading.Event()
        self._thread = threading.Thread(target=_write_beats, args=(weakref.ref(self), self._stop, self.every_s),
                                        daemon=True, name="elastic-ring-beats")
        self._thread.start()

    def stop(self) -> None:
        """The newest note written, the thread ended (the file stays open for :meth:`write`)."""
        if self._stop is not None:
            self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = self._stop = None
        self.flush()

    def close(self) -> None:
        self.stop()
        with self._lock:
            if self._file is not None:
                self._file.close()
            self._file = self._key = None


def _write_beats(ref: "weakref.ReferenceType[Beats]", stop: threading.Event, every_s: float) -> None:
    """The writer thread: the newest note every ``every_s`` until stopped or its writer is gone."""
    while not stop.wait(every_s):
        beats = ref()
        if beats is None:
            return
        try:
            beats.flush()
        except Exception:  # noqa: BLE001 - a heartbeat is never worth a worker's life
            pass
        del beats


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
