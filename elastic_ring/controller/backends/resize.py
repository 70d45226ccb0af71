"""How a resize is carried out, chosen once per run (``--relaunch``): a strategy object the
controller's segment loop asks at each point instead of testing the mode's name.

- :class:`Relaunch`: new workers per segment, from the checkpoint the old ones wrote. ``sequential``
  starts them once the old ones have exited; ``overlap`` as soon as the checkpoint is on disk,
  while the old ones exit; ``prelaunch`` before the old ones stop (they build everything and wait
  for a go).
- :class:`InPlace`: the workers pause between two steps and re-form their ring at the new size in
  their own processes; the ring is re-formed by an :class:`~.api.InPlaceRing` backend (Horovod
  Elastic's driver, or a ring the controller forms for Ray actors). A scheduled resize is prepared
  ahead, while the segment trains.

Either re-forms a group from the state source the controller decided
(:attr:`~.membership.MembershipChange.state_source`): ``ResizeStrategy.reform`` takes it, and the
backend serves it or refuses it in one line; the controller never asks which backend it has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from elastic_ring.controller.backends.api import InPlaceRing, SegmentLaunch
from elastic_ring.controller.membership import StateSource

RELAUNCH_MODES = ("prelaunch", "overlap", "sequential")
MODES = (*RELAUNCH_MODES, "inplace")


class ResizeStrategy(Protocol):
    name: str  # the --relaunch mode (kept in run.json)
    keeps_workers: bool  # paused workers go on at the new size (no new processes)
    overlaps_exit: bool  # the next segment starts while the stopped workers exit
    prelaunches: bool  # the next workers start before the running ones stop

    def prepare_ahead(self, launch: SegmentLaunch) -> None:
        """A scheduled resize to ``launch`` comes at the end of the running segment."""

    def withdraw_ahead(self, segment: int) -> bool:
        """Withdraw what was prepared for the end of ``segment``; False when the workers already
        took it (a live request or an interrupt then waits for the next segment)."""

    def reform(self, paused_segment: int, launch: SegmentLaunch, t_launch: float, source: StateSource) -> None:
        """The workers paused at the end of ``paused_segment`` go on as ``launch``, from ``source``
        (keeps_workers; a source the backend cannot serve is refused in one line)."""

    def ask_exit(self, paused_segment: int, t: float) -> None:
        """The paused workers checkpoint and leave (keeps_workers; an interrupt)."""


@dataclass(frozen=True)
class Relaunch:
    """New workers per segment (``prelaunch``, ``overlap`` or ``sequential``): nothing is prepared
    ahead in the running workers, and none stays paused."""

    name: str
    keeps_workers = False

    def __post_init__(self) -> None:
        if self.name not in RELAUNCH_MODES:
            raise ValueError(f"not a relaunch mode: {self.name}")

    @property
    def overlaps_exit(self) -> bool:
        return self.name != "sequential"

    @property
    def prelaunches(self) -> bool:
        return self.name == "prelaunch"

    def prepare_ahead(self, launch: SegmentLaunch) -> None:
        return None  # the next workers are new processes: the loop starts them

    def withdraw_ahead(self, segment: int) -> bool:
        return True  # nothing was written ahead

    def reform(self, paused_segment: int, launch: SegmentLaunch, t_launch: float, source: StateSource) -> None:
        raise RuntimeError(f"a relaunch starts new workers from the checkpoint: no worker waits paused to go on "
                           f"from {source.value}")

    def ask_exit(self, paused_segment: int, t: float) -> None:
        raise RuntimeError("a relaunch starts new workers: no worker waits paused")


@dataclass(frozen=True)
class InPlace:
    """The same workers across resizes (``inplace``): ``ring`` re-forms their ring."""

    ring: InPlaceRing
    name = "inplace"
    keeps_workers = True
    overlaps_exit = True
    prelaunches = False

    def prepare_ahead(self, launch: SegmentLaunch) -> None:
        self.ring.report_ahead(launch)

    def withdraw_ahead(self, segment: int) -> bool:
        return self.ring.retract_ahead(segment)

    def reform(self, paused_segment: int, launch: SegmentLaunch, t_launch: float, source: StateSource) -> None:
        self.ring.resize_in_place(paused_segment, launch, t_launch, source)

    def ask_exit(self, paused_segment: int, t: float) -> None:
        self.ring.ask_exit(paused_segment, t)
