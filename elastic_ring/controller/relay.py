"""The workers' events into the run's ``events.jsonl``.

Every rank appends its events to ``RUN_DIR/WORKER_EVENTS``; the controller calls :meth:`Relay.poll`
while it watches a segment: each complete new line is copied into the run's event log (a throughput
window with a telemetry sample of the workers' processes added) and handed to the controller's
callback, in order, as its typed record (:func:`~elastic_ring.events.api.as_event`). The line
itself is written as the worker wrote it. The TensorBoard sink, when the run has one, is fed from the same log,
at most once every :data:`TB_EVERY_S` (each feed flushes the curves and rewrites the sink's offset
file: at every poll with new lines, 10 times a second, that was a fifth of the controller's busy
time in a steady run; docs/reports/worker.md, "The tool's CPU beside the training"), and in full
at :meth:`close`.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Callable

from elastic_ring.events.api import Event, EventLog, Throughput, as_event
from elastic_ring.protocol import WORKER_EVENTS
from elastic_ring.telemetry import Telemetry
from elastic_ring.telemetry.tensorboard import sink_for_run as tensorboard_sink

TB_EVERY_S = 1.0  # the TensorBoard curves lag the events by at most this (a resume loses none: see the sink)


class Relay:
    def __init__(self, run_dir: Path, events: EventLog, clock: Callable[[], float] = time.monotonic) -> None:
        self.events = events
        self._clock, self._tb_at = clock, None
        self.path = run_dir / WORKER_EVENTS
        self.pos = self.path.stat().st_size if self.path.exists() else 0  # a resume relays what is new
        self.telemetry: Telemetry | None = None
        self._tb = tensorboard_sink(run_dir)  # TensorBoard curves, fed from events.jsonl

    def sample(self, pid: int, gpus: bool) -> None:
        """Sample the processes under ``pid`` (a segment's launcher) from now on."""
        self.telemetry = Telemetry(pid, gpus=gpus)

    def poll(self, on_event: Callable[[Event], None], hold: Callable[[Event], bool] = lambda ev: False) -> None:
        """Relay the complete lines written since the last call, in order; stop before the first
        event that ``hold`` holds back (asked of each in turn, after the ones before it were
        handled: workers that took a resize written ahead are past the segment that just ended,
        and their events wait until the controller is at theirs)."""
        now = self._clock()
        if self._tb is not None and (self._tb_at is None or now - self._tb_at >= TB_EVERY_S):
            self._tb_at = now
            self._tb.sync()
        if not self.path.exists():
            return
        with self.path.open("rb") as f:
            f.seek(self.pos)
            data = f.read()
        end = data.rfind(b"\n")
        if end < 0:
            return
        for line in data[:end + 1].splitlines(keepends=True):
            try:
                d = json.loads(line)
                ev = as_event(d)
            except (json.JSONDecodeError, AttributeError, TypeError):  # not an event object
                self.pos += len(line)
                continue
            if hold(ev):
                return
            self.pos += len(line)
            if isinstance(ev, Throughput) and self.telemetry is not None:
                d["telemetry"] = self.telemetry.sample()
                ev = dataclasses.replace(ev, telemetry=d["telemetry"])
            self.events.write(d)
            on_event(ev)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
