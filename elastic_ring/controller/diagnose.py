"""Why a segment failed, whether a running one hangs, and how far a failed one got.

:class:`Diagnosis` reads what the workers and the launcher leave behind (crash records, process
records, heartbeats, the launcher's log, ``progress.json``) and what the backend saw, and asks the
hosts of ``--hosts``/``--hostfile`` whether they still answer (:class:`~.watchdog.HostMonitor`,
while the job runs). The controller asks it :meth:`~Diagnosis.check_stall` while it watches a
segment, and :meth:`~Diagnosis.account` (:meth:`~Diagnosis.failure_cause`, :meth:`~Diagnosis.failed_at`) when one failed;
whether to restart is the controller's decision (:mod:`.restart_rule`).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any, Callable

from elastic_ring import protocol
from elastic_ring.controller import watchdog as wdog
from elastic_ring.heartbeat import read_beats
from elastic_ring.controller.api import RunSpec, parse_hostfile, parse_hosts
from elastic_ring.controller.backends.api import Backend
from elastic_ring.controller.segment import Segment
from elastic_ring.events.api import EventLog, Stalled

Hosts = list[tuple[str, int]]
Cause = tuple[str, "int | None", "protocol.Failure | None"]  # (one line, first failed rank, the failure)


def run_hosts(spec: RunSpec) -> Hosts:
    """The hosts of --hosts/--hostfile ([] on one host)."""
    if not (spec.hosts or spec.hostfile):
        return []
    return parse_hosts(spec.hosts) if spec.hosts else parse_hostfile(spec.hostfile)


@dataclass(frozen=True)
class FailureAccount:
    """One failure as a restart counts it (:meth:`Diagnosis.account`): the one line, the rank that
    failed first and its node, its crash record, the failure the restart rule compares
    (:mod:`.restart_rule`), and the last step done before it (``last``, at ``t_last``)."""

    why: str
    rank: int | None
    node: str | None
    record: dict[str, Any] | None
    failure: dict[str, Any]
    last: int
    t_last: float


class Diagnosis:
    def __init__(self, spec: RunSpec, backend: Backend, watchdog: wdog.Watchdog,
                 host_probe: Callable[[Hosts], Hosts], events: EventLog, out: Callable[[str], None],
                 clock: Callable[[], float], keeps_processes: bool = False) -> None:
        self.spec, self.backend, self.watchdog = spec, backend, watchdog
        self.host_probe, self.events, self.out, self.clock = host_probe, events, out, clock
        self.keeps_processes = keeps_processes  # processes outlive their first segment (inplace)
        self._monitor: wdog.HostMonitor | None = None  # asks the hosts while the job runs
        self._t_beats = 0.0

    @property
    def hosts(self) -> Hosts:
        """The hosts of --hosts/--hostfile, as they read now ([] on one host)."""
        return run_hosts(self.spec)

    def start(self) -> None:
        if self.hosts and self.watchdog.timeout_s != 0:
            self._monitor = wdog.HostMonitor(self.hosts, self.host_probe, wdog.HOST_PROBE_EVERY_S)
            self._monitor.start()

    def stop(self) -> None:
        if self._monitor is not None:
            self._monitor.stop()

    # ------------------------------------------------------------------ while it runs
    def check_stall(self, seg: Segment) -> bool:
        """Read the heartbeats (twice a second); True when the watchdog found a stall (then
        ``seg.stall`` says where and whom, and a ``stalled`` event is written; see :mod:`.watchdog`)."""
        now = self.clock()
        if now - self._t_beats < 0.5:
            return False
        self._t_beats = now
        wd, rd = self.watchdog, self.spec.run_dir
        if wd.segment != seg.index:
            wd.reset(seg.index, seg.world, seg.t_launch)
        wd.observe(read_beats(rd, seg.index), now)
        local = {socket.gethostname(), socket.getfqdn(), "localhost", "127.0.0.1", "::1"}

        def log_text() -> str:
            try:
                return seg.log.read_text(errors="replace")[-200_000:] if seg.log else ""
            except OSError:
                return ""

        seg.stall = st = wd.check(
            # (with the records written after an in-place re-form: a survivor's rank and segment are there)
            now, stopped=lambda: wdog.stopped_ranks(protocol.read_pid_records(rd, reformed=True), seg.index, local),
            dead_hosts=lambda: self.dead_host_ranks(seg),
            missing=lambda: wdog.missing_ranks(log_text()),
            lost=lambda: self.dead_host_ranks(seg, silent=self._seen_silent()))
        if st is not None:
            self.events.write(Stalled(segment=st.segment, last_step=st.last_step, idle_s=st.idle_s,
                                      allowed_s=st.allowed_s, ranks=list(st.ranks), why=st.why, time=now))
            self.out(f"{st.message}; no step for {st.idle_s:.1f} s (allowed {st.allowed_s:.1f} s): "
                     "killing the workers")
        return st is not None

    def silent_hosts(self) -> frozenset[str]:
        """The hosts of --hosts/--hostfile the newest round of the host monitor found silent (none
        while it does not run)."""
        return self._seen_silent()

    def _seen_silent(self) -> frozenset[str]:
        """The hosts the last round of the host monitor found silent (asks no one now)."""
        return self._monitor.silent() if self._monitor is not None else frozenset()

    def dead_host_ranks(self, seg: Segment, silent: frozenset[str] | None = None) -> dict[int, str]:
        """rank -> host, for ranks of ``seg`` on hosts of --hosts/--hostfile that no longer answer
        (``silent``: those hosts as already found; None: ask every host now)."""
        hosts = self.hosts
        if not hosts or silent == frozenset():
            return {}
        names = {h for h, _ in hosts}
        alive = names - silent if silent is not None else {h for h, _ in self.host_probe(hosts)}
        return wdog.ranks_on_dead_hosts(protocol.read_pid_records(self.spec.run_dir, reformed=True), seg.index,
                                        alive, names)

    # ------------------------------------------------------------------ after a failure
    @staticmethod
    def stalled_hosts(seg: Segment) -> str | None:
        """The hosts that did not answer, when the watchdog stopped ``seg`` for that."""
        return ", ".join(seg.stall.hosts) if seg.stall is not None and seg.stall.hosts else None

    def failed_at(self, seg: Segment, records: list[dict[str, Any]]) -> tuple[int, float]:
        """(the last step done, when) by the newest evidence: progress.json, the segment's own
        events, the crash ``records`` and the heartbeats the watchdog read."""
        prog = protocol.read_json(protocol.control_dir(self.spec.run_dir) / protocol.PROGRESS_FILE) or {}
        last = max(int(prog.get("step", 0)), seg.last_step, seg.start_step)
        t_last = float(prog.get("time", 0.0)) or seg.last_step_t or seg.t_launch
        # the ranks that died of their peer's loss name the step they were in: the one before it
        # was done (progress.json is written at most twice a second, so it may lag behind)
        for r in records:
            if isinstance(r.get("step"), int) and r["step"] - 1 > last:
                last, t_last = r["step"] - 1, float(r.get("time", t_last))
        if seg.stall is not None and seg.stall.last_step > last:  # the heartbeats are newer still
            last, t_last = seg.stall.last_step, self.watchdog.t_progress
        return last, t_last

    def failure_cause(self, seg: Segment, rc: int, records: list[dict[str, Any]] | None = None) -> Cause:
        """(one-line cause, first failed rank, the failure blamed) of a failed segment."""
        if records is None:
            records = protocol.read_error_records(self.spec.run_dir, since=seg.t_started)
        hr_first = self.backend.first_failed_rank(seg.log)
        first = protocol.first_failure(records, self._dead_ranks(seg, records, hr_first))
        if seg.stall is not None:  # killed by the watchdog: the others only lost their peer
            first = protocol.Failure(seg.stall.rank, "Stalled", seg.stall.message, seg.stall.last_step + 1)
        seen = self._seen(seg)
        if seen and seg.stall is None and (first is None or first.type in (None, "Killed", "PeerLost")):
            return seen.message or "", seen.rank, None  # the backend saw who went first
        if first is None and hr_first is not None:
            first = protocol.Failure(hr_first, None, None)
        if first is None:
            return f"horovodrun exited with status {rc} before the workers checkpointed", None, None
        rank, kind = first.rank, first.type
        if kind == "Stalled":
            return first.message or "", rank, first
        if kind == "Killed":
            return first.message or "", rank, None
        if kind == "PeerLost":
            return first.message or "", None, first
        if kind is None:
            return f"worker rank {rank} exited first (horovodrun status {rc})", rank, None
        return f"worker rank {rank} failed: {first.message}", rank, first

    def _seen(self, seg: Segment) -> protocol.Failure | None:
        """The failure the backend blamed for ``seg``: as read when the failure was taken, else now."""
        return seg.failure_seen if seg.failure_seen is not None else self.backend.failure_detail()

    def account(self, seg: Segment, rc: int | None, step: int, survivors: Any = None) -> FailureAccount:
        """A failed segment as its restart counts it, from the state at ``step`` (the checkpoint's,
        or the step the backend's ``survivors`` all hold in memory: their failure is the one blamed)."""
        records = protocol.read_error_records(self.spec.run_dir, since=seg.t_started)
        last, t_last = self.failed_at(seg, records)
        last = max(last, step)  # the progress file may lag behind the checkpoint's (the survivors') step
        if survivors is None:
            why, rank, blamed = self.failure_cause(seg, rc if rc is not None else -1, records)
            seen = self._seen(seg)
            return FailureAccount(why, rank, (seen.node if seen else None) or self.stalled_hosts(seg),
                                  blamed.record if blamed is not None else None,  # the crash record on disk, if one
                                  {"from_step": step, "type": blamed.type if blamed else None,
                                   "message": blamed.message if blamed else why,
                                   "step": blamed.step if blamed else None}, last, t_last)
        f = survivors.failure
        why = seg.stall.message if seg.stall is not None else f.message or f"worker rank {f.rank} failed"
        rec = f.record or next((r for r in records if r.get("rank") == f.rank and not r.get("peer_loss")), None)
        return FailureAccount(why, f.rank, f.node, rec,
                              {"from_step": step, "type": "Stalled" if seg.stall is not None else f.type,
                               "message": why, "step": f.step if f.step is not None else last + 1}, last, t_last)

    def _dead_ranks(self, seg: Segment, records: list[dict[str, Any]], hr_first: int | None) -> list[int]:
        """The ranks that died without a crash record: the one the launcher names, else those
        with a process record of the segment (e.g. Horovod Elastic's driver names no rank)."""
        with_record = {r.get("rank") for r in records}
        if hr_first is not None and hr_first not in with_record:
            return [hr_first]
        pids = seg.pids or protocol.read_pid_records(self.spec.run_dir)
        return sorted({int(p["rank"]) for p in pids if p.get("segment") == seg.index or (
            self.keeps_processes and float(p.get("created") or 0) >= seg.t_started - 1.0)} - with_record)
