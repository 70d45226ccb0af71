"""The running ring of the Ray backend (:class:`RayGroup`): it polls its members' ``run`` calls,
kills them, and names the failure that caused the others (by :func:`elastic_ring.protocol.blame`,
the rule the controller uses for every launcher).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from elastic_ring import protocol
from elastic_ring.controller.backends.ray_members import Member
from elastic_ring.protocol import RETIRED

GRACE_S = 5.0  # after a member fails, how long to wait for the one that caused it to show
SETTLE_S = 0.5  # a silent death Ray reported waits this long for a record or a lost node to show


class Nodes(Protocol):
    """What the group asks the cluster (:class:`~.ray_cluster.RayCluster`)."""

    def node_alive(self, node_id: str) -> bool: ...
    def process_gone(self, info: dict[str, Any]) -> bool: ...


def record_of(m: Member, records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """``m``'s crash record: the one its process wrote (host and pid), else its rank's."""
    pid, host = m.info.get("pid"), m.info.get("host")
    for r in reversed(records):
        if r.get("pid") == pid and (host is None or r.get("host") in (None, host)):
            return r
    for r in reversed(records):
        if r.get("pid") is None and r.get("rank") == m.rank:
            return r
    return None


def _unavailable(e: Exception | None) -> bool:
    return e is not None and "ActorUnavailableError" in type(e).__name__


@dataclass
class RayGroup:
    """The workers of the running ring: ``poll`` is None while they run, 0 when all finished, 1
    when any member failed (``failure`` says which). Members that left the ring (a shrink) are
    moved to ``left`` for the backend to recycle or end (``end``: how an actor is ended)."""

    nodes: Nodes
    run_dir: Path
    end: Callable[[Any], None]
    members: list[Member] = field(default_factory=list)
    pid: int = 0
    failure: protocol.Failure | None = None
    lost_node: str | None = None  # the node of the failed member, when it is lost
    rc: int | None = None
    t_start: float = field(default_factory=time.time)
    left: list[Member] = field(default_factory=list)
    _failed_seen: list[tuple[Member, Exception | None, float]] = field(default_factory=list)

    @property
    def failing(self) -> bool:
        """A member has failed (the cause may not be named yet)."""
        return bool(self._failed_seen)

    def poll(self) -> int | None:
        if self.rc is not None:
            return self.rc
        import ray

        refs = [m.ref for m in self.members if m.ref is not None]
        if not refs and not self._failed_seen:
            return None
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0) if refs else ([], [])
        done = set(ready)
        for m in list(self.members):
            if m.ref is None or m.ref not in done:
                continue
            try:
                out = ray.get(m.ref)
            except Exception as e:  # noqa: BLE001 - ActorDiedError, ActorUnavailableError, RayTaskError
                self._failed_seen.append((m, e, time.time()))
                m.ref = None
                continue
            if out == RETIRED or m.retiring:
                self.members.remove(m)
                self.left.append(m)  # its process (imports done) may become a spare
                continue
            m.ref = None  # finished
        now = time.time()
        for m in self.members:  # Ray can be slow to report a dead actor on a loaded machine (seen:
            # minutes): a member whose process is gone on this host has failed, reported or not
            if m.ref is not None and self.nodes.process_gone(m.info):
                self._failed_seen.append((m, None, now))
                m.ref = None
        if self._failed_seen:
            return self._judge()
        if all(m.ref is None for m in self.members):
            self.rc = 0
        return self.rc

    def _judge(self) -> int | None:
        """Name the failure that caused the others once it shows (:func:`elastic_ring.protocol.blame`
        over the failed members in the order seen: a lost node, an own error, a death without a
        record). A silent death Ray reported waits ``SETTLE_S`` for a lost node or a late record to
        show; one whose process is seen gone on this host does not (nothing more can show: a process
        that is gone wrote its record before, and its node is this host's). While only
        members that lost a peer have failed, the others get up to ``GRACE_S`` to show; after that
        the cause is a member that never reported, or no rank when all of them only lost a peer."""
        seen = self._failed_seen
        running = [m for m in self.members if m.ref is not None]
        # gone on this host before the records are read: whatever record such a process wrote is read
        gone = {id(m) for m in self.members if self.nodes.process_gone(m.info)}
        records = protocol.read_error_records(self.run_dir, since=self.t_start)
        # failed members: those Ray reported, and those whose process is seen gone on this host
        failed = [protocol.Seen(m.rank, record_of(m, records),
                                _unavailable(e) or not self.nodes.node_alive(m.info["node_id"]), who=(m, e))
                  for m, e, _ in seen]
        failed += [protocol.Seen(m.rank, record_of(m, records), who=(m, None)) for m in running if id(m) in gone]
        waited = time.time() - seen[0][2]
        culprit = protocol.blame(failed)
        if culprit is not None:
            settled = waited > SETTLE_S or id(culprit.who[0]) in gone
            if culprit.record is None and not culprit.node_lost and not settled:
                return None
            self._failed(*culprit.who)
            return self.rc
        if waited > GRACE_S or not running:
            never = protocol.blame([protocol.Seen(m.rank, who=(m, None)) for m in running])
            self._failed(*(never.who if never is not None else (None, seen[0][1])))
            return self.rc
        return None

    def _failed(self, m: Member | None, e: Exception | None) -> None:
        if m is None:  # every member that failed only lost a peer (a kill elsewhere, not seen)
            self.failure = protocol.Failure(None, "PeerLost", "every worker that failed only lost a peer (no rank "
                                            f"to blame): {type(e).__name__ if e is not None else 'lost'}")
            self.rc = 1
            return
        node = m.info.get("node_id", "?")
        kind = type(e).__name__ if e is not None else "ActorDiedError"
        lost = "ActorUnavailableError" in kind or not self.nodes.node_alive(node)
        if lost:
            self.lost_node = node
        how = " (node lost)" if lost else (" (its process is gone; no error reported)" if e is None else "")
        where = f"{node[:12]} ({m.info.get('ip', '?')})"
        self.failure = protocol.Failure(m.rank, kind, f"worker rank {m.rank} on Ray node {where} failed: {kind}{how}",
                                        node=where)
        self.rc = 1

    def running(self) -> list[Member]:
        """The members still in the ring and running (after a failure: the survivors)."""
        failed = {id(m) for m, _, _ in self._failed_seen}
        return [m for m in self.members if m.ref is not None and not m.retiring and id(m) not in failed]

    def go_on(self, survivors: list[Member]) -> None:
        """The ring goes on with ``survivors`` (a failure taken as a shrink): the others are ended
        and the failure forgotten; the group is watched again from now."""
        for m in self.members:
            if m not in survivors:
                self.end(m.actor)
        self.members = list(survivors)
        self.failure, self.lost_node, self.rc = None, None, None
        self._failed_seen = []
        self.t_start = time.time()

    def kill(self) -> None:
        for m in self.members:
            self.end(m.actor)
        if self.rc is None:
            self.rc = -9
