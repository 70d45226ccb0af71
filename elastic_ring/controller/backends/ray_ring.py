"""Rings the controller forms for the Ray backend: members -> ranks and Horovod environments.

:func:`assign_ranks` (one Horovod host per Ray node, members in rank order as far as nodes allow)
and :func:`member_envs` (each member's Horovod environment for a rendezvous at ``ip:port``) are
pure; :class:`RingFormer` serves one Horovod rendezvous per ring (``RendezvousServer``) and keeps
the servers until the ring that replaced them is in use.
"""

from __future__ import annotations

from typing import Any, Callable

from elastic_ring.controller.backends.ray_members import Member
from elastic_ring.controller.backends.ray_worker import rendezvous_handler


def assign_ranks(members: list[Member]) -> list[tuple[Member, Any]]:
    """Each member's Horovod slot (``SlotInfo``), in rank order; sets ``member.rank``. One Horovod
    host per Ray node ID, in the order the nodes first appear among ``members``."""
    from horovod.runner.common.util.hosts import HostInfo, get_host_assignments

    order: list[str] = []
    by_node: dict[str, list[Member]] = {}
    for m in members:
        node = m.info["node_id"]
        if node not in by_node:
            order.append(node)
            by_node[node] = []
        by_node[node].append(m)
    slots = get_host_assignments([HostInfo(n, len(by_node[n])) for n in order], len(members))
    taken = {n: 0 for n in order}
    out = []
    for slot in slots:
        m = by_node[slot.hostname][taken[slot.hostname]]
        taken[slot.hostname] += 1
        m.rank = slot.rank
        out.append((m, slot))
    return out


def member_envs(assigned: list[tuple[Member, Any]], ip: str, port: int) -> dict[str, dict[str, str]]:
    """member name -> its Horovod environment in the ring served at ``ip:port``."""
    from horovod.runner.gloo_run import create_run_env_vars, create_slot_env_vars

    envs: dict[str, dict[str, str]] = {}
    for m, slot in assigned:
        # elastic=True: Horovod asks the rendezvous for its rank (served by rendezvous_handler),
        # and a DistributedOptimizer made at size 1 still allreduces once the ring grows
        env = {k: str(v) for k, v in create_run_env_vars(ip, [m.info["iface"]], port, elastic=True).items()}
        env.update({k: str(v) for k, v in create_slot_env_vars(slot).items()})
        env["ELASTIC_RING_MEMBER"] = m.name
        envs[m.name] = env
    return envs


def _serve(slots: list[Any]):
    from horovod.runner.http.http_server import RendezvousServer

    server = RendezvousServer()
    port = server.start(rendezvous_handler({(s.hostname, s.local_rank): s for s in slots}))
    server.init(slots)
    return server, port


def _controller_ip() -> str:
    import ray

    return ray.util.get_node_ip_address()


class RingFormer:
    """Forms rings: a new rendezvous for each, served from this process (``serve`` and ``ip`` are
    passed in by tests)."""

    def __init__(self, serve: Callable[[list[Any]], tuple[Any, int]] = _serve,
                 ip: Callable[[], str] = _controller_ip) -> None:
        self.serve, self.ip = serve, ip
        self.servers: list[Any] = []  # the newest last; older ones stop once it is in use

    def form(self, members: list[Member]) -> dict[str, dict[str, str]]:
        """A new ring of ``members`` (their ranks set): each member's Horovod environment."""
        assigned = assign_ranks(members)
        server, port = self.serve([slot for _, slot in assigned])
        self.servers.append(server)
        return member_envs(assigned, self.ip(), port)

    @property
    def newest(self) -> Any:
        return self.servers[-1]

    def in_use(self) -> None:
        """The newest ring is forming: stop the older rendezvous."""
        for s in self.servers[:-1]:
            s.stop()
        self.servers = self.servers[-1:]

    def withdraw(self, server: Any) -> None:
        """A ring formed ahead and withdrawn: stop its rendezvous."""
        server.stop()
        self.servers.remove(server)

    def stop_all(self) -> None:
        for s in self.servers:
            s.stop()
        self.servers = []
