"""Where the live scheduler's slots come from: a fixed list of hosts, or a Ray cluster's nodes.

The scheduler asks its :class:`SlotSource` for the :class:`Capacity` at every pass. A
:class:`FixedSlots` (``cluster up --slots N`` / ``--hostfile``) always answers the same hosts.
A :class:`RaySlots` (``cluster up --ray [ADDRESS]``) answers the Ray cluster's alive nodes, each
with the slots its resources hold: its CPUs (one slot per ``cpus_per_slot`` CPUs) on ``--device
cpu``, its GPUs on ``--device cuda``; so a node that joins adds its slots at the next pass and a
node that leaves (or is found dead by Ray) takes them away. It also says how many slots Ray could
place now (its free resources): what the jobs' own actors, or anything else on the cluster, hold
is not free, whatever the scheduler's accounts say.

Ray slots are counts, not places: Ray places a job's workers (the job's placement group, PACK by
default), so a slot number held by a job names no node and no core.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from elastic_ring.cluster.api import ClusterConfig, ClusterError
from elastic_ring.controller.backends.ray import check_answers
from elastic_ring.env import ray_address

AUTO = ""  # ``cluster up --ray`` without an address: $RAY_ADDRESS, else a local Ray started here
LOCAL_OBJECT_STORE = 100 * 1024 * 1024  # a local Ray's object store (the jobs store nothing in it)


@dataclass(frozen=True)
class Node:
    """One host or Ray node: its name and its slots."""

    name: str
    slots: int


@dataclass(frozen=True)
class Capacity:
    """The slots of every node now; ``free``: slots the engine could place now (None: all of
    those not held by the scheduler's jobs, as on fixed hosts)."""

    nodes: tuple[Node, ...]
    free: int | None = None

    @property
    def total(self) -> int:
        return sum(n.slots for n in self.nodes)

    def can_place(self, n: int) -> bool:
        """Whether ``n`` more slots can be placed now (beyond the scheduler's own accounts)."""
        return self.free is None or n <= self.free

    def placed(self, n: int) -> "Capacity":
        """This capacity after ``n`` more slots were handed out (the engine sees them later)."""
        return self if self.free is None else Capacity(self.nodes, max(0, self.free - n))


class SlotSource(Protocol):
    """What the scheduler asks for its slots.

    live_resize: jobs are resized in place (else by a stop and a resume on the new slots).
    elastic: nodes may join and leave, so a job may restart on fewer workers than it held.
    """

    live_resize: bool
    elastic: bool

    def capacity(self) -> Capacity: ...


class FixedSlots:
    """The hosts of the cluster's config (``--slots`` or ``--hostfile``)."""

    elastic = False

    def __init__(self, config: ClusterConfig) -> None:
        self._cap = Capacity(tuple(Node(h, n) for h, n in config.hosts))
        self.live_resize = config.device == "cpu" and not config.multi_host

    def capacity(self) -> Capacity:
        return self._cap


def node_slots(nodes: list[dict[str, Any]], device: str, cpus_per_slot: float = 1.0) -> tuple[Node, ...]:
    """The alive nodes of ``ray.nodes()`` and their slots (CPUs // ``cpus_per_slot`` on cpu, GPUs
    on cuda), named ``ip/node-id-prefix`` (several Ray nodes may share an IP), in name order."""
    out = []
    for n in nodes:
        if not n.get("Alive"):
            continue
        res = n.get("Resources") or {}
        k = int(res.get("GPU", 0)) if device == "cuda" else int(res.get("CPU", 0) // cpus_per_slot)
        out.append(Node(f"{n.get('NodeManagerAddress', '?')}/{str(n.get('NodeID', '?'))[:12]}", k))
    return tuple(sorted(out, key=lambda x: x.name))


def free_slots(available: dict[str, float], device: str, cpus_per_slot: float = 1.0) -> int:
    """Slots Ray could place now, from ``ray.available_resources()``."""
    if device == "cuda":
        return int(available.get("GPU", 0))
    return int(available.get("CPU", 0) // cpus_per_slot)


class RaySlots:
    """The slots of a Ray cluster's alive nodes, read at every pass.

    Args:
        address: the Ray cluster (:data:`AUTO`: ``$RAY_ADDRESS``, else a local Ray started here and
            shut down by :meth:`close`).
        nodes, available: for tests, replacements of ``ray.nodes`` and ``ray.available_resources``
            (then nothing connects to Ray).
    """

    live_resize = True  # the jobs' Ray backend resizes in place, across nodes, on CPUs or GPUs
    elastic = True

    def __init__(self, address: str, device: str = "cpu", cpus_per_slot: float = 1.0,
                 nodes: Callable[[], list[dict[str, Any]]] | None = None,
                 available: Callable[[], dict[str, float]] | None = None) -> None:
        self.device, self.cpus = device, cpus_per_slot
        self.requested = address
        self.address = address or None  # what the jobs get (--ray-address), once connected
        self._nodes, self._available = nodes, available
        self._connected = False

    def connect(self) -> str:
        """Join the Ray cluster (or start a local one); returns its address for the jobs.

        Raises:
            ClusterError: Ray is not installed, or nothing answers at the address.
        """
        if self._nodes is not None:
            return self.address or "fake"
        try:
            import ray
        except ImportError:
            from elastic_ring import extras

            raise ClusterError(extras.message("cluster up --ray", "ray")) from None
        address = self.requested or ray_address() or None
        if address is not None:
            check_answers(address, error=ClusterError)  # not minutes of Ray's retries
        kw: dict[str, Any] = {"log_to_driver": False, "include_dashboard": False, "ignore_reinit_error": True}
        if address is None:
            kw["object_store_memory"] = LOCAL_OBJECT_STORE
        try:
            ray.init(address=address, **kw)
        except Exception as e:  # noqa: BLE001 - an unreachable address, a bad cluster
            first = str(e).splitlines()[0] if str(e) else ""
            raise ClusterError(f"cannot connect to Ray at {address or 'a new local cluster'}: "
                               f"{type(e).__name__}: {first}") from None
        self._connected = True
        self.address = ray.get_runtime_context().gcs_address
        return self.address

    def capacity(self) -> Capacity:
        if self._nodes is not None:
            nodes, avail = self._nodes(), (self._available() if self._available else None)
        else:
            import ray

            nodes, avail = ray.nodes(), ray.available_resources()
        free = None if avail is None else free_slots(avail, self.device, self.cpus)
        return Capacity(node_slots(nodes, self.device, self.cpus), free)

    def close(self) -> None:
        if self._connected:
            import ray

            ray.shutdown()
            self._connected = False


def slot_source(config: ClusterConfig) -> FixedSlots | RaySlots:
    """The source of ``config``'s slots (not yet connected)."""
    if config.ray is None:
        return FixedSlots(config)
    return RaySlots(config.ray, config.device)
