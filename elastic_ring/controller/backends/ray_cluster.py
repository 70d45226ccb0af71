"""The Ray backend's view of the cluster (:class:`RayCluster`): the connection, which nodes are
alive or draining, whether a worker's process is gone, whether every node sees the run folder, how many
workers the free resources hold, and placement: one placement group per worker, so that a shrink
gives back what its leavers held (those placed for a restart kept for it).
"""

from __future__ import annotations

import socket
import uuid
from pathlib import Path
from typing import Any

from elastic_ring import protocol
from elastic_ring.controller.backends.ray_worker import READY_TIMEOUT_S, sees_file
from elastic_ring.env import ray_address
from elastic_ring.errors import UserError

class RayCluster:
    """The Ray cluster as this run sees it: nodes (those whose actors became unavailable left
    out), free slots of ``cpus``/``gpus`` per worker, and placement (``strategy``)."""

    def __init__(self, address: str | None, strategy: str = "PACK", cpus: float = 1.0, gpus: float = 0.0) -> None:
        self.address, self.strategy, self.cpus, self.gpus = address, strategy, cpus, gpus
        self.suspect_nodes: set[str] = set()  # nodes whose actors became unavailable
        self.connected = False
        self._reserved: tuple[Any, int] | None = None  # (placement group, size) kept for the restart

    def where(self) -> str:
        return self.address or ray_address() or "local"

    def connect(self, run_dir: Path) -> bool:
        """Join (or start) the Ray cluster and check that every node sees ``run_dir``; False when
        already connected."""
        if self.connected:
            return False
        import ray

        address = self.address or ray_address() or None
        kw: dict[str, Any] = {"log_to_driver": False, "include_dashboard": False,
                              "ignore_reinit_error": True}
        if address is None:  # a local Ray, started here: a small object store (we store nothing)
            kw["object_store_memory"] = 100 * 1024 * 1024
        try:
            ray.init(address=address, **kw)
        except Exception as e:  # noqa: BLE001 - an unreachable address, a bad cluster
            raise UserError(f"cannot connect to Ray at {address or 'a new local cluster'}: "
                            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
        self.connected = True
        self.check_run_dir(run_dir)
        return True

    def disconnect(self) -> None:
        import ray

        self.release_reserved()
        ray.shutdown()
        self.connected = False

    # ------------------------------------------------------------------ nodes and processes
    def node_alive(self, node_id: str) -> bool:
        import ray

        try:
            return any(n["NodeID"] == node_id and n.get("Alive") for n in ray.nodes())
        except Exception:  # noqa: BLE001
            return True

    def process_gone(self, info: dict[str, Any]) -> bool:
        """True when the process of an actor (its ``info``) ran on this host and is gone (Ray may
        report a killed actor seconds later than its peers' errors on a loaded machine): reaped,
        or a zombie whose every thread has ended. A zombie main thread alone is not enough: the
        process's other threads are still exiting, and its sockets close only once the last one
        has freed the process's memory (measured here: a worker actor's main thread a zombie while
        one more thread lived, its peer's connection still open; up to 1.7 s on a loaded machine),
        so its peers in a collective cannot know yet that it died, and the wait for the survivors'
        word (:func:`~.survival.hear`) must not start before."""
        if info.get("host") != socket.gethostname() or not info.get("pid"):
            return False
        import psutil

        try:
            p = psutil.Process(int(info["pid"]))
            return p.status() == psutil.STATUS_ZOMBIE and p.num_threads() <= 1
        except psutil.NoSuchProcess:
            return True
        except Exception:  # noqa: BLE001 - access denied etc.: not known to be gone
            return False

    def alive_nodes(self) -> list[dict[str, Any]]:
        """The live nodes this run may place workers on: not those whose actors became
        unavailable, nor those Ray is draining."""
        import ray

        out = self.draining()
        return [n for n in ray.nodes() if n.get("Alive") and n["NodeID"] not in self.suspect_nodes
                and n["NodeID"] not in out]

    def draining(self) -> dict[str, float]:
        """The nodes Ray is draining now (a drain it accepted: ``ray drain-node``, an autoscaler's
        preemption or idle termination): node ID -> its deadline (seconds since the epoch; 0: none
        given). Empty where this Ray cannot say (an older one)."""
        try:
            from ray._private.worker import global_worker

            return {str(k): float(v) / 1000.0 for k, v in global_worker.gcs_client.get_draining_nodes().items()}
        except Exception:  # noqa: BLE001 - no such call in this Ray, or the GCS did not answer
            return {}

    def check_run_dir(self, run_dir: Path) -> None:
        """Every alive node must see the run folder (checkpoints and events live there).

        Raises:
            UserError: a node does not see it (one line naming the node).
        """
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ctl = protocol.control_dir(run_dir)
        ctl.mkdir(parents=True, exist_ok=True)
        token = uuid.uuid4().hex
        probe = ctl / f".ray-visible-{token[:8]}"
        probe.write_text(token)
        sees = ray.remote(sees_file)
        try:
            refs = [sees.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
                n["NodeID"], soft=False)).remote(str(probe), token) for n in self.alive_nodes()]
            res = ray.get(refs, timeout=READY_TIMEOUT_S)
        finally:
            probe.unlink(missing_ok=True)
        for r in res:
            if not r["ok"]:
                raise UserError(f"the run folder {run_dir} is not visible from Ray node "
                                f"{r['node_id'][:12]} ({r['ip']}): put it on a filesystem every node mounts")

    # ------------------------------------------------------------------ resources and placement
    def free_slots(self, total: bool = False) -> int:
        """Workers the free resources of the live nodes hold (Ray's resource view, now); with
        ``total``, their whole resources."""
        from ray._private.state import available_resources_per_node

        nodes = self.alive_nodes()
        avail = {n["NodeID"]: n.get("Resources", {}) for n in nodes}
        if not total:
            try:
                avail = available_resources_per_node()
            except Exception:  # noqa: BLE001 - an older Ray: the totals, as before
                pass
        count = 0
        for n in nodes:
            res = avail.get(n["NodeID"], {})
            k = int(res.get("CPU", 0) // self.cpus) if self.cpus else 1 << 20
            if self.gpus:
                k = min(k, int(res.get("GPU", 0) // self.gpus))
            count += k
        return count

    def bundle(self) -> dict[str, float]:
        """One worker's resources in a placement group."""
        return {"CPU": self.cpus, **({"GPU": self.gpus} if self.gpus else {})}

    def place(self, n: int, timeout_s: float) -> list[Any] | None:
        """``n`` worker bundles, ready within ``timeout_s`` (else None): one placement group per
        worker, so that a worker's resources are given back alone (:meth:`place_one`, :func:`remove_pg`).
        The bundles are first placed together, by the strategy (``PACK``: fewest nodes, or
        ``SPREAD``); each worker's group then takes its bundle's node (``STRICT_PACK`` of one
        bundle, that node as its soft target) once that group is removed."""
        import ray
        from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

        probe = placement_group([self.bundle() for _ in range(n)], strategy=self.strategy)
        try:
            ray.get(probe.ready(), timeout=timeout_s)
        except Exception:  # noqa: BLE001 - GetTimeoutError
            remove_placement_group(probe)
            return None
        nodes = placement_group_table(probe).get("bundles_to_node_id", {})
        remove_placement_group(probe)
        pgs = [placement_group([self.bundle()], strategy="STRICT_PACK", _soft_target_node_id=nodes.get(i))
               for i in range(n)]
        try:
            ray.get([pg.ready() for pg in pgs], timeout=timeout_s)
        except Exception:  # noqa: BLE001 - another user took the room meanwhile
            for pg in pgs:
                remove_placement_group(pg)
            return None
        return pgs

    def place_one(self, timeout_s: float):
        """One more worker's bundle (a grow's joiner), in a placement group of its own, ready within
        ``timeout_s`` (else None)."""
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        pg = placement_group([self.bundle()], strategy="STRICT_PACK")
        try:
            ray.get(pg.ready(), timeout=timeout_s)
        except Exception:  # noqa: BLE001 - GetTimeoutError
            remove_placement_group(pg)
            return None
        return pg

    def reserve(self, pgs: list[Any], n: int) -> None:
        """Keep the placement groups ``pgs`` of ``n`` workers for the next start."""
        self._reserved = (pgs, n)

    def take_reserved(self, n: int):
        """The placement groups kept for a start of ``n`` workers, if they are (else None, and any
        others kept are given back)."""
        if self._reserved is not None and self._reserved[1] == n:
            pg, self._reserved = self._reserved[0], None
            return pg
        self.release_reserved()
        return None

    @property
    def reserved(self) -> tuple[Any, int] | None:
        return self._reserved

    def release_reserved(self) -> None:
        """Give back the placement groups kept for a restart, if a start did not take them."""
        if self._reserved is not None:
            for pg in self._reserved[0]:
                remove_pg(pg)
            self._reserved = None


def remove_pg(pg) -> None:
    from ray.util.placement_group import remove_placement_group

    remove_placement_group(pg)
