"""The stall watchdog: a job that makes no step for too long is killed and restarted.

A crash ends horovodrun; a hang does not. A worker stopped by a signal, a deadlocked data loader,
a hung GPU or a host that vanished without closing its sockets leaves the other ranks waiting in
a collective until Gloo's timeout (tens of seconds on the CPU; NCCL can wait far longer).

Each rank writes a heartbeat: one fixed-width line ``STEP PHASE TIME`` rewritten in place
(``control/beats/seg<n>-rank<r>``, one ``pwrite`` per step, no rename: microseconds). The
controller reads them while it watches a segment (:meth:`Watchdog.observe`) and stamps each
change with its own clock (hosts' clocks may disagree). When the job as a whole made no step for
the timeout (:func:`allowed_idle_s`: ``--stall-timeout``, default the larger of 10x the median
step time and 30 s; longer while starting up, checkpointing, evaluating or ending), or a local
worker sits in the stopped state (``T`` in ``/proc/PID/stat``) for a few seconds without a step,
:meth:`Watchdog.check` returns a :class:`Stall`, and the controller kills the segment and
restarts it from the newest checkpoint like any failure (with ``--survive``, where the stall names
some ranks but not all, only those are ended: the others go on from memory as after a death). The hosts of a ``--hosts``/``--hostfile``
run are asked every few seconds while it runs (:class:`HostMonitor`): a host that stops answering
is evidence like a stopped worker (the job is stalled once it made no step for a few seconds),
and the restart goes on without it.

Blame (:func:`blame`), first that applies: local workers in the stopped state or gone; ranks on
hosts that no longer answer; the ranks Horovod's stall inspector names as missing in the log;
the ranks whose heartbeat is oldest (:func:`beat_order`: a lower step, or the same step but not
yet in phase ``sync``, which a rank enters when it has done its own forward and backward pass
and waits at the optimizer's step for the other ranks' gradients; or no heartbeat at all), when
they are not all equal. So a rank hung while running (a deadlocked data loader, a loop that never
ends) is named although it is not stopped. Else no rank is named: a rank that is only waiting
for a peer is never the culprit.

Everything here is pure or takes its side effects as arguments; the controller's hook is
``Diagnosis.check_stall`` (:mod:`.diagnose`).
"""

from __future__ import annotations

import re
import statistics
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from elastic_ring import protocol
from elastic_ring.heartbeat import Beat

FLOOR_S = 30.0  # the default timeout is never shorter than this
STEP_FACTOR = 10.0  # ... nor than this many median step times
STARTUP_S = 300.0  # allowance before a segment's first step (Horovod's own start timeout is 120 s)
SLOW_PHASE_S = 120.0  # at least this long while checkpointing, evaluating, pausing or ending
SLOW_PHASES = ("checkpoint", "eval", "paused", "ending")
STOPPED_GRACE_S = 5.0  # a stopped (SIGSTOP) worker and no step for this long: a stall at once
WAITING_PHASE = "sync"  # a rank done with its part of the next step, waiting for the others' gradients

_PREFIX = re.compile(r"^\[[\d,]+\]<std(?:out|err)>:")


def proc_state(pid: int) -> str | None:
    """The one-letter state of a local process (``R``, ``S``, ``T`` stopped, ``Z``...), None if gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:
        return raw[raw.rindex(")") + 2]
    except (ValueError, IndexError):
        return None


def missing_ranks(log_text: str) -> list[int]:
    """The ranks Horovod's stall inspector lists as missing (its newest report in the log; lines
    may carry horovodrun's ``[1,0]<stderr>:`` prefix)."""
    lines = [_PREFIX.sub("", ln) for ln in log_text.splitlines()]
    starts = [i for i, ln in enumerate(lines) if ln.strip().startswith("Missing ranks:")]
    if not starts:
        return []
    ranks = set()
    for ln in lines[starts[-1] + 1:]:
        m = re.match(r"\s*(\d+): \[", ln)
        if not m:
            break
        ranks.add(int(m.group(1)))
    return sorted(ranks)


# ---------------------------------------------------------------------- the rule
def default_timeout(step_times: Iterable[float], floor_s: float = FLOOR_S) -> float:
    """``--stall-timeout`` when not given: max(10x the median step time, the floor)."""
    st = [s for s in step_times if s > 0]
    return max(floor_s, STEP_FACTOR * statistics.median(st)) if st else floor_s


def allowed_idle_s(timeout_s: float, started: bool, phases: Iterable[str]) -> float:
    """How long the job may go without a step now: the timeout, longer before the first step
    and while a rank checkpoints, evaluates, pauses or ends its segment."""
    if not started:
        return max(timeout_s, STARTUP_S)
    if any(p in SLOW_PHASES for p in phases):
        return max(3 * timeout_s, SLOW_PHASE_S)
    return timeout_s


@dataclass(frozen=True)
class Stall:
    segment: int
    last_step: int
    idle_s: float
    allowed_s: float
    ranks: tuple[int, ...]  # blamed; empty when none stands out
    why: str  # how they were found
    hosts: tuple[str, ...] = ()  # the hosts that do not answer, when that is why

    @property
    def message(self) -> str:
        """Stable for the same stall (the restart rule compares messages): no times in it."""
        who = (f"rank {', '.join(map(str, self.ranks))}" if self.ranks else "no rank stands out")
        return f"stall: no step after step {self.last_step} ({who}: {self.why})"

    @property
    def rank(self) -> int | None:
        return self.ranks[0] if self.ranks else None


def beat_order(b: Beat | None) -> tuple[int, int]:
    """How far a rank got: its last step done, then whether it is already waiting for the others
    in the next step's gradient exchange (phase ``sync``). No heartbeat at all: before anything."""
    if b is None:
        return (-1, 0)
    return (b.step, 1 if b.phase == WAITING_PHASE else 0)


def blame(beats: list[Beat], world: int, stopped: dict[int, str], dead_hosts: dict[int, str],
          missing: list[int]) -> tuple[tuple[int, ...], str]:
    """(ranks to blame, how they were found); see the module docstring for the order.
    ``dead_hosts``: rank -> its host, for the ranks on hosts that do not answer."""
    if stopped:
        states = ", ".join(f"{r}:{s}" for r, s in sorted(stopped.items()))
        return tuple(sorted(stopped)), f"process stopped or gone ({states})"
    if dead_hosts:
        names = ", ".join(sorted(set(dead_hosts.values())))
        return tuple(sorted(dead_hosts)), f"its host does not answer ({names})"
    if missing:
        return tuple(missing), "Horovod's stall inspector lists it as missing"
    by_rank = {b.rank: b for b in beats}
    got = [beat_order(by_rank.get(r)) for r in range(world)]
    if world > 1 and min(got) < max(got):
        low = min(got)
        return tuple(r for r in range(world) if got[r] == low), "oldest heartbeat"
    return (), "every rank reached the same point"


@dataclass
class Watchdog:
    """Watches one segment at a time. ``timeout_s`` None: :func:`default_timeout`; 0: off."""

    timeout_s: float | None = None
    floor_s: float = FLOOR_S
    step_times: list[float] = field(default_factory=list)
    segment: int = -1
    world: int = 0
    t_progress: float = 0.0  # controller clock: the last step of any rank (or the launch)
    started: bool = False
    beats: dict[int, Beat] = field(default_factory=dict)

    def reset(self, segment: int, world: int, now: float) -> None:
        self.segment, self.world, self.t_progress = segment, world, now
        self.started, self.beats = False, {}

    def add_step_time(self, seconds: float) -> None:
        self.step_times = [*self.step_times[-49:], seconds]

    def timeout(self) -> float:
        return self.timeout_s if self.timeout_s is not None else default_timeout(self.step_times, self.floor_s)

    def observe(self, beats: list[Beat], now: float) -> None:
        """Any change of a rank's heartbeat (a step done, a phase entered) is progress."""
        for b in beats:
            if self.beats.get(b.rank) == b:
                continue
            self.beats[b.rank] = b
            self.t_progress = max(self.t_progress, now)
            self.started = self.started or b.step > 0

    def last_step(self) -> int:
        return max((b.step for b in self.beats.values()), default=0)

    def check(self, now: float, stopped: Callable[[], dict[int, str]],
              dead_hosts: Callable[[], dict[int, str]] = dict,
              missing: Callable[[], list[int]] = lambda: [],
              lost: Callable[[], dict[int, str]] = dict) -> Stall | None:
        """A :class:`Stall` when the job made no step for its allowance, else None.

        The callables are asked only when needed: ``stopped`` (rank -> state of local workers
        stopped or gone), ``lost`` (rank -> host, for ranks on hosts the :class:`HostMonitor`
        already found silent: cheap), ``dead_hosts`` (the same, asking the hosts now) and
        ``missing`` (Horovod's stall inspector). A stopped worker or a silent host is evidence
        enough: the job is stalled once it made no step for the grace (``STOPPED_GRACE_S``)."""
        if self.timeout_s == 0:  # --stall-timeout 0: off
            return None
        idle = now - self.t_progress
        timeout = self.timeout()
        grace = min(timeout, STOPPED_GRACE_S)
        if idle < grace:
            return None
        phases = [b.phase for b in self.beats.values()]
        allowed = allowed_idle_s(timeout, self.started, phases)
        st = stopped()
        gone = {} if st else lost()
        evidence = any(s == "T" for s in st.values()) or bool(gone)
        if idle < allowed and not evidence:
            return None
        if evidence and idle < allowed:
            allowed = grace
        dead = gone or (dead_hosts() if not st else {})
        ranks, why = blame(list(self.beats.values()), self.world, st, dead,
                           missing() if not (st or dead) else [])
        hosts = tuple(sorted(set(dead.values()))) if dead and not st else ()
        return Stall(self.segment, self.last_step(), idle, allowed, ranks, why, hosts)


def stopped_ranks(pid_records: list[dict], segment: int, local_hosts: set[str],
                  state: Callable[[int], str | None] = proc_state) -> dict[int, str]:
    """rank -> state of this segment's local workers that are stopped (``T``), zombies or gone."""
    out = {}
    for rec in pid_records:
        if rec.get("segment") != segment or rec.get("host") not in local_hosts:
            continue
        s = state(int(rec.get("pid", 0)))
        if s is None or s in ("T", "t", "Z", "X"):
            out[int(rec["rank"])] = s or "gone"
    return out


def ranks_on_dead_hosts(pid_records: list[dict], segment: int, alive_hosts: set[str],
                        all_hosts: set[str]) -> dict[int, str]:
    """rank -> host, for the ranks of the segment whose host was asked and did not answer (a
    record's host as the launcher's host list names it, else its own host name)."""
    dead = all_hosts - alive_hosts
    out = {}
    for r in pid_records:
        host = r.get("launch_host") or r.get("host")
        if r.get("segment") == segment and host in dead:
            out[int(r["rank"])] = str(host)
    return out


# ---------------------------------------------------------------------- hosts, while the job runs
HOST_PROBE_EVERY_S = 5.0  # a --hosts/--hostfile run's hosts are asked this often while it runs


class HostMonitor:
    """Asks a run's hosts whether they still answer, every ``every_s``, on a thread of its own
    (``probe``: the hosts -> those that answer; the real one runs ``ssh HOST true`` for a host
    that is not this one, so a round may take seconds and must not hold up the controller's
    loop). :meth:`silent` is the answer of the newest round: the controller's watchdog reads it
    at every check, so a host that vanished mid-run (its sockets never closed, the ring waiting)
    is found within about ``every_s`` plus the probe's own timeout, not only at a restart.

    Nothing starts in the constructor; :meth:`start` and :meth:`stop` own the thread, and
    :meth:`poll_once` is one round (what the tests call)."""

    def __init__(self, hosts: list[tuple[str, int]],
                 probe: Callable[[list[tuple[str, int]]], list[tuple[str, int]]],
                 every_s: float = HOST_PROBE_EVERY_S) -> None:
        self.hosts, self.probe, self.every_s = list(hosts), probe, every_s
        self.rounds = 0
        self._silent: frozenset[str] = frozenset()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll_once(self) -> frozenset[str]:
        try:
            alive = {h for h, _ in self.probe(self.hosts)}
        except Exception:  # noqa: BLE001 - a failed round says nothing about the hosts
            return self._silent
        self._silent = frozenset(h for h, _ in self.hosts if h not in alive)
        self.rounds += 1
        return self._silent

    def silent(self) -> frozenset[str]:
        return self._silent

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="elastic-ring-hosts")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=15)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.poll_once()
            if self._stop.wait(self.every_s):
                return
