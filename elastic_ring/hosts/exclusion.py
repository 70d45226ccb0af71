"""Hosts left out after a failure, for a cooldown that grows with repeated failures.

The model is Horovod Elastic's ``--blacklist-cooldown-range LOW HIGH``: a host whose worker
failed is not used for a while; after that it may be used again (and is grown back onto when
discovery still lists it). Here the n-th failure of a host excludes it for
``min(HIGH, LOW * 2**(n-1))`` seconds — LOW, 2 LOW, 4 LOW, ... capped at HIGH — with no random
part, so that `status` can say until when and a test can check it. A failure reported while the
host is still excluded (its other workers failing with it) does not count again.

:class:`Exclusions` takes its clock as an argument (wall-clock seconds by default, so that the
``until`` it reports can be shown as a time of day); nothing here sleeps or starts a thread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterable

from elastic_ring.errors import UserError
from elastic_ring.hosts.api import HostSet


@dataclass(frozen=True)
class CooldownRange:
    """LOW and HIGH seconds of the cooldown (Horovod's range: LOW >= 1, HIGH <= 3600)."""

    low: float = 10.0
    high: float = 300.0

    def __post_init__(self):
        if not (self.low > 0 and self.high >= self.low):
            raise UserError(f"the cooldown range needs 0 < LOW <= HIGH, got {self.low:g}:{self.high:g}")

    def delay(self, failures: int) -> float:
        """The cooldown after a host's ``failures``-th failure (1, 2, ...)."""
        if failures < 1:
            return 0.0
        return min(self.high, self.low * 2.0 ** min(failures - 1, 64))


def parse_cooldown_range(text: str) -> CooldownRange:
    """``"LOW:HIGH"`` (seconds) -> a :class:`CooldownRange`.

    Raises:
        UserError: not two numbers, LOW <= 0 or LOW > HIGH (one line).
    """
    lo, sep, hi = str(text).strip().partition(":")
    try:
        low, high = float(lo), float(hi if sep else lo)
    except ValueError:
        raise UserError(f"a cooldown range is LOW:HIGH in seconds, got {text!r}") from None
    return CooldownRange(low, high)


@dataclass(frozen=True)
class Excluded:
    """A host left out: until when (the clock's seconds) and after how many failures."""

    host: str
    until: float
    failures: int


class Exclusions:
    """The failed hosts and their cooldowns."""

    def __init__(self, cooldown: CooldownRange | None = None, clock: Callable[[], float] = time.time):
        self.cooldown = cooldown or CooldownRange()
        self.clock = clock
        self._failures: dict[str, int] = {}
        self._until: dict[str, float] = {}

    def failed(self, host: str) -> Excluded:
        """Record a failure of a worker on ``host``; it is left out until the returned time."""
        now = self.clock()
        if self._until.get(host, float("-inf")) > now:  # already cooling down: the same failure
            return Excluded(host, self._until[host], self._failures[host])
        n = self._failures.get(host, 0) + 1
        self._failures[host] = n
        self._until[host] = now + self.cooldown.delay(n)
        return Excluded(host, self._until[host], n)

    def is_excluded(self, host: str) -> bool:
        return self._until.get(host, float("-inf")) > self.clock()

    def excluded(self) -> list[Excluded]:
        """The hosts left out now, soonest back first."""
        now = self.clock()
        out = [Excluded(h, u, self._failures[h]) for h, u in self._until.items() if u > now]
        return sorted(out, key=lambda e: (e.until, e.host))

    def usable(self, hosts: HostSet) -> HostSet:
        """``hosts`` less those left out now (order kept)."""
        return hosts.without(e.host for e in self.excluded())

    def next_return(self) -> float | None:
        """When the next excluded host comes back (the clock's seconds), or None."""
        ex = self.excluded()
        return ex[0].until if ex else None

    def failures(self, host: str) -> int:
        """How many failures of ``host`` were counted (they are kept after the cooldown: the next
        one excludes it for longer), until :meth:`forgive`."""
        return self._failures.get(host, 0)

    def forgive(self, hosts: Iterable[str]) -> None:
        """Forget the failures of ``hosts`` (say, after they have run cleanly for long): the next
        failure is a first one again, and a host still cooling down is usable at once."""
        for h in hosts:
            self._failures.pop(h, None)
            self._until.pop(h, None)

    def line(self, fmt: Callable[[float], str] | None = None) -> str:
        """``excluded: a until 12:04:05 (2 failures), b until ...`` or ``excluded: none``;
        ``fmt`` turns an ``until`` into text (default: the local time of day, for a wall clock)."""
        fmt = fmt or (lambda t: time.strftime("%H:%M:%S", time.localtime(t)))
        ex = self.excluded()
        if not ex:
            return "excluded: none"
        return "excluded: " + ", ".join(
            f"{e.host} until {fmt(e.until)} ({e.failures} failure{'s' if e.failures != 1 else ''})" for e in ex)
