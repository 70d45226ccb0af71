"""A segment's workers at run time, and the processes the controller still holds.

:class:`Segment` is the runtime record of one segment: one launch of workers, or one ring size of
workers that are kept (``--relaunch inplace``, Ray). :class:`Processes` starts segments through the
backend, releases the pre-launched ones, keeps the stopped ones until their launcher exits (each
exit is a ``workers_exited`` event, and goes to a callback), and kills whatever is left when the run
ends. What to start and when is the controller's decision.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Callable

from elastic_ring import protocol
from elastic_ring.controller import watchdog as wdog
from elastic_ring.controller.backends.api import Backend, Handle, SegmentLaunch
from elastic_ring.controller.membership import MembershipChange
from elastic_ring.events.api import ErrorEvent, Event, EventLog, FirstStep, SegmentEnd, Throughput, WorkersExited
from elastic_ring.seam import Go, write_go


def segment_log(run_dir: Path, index: int, world: int) -> Path:
    """The log of segment ``index`` at ``world`` workers (the launcher's output)."""
    return run_dir / "logs" / f"segment-{index:03d}-w{world}.log"


class Stop(Enum):
    """What an interrupt (Ctrl-C, SIGTERM) did to a segment: nothing yet; left it running, as its
    workers took the resize written ahead (the next segment is stopped); asked its workers to stop
    at the next agreed step; asked its workers, paused in place, to checkpoint and leave."""

    NONE = "none"
    DEFERRED = "deferred"
    ASKED = "asked"
    EXIT_SENT = "exit_sent"

    @property
    def goes_on(self) -> bool:
        """The segment's end leads to the next one (no stop asked of it)."""
        return self in (Stop.NONE, Stop.DEFERRED)


@dataclass
class Segment:
    """One segment's runtime record: what it was started as, what its workers showed, how it ended."""

    index: int
    world: int
    stop_at: int
    handle: Handle | None = None
    t_launch: float = 0.0  # relaunch -> first step is measured from here (the go, if pre-launched)
    t_started: float = 0.0  # when its processes really started (crash records are newer)
    end: SegmentEnd | None = None
    ckpt_s: float = 0.0
    asked: MembershipChange | None = None  # a live resize or a joiner asked while it runs (its step: the stop's)
    # the hosts of the shrink (asked, or scheduled over hosts) written ahead for its stop (Asks._shrink_ahead)
    ahead_hosts: str | None = None
    start_step: int = 0  # the last step done before this segment
    stop: Stop = field(default_factory=lambda: Stop.NONE)  # what an interrupt did to it
    go_file: Path | None = None  # set when pre-launched: the workers wait for this file
    cmd: list[str] = field(default_factory=list)
    last_step: int = 0
    last_step_t: float = 0.0
    steps_per_s: float = 0.0
    log: Path | None = None
    stall: wdog.Stall | None = None  # set when the watchdog killed it
    # the failure the backend blamed, read when the failure was taken (before the restart's
    # usable_slots, which on Ray drops the group that holds it)
    failure_seen: Any = None
    pids: list[dict[str, Any]] = field(default_factory=list)  # process records at its exit

    def observe(self, ev: Event) -> None:
        """Take the progress one of this segment's own worker events shows."""
        if isinstance(ev, (FirstStep, Throughput)):
            self.last_step, self.last_step_t = int(ev.step), float(ev.time)
        if isinstance(ev, Throughput):
            self.steps_per_s = float(ev.steps_per_s)
        elif isinstance(ev, SegmentEnd):
            self.end = ev

    @property
    def paused(self) -> bool:
        """Its workers stopped at a step boundary for a change (a resize or a stop, not the end)."""
        return self.end is not None and self.end.reason != "finished"

    def launch(self, owner: str) -> SegmentLaunch:
        """What a backend is told to start (or to re-form in place) for this segment."""
        return SegmentLaunch(self.world, self.index, self.stop_at, owner, self.go_file)


class Processes:
    """The launched segments whose processes may still run: started through ``backend``, the
    stopped ones reaped as they exit (:meth:`reap`), all killed by :meth:`kill_all`."""

    def __init__(self, backend: Backend, run_dir: Path, owner: str, clock: Callable[[], float],
                 events: EventLog) -> None:
        self.backend, self.run_dir, self.owner, self.clock, self.events = backend, run_dir, owner, clock, events
        self.draining: list[Segment] = []  # stopped segments whose processes are still exiting
        self.launchers: dict[int, list[float]] = {}  # segment -> [launcher pid, its create time]

    def start(self, seg: Segment) -> None:
        """Start ``seg``'s workers; sets its log, handle, command and start times."""
        seg.log = segment_log(self.run_dir, seg.index, seg.world)
        seg.t_launch = seg.t_started = self.clock()
        started = self.backend.start(seg.launch(self.owner), seg.log)
        seg.handle, seg.cmd = started.handle, started.cmd
        self.launchers[seg.index] = [seg.handle.pid, _create_time(seg.handle.pid)]

    def release(self, seg: Segment) -> float:
        """Let a pre-launched segment's workers go (they stop at ``seg.stop_at``); from now its
        relaunch -> first step is measured. Returns how long they had been waiting."""
        assert seg.go_file is not None
        t_go = self.clock()
        write_go(seg.go_file, Go(seg.stop_at, t_go))
        waited, seg.t_launch = t_go - seg.t_launch, t_go
        return waited

    def exited(self, seg: Segment, rc: int, t: float) -> None:
        """The launcher of the segment being watched exited: say so; forget its process records
        (kept in ``seg.pids`` for the failure's cause)."""
        self.events.write(WorkersExited(segment=seg.index, world_size=seg.world, returncode=rc, time=t))
        seg.pids = protocol.read_pid_records(self.run_dir)
        for f in protocol.pid_dir(self.run_dir).glob(f"seg{seg.index:03d}-rank*.json"):
            f.unlink(missing_ok=True)

    def end(self, seg: Segment) -> None:
        """Kill ``seg``'s processes and wait until its launcher has exited."""
        assert seg.handle is not None
        seg.handle.kill()
        while seg.handle.poll() is None:
            time.sleep(0.05)

    def kill_all(self, *others: Segment | None) -> None:
        """Leave no process behind: the draining segments and ``others`` (the running one, the
        pre-launched one), whatever ended the run (an exception included)."""
        for seg in [*self.draining, *others]:
            if seg is not None and seg.handle is not None and seg.handle.poll() is None:
                seg.handle.kill()

    def reap(self, on_exit: Callable[[Segment, float], None], wait: bool = False,
             timeout: float = 60.0, poll_s: float = 0.1) -> None:
        """Report each stopped segment whose launcher exited (an event, then ``on_exit(seg,
        time)``); with ``wait``, until all are gone (killed after ``timeout`` seconds)."""
        t0 = time.time()
        while self.draining:
            for seg in list(self.draining):
                assert seg.handle is not None
                rc = seg.handle.poll()
                if rc is None and wait and time.time() - t0 > timeout:
                    seg.handle.kill()
                    continue
                if rc is None:
                    continue
                self.draining.remove(seg)
                now = self.clock()
                self.events.write(WorkersExited(segment=seg.index, world_size=seg.world,
                                                returncode=rc, time=now))
                if rc != 0:  # after a complete checkpoint: report, but the run goes on
                    self.events.write(ErrorEvent(message=f"workers of segment {seg.index} exited "
                                                 f"with status {rc} after their checkpoint",
                                                 segment=seg.index))
                on_exit(seg, now)
            if not wait or not self.draining:
                return
            time.sleep(poll_s)


def _create_time(pid: int) -> float:
    try:
        import psutil

        return psutil.Process(pid).create_time()
    except Exception:  # noqa: BLE001 - a fake launcher's pid
        return 0.0
