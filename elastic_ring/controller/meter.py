"""What each resize and each restart costs, measured from the workers' own events.

A resize (:class:`PendingResize`) is measured from the stop request to the first step at the new
size: the stop latency (request -> the old workers' exit), the checkpoint write, relaunch -> first
step, and the total time lost (first step - request - one steady step at the new size); its
``resize_overhead`` event is written once both the old workers' exit and a steady step time are
known. A restart (:class:`Restarting`) is measured from the failure's detection to the first step
after it, with the steps redone. :class:`Meter` holds the one of each in progress and writes the
events; it also keeps the start-up times and the latest speed, and from them says when to
pre-launch the next segment.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from elastic_ring.controller.segment import Segment
from elastic_ring.events.api import (EventLog, FirstStep, FirstStepAfterResize, Recovered, Relaunched, ResizeOverhead,
                                     Throughput)


@dataclass
class PendingResize:
    from_workers: int
    to_workers: int
    step: int
    t_request: float
    lr_last: float
    checkpoint_s: float = 0.0
    t_exit: float | None = None
    t_launch: float | None = None
    t_first: float | None = None
    steady_step_s: float | None = None
    segment: int = -1  # the segment whose workers are being stopped
    t_failure: float | None = None  # a joiner's grow (--survive): when the failure it heals was seen


@dataclass
class Restarting:
    """A restart in progress, measured up to the first step after it."""

    attempt: int
    t_detect: float
    t_last_progress: float
    steps_redone: int
    from_step: int
    segment: int = -1
    path: str = "disk"  # or "memory": the survivors of the failure went on in their processes


class Meter:
    """The resize and the restart being measured; ``rule`` (a :mod:`elastic_ring.worker.lr` rule)
    gives the new LR that ``relaunched`` events report for the built-in model."""

    def __init__(self, events: EventLog, rule, lr_by_script: bool = False) -> None:
        self.events, self.rule = events, rule
        # a user's script, which may set the LR itself (per batch, in Horovod Elastic's reset
        # callbacks, on_resize): the ``relaunched`` event waits for the first step, and reports
        # the LR that step used, with the rule the workers applied and the LR it gave
        self.lr_by_script = lr_by_script
        self._relaunched: tuple[int, float] | None = None
        self.pending: PendingResize | None = None
        self.restarting: Restarting | None = None
        self.startup_s: list[float] = []  # measured launch -> first step, for the pre-launch lead
        self.last_speed = 0.0  # steps/s of the latest throughput window of the running segment

    def prelaunch_lead_s(self, default_startup_s: float) -> float:
        """How long before a segment's stop its successor should be started: twice the median
        measured start-up (launch -> first step; ``default_startup_s`` before any) plus a second,
        as start-ups run slower beside training."""
        return 2.0 * (statistics.median(self.startup_s) if self.startup_s else default_startup_s) + 1.0

    def seconds_left(self, seg: Segment, now: float) -> float | None:
        """Estimated seconds until ``seg`` reaches its stop step, at its latest speed (else the
        latest seen at all); None before any speed is known. Before its first step: the whole
        segment's."""
        speed = seg.steps_per_s or self.last_speed
        if speed <= 0:
            return None
        if seg.last_step_t <= 0:
            return (seg.stop_at - seg.start_step) / speed
        return (seg.stop_at - (seg.last_step + (now - seg.last_step_t) * speed)) / speed

    def relaunched(self, segment: int, t_launch: float) -> Relaunched | None:
        """The new workers of the pending resize were started (or released) at ``t_launch``; the
        event written (None: no resize pending)."""
        p = self.pending
        if p is None:
            return None
        p.t_launch = t_launch
        if self.lr_by_script:  # written at the first step, with the LR the script's callbacks set
            self._relaunched = (segment, t_launch)
            return None
        return self._write_relaunched(segment, self.rule.scale(p.lr_last, p.from_workers, p.to_workers), t_launch)

    def _write_relaunched(self, segment: int, lr_new: float, t_launch: float, first: FirstStep | None = None
                          ) -> Relaunched:
        p = self.pending
        assert p is not None
        ev = Relaunched(segment=segment, from_workers=p.from_workers, to_workers=p.to_workers, step=p.step,
                        lr_last=p.lr_last, lr_new=lr_new, time=t_launch,
                        rule=getattr(first, "rule", None), lr_rule=getattr(first, "lr_rule", None))
        self.events.write(ev)
        return ev

    def first_step(self, segment: int, ev: FirstStep, t_launch: float, prelaunched: bool) -> Relaunched | None:
        """The running segment's first step (``ev``): ends the restart being measured, and the
        relaunch part of the pending resize; returns the ``relaunched`` event written now (a
        script's, with the LR that step used), else None."""
        t_first = float(ev.time)
        if not prelaunched and 0 < t_first - t_launch < 3600:  # ignore clock skew between hosts
            self.startup_s.append(t_first - t_launch)
        rs = self.restarting
        if rs is not None:
            step_s = 1.0 / self.last_speed if self.last_speed > 0 else 0.0
            self.events.write(Recovered(attempt=rs.attempt, segment=segment, world_size=ev.world_size,
                                        step=ev.step, from_step=rs.from_step,
                                        steps_redone=rs.steps_redone,
                                        detect_to_first_step_s=t_first - rs.t_detect,
                                        time_lost_s=max(0.0, t_first - rs.t_last_progress)
                                        + rs.steps_redone * step_s, path=rs.path, time=t_first))
            self.restarting = None
        p = self.pending
        rel = None
        if p is not None and self._relaunched is not None:
            rel = self._write_relaunched(self._relaunched[0], float(ev.lr), self._relaunched[1], ev)
            self._relaunched = None
        if p is not None:
            p.t_first = t_first
            self.events.write(FirstStepAfterResize(segment=segment, world_size=ev.world_size,
                                                   step=ev.step, lr=ev.lr,
                                                   since_launch_s=t_first - (p.t_launch or t_first),
                                                   since_failure_s=None if p.t_failure is None
                                                   else t_first - p.t_failure,
                                                   joiner="broadcast" if p.t_failure is not None else None,
                                                   time=t_first))
        return rel

    def throughput(self, ev: Throughput, running: bool) -> None:
        """A throughput window (of the running segment when ``running``): the first one after a
        resize gives its steady step time."""
        if running:
            self.last_speed = float(ev.steps_per_s)
        p = self.pending
        if p is not None and p.t_first is not None and p.steady_step_s is None:
            p.steady_step_s = ev.seconds / max(1, ev.steps)
            if p.t_exit is not None:
                self._overhead(p.steady_step_s)

    def exited(self, segment: int, t: float) -> None:
        """The launcher of ``segment`` exited at ``t`` after its checkpoint."""
        p = self.pending
        if p is not None and p.segment == segment:
            p.t_exit = t
            if p.t_first is not None and p.steady_step_s is not None:
                self._overhead(p.steady_step_s)

    def flush(self) -> None:
        """The segment after the resize ended before a full window: no steady step (0)."""
        if self.pending is not None and self.pending.t_first is not None:
            self._overhead(self.pending.steady_step_s or 0.0)

    def _overhead(self, steady_step_s: float) -> None:
        p = self.pending
        assert p is not None and p.t_first is not None
        self.events.write(ResizeOverhead(
            from_workers=p.from_workers, to_workers=p.to_workers, step=p.step,
            stop_latency_s=(p.t_exit or p.t_request) - p.t_request, checkpoint_s=p.checkpoint_s,
            relaunch_to_first_step_s=p.t_first - (p.t_launch or p.t_first),
            total_lost_s=max(0.0, p.t_first - p.t_request - steady_step_s),
            steady_step_s=steady_step_s))
        self.pending = None
