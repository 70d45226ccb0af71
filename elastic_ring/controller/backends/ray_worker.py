"""What runs on the Ray nodes: the actor that runs a worker (:class:`WorkerActor`), Horovod's
rendezvous handler for a ring the controller forms (:func:`rendezvous_handler`), and the run-folder
probe (:func:`sees_file`). Ray ships these to the workers by module path (the package is installed
there).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

READY_TIMEOUT_S = 120.0  # how long an actor (or a probe) may take to answer


def iface_of(ip: str) -> str:
    """The network interface that carries ``ip`` (``lo`` for a loopback address)."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == ip for a in addrs):
            return name
    return "lo" if ip.startswith("127.") else "eth0"


# the modules a worker of each collective imports first (a warm actor has them before its run)
COLLECTIVE_MODULES = {"horovod": ("torch", "horovod.torch"), "torch": ("torch", "torch.distributed")}


class WorkerActor:
    """One warm worker process: torch and its collective's module (``horovod.torch``, or
    ``torch.distributed`` for ``--collective torch``, which needs no Horovod installed) imported at
    creation; ``run`` runs the worker entry in this process (output appended to ``log_path``)."""

    def __init__(self, preload: tuple[str, ...] = (), collective: str = "horovod") -> None:
        t0 = time.time()
        import importlib

        for mod in COLLECTIVE_MODULES[collective]:  # (an ImportError: the actor's creation fails with it)
            importlib.import_module(mod)
        for mod in ("elastic_ring.worker.api", "elastic_ring.worker.run", "elastic_ring.events.api", *preload):
            try:  # a module target's own imports, so that a joiner only runs its code
                importlib.import_module(mod)
            except Exception:  # noqa: BLE001 - the run itself will report it
                pass
        self.import_s = time.time() - t0

    def info(self) -> dict[str, Any]:
        import ray

        ip = ray.util.get_node_ip_address()
        return {"node_id": ray.get_runtime_context().get_node_id(), "ip": ip, "iface": iface_of(ip),
                "pid": os.getpid(), "host": socket.gethostname(), "import_s": self.import_s}

    def run(self, argv: list[str], env: dict[str, str], log_path: str) -> int:
        from elastic_ring.worker import api

        api.reset()  # a new job in this process (a retired worker's, serving again)
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        _stacks_on_signal()
        os.environ.update(env)
        from elastic_ring.worker import run

        return run.main(argv, in_process=True)


def _stacks_on_signal() -> None:
    """On :data:`~.survival.STACKS_SIGNAL` (SIGUSR2) write every thread's stack to the log (fd 2,
    dup'ed to it): the controller asks that of a survivor that stayed silent after a failure
    (:func:`~.survival.dump_stacks`), before its restart ends the process."""
    import faulthandler

    from elastic_ring.controller.backends.survival import STACKS_SIGNAL

    try:
        faulthandler.register(STACKS_SIGNAL, file=2, all_threads=True)
    except (ValueError, OSError, RuntimeError):  # not where it cannot be (no such signal, no fd 2)
        pass


def rendezvous_handler(slots: dict[tuple[str, int], Any]):
    """Horovod's rendezvous handler, plus the one question an elastic-mode worker asks at
    ``hvd.init()``: its rank and sizes (``rank_and_size``, key ``host:local_rank``), answered from
    this ring's slot assignment (what Horovod Elastic's driver would answer)."""
    from horovod.runner.http.http_server import RendezvousHandler

    class Handler(RendezvousHandler):
        def _get_value(self, scope, key):
            if scope == "rank_and_size":
                host, local_rank = key.rsplit(":", 1)
                slot = slots.get((host, int(local_rank)))
                return None if slot is None else slot.to_response_string().encode("ascii")
            return super()._get_value(scope, key)

    return Handler


def sees_file(path: str, token: str) -> dict[str, Any]:
    """Whether this node reads ``token`` in ``path`` (the run folder is one folder every node sees)."""
    import ray

    try:
        ok = Path(path).read_text() == token
    except OSError:
        ok = False
    return {"ok": ok, "node_id": ray.get_runtime_context().get_node_id(),
            "ip": ray.util.get_node_ip_address()}
