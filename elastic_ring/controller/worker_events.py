"""What the controller does with each worker event the relay hands it.

:class:`~.relay.Relay` copies the workers' events into ``events.jsonl``; a :class:`WorkerEvents`,
owned by the :class:`~.controller.Controller`, reacts to each (:meth:`WorkerEvents.react`): the
watched segment's progress (``Segment.observe``), its first step (the controller's callback: the
launch's transition over, the ring written ahead), the measurements (:mod:`.meter`, the stall
watchdog's step time) and the display. An event of a segment after the one that just ended waits
(:meth:`WorkerEvents.hold`).
"""

from __future__ import annotations

from typing import Callable

from elastic_ring.controller.display import Display, layout_words
from elastic_ring.controller.meter import Meter
from elastic_ring.controller.segment import Segment
from elastic_ring.controller.watchdog import Watchdog
from elastic_ring.events.api import CheckpointWritten, Evaluation, Event, FirstStep, Notice, Throughput


class WorkerEvents:
    def __init__(self, meter: Meter, display: Display, watchdog: Watchdog, constant_batch: tuple[int, int] | None,
                 first_step: Callable[[Segment], None]) -> None:
        self.meter, self.display, self.watchdog, self.constant_batch = meter, display, watchdog, constant_batch
        self._first_step = first_step  # the watched segment's workers made their first step

    @staticmethod
    def hold(ev: Event, seg: Segment | None) -> bool:
        """An event of a segment after the one that just ended (``seg``: workers that took a resize
        written ahead): it waits until that segment is watched."""
        n = getattr(ev, "segment", None)
        return seg is not None and seg.end is not None and isinstance(n, int) and n > seg.index

    def react(self, ev: Event, seg: Segment | None) -> None:
        """React to one worker event (already in ``events.jsonl``; ``seg`` the segment watched):
        the running segment's progress, the measurements, the display."""
        mine = seg is not None and getattr(ev, "segment", None) == seg.index
        if mine:
            seg.observe(ev)
        if isinstance(ev, FirstStep) and mine:
            self._first_step(seg)
            rel = self.meter.first_step(seg.index, ev, seg.t_launch, prelaunched=seg.go_file is not None)
            if rel is not None:
                self.display.resized(rel.from_workers, rel.to_workers, rel.step, rel.lr_last, rel.lr_new,
                                     rule=rel.rule, lr_rule=rel.lr_rule,
                                     layout=layout_words(self.constant_batch, rel.to_workers))
        elif isinstance(ev, Throughput):
            if ev.steps:
                self.watchdog.add_step_time(float(ev.seconds) / int(ev.steps))
            self.meter.throughput(ev, running=mine)
            self.display.throughput(ev)
        elif isinstance(ev, CheckpointWritten) and seg is not None:
            seg.ckpt_s = float(ev.seconds)
        elif isinstance(ev, Evaluation):
            self.display.evaluation(ev)
        elif isinstance(ev, Notice):
            self.display.notice(ev.message)
