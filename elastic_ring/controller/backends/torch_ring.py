"""Process groups the controller forms for a ``--collective torch`` job resized in place (the local
in-place backend, :class:`~.local.LocalRingBackend`, and the Ray backend): members -> ranks, and a
``TCPStore`` served for the controller for each group (in a process its zygote forks, where one
runs: :func:`serve_store`).

:func:`torch_envs` is pure: each member's environment (torchrun's ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, the store's ``host:port`` and the member's
name). :class:`TorchRingFormer` has the interface of the Ray backend's Horovod
:class:`~.ray_ring.RingFormer`: a new store for each group (a new port, nothing left from the old
group), kept until the group after next is in use.
"""

from __future__ import annotations

import functools
from datetime import timedelta
from typing import Any, Callable

from elastic_ring.worker.collective import PG_TIMEOUT_S
from elastic_ring.worker.ring import MEMBER_ENV, STORE_ENV


def torch_envs(members: list[Any], store: str) -> dict[str, dict[str, str]]:
    """member name -> its environment in the group whose store is at ``store`` (``host:port``);
    ranks follow the list (sets ``member.rank``), local ranks count the members of each node
    (``member.info["node_id"]``; one node when none is named)."""
    nodes: list[str] = []
    count: dict[str, int] = {}
    for m in members:
        node = str(m.info.get("node_id", ""))
        if node not in count:
            nodes.append(node)
            count[node] = 0
        count[node] += 1
    seen = {n: 0 for n in nodes}
    envs: dict[str, dict[str, str]] = {}
    for rank, m in enumerate(members):
        node = str(m.info.get("node_id", ""))
        m.rank = rank
        host, _, port = store.rpartition(":")
        envs[m.name] = {"RANK": str(rank), "WORLD_SIZE": str(len(members)), "LOCAL_RANK": str(seen[node]),
                        "LOCAL_WORLD_SIZE": str(count[node]), "GROUP_RANK": str(nodes.index(node)),
                        "MASTER_ADDR": host, "MASTER_PORT": port, STORE_ENV: store, MEMBER_ENV: m.name}
        seen[node] += 1
    return envs


def serve_store(host: str, start_zygote: bool = False) -> tuple[Any, int]:
    """A ``TCPStore`` on a free port of ``host``: (its handle, its port). Forked by this process's
    zygote where one serves (``start_zygote``: started here if none runs yet, as for the workers
    of a CPU run), so that this process never imports torch: a
    :class:`~elastic_ring.worker.zygote.Served` process that ends when the handle is dropped
    (:mod:`.store_server`). Otherwise served from this process (the store object)."""
    from elastic_ring.worker import zygote

    name = zygote.ensure(compile_=True) if start_zygote else zygote.running()
    if name is not None:
        got = zygote.serve_forked(name, "elastic_ring.controller.backends.store_server", [host, str(PG_TIMEOUT_S)])
        if got is not None and got[1].isdigit():
            return got[0], int(got[1])
        if got is not None:
            got[0].close()
    import torch.distributed as dist

    store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=PG_TIMEOUT_S))
    return store, int(store.port)


def serve_store_for(launcher: Any) -> Callable[[str], tuple[Any, int]]:
    """:func:`serve_store` for a backend whose workers ``launcher`` starts: forked by the zygote
    they fork from where it has one (``launcher.fork_server``: CPU runs), so that the controller
    never imports torch."""
    return functools.partial(serve_store, start_zygote=bool(getattr(launcher, "fork_server", False)))


class TorchRingFormer:
    """Forms process groups: a new store for each, served from this process at ``ip()``
    (``serve`` and ``ip`` are passed in by tests)."""

    def __init__(self, ip: Callable[[], str], serve: Callable[[str], tuple[Any, int]] = serve_store) -> None:
        self.ip, self.serve = ip, serve
        self.servers: list[Any] = []  # the newest last
        self._old: list[Any] = []  # the group replaced last: its store outlives it by one resize

    def form(self, members: list[Any]) -> dict[str, dict[str, str]]:
        """A new group of ``members`` (their ranks set): each member's environment."""
        host = self.ip()
        store, port = self.serve(host)
        self.servers.append(store)
        return torch_envs(members, f"{host}:{port}")

    @property
    def newest(self) -> Any:
        return self.servers[-1]

    def in_use(self) -> None:
        """The newest group is forming: the older stores go (the one before it at the next call)."""
        self._old, self.servers = self.servers[:-1], self.servers[-1:]

    def withdraw(self, server: Any) -> None:
        """A group formed ahead and withdrawn: its store goes."""
        self.servers.remove(server)

    def stop_all(self) -> None:
        self.servers, self._old = [], []
