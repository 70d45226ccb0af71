"""``--collective torch`` on several hosts (``--hosts``/``--hostfile``, the relaunch modes): one
``horovodrun`` per segment launches the workers, as for Horovod (its host list, its ssh to the
other hosts, its end of the segment when a worker fails), but nothing in them uses Horovod. Each
worker takes torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` and
``GROUP_RANK`` from the ranks horovodrun sets
(:func:`elastic_ring.worker.collective.torchrun_env_from_horovodrun`) and forms its process group
over a ``TCPStore`` this controller serves for the segment (``ELASTIC_RING_STORE``, also
torchrun's ``MASTER_ADDR``/``MASTER_PORT``): a new store per segment, on a port the controller
bound, so no host has to find a free port for another. The store's address is the one of this
machine that the first remote host is reached from (127.0.0.1 when every host is this one).
"""

from __future__ import annotations

import socket
from typing import Any, Callable

from elastic_ring.controller.backends.api import SegmentLaunch
from elastic_ring.controller.backends.horovodrun import _LOCAL_HOSTS, HorovodrunBackend, host_slots
from elastic_ring.controller.backends.torch_ring import serve_store, serve_store_for
from elastic_ring.worker.ring import STORE_ENV


def store_address(hosts: list[str]) -> str:
    """The address of this machine the workers on ``hosts`` reach it at: 127.0.0.1 when all are this
    machine; else the local address of the route to the first other host (a UDP socket's
    ``connect`` sends nothing), or this machine's name where that fails."""
    me = {socket.gethostname(), socket.getfqdn()} | _LOCAL_HOSTS
    others = [h for h in hosts if h not in me]
    if not others:
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((others[0], 9))
            return str(s.getsockname()[0])
    except OSError:
        return socket.gethostname()


class TorchHostsBackend(HorovodrunBackend):
    """A fresh horovodrun per segment whose workers form a ``torch.distributed`` group over a store
    served here (see the module docstring)."""

    name = "horovodrun-torch"

    def __init__(self, spec, *args: Any, serve: Callable[[str], tuple[Any, int]] = serve_store, **kw: Any) -> None:
        super().__init__(spec, *args, **kw)
        if serve is serve_store:  # forked by the zygote its workers fork from (CPU runs): no torch here
            serve = serve_store_for(self.launcher)
        self.serve = serve
        self.stores: list[Any] = []  # the newest last; a segment's outlives it by one (overlap)

    def segment_env(self, launch: SegmentLaunch) -> dict[str, str]:
        """The workers' environment, with a new store served here for the segment's group."""
        host = store_address([h for h, _ in host_slots(self.spec, self.hosts_override)])
        store, port = self.serve(host)
        self.stores = [*self.stores[-1:], store]
        env = super().segment_env(launch)
        env.update({STORE_ENV: f"{host}:{port}", "MASTER_ADDR": host, "MASTER_PORT": str(port)})
        return env

    def close(self) -> None:
        self.stores = []
