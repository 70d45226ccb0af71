"""What a worker tells while it trains (:class:`Progress`): throughput windows, first-step phases,
evaluations, the progress file and its heartbeat.

Rank 0 writes the events (``events.api``); every rank writes its own heartbeat for the
controller's stall watchdog (``heartbeat``: the training thread notes its step and phase, a thread
writes them).
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from elastic_ring import protocol
from elastic_ring.heartbeat import Beats
from elastic_ring.worker.segment import Segment


PROGRESS_EVERY_S = 0.5  # rank 0 writes the progress file at most this often (the first step always)


@dataclass
class _Window:
    t0: float | None = None
    steps: int = 0
    samples: int = 0
    losses: list = field(default_factory=list)  # this rank's losses (tensors are read at the window's end)


def _mean(losses: list) -> float:
    """The mean of a window's losses (tensors, or floats): one stack and sum, not a tensor
    operation per loss (each costs microseconds right after a step)."""
    if not losses:
        return float("nan")
    if hasattr(losses[0], "dim"):
        import torch

        try:
            return float(torch.stack(losses).sum()) / len(losses)
        except (TypeError, RuntimeError):  # (floats among them, or losses of other shapes)
            pass
    return float(sum(losses)) / len(losses)


class ProgressWriter:
    """Writes rank 0's progress file in a thread of its own, started at the first record: a file
    created and renamed on the training thread can wait for the file system (a journal commit, a
    busy disk), and every rank waits for rank 0 at the next step's collectives. Only the newest
    record is written; :meth:`flush` waits until it is on disk. The thread ends after ``idle_s``
    without a record (a process whose job ended leaves none behind)."""

    def __init__(self, path: Path, idle_s: float = 10.0) -> None:
        self.path, self.idle_s = path, idle_s
        self._cv = threading.Condition()
        self._pending: dict[str, Any] | None = None
        self._events: list[tuple[Any, Callable[[], Any]]] = []  # (log, the event's maker), in order
        self._busy = False
        self._thread: threading.Thread | None = None

    def submit(self, record: dict[str, Any]) -> None:
        with self._cv:
            self._pending = record
            self._wake()

    def submit_event(self, log: Any, make: Callable[[], Any]) -> None:
        """Append ``make()`` (an event, made on this thread) to the event log ``log``, after the
        events submitted before it (:meth:`flush` waits for them)."""
        with self._cv:
            self._events.append((log, make))
            self._wake()

    def _wake(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True, name="elastic-ring-progress")
            self._thread.start()
        self._cv.notify()

    def flush(self, timeout: float = 5.0) -> None:
        with self._cv:
            self._cv.wait_for(lambda: self._pending is None and not self._events and not self._busy, timeout)

    def _run(self) -> None:
        while True:
            with self._cv:
                if not self._cv.wait_for(lambda: self._pending is not None or self._events, self.idle_s):
                    self._thread = None  # the next submit starts another
                    return
                record, self._pending, self._busy = self._pending, None, True
                events, self._events = self._events, []
            try:
                for log, make in events:
                    try:
                        log.write(make())
                    except OSError:
                        pass  # (as a write on the training thread would: the run goes on)
                if record is not None:
                    protocol.write_json_atomic(self.path, record)
            except OSError:
                pass  # the controller reads the next one
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()


@dataclass
class StartUp:
    """When this segment's start-up phases ended (``marks``, in order), counted from ``t_start``
    (the process's start, or the in-place reset's request); reported with the first step."""

    t_start: float
    marks: dict[str, float] = field(default_factory=dict)

    def mark(self, name: str) -> None:
        self.marks[name] = time.time()

    def restart(self, t0: float) -> None:
        """An in-place reset requested at ``t0``: its phases replace the launch's."""
        self.t_start, self.marks = t0, {"reset_request": t0}

    def phases(self) -> dict[str, float]:
        out, prev = {}, self.t_start
        for name, t in self.marks.items():
            out[name] = round(t - prev, 4)
            prev = t
        return out


class Progress:
    """Events, throughput windows, evaluations and heartbeats of one worker.

    ``ring``: its rank and sizes (they change at an in-place resize); ``seg``: the job's counters;
    ``window_steps``: steps per throughput window; ``current_lr``: the LR the optimizer holds now.
    """

    def __init__(self, run_dir: Path, ring: Any, seg: Segment, start: StartUp, window_steps: int,
                 eval_every: int, current_lr: Callable[[], float]) -> None:
        self.run_dir, self.ring, self.seg, self.start = run_dir, ring, seg, start
        self.window_steps, self.eval_every, self.current_lr = window_steps, eval_every, current_lr
        self.window = _Window()
        self.eval_hook: Callable[[int], dict[str, float] | None] | None = None
        self.lr_used: float | None = None  # the LR before the segment's first step
        self.lr_stepped: float | None = None  # the LR its optimizer step really ran with
        # this segment's LR rescale at a new size: (the rule applied, the LR it left); None: none
        self.rescaled: Callable[[], tuple[str, float | None] | None] = lambda: None
        self.last_loss = float("nan")
        self._window_pending = None  # (allreduce handle, world size, the event's fields) of the closed window
        # a closed window whose loss rides in the stop vote (:meth:`close_window`, ``ride``): this
        # rank's loss waiting for the vote, then the vote in flight that carries it: (loss, size, fields)
        self.window_waiting: tuple | None = None
        self._window_voting: tuple | None = None
        self._events = None
        self._later = 0  # events handed to the writer's thread since the last wait for them
        self.beats = Beats(run_dir)  # this rank's heartbeat (controller.watchdog), written by a thread
        self.progress_due_t = 0.0  # the progress file is written at a step after this time (rank 0)
        self._progress_writer = ProgressWriter(protocol.control_dir(run_dir) / protocol.PROGRESS_FILE)
        self._threads_warned = False
        self.open_events()

    def open_events(self) -> None:
        """Rank 0 writes the events (called again once an in-place reset made this rank 0)."""
        if self.ring.rank == 0 and self._events is None:
            from elastic_ring.events.api import EventLog

            self._events = EventLog(self.run_dir / protocol.WORKER_EVENTS)

    def emit(self, event) -> None:
        if self._events is not None:
            if self._later:  # (after the events handed to the writer's thread: in order)
                self._later = 0
                self._progress_writer.flush()
            self._events.write(event)

    def emit_later(self, make: Callable[[], Any]) -> None:
        """The event ``make()`` appended by the progress writer's thread, in order with the others
        (:meth:`emit` and a segment's end wait for it): a throughput window's, made and written
        off the training thread (on rank 0, 150-200 µs right after a step: issue 50)."""
        if self._events is not None:
            self._later += 1
            self._progress_writer.submit_event(self._events, make)

    def warn(self, msg: str) -> None:
        print(f"elastic-ring worker: {msg}", file=sys.stderr, flush=True)
        from elastic_ring.events.api import ErrorEvent

        self.emit(ErrorEvent(message=msg, rank=self.ring.rank, segment=self.seg.number))

    def notice(self, msg: str) -> None:
        """Something the user must know that is not a failure (rank 0: the console and a ``notice``
        event; the other ranks stay quiet, as they take the same decision)."""
        if self.ring.rank != 0:
            return
        print(f"elastic-ring worker: {msg}", file=sys.stderr, flush=True)
        from elastic_ring.events.api import Notice

        self.emit(Notice(message=msg, rank=self.ring.rank, segment=self.seg.number))

    def heartbeat(self, step: int, phase: str) -> None:
        """Tell the controller's stall watchdog this rank's step and phase now (one ``pwrite`` on
        this thread): the rare phases (a checkpoint, an evaluation, a pause, the segment's end).
        Per step the training thread only notes them (:meth:`beat`)."""
        self.beats.write(self.seg.number, self.ring.rank, step, phase, time.time())

    def beat(self, step: int, phase: str, now: float) -> None:
        """The per-step heartbeat: ``step`` (the last done) and ``phase`` reached at ``now``, noted
        for the heartbeat's writer thread (:class:`~elastic_ring.heartbeat.Beats`); nothing written
        here. The watchdog judges on the note, so a hang of this thread stays visible."""
        self.beats.note = (self.seg.number, self.ring.rank, step, phase, now)

    def begin_segment(self, lr_used: float | None = None) -> None:
        """A segment's steps start: a new window; the LR its first step runs with unless the step
        sets it itself (seen by :meth:`optimizer_step`). A window closed before and not yet read
        is dropped (a segment that ended has read it: :meth:`flush_window`; after a lost peer its
        collective fails)."""
        self.window = _Window()
        self._window_pending = self.window_waiting = self._window_voting = None
        self.lr_used, self.lr_stepped = lr_used, None
        self.beats.start()  # (a thread, unless it runs: the segment's per-step heartbeats)

    def optimizer_step(self, opt) -> None:
        """Before the registered optimizer's step (a pre-hook, so before Horovod waits there for
        the other ranks' gradients): the heartbeat says this rank is done with its own part of
        the step (phase ``sync``), so a rank hung in its data loader or its forward pass is told
        apart from the ranks waiting for it. Also, until the segment's first step is done, the LR the
        step really runs with (the script may set it inside the step, or a scheduler may move it
        after), for ``first_step``; not after (issue 50: a read on every step's path)."""
        self.beats.note = (self.seg.number, self.ring.rank, self.seg.step, "sync", time.time())  # (beat())
        if self.window.t0 is None and opt.param_groups:  # (the segment's first step not yet done)
            self.lr_stepped = float(opt.param_groups[0]["lr"])

    def first_step(self, step: int, now: float) -> None:
        """The segment's first step is done: its start-up phases (after an in-place reset: the
        reset's) and the LR it ran with; the first throughput window starts now. The event is
        made only where it is written (rank 0): another rank would import the events' module
        here, on its first step's path (12-14 ms in a fresh process), for an event it drops."""
        self.check_threads()
        if self._events is not None:
            from elastic_ring.events.api import FirstStep

            rule, lr_rule = self.rescaled() or (None, None)
            self.emit(FirstStep(segment=self.seg.number, world_size=self.ring.size, step=step,
                                since_launch_s=now - self.start.t_start,
                                lr=self.lr_stepped if self.lr_stepped is not None else self.lr_used,
                                phases=self.start.phases(), rule=rule, lr_rule=lr_rule))
        self.window = _Window(t0=time.time())
        # the segment's first step always reaches the progress file (the next write_progress is not
        # held back by the half-second rule): hvdrun's check that a joiner's ring formed reads it
        self.progress_due_t = 0.0

    def check_threads(self) -> None:
        """Warn once when the script set torch's thread count over the library's (the cores of
        this host shared by its workers): more threads than cores slow every worker down."""
        import torch

        if self._threads_warned:
            return
        local_size = self.ring.local_size
        ours, now = self.ring.threads or protocol.cpu_threads(local_size), torch.get_num_threads()
        if now != ours:
            self._threads_warned = True
            if self.ring.rank == 0:
                print(f"elastic-ring worker: the script set torch's threads to {now}: its {now} per worker apply,"
                      f" not the library's {ours} (this host's cores shared among its "
                      f"{local_size} worker(s); {protocol.CPU_THREADS_ENV} sets it)", file=sys.stderr, flush=True)

    def close_window(self, step: int, epoch: int = 0, ride: bool = False) -> tuple[float, float]:
        """End the throughput window at ``step`` and return (the last mean loss known, the time the
        next window starts). The ranks' mean loss travels with the next steps' collectives, so no
        blocking collective runs between steps: with ``ride``, in the next stop vote the step
        boundary starts (:meth:`take_window`, read back by :meth:`window_rode`); else in an
        allreduce of its own, read at the next window's close or the segment's end
        (:meth:`flush_window`). Rank 0 emits the window's ``throughput`` event once the mean is read."""
        self.flush_window(waiting=False)
        if self.window_waiting is not None:  # (no vote took the last one: it goes alone)
            self._window_alone(*self.window_waiting)
        w, size = self.window, self.ring.size
        local = _mean(w.losses)
        now = time.time()
        dt = max(now - (w.t0 or now), 1e-9)
        fields = dict(segment=self.seg.number, world_size=size, step=step, steps=w.steps, seconds=dt,
                      images_per_s=w.samples * size / dt, steps_per_s=w.steps / dt, lr=self.current_lr(),
                      epoch=epoch)
        self.window_waiting = None
        if ride:
            self.window_waiting = (local, size, fields)
        else:
            self._window_alone(local, size, fields)
        self.window = _Window(t0=now)
        return self.last_loss, now

    def _window_alone(self, local: float, size: int, fields: dict) -> None:
        import torch

        self.flush_window(waiting=False)
        handle = self.ring.coll.allreduce_async(torch.tensor([local]), name="window_loss")
        self._window_pending = (handle, size, fields)
        self.window_waiting = None

    def take_window(self) -> float | None:
        """The stop vote starting now carries the closed window waiting (this rank's loss; None: none)."""
        waiting, self.window_waiting = self.window_waiting, None
        if waiting is None:
            return None
        self._window_voting = waiting
        return waiting[0]

    def window_rode(self, total: float | None) -> None:
        """The stop vote that carried a window is read: ``total``, the ranks' sum of its loss; on
        rank 0 its event."""
        voting, self._window_voting = self._window_voting, None
        if voting is None or total is None:
            return
        self._emit_window(total, voting[1], voting[2])

    def _emit_window(self, total: float, size: int, fields: dict) -> None:
        loss = self.last_loss = total / size
        if self._events is not None:  # (rank 0: the others do not import the events' module for it)
            from elastic_ring.events.api import Throughput

            self.emit_later(lambda: Throughput(**fields, loss=loss))

    def flush_window(self, waiting: bool = True) -> None:
        """The closed window's mean loss (every rank waits for it) and, on rank 0, its event; with
        ``waiting``, also a window no vote took (a stop agreed at its step): its own allreduce."""
        pending, self._window_pending = self._window_pending, None
        if pending is not None:
            handle, size, fields = pending
            self._emit_window(float(self.ring.coll.wait(handle)[0].item()), size, fields)
        if waiting and self.window_waiting is not None:
            self._window_alone(*self.window_waiting)
            self.flush_window(waiting=False)

    def write_progress(self, step: int, now: float, vote_every: int = 1, vote_lag: int = 1) -> None:
        """Rank 0: the progress file the controller reads (at most twice a second), written off
        the training thread (:class:`ProgressWriter`); ``vote_every``: the stop vote's period now,
        ``vote_lag``: the steps from a vote's start to its read (a live stop lands within their
        sum)."""
        if self.ring.rank == 0 and now > self.progress_due_t:
            self.progress_due_t = now + PROGRESS_EVERY_S
            self._progress_writer.submit({"step": step, "segment": self.seg.number, "time": now,
                                          "vote_every": vote_every, "vote_lag": vote_lag})

    def flush_progress(self) -> None:
        """The last progress record on disk (a segment's end)."""
        self._progress_writer.flush()

    def evaluation_due(self, step: int) -> bool:
        return bool(self.eval_every) and step % self.eval_every == 0 and step < self.seg.total_steps

    def evaluate(self, step: int) -> None:
        """The script's evaluation hook (every rank); its result an ``evaluation`` event."""
        if self.eval_hook is None:
            return
        res = self.eval_hook(step)
        if res and self.ring.rank == 0:
            from elastic_ring.events.api import Evaluation

            self.emit(Evaluation(step=step, test_loss=float(res.get("test_loss", float("nan"))),
                                 test_accuracy=float(res.get("test_accuracy", float("nan"))),
                                 samples=int(res.get("samples", 0))))

    @contextmanager
    def evaluating(self):
        """An evaluation kept out of the throughput window, with the watchdog's allowance."""
        t0 = time.time()
        self.heartbeat(self.seg.step, "eval")
        try:
            yield
        finally:
            w = self.window
            if w.t0 is not None:
                w.t0 += time.time() - t0
            self.heartbeat(self.seg.step, "step")
