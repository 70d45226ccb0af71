"""The Ray backend's view of the cluster: which nodes are alive, whether a member's process is
gone, whether every node sees the run folder, and how many workers the free resources place
(:class:`ClusterMixin`, mixed into :class:`~elastic_ring.controller.backends.ray.RayBackend`,
whose attributes it uses).
"""

from __future__ import annotations

import socket
import uuid
from typing import Any

from elastic_ring import protocol
from elastic_ring.controller.backends.ray_actor import _READY_TIMEOUT_S
from elastic_ring.controller.backends.ray_group import Member
from elastic_ring.errors import UserError


class ClusterMixin:
    """Nodes, the run folder's visibility and placement (part of :class:`~elastic_ring.controller.backends.ray.RayBackend`)."""

    def _node_alive(self, node_id: str) -> bool:
        import ray

        try:
            return any(n["NodeID"] == node_id and n.get("Alive") for n in ray.nodes())
        except Exception:  # noqa: BLE001
            return True

    def _process_gone(self, m: Member) -> bool:
        """True when ``m``'s process ran on this host and is gone (Ray may report a killed actor
        seconds later than its peers' errors on a loaded machine)."""
        if m.info.get("host") != socket.gethostname() or not m.info.get("pid"):
            return False
        import psutil

        try:
            return psutil.Process(int(m.info["pid"])).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True
        except Exception:  # noqa: BLE001 - access denied etc.: not known to be gone
            return False

    def _alive_nodes(self) -> list[dict[str, Any]]:
        import ray

        return [n for n in ray.nodes() if n.get("Alive") and n["NodeID"] not in self.suspect_nodes]

    def _check_run_dir(self) -> None:
        """Every alive node must see the run folder (checkpoints and events live there)."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        ctl = protocol.control_dir(self.spec.run_dir)
        ctl.mkdir(parents=True, exist_ok=True)
        token = uuid.uuid4().hex
        probe = ctl / f".ray-visible-{token[:8]}"
        probe.write_text(token)
        try:
            refs = [self._sees.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
                n["NodeID"], soft=False)).remote(str(probe), token) for n in self._alive_nodes()]
            res = ray.get(refs, timeout=_READY_TIMEOUT_S)
        finally:
            probe.unlink(missing_ok=True)
        for r in res:
            if not r["ok"]:
                raise UserError(f"the run folder {self.spec.run_dir} is not visible from Ray node "
                                f"{r['node_id'][:12]} ({r['ip']}): put it on a filesystem every node mounts")
        self._checked = True

    def _free_slots(self, total: bool = False) -> int:
        """Workers the free resources of the live nodes hold (Ray's resource view, now); with
        ``total``, their whole resources."""
        from ray._private.state import available_resources_per_node

        nodes = self._alive_nodes()
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

    def _placed(self, n: int, timeout_s: float):
        """A placement group of ``n`` worker bundles, ready within ``timeout_s`` (else None)."""
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group

        pg = placement_group([self._bundle() for _ in range(n)], strategy=self.strategy)
        try:
            ray.get(pg.ready(), timeout=timeout_s)
        except Exception:  # noqa: BLE001 - GetTimeoutError
            remove_placement_group(pg)
            return None
        return pg

    def _bundle(self) -> dict[str, int]:
        """One worker's resources in a placement group."""
        return {"CPU": self.cpus, **({"GPU": self.gpus} if self.gpus else {})}

    def _release_reserved(self) -> None:
        """Give back the placement group :meth:`usable_slots` kept, if a start did not take it."""
        if self._reserved is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._reserved[0])
            self._reserved = None
