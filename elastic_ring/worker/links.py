"""The TCP connections a ``torch.distributed`` gloo group holds, closed after a peer's loss so that
no survivor waits on this one.

Why: gloo wakes a rank blocked in a collective only when the connection it waits on closes. When
a rank dies inside a collective, the survivors that talked to it get an error at once, but one
that waits on another survivor (gloo's allreduce, which FSDP2's reduce-scatter runs on, waits on
several peers in turn) waits until that survivor's connection closes, and a survivor waiting for
the controller's word keeps its group, so it never does: the controller's wait
(``survival.WAIT_S``) ends with that survivor silent, and the run restarts from the checkpoint on
disk instead of going on from memory (seen once in a fresh-clone CI run, at three ranks of a
sharded model). ``scripts/probe_gloo_links.py`` counts it with and without :meth:`Links.drop`
(``results/probe_gloo_links.json``). Neither ``ProcessGroupGloo.abort()``, its ``shutdown()`` nor
``destroy_process_group()``, called by the survivor that left, woke the blocked one in trials
like the probe's (torch 2.14): the group's connections stay open while its objects live.
Shutting the sockets down does.

:class:`Links` notes the connections this process holds before its first group forms (a Ray
actor's own, the launcher's), and the ports of the stores it reaches the group's rendezvous by;
:meth:`Links.drop` shuts down every other established TCP connection: the gloo groups' (the
default group, the library's control group, a script's or a device mesh's own). The store's stay
open: the survivors form their next group over it. A connection that is not a group's but was
opened after the first group formed (a script's own client, a Ray call's new channel) is shut down
too: its owner sees it reset (gRPC connects again).
"""

from __future__ import annotations

import socket
from typing import Any


def _established() -> list[Any]:
    """This process's established TCP connections (``psutil``'s records: ``fd``, ``laddr``, ``raddr``)."""
    import psutil

    return [c for c in psutil.Process().net_connections("tcp")
            if c.status == psutil.CONN_ESTABLISHED and c.raddr and c.fd is not None and c.fd >= 0]


def _key(c: Any) -> tuple:
    return (tuple(c.laddr), tuple(c.raddr))


class Links:
    """The connections that are this process's groups': every established TCP connection but
    those held before :meth:`mark` and those to or from a port given to :meth:`keep_port`."""

    def __init__(self) -> None:
        self._before: set[tuple] | None = None
        self._kept_ports: set[int] = set()

    def mark(self) -> None:
        """Note the connections held now, before the first group forms (later calls: no-op)."""
        if self._before is None:
            self._before = {_key(c) for c in _established()}

    def keep_port(self, port: int) -> None:
        """Connections to or from ``port`` (a store's) are never dropped."""
        self._kept_ports.add(int(port))

    def _ours(self, c: Any) -> bool:
        return (self._before is not None and _key(c) not in self._before
                and c.laddr.port not in self._kept_ports and c.raddr.port not in self._kept_ports)

    def drop(self) -> int:
        """Shut down (both ways) every connection of the groups; returns how many. A connection
        that closed meanwhile is passed over. Nothing when :meth:`mark` was never called."""
        n = 0
        for c in _established():
            if not self._ours(c):
                continue
            try:  # a duplicate of the group's descriptor (closed here; the group's own stays, shut down)
                with socket.fromfd(c.fd, c.family, c.type) as s:
                    if (s.getsockname()[1], s.getpeername()[1]) == (c.laddr.port, c.raddr.port):  # still that one
                        s.shutdown(socket.SHUT_RDWR)
                        n += 1
            except OSError:  # (closed meanwhile, or the descriptor is something else now)
                pass
        return n
