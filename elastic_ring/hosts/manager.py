"""One object for the hosts a job may use now: what discovery lists, less the hosts cooling down
after a failure, and the size the job should run at within its bounds.

:class:`HostManager` holds a :class:`~.discovery.HostPoller`, an :class:`~.exclusion.Exclusions`
and the job's :class:`~.api.WorkerBounds` (each built and tested alone) and answers the
controller's two questions between steps: has the usable set changed (:meth:`HostManager.update`:
a host appeared, left, changed slots, was excluded or came back from its cooldown), and at what
size and on which hosts should the job run (:class:`HostView`). Below the minimum it says
``waiting for hosts (have K, need N)`` and, past ``min_wait_s``, that it gives up. A host drained
with notice (:meth:`HostManager.drain`: `elastic-ring drain`, a worker's SIGTERM) is left out
until discovery stops listing it and lists it again.

Pure logic over the clock passed in (the same clock for the poller and the exclusions); nothing
here launches or stops a worker.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterable

from elastic_ring.hosts.api import HostDiff, HostSet, WorkerBounds
from elastic_ring.hosts.discovery import HostPoller
from elastic_ring.hosts.exclusion import Excluded, Exclusions


@dataclass(frozen=True)
class HostView:
    """The hosts now: discovered (None: no good answer yet), usable (less the excluded, in rank
    order), excluded, and the size to run at (None: wait)."""

    discovered: HostSet | None
    usable: HostSet
    excluded: tuple[Excluded, ...]
    target: int | None
    need: int
    drained: tuple[str, ...] = ()

    def hosts_for(self, world: int) -> HostSet:
        """The hosts of a job of ``world`` workers: the first ``world`` usable slots."""
        return self.usable.first(world)

    def line(self, until: Callable[[float], str] | None = None, draining: tuple[str, ...] = ()) -> str:
        """`status`'s line about hosts; ``until`` turns an exclusion's end into text (the excluded
        hosts are then named with until when: ``excluded: b until 01:40:12``); ``draining``: the
        drained hosts the job still runs on (``draining: b``; the others: ``drained: b``)."""
        names = [e.host if until is None else f"{e.host} until {until(e.until)}" for e in self.excluded]
        ex = f"; excluded: {', '.join(names)}" if names else ""
        going = [h for h in self.drained if h in draining]
        gone = [h for h in self.drained if h not in draining]
        ex += f"; draining: {', '.join(going)}" if going else ""
        ex += f"; drained: {', '.join(gone)}" if gone else ""
        if self.target is None:
            return f"waiting for hosts (have {self.usable.total}, need {self.need}){ex}"
        n = self.usable.total
        return f"hosts: {self.usable.arg() or 'none'} ({n} slot{'s' if n != 1 else ''}){ex}"


@dataclass(frozen=True)
class HostChange:
    """The usable hosts changed: how (``diff``, from the previous usable set), the view now, and
    the lines to log (a discovery failure, a host excluded or back)."""

    diff: HostDiff
    view: HostView
    notes: tuple[str, ...] = ()


class HostManager:
    def __init__(self, poller: HostPoller, bounds: WorkerBounds, exclusions: Exclusions | None = None,
                 min_wait_s: float | None = None, clock: Callable[[], float] | None = None):
        self.poller, self.bounds = poller, bounds
        self.clock = clock or poller.clock
        self.exclusions = exclusions or Exclusions(clock=self.clock)
        self.min_wait_s = min_wait_s
        self._usable = HostSet()
        self._excluded: set[str] = set()
        self._waiting_since: float | None = None
        self._notes: list[str] = []
        # drained hosts -> whether discovery has stopped listing them since (listed again: back)
        self._drained: dict[str, bool] = {}
        # --relaunch inplace over the hosts as listed (not this host's slots only: prepare_hosts.host_manager)
        self.over_hosts = False
        # the hosts that do not answer now (the watchdog's host monitor, --host-probe: set by the
        # controller) and those the job runs on: a silent host the job does not run on is not
        # usable (not grown onto) until it answers again; one it runs on is the watchdog's (a stall)
        self.silent: Callable[[], Iterable[str]] = tuple
        self.in_use: Iterable[str] = ()
        self._silent: set[str] = set()

    def view(self, asked: int | None = None) -> HostView:
        usable = self.exclusions.usable(self.poller.hosts or HostSet()).without(self._drained)
        usable = usable.without(set(self.silent()) - set(self.in_use))
        return HostView(self.poller.hosts, usable, tuple(self.exclusions.excluded()),
                        self.bounds.target(usable.total, asked), self.bounds.min, tuple(self._drained))

    def drain(self, host: str) -> None:
        """``host`` leaves with notice: left out (the change shows at the next update) until
        discovery stops listing it and then lists it again (a host drained for maintenance and
        brought back); without that, for the rest of the run's controller."""
        self._drained.setdefault(host, False)

    def undrain(self, host: str) -> None:
        """Withdraw a drain (its notice came from a segment that failed instead: the failure's path rules)."""
        self._drained.pop(host, None)

    @property
    def drained(self) -> tuple[str, ...]:
        return tuple(self._drained)

    def failed(self, host: str) -> Excluded:
        """A worker on ``host`` failed: leave the host out (the change shows at the next update)."""
        return self.exclusions.failed(host)

    def update(self, asked: int | None = None) -> HostChange | None:
        """Poll discovery if due; a :class:`HostChange` when the usable hosts differ from the last
        update's (None otherwise, also when only the notes are new: see :meth:`notes`)."""
        poll = self.poller.poll_if_due()
        if poll is not None and poll.note:
            self._notes.append(poll.note)
        now_excluded = {e.host for e in self.exclusions.excluded()}
        known = self.poller.hosts or HostSet()
        for h in sorted(now_excluded - self._excluded):
            if h in known:
                self._notes.append(f"host {h} excluded after a failure")
        for h in sorted(self._excluded - now_excluded):
            if h in known:
                self._notes.append(f"host {h} back from its cooldown")
        self._excluded = now_excluded
        silent = set(self.silent()) & set(known)
        for h in sorted(silent - self._silent):
            self._notes.append(f"host {h} does not answer (--host-probe, or ssh): not grown onto until it does")
        for h in sorted(self._silent - silent):
            self._notes.append(f"host {h} answers again")
        self._silent = silent
        if poll is not None and poll.ok:
            for h in list(self._drained):
                if h not in known:
                    self._drained[h] = True  # no longer listed: listed again, it is back
                elif self._drained[h]:
                    del self._drained[h]
                    self._notes.append(f"host {h} listed again after its drain")
        view = self.view(asked)
        self._track_wait(view)
        diff = self._usable.diff(view.usable)
        self._usable = view.usable
        if not diff:
            return None
        notes, self._notes = tuple(self._notes), []
        return HostChange(diff, view, notes)

    def notes(self) -> list[str]:
        """Lines not yet handed out with a change (a failing discovery keeps its hosts)."""
        out, self._notes = self._notes, []
        return out

    def _track_wait(self, view: HostView) -> None:
        if view.target is None:
            if self._waiting_since is None:
                self._waiting_since = self.clock()
        else:
            self._waiting_since = None

    def waited_s(self) -> float:
        """Seconds below the minimum so far (0 when not waiting)."""
        return 0.0 if self._waiting_since is None else self.clock() - self._waiting_since

    def gave_up(self) -> str | None:
        """The line to stop on once the job has waited below its minimum for ``min_wait_s``."""
        if self.min_wait_s is None or self._waiting_since is None or self.waited_s() < self.min_wait_s:
            return None
        return (f"gave up waiting for hosts after {self.waited_s():.0f} s (have {self._usable.total}, "
                f"need {self.bounds.min})")
