"""The Ray backend's records of its actors: a ring's :class:`Member`, a warm :class:`Spare`, and the
next ring formed :class:`Ahead` of a scheduled resize. Plain values, shared by the actor pool, the
ring former, the group and the backend."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elastic_ring.controller.backends.api import SegmentLaunch


@dataclass
class Member:
    """One actor of a ring: its ``info`` (node, ip, interface, pid, host), its rank in the ring, and
    the running ``run`` call (``ref``)."""

    name: str
    actor: Any
    info: dict[str, Any]
    rank: int = -1
    ref: Any = None  # the running ``run`` call
    retiring: bool = False
    go: Path | None = None  # a pre-started spare: it waits for this file, which brings its env
    bundle: int | None = None  # its bundle in the run's placement group (None: an actor outside it)


@dataclass
class Spare:
    """A warm actor running the worker entry up to its wait for ``go`` (not in a ring yet)."""

    name: str
    actor: Any
    info_ref: Any
    run_ref: Any
    go: Path
    info: dict[str, Any] = field(default_factory=dict)
    bundle: int | None = None  # a failed member's bundle it was started in (None: outside the group)

    def member(self) -> Member:
        return Member(self.name, self.actor, self.info, ref=self.run_ref, go=self.go, bundle=self.bundle)


@dataclass
class Ahead:
    """The next ring, formed while the running segment trains (a scheduled resize): its action is
    written ahead, and rank 0 takes it at the pause (or the controller withdraws it)."""

    segment: int  # the running segment, at whose last step it applies
    launch: SegmentLaunch  # the next segment
    members: list[Member]  # the next ring: survivors, then joiners
    leave: list[Member]
    joiners: list[Member]
    spares: list[Spare]  # the joiners as they were (given back if withdrawn)
    server: Any
    taken: bool = False
