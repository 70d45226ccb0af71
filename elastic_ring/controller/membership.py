"""A change of a job's members, whatever caused it: one typed record, decided in one place.

A scheduled resize, a live ``resize`` (or a scheduler's), a warm worker joining for a failed one's
place, a failure, a hang, a host that stopped answering, a host drained or preempted with notice: each ends one segment's ring and starts the
next one's at some number of workers, from some copy of the training state. :func:`decide` turns
the cause and what the backend offers (the survivors it keeps, whether the workers re-form their
ring in place) into a :class:`MembershipChange`; the controller acts on that record
(``Controller._act``) and writes it as a ``membership_change`` event, which `status`, the summary
and the cluster's web page show; the next segment begins from its state source
(``Controller._begin``: a new group from the checkpoint, else the backend's re-form in place, handed
the source: ``ResizeStrategy.reform``).

Where the next ring's state comes from (:class:`StateSource`):

- ``memory``: the workers that go on hold it in their processes (an in-place shrink, the survivors
  of a failure under ``--survive``, rolled back to the last step they all hold);
- ``peer``: the workers that go on hold it, and new ones get it by broadcast from a live rank (an
  in-place grow, a warm worker joining, warm spares taking failed workers' places);
- ``checkpoint``: every worker of the next ring loads the newest checkpoint (a relaunch, a restart).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from elastic_ring.events.api import MembershipChanged

if TYPE_CHECKING:
    from elastic_ring.controller.backends.api import Survival


class Cause(str, Enum):
    """Why the members change (the ``source`` of a ``resize_requested`` event for a resize)."""

    SCHEDULE = "schedule"  # the plan's resize at this step
    LIVE = "live"  # `elastic-ring resize`
    POLICY = "policy"  # the cluster's scheduler (its policy), through the same request as `resize`
    JOINER = "joiner"  # a warm worker takes a failed one's place (--survive): the survivors grow back
    FAILURE = "failure"  # a worker died, or its launcher exited non-zero
    STALL = "stall"  # the watchdog found the job hung
    LOST_HOST = "lost_host"  # a failure, and fewer slots answer: restarted at the count that fits
    INTERRUPT = "interrupt"  # Ctrl-C / SIGTERM: the workers checkpoint and leave
    HOSTS = "hosts"  # host discovery: the usable slots changed (hosts appeared or left, or below the minimum)
    DRAINED = "drained"  # `elastic-ring drain RUN_DIR HOST`: the job shrinks off the host at the next step
    PREEMPTED = "preempted"  # a worker's SIGTERM (a preemption with notice): its host is drained as above

    @property
    def is_failure(self) -> bool:
        return self in (Cause.FAILURE, Cause.STALL, Cause.LOST_HOST)


class StateSource(str, Enum):
    """Where the next ring's training state comes from (see the module's docstring)."""

    MEMORY = "memory"
    PEER = "peer"
    CHECKPOINT = "checkpoint"


@dataclass(frozen=True)
class MembershipChange:
    """One change of members: ``members_before`` workers ran up to ``step`` (the step the state
    that goes on is at: a failure's rollback step), ``members_after`` go on from ``state_source``.
    ``time``: when it was asked or seen (a resize's and a restart's cost are measured from it)."""

    cause: Cause
    step: int
    members_before: int
    members_after: int
    state_source: StateSource
    time: float = 0.0
    survivors: Survival | None = field(default=None, compare=False, repr=False)  # memory: the backend's offer

    def event(self, segment: int) -> MembershipChanged:
        """The ``membership_change`` event of this change, ending ``segment``."""
        return MembershipChanged(cause=self.cause.value, step=self.step, members_before=self.members_before,
                                 members_after=self.members_after, state_source=self.state_source.value,
                                 segment=segment, time=self.time)

    def describe(self) -> str:
        """A few words for a person: ``failure at step 12: 4 -> 3 workers, from memory``."""
        return (f"{self.cause.value.replace('_', ' ')} at step {self.step}: {self.members_before} -> "
                f"{self.members_after} workers, from {self.state_source.value}")


def decide(cause: Cause, step: int, before: int, after: int, *, in_place: bool, survivors: Survival | None = None,
           usable: int | None = None, time: float = 0.0) -> MembershipChange:
    """The one decision of how members change.

    ``in_place``: the workers re-form their ring in their processes (``--relaunch inplace``, Ray);
    ``survivors``: for a failure, the backend's :class:`~.backends.api.Survival` (its ``step`` and
    ``world``), or None when it keeps none; ``usable``: for a failure restarted from the checkpoint,
    the slots that still answer (fewer than ``after``: a lost host)."""
    if cause.is_failure:
        if survivors is not None:  # they go on from the step they all hold in memory (warm spares: by broadcast)
            source = StateSource.PEER if survivors.joiners else StateSource.MEMORY
            return MembershipChange(cause, int(survivors.step), before, int(survivors.world), source, time, survivors)
        if usable is not None and usable < after:
            cause, after = Cause.LOST_HOST, usable
        return MembershipChange(cause, step, before, after, StateSource.CHECKPOINT, time)
    if cause is Cause.INTERRUPT or not in_place:
        return MembershipChange(cause, step, before, after, StateSource.CHECKPOINT, time)
    return MembershipChange(cause, step, before, after, StateSource.PEER if after > before else StateSource.MEMORY,
                            time)


def from_event(e: Any) -> MembershipChange | None:
    """The record a ``membership_change`` event holds (None: a cause or state source this version
    does not know, or a field missing)."""
    try:
        return MembershipChange(Cause(e.cause), int(e.step), int(e.members_before), int(e.members_after),
                                StateSource(e.state_source), float(e.time))
    except (TypeError, ValueError):
        return None
