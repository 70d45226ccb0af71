"""Host discovery as the controller's loop sees it: the size a segment is launched at, the hosts it
starts on, and when a running segment must change because the usable slots did.

A :class:`HostWatch` holds the run's :class:`~elastic_ring.hosts.manager.HostManager` (which polls
the discovery script, or reads a fixed host list as one that never changes, and keeps the usable
hosts) and what the controller asked of it; the :class:`~.controller.Controller` owns one under
``--host-discovery-script`` or over several ``--hosts`` (:func:`.prepare_hosts.host_manager`) and calls it from its
loop: :meth:`HostWatch.world` before a launch, :meth:`HostWatch.view` and :meth:`HostWatch.check`
from the watch, :meth:`HostWatch.failed` when a worker failed (its host is left out for a cooldown,
``--blacklist-cooldown-range``, and grown back onto after it). Asking a change (the stop file, the
``resize_requested`` event) stays the controller's (``Controller._ask``).

Besides `status`'s line it keeps the hosts as data in ``controller.json`` (:meth:`HostWatch.state`:
discovered, in use, excluded with until when, draining), which the cluster page and ``/metrics``
read (:mod:`elastic_ring.telemetry.hosts`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from elastic_ring import protocol
from elastic_ring.controller.api import Plan
from elastic_ring.controller.membership import Cause, decide
from elastic_ring.controller.meter import Meter
from elastic_ring.controller.segment import Segment
from elastic_ring.events.api import ErrorEvent, EventLog, HostsChanged, Notice

if TYPE_CHECKING:
    from elastic_ring.hosts.api import HostSet
    from elastic_ring.hosts.exclusion import Excluded
    from elastic_ring.hosts.manager import HostManager, HostView


class HostWatch:
    def __init__(self, manager: HostManager, asked: int | None, *, plan: Plan, save_plan: Callable[[], None],
                 meter: Meter, events: EventLog, out: Callable[[str], None], clock: Callable[[], float],
                 poll_s: float, show_line: Callable[[str, HostView], Any], interrupted: Callable[[], int],
                 show_state: Callable[[dict[str, Any]], Any] | None = None) -> None:
        # the size asked of discovery (--workers, the schedule's, a live resize's; None: every
        # usable slot up to --max-workers) and the hosts each segment was started on
        self.manager = manager
        self.asked: int | None = asked
        self.hosts_of: dict[int, HostSet] = {}
        self._line: str | None = None
        self.plan, self._save_plan, self.meter, self.events = plan, save_plan, meter, events
        self.out, self.clock, self.poll_s = out, clock, poll_s
        self._show_line = show_line  # `status`'s hosts line (and the usable hosts), into controller.json
        self._interrupted = interrupted  # the controller's count of signals
        self._show_state = show_state  # the hosts as data (state()), into controller.json
        self._state: dict[str, Any] | None = None
        self.in_use: HostSet | None = None  # the hosts the newest segment was started on
        self.kept: HostSet | None = None  # the hosts the next segment runs on as they are (keep)
        # hosts leaving with notice the job still runs on -> their deadline (the controller's wall
        # clock; None: none); .drains.Drains keeps it
        self.draining: dict[str, float | None] = {}
        # the manager's clock (monotonic) to the controller's (wall), for `status`'s "until 01:40:12"
        self._to_wall = clock() - manager.clock()

    def until(self, t: float) -> str:
        """A time of the manager's clock (an exclusion's end) as a local time of day."""
        return time.strftime("%H:%M:%S", time.localtime(t + self._to_wall))

    def host_of(self, seg: Segment, rank: int, run_dir: Path | None = None) -> str | None:
        """The host ``rank`` of ``seg`` ran on: its process record's name in horovodrun's ``-H``
        (``launch_host``) when that is one of the segment's hosts (the records kept when its
        launcher exited, ``seg.pids``, or those in ``run_dir``), else the rank's place in the hosts
        it was started on (rank order: :meth:`place`); None when not known. (Horovod Elastic's
        driver numbers the hosts in an order of its own: in place the records name the host.)"""
        on = self.hosts_of.get(seg.index)
        if on is None:
            return None
        if run_dir is not None:
            for p in [*seg.pids, *protocol.read_pid_records(run_dir)]:
                if p.get("segment") == seg.index and p.get("rank") == rank and p.get("launch_host") in on:
                    return str(p["launch_host"])
        first = 0
        for host, n in on.items():
            if first <= rank < first + n:
                return host
            first += n
        return None

    def failed(self, seg: Segment, rank: int | None, run_dir: Path | None = None,
               host: str | None = None) -> Excluded | None:
        """Rank ``rank`` of ``seg`` failed: its host (``host`` where the backend named it) is left
        out for its cooldown (the next :meth:`view` shows it: a ``hosts_changed`` event, the
        restart launched on the other hosts, or the survivors' ring re-formed in place without it);
        a ``notice`` event and a line say which host and until when. None: its host is not known."""
        if host is None:
            host = None if rank is None else self.host_of(seg, rank, run_dir)
        if host is None:
            return None
        ex = self.manager.failed(host)
        note = (f"host {host} (rank {rank}) excluded until {self.until(ex.until)} after "
                f"{ex.failures} failure{'s' if ex.failures != 1 else ''} "
                f"(cooldown {ex.until - self.manager.clock():.0f} s)")
        self.out(note)
        self.events.write(Notice(message=note, segment=seg.index))
        return ex

    def capped(self, n: int | None) -> int | None:
        """The size ``n`` workers is capped to by the usable slots (None: below the minimum)."""
        return self.manager.view(n).target

    def keep(self, hosts: str) -> None:
        """The next segment runs on ``hosts`` (``a:1,b:2``) as they are, whatever the usable slots
        allow: the survivors of a failure in place over discovered hosts, on their own hosts (a
        change the hosts allow comes after, from the watch: :meth:`check`)."""
        from elastic_ring.hosts.api import HostSet

        self.kept = HostSet.from_arg(hosts)

    def ahead(self, world: int) -> HostSet:
        """The hosts a next segment of ``world`` would start on now (:meth:`place`, nothing kept):
        a shrink asked in place tells them to the backend ahead of the pause."""
        return self.kept or self.manager.view(self.asked).hosts_for(world)

    def place(self, seg: Segment) -> HostSet:
        """The hosts ``seg`` starts on: the first ``seg.world`` usable slots, in rank order (or
        those :meth:`keep` gave)."""
        on, self.kept = self.kept or self.manager.view(self.asked).hosts_for(seg.world), None
        self.hosts_of[seg.index] = on
        self.in_use = on
        self.manager.in_use = tuple(on)
        self._show(self.manager.view(self.asked))
        return on

    def view(self, segment: int | None = None) -> HostView:
        """Poll discovery when due (:meth:`HostManager.update`): its lines said, a change of the
        usable hosts an event, `status`'s hosts line kept in ``controller.json``; the view now."""
        ch = self.manager.update(self.asked)
        for note in (ch.notes if ch is not None else self.manager.notes()):
            self.out(note)
            self.events.write(Notice(message=note, segment=segment))
        view = ch.view if ch is not None else self.manager.view(self.asked)
        if ch is not None:
            self.events.write(HostsChanged(diff=ch.diff.line(), hosts=view.usable.arg(), slots=view.usable.total,
                                           target=view.target, segment=segment))
            self.out(f"hosts changed: {ch.diff.line()}; {view.line(until=self.until)}")
        line = view.line(until=self.until, draining=tuple(sorted(self.draining)))
        if line != self._line:
            self._line = line
            self._show_line(line, view)
        self._show(view)
        return view

    def state(self, view: HostView) -> dict[str, Any]:
        """The hosts as data (``controller.json``'s ``host_state``): ``discovered`` (``[[host, slots]]``,
        None before a good answer), ``usable`` (less the excluded), ``in_use`` (the newest segment's),
        ``excluded`` (``[{host, until, failures}]``, until in wall-clock seconds), ``draining``
        (``[{host, deadline}]``: hosts leaving with notice), ``target`` (None: waiting) and ``need``
        (``--min-workers``)."""
        return {"discovered": view.discovered.pairs() if view.discovered is not None else None,
                "usable": view.usable.pairs(), "in_use": self.in_use.pairs() if self.in_use is not None else [],
                "excluded": [{"host": e.host, "until": round(e.until + self._to_wall, 3), "failures": e.failures}
                             for e in view.excluded],
                "draining": [{"host": h, "deadline": t} for h, t in sorted(self.draining.items())],
                "target": view.target, "need": view.need}

    def _show(self, view: HostView) -> None:
        if self._show_state is None:
            return
        st = self.state(view)
        if st != self._state:
            self._state = st
            self._show_state(st)

    def check(self, seg: Segment, view: HostView) -> int | None:
        """The size to ask of ``seg`` when the usable slots (``view``, polled by :meth:`view`) allow
        another size than its, or no longer hold the hosts it runs on; None: it may go on."""
        target = view.target if view.target is not None else view.usable.total
        on = self.hosts_of.get(seg.index)
        fits = on is None or all(view.usable.get(h, 0) >= n for h, n in on.items())
        return None if target == seg.world and fits else target

    def within(self, seg: Segment, target: int) -> int | None:
        """A live resize's ``target`` under host discovery: within ``--min-workers``/``--max-workers``
        (else refused: None), capped by the usable slots (and grown to later when more appear);
        None when nothing is left to do now."""
        b = self.manager.bounds
        if target < b.min or (b.max is not None and target > b.max):
            self.events.write(ErrorEvent(message=f"live resize to {target} refused (--min-workers {b.min}, "
                                         f"--max-workers {b.max if b.max is not None else 'none'})",
                                         segment=seg.index))
            return None
        self.asked = target
        capped = self.manager.view(target).target
        if capped is None or capped == target:
            return target if capped is not None and target != seg.world else None
        self.out(f"live resize to {target}: {capped} usable slot(s) discovered: to {capped} now, to {target} "
                 f"when hosts appear")
        return capped if capped != seg.world else None

    def world(self, step: int, world: int, segment: int) -> int | str:
        """The size to launch ``segment`` at: what the usable hosts allow now (waiting below the
        minimum, `status` saying ``waiting for hosts (have K, need N)``); a size other than the one
        decided (the hosts changed since, or the first launch) goes in the plan, and after the first
        segment is a ``membership_change`` of cause ``hosts``. A str: why it stopped waiting (it
        gave up after ``--min-wait``, or an interrupt). The hosts :meth:`keep` gave: their size."""
        view = self.view(segment)
        if self.kept is not None:
            return self.kept.total
        while view.target is None:
            if self._interrupted():
                return f"interrupted while {view.line()}"
            why = self.manager.gave_up()
            if why is not None:
                return why
            time.sleep(self.poll_s)
            view = self.view(segment)
        if view.target != world:
            self.plan.add(step, view.target, Cause.HOSTS.value)
            self._save_plan()
            if self.meter.pending is not None and self.meter.pending.step == step:
                self.meter.pending.to_workers = view.target  # the resize measured is to the size launched
            if segment > 0:
                self.events.write(decide(Cause.HOSTS, step, world, view.target, in_place=False,
                                         time=self.clock()).event(segment - 1))
        return view.target
