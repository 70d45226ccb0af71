"""TensorBoard curves of a run, written from its ``events.jsonl`` (nothing in the training step).

:class:`TensorBoardSink` tails ``RUN_DIR/events.jsonl`` and turns each record into scalars of
TensorBoard's event format (the ``tensorboard`` package's protocol buffers, in its record
format: :class:`EventFileScalars`), x-axis = the training step,
wall time = the event's ``time``. The controller calls :meth:`TensorBoardSink.sync` from its event
relay, so the curves follow the run as it goes; the workers never see it.

Resume without duplicates: the byte offset of ``events.jsonl`` already written is kept in
``<logdir>/.events-offset`` (written after each flush). A resumed controller starts from there,
so every event becomes scalars once (a crash between a flush and the offset's write can repeat at
most that one batch).

Steps done again: a restart from a checkpoint (a worker's death, a hang, a ``--resume`` after the
controller was killed) trains some steps a second time, and ``events.jsonl`` holds their records
twice. Each segment's ``launch`` record becomes a ``SessionLog.START`` at its first step, TensorBoard's
own sign of a restarted writer: its reader drops every point it holds at that step or later, so a
curve shows each step once, the last time it was trained. The points of the ``restart`` record that
led to the launch (at the failed step, past the start) are written again after the START.

Where: ``RUN_DIR/tensorboard`` by default; the variable ``ELASTIC_RING_TENSORBOARD_DIR`` names
another folder (a cluster job writes under ``CLUSTER_DIR/tensorboard/<id>-<name>/``, so
``tensorboard --logdir CLUSTER_DIR/tensorboard`` compares the jobs); ``ELASTIC_RING_TENSORBOARD=0``
turns it off, as does an install without the ``tensorboard`` package (the ``[report]`` extra).
"""

from __future__ import annotations

import itertools
import json
import os
import struct
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from elastic_ring import env
from elastic_ring.events.api import (CheckpointWritten, Evaluation, Event, Recovered, ResizeOverhead, Restart,
                                     Throughput, as_event)

ENV_DIR = env.TENSORBOARD_DIR
ENV_ON = env.TENSORBOARD
OFFSET_FILE = ".events-offset"

# event record -> (the field holding its step, [(tag, field)])
SCALARS: dict[type[Event], tuple[str, list[tuple[str, str]]]] = {
    Throughput: ("step", [("train/loss", "loss"), ("train/lr", "lr"),
                            ("train/images_per_s", "images_per_s"), ("train/steps_per_s", "steps_per_s"),
                            ("train/world_size", "world_size")]),
    Evaluation: ("step", [("test/loss", "test_loss"), ("test/accuracy", "test_accuracy")]),
    ResizeOverhead: ("step", [("resize/stop_latency_s", "stop_latency_s"),
                                 ("resize/checkpoint_s", "checkpoint_s"),
                                 ("resize/relaunch_to_first_step_s", "relaunch_to_first_step_s"),
                                 ("resize/total_lost_s", "total_lost_s"),
                                 ("resize/from_workers", "from_workers"),
                                 ("resize/to_workers", "to_workers")]),
    Restart: ("failed_at_step", [("restart/attempt", "attempt"), ("restart/steps_redone", "steps_redone"),
                                   ("restart/new_world_size", "new_world_size")]),
    Recovered: ("step", [("restart/time_lost_s", "time_lost_s"),
                           ("restart/detect_to_first_step_s", "detect_to_first_step_s")]),
    CheckpointWritten: ("step", [("checkpoint/seconds", "seconds"), ("checkpoint/stall_s", "stall_s")]),
}


def scalars_of(ev: Event | Mapping[str, Any]) -> Iterator[tuple[str, float, int, float]]:
    """(tag, value, step, wall time) of one ``events.jsonl`` record (or its JSON object); nothing
    for other kinds. The run's count of restarts so far is ``restart/attempt``'s points."""
    ev = as_event(ev)
    spec = SCALARS.get(type(ev))
    if spec is None:
        return
    step_key, fields = spec
    try:
        step, wall = int(getattr(ev, step_key)), float(ev.time)
    except (TypeError, ValueError):
        return
    for tag, key in fields:
        v = getattr(ev, key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            yield tag, float(v), step, wall


def logdir_for(run_dir: Path) -> Path | None:
    """Where a run's curves go (None: turned off, or TensorBoard not installed)."""
    from elastic_ring.extras import installed

    if not env.tensorboard_on() or not installed("tensorboard"):
        return None
    d = env.tensorboard_dir()
    return Path(d) if d else Path(run_dir) / "tensorboard"


class TensorBoardSink:
    """Appends the scalars of new ``events.jsonl`` lines to a TensorBoard log folder.

    ``writer_factory(logdir)`` returns an object with ``add(tag, value, step, wall)``,
    ``start(step, wall)`` (a restarted writer: drop the points at ``step`` or later), ``flush()``
    and ``close()`` (default: :class:`EventFileScalars`, an event file of TensorBoard's format).
    """

    def __init__(self, events_path: Path, logdir: Path,
                 writer_factory: Callable[[Path], Any] | None = None) -> None:
        self.events_path = Path(events_path)
        self.logdir = Path(logdir)
        self._factory = writer_factory or EventFileScalars
        self._writer: Any = None
        self._offset: int | None = None
        self._restart: list[tuple[str, float, int, float]] = []  # the last restart's points (see launch)
        self.failed: str | None = None  # the curves are a side output: an error only stops them

    def _load_offset(self) -> int:
        try:
            return int(json.loads((self.logdir / OFFSET_FILE).read_text())["offset"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0

    def _save_offset(self) -> None:
        tmp = self.logdir / (OFFSET_FILE + ".tmp")
        tmp.write_text(json.dumps({"offset": self._offset}))
        os.replace(tmp, self.logdir / OFFSET_FILE)

    def sync(self) -> int:
        """Write the scalars of the whole lines added since the last call; returns how many."""
        if self.failed is not None:
            return 0
        try:
            return self._sync()
        except Exception as e:  # noqa: BLE001 - never stop a training run for its curves
            self.failed = f"{type(e).__name__}: {e}"
            return 0

    def _sync(self) -> int:
        if self._offset is None:
            self.logdir.mkdir(parents=True, exist_ok=True)
            self._offset = self._load_offset()
        try:
            with self.events_path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return 0
        end = data.rfind(b"\n")
        if end < 0:
            return 0
        n = 0
        for line in data[:end + 1].splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if not isinstance(ev, dict):
                continue
            rows = list(scalars_of(ev))
            if ev.get("kind") == "launch" and isinstance(ev.get("start_step"), int):
                start = ev["start_step"]
                self._writer_().start(start, float(ev.get("time") or 0.0))  # steps done again: one point each
                rows = [r for r in self._restart if r[2] >= start]
                self._restart = []
            elif ev.get("kind") == "restart":
                self._restart = rows
            for tag, value, step, wall in rows:
                self._writer_().add(tag, value, step, wall)
                n += 1
        if self._writer is not None:
            self._writer.flush()
        self._offset += end + 1
        self._save_offset()
        return n

    def _writer_(self) -> Any:
        if self._writer is None:
            self._writer = self._factory(self.logdir)
        return self._writer

    def close(self) -> None:
        self.sync()
        if self._writer is not None:
            self._writer.close()
            self._writer = None


_CRC32C: list[int] = []  # CRC-32C's (Castagnoli) byte table, made at the first record
_FILES = itertools.count()  # this process's event files (a part of each name, as TensorBoard's writer)


def masked_crc32c(data: bytes) -> int:
    """The checksum of TensorBoard's record format (TFRecord): the CRC-32C of ``data``, rotated
    right by 15 bits plus a constant."""
    if not _CRC32C:
        for i in range(256):
            c = i
            for _ in range(8):
                c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
            _CRC32C.append(c)
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC32C[(crc ^ b) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class EventFileScalars:
    """Scalars into an event file of TensorBoard's format (one new ``events.out.tfevents.*`` file
    per writer; TensorBoard reads all the files of a folder as one run): TensorBoard's ``Event``
    protocol buffers, each one record (its length, the length's checksum, the bytes, their
    checksum). Written here rather than by the ``tensorboard`` package's ``EventFileWriter``,
    whose import (its package's summary ops) costs each controller about 0.25 s of CPU."""

    def __init__(self, logdir: Path) -> None:
        import socket
        import time

        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        self._Event, self._Summary = Event, Summary
        Path(logdir).mkdir(parents=True, exist_ok=True)
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_FILES)}"
        self._f = open(Path(logdir) / name, "wb")
        self._record(Event(wall_time=time.time(), file_version="brain.Event:2"))
        self.flush()

    def _record(self, event: Any) -> None:
        data = event.SerializeToString()
        head = struct.pack("<Q", len(data))
        self._f.write(head + struct.pack("<I", masked_crc32c(head)) + data + struct.pack("<I", masked_crc32c(data)))

    def add(self, tag: str, value: float, step: int, wall: float) -> None:
        summ = self._Summary(value=[self._Summary.Value(tag=tag, simple_value=value)])
        self._record(self._Event(wall_time=wall, step=step, summary=summ))

    def start(self, step: int, wall: float) -> None:
        """A ``SessionLog.START`` at ``step``: TensorBoard's reader drops the points it holds at
        ``step`` or later (those of steps a restart does again)."""
        from tensorboard.compat.proto.event_pb2 import SessionLog

        self._record(self._Event(wall_time=wall, step=step, session_log=SessionLog(status=SessionLog.START)))

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def sink_for_run(run_dir: Path) -> TensorBoardSink | None:
    """The controller's sink for ``run_dir`` (None when turned off)."""
    logdir = logdir_for(run_dir)
    return None if logdir is None else TensorBoardSink(Path(run_dir) / "events.jsonl", logdir)
