"""The Ray backend's running ring: its members, the warm spares, the ring formed ahead for a
scheduled resize, and the group that polls them and names the failure that caused the others
(:class:`RayGroup`, the controller's ``Handle``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from elastic_ring import protocol
from elastic_ring.controller.backends.api import SegmentLaunch

if TYPE_CHECKING:
    from elastic_ring.controller.backends.ray import RayBackend

RETIRED = 3  # elastic_ring.worker.run.RETIRED (not imported here: that module is the workers')
_GRACE_S = 5.0  # after a member fails, how long to wait for the one that caused it to show


def _record_of(m: "Member", records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """``m``'s crash record: the one its process wrote (host and pid), else its rank's."""
    pid, host = m.info.get("pid"), m.info.get("host")
    for r in reversed(records):
        if r.get("pid") == pid and (host is None or r.get("host") in (None, host)):
            return r
    for r in reversed(records):
        if r.get("pid") is None and r.get("rank") == m.rank:
            return r
    return None


def _peer_loss(rec: dict[str, Any]) -> bool:
    return bool(rec.get("peer_loss") or protocol.is_peer_loss(rec.get("type"), rec.get("message")))


@dataclass
class Member:
    name: str
    actor: Any
    info: dict[str, Any]
    rank: int = -1
    ref: Any = None  # the running ``run`` call
    retiring: bool = False
    go: Path | None = None  # a pre-started spare: it waits for this file, which brings its env


@dataclass
class Spare:
    name: str
    actor: Any
    info_ref: Any
    run_ref: Any
    go: Path
    info: dict[str, Any] = field(default_factory=dict)


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


@dataclass
class RayGroup:
    """The workers of the running ring (a controller ``Handle``): ``poll`` is None while they run,
    0 when all finished, 1 when any member failed (``failure`` says which)."""

    backend: "RayBackend"
    members: list[Member] = field(default_factory=list)
    pid: int = 0
    failure: dict[str, Any] | None = None
    rc: int | None = None
    t_start: float = field(default_factory=time.time)
    _failed_seen: list[tuple[Member, Exception | None, float]] = field(default_factory=list)

    def poll(self) -> int | None:
        if self.rc is not None:
            return self.rc
        import ray

        want = self.backend._want_ahead
        if want is not None and not self._failed_seen and self.backend._launch is not None \
                and want[0] == self.backend._launch.segment:
            self.backend.report_ahead(want[1].world, want[1])
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
                self.backend._recycle(m)  # its process (imports done) becomes a spare
                continue
            m.ref = None  # finished
        now = time.time()
        for m in self.members:  # Ray can be slow to report a dead actor on a loaded machine (seen:
            # minutes): a member whose process is gone on this host has failed, reported or not
            if m.ref is not None and self.backend._process_gone(m):
                self._failed_seen.append((m, None, now))
                m.ref = None
        if self._failed_seen:
            return self._judge()
        if all(m.ref is None for m in self.members):
            self.rc = 0
        return self.rc

    def _judge(self) -> int | None:
        """The failure that caused the others, the same rule as the controller's
        (:func:`elastic_ring.protocol.first_failure`): a member whose node is gone; else one that
        failed with an error of its own (a crash record that is not a peer loss); else one that
        died without any record (kill -9, the OOM killer), whether Ray reported it yet or its
        process is seen gone on this host. A member whose record says it only lost a peer
        (HorovodInternalError, "Connection reset/closed by peer") is never the cause: while only
        such members have failed, the others are given up to ``_GRACE_S`` to show; after that the
        cause is a member that never reported (or no rank, when all of them only lost a peer)."""
        records = protocol.read_error_records(self.backend.spec.run_dir, since=self.t_start)
        seen = self._failed_seen
        for m, e, _ in seen:
            if (e is not None and "ActorUnavailableError" in type(e).__name__) or not self.backend._node_alive(m.info["node_id"]):
                self._failed(m, e)
                return self.rc
        running = [m for m in self.members if m.ref is not None]
        # failed members: those Ray reported, and those whose process is seen gone on this host
        failed = [(m, e) for m, e, _ in seen] + [(m, None) for m in running if self.backend._process_gone(m)]
        for m, e in failed:
            r = _record_of(m, records)
            if r is not None and not _peer_loss(r):
                self._failed(m, e)
                return self.rc
        waited = time.time() - seen[0][2]
        silent = [(m, e) for m, e in failed if _record_of(m, records) is None]
        if silent:  # after 0.5 s: a lost node surfaces ~2.5 s after its processes (see above)
            if waited > 0.5:
                self._failed(*silent[0])
                return self.rc
            return None
        if waited > _GRACE_S or not running:
            if running:  # a member that never reported while its peers lost it
                self._failed(running[0], None)
            else:  # every member only lost a peer: no rank to blame
                self._failed(None, seen[0][1])
            return self.rc
        return None

    def _failed(self, m: Member | None, e: Exception | None) -> None:
        if m is None:  # every member that failed only lost a peer (a kill elsewhere, not seen)
            self.failure = {"rank": None, "node": None, "type": "PeerLost",
                            "message": "every worker that failed only lost a peer (no rank to blame): "
                                       f"{type(e).__name__ if e is not None else 'lost'}"}
            self.rc = 1
            return
        node = m.info.get("node_id", "?")
        kind = type(e).__name__ if e is not None else "ActorDiedError"
        lost = "ActorUnavailableError" in kind or not self.backend._node_alive(node)
        if lost:
            self.backend.suspect_nodes.add(node)
        how = " (node lost)" if lost else (" (its process is gone; no error reported)" if e is None else "")
        self.failure = {"rank": m.rank, "node": f"{node[:12]} ({m.info.get('ip', '?')})", "type": kind,
                        "message": f"worker rank {m.rank} on Ray node {node[:12]} ({m.info.get('ip', '?')}) "
                                   f"failed: {kind}{how}"}
        self.rc = 1

    def kill(self) -> None:
        for m in self.members:
            self.backend._end_actor(m.actor)
        if self.rc is None:
            self.rc = -9
