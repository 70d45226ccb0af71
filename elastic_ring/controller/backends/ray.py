"""The Ray backend of ``elastic-ring train --backend ray``: workers are Ray actors, and they stay warm.

- **Start.** A placement group of N one-worker bundles (``PACK``: fewest nodes, or ``SPREAD``), an
  actor per bundle. The actor imports torch and Horovod when it is created, then runs the same
  worker entry and library as horovodrun's workers, in its own process (``worker.run.main`` with
  ``in_process``). The controller serves Horovod's Gloo rendezvous itself
  (``horovod.runner.http.http_server.RendezvousServer``, one per ring); each actor gets the
  environment of ``horovod.runner.gloo_run.create_run_env_vars`` / ``create_slot_env_vars`` for
  its slot of ``get_host_assignments``, one Horovod host per Ray node ID, the network interface
  being the one that carries that node's IP.
- **Resize in place.** At a resize the workers pause between two steps (the worker library's
  in-place mode). The backend starts a new rendezvous for the new ring and writes, in
  ``control/inplace-<seg>.json``, every member's new Horovod environment: survivors keep their
  process (imports, data, model) and re-form the ring; a worker whose slot goes leaves the ring
  (``Retired``) and its actor is ended; a joiner comes from a pool of spare actors that already
  imported torch and Horovod (``warm_spares``), runs the worker entry and syncs from rank 0.
- **Formed ahead.** For a scheduled resize the next ring (spares taken, rendezvous served, every
  member's environment) is formed while the segment trains and its action written ahead
  (:meth:`RayBackend.report_ahead`): rank 0 takes it at the pause, or the controller withdraws it
  (:meth:`RayBackend.retract_ahead`): one rename decides.
- **Failures.** ``ActorDiedError``, ``ActorUnavailableError`` or ``RayTaskError`` of any member is a
  failed segment: the controller restarts from the newest checkpoint at the largest size the
  cluster's free resources hold now, placed before it is chosen (:meth:`RayBackend.usable_slots`);
  the node and rank are named in the restart.
- **Run folder.** Checked at start from a task on every alive node: it must be one folder every
  node sees (a shared filesystem on a real cluster).

Not built: GPU bundles are requested (``gpus_per_worker``) but were not tried here (no GPU);
joiners of a grow are spare actors outside the placement group (they hold their own CPUs), and
a shrink's freed bundle stays reserved until the next restart.

The parts: :mod:`.ray_actor` (the actor, the rendezvous handler, the run-folder probe),
:mod:`.ray_group` (members, spares, the ring formed ahead, the running group and its failure),
:mod:`.ray_spares` (actors and the spare pool), :mod:`.ray_ring` (rendezvous and environments),
:mod:`.ray_cluster` (nodes, run-folder check, placement); this module is the backend itself.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

from elastic_ring import protocol
from elastic_ring.controller.backends.api import BUILTIN_TARGET, SegmentLaunch, Started  # noqa: F401
from elastic_ring.controller.backends.ray_actor import (_READY_TIMEOUT_S, WorkerActor, _handler,  # noqa: F401 - re-exported
                                                        _iface_of, _sees)
from elastic_ring.controller.backends.ray_cluster import ClusterMixin
from elastic_ring.controller.backends.ray_group import (_GRACE_S, RETIRED, Ahead, Member, RayGroup, Spare,  # noqa: F401
                                                        _peer_loss, _record_of)
from elastic_ring.controller.backends.ray_ring import RingMixin
from elastic_ring.controller.backends.ray_spares import SparePoolMixin
from elastic_ring.errors import UserError

STRATEGIES = ("PACK", "SPREAD")
_FREE_WAIT_S = 3.0  # at a restart, how long released resources may take to show as free
_PLACE_TRY_S = 5.0  # at a restart, how long a placement of a size may take before one fewer is tried


def check_answers(address: str | None, timeout_s: float = 5.0, error: type[Exception] = UserError) -> None:
    """A ``host:port`` Ray address must accept a TCP connection: ``ray.init`` would retry it for
    minutes. Other forms (None, ``auto``, ``ray://...``) are left to Ray.

    Raises:
        error: nothing listens there (one line: the address and the socket's reason).
    """
    if not address:
        return
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "/" in host:
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as e:
        raise error(f"cannot connect to Ray at {address}: {e.strerror or e}") from None


class RayBackend(ClusterMixin, SparePoolMixin, RingMixin):
    """Workers as Ray actors; resizes in place with warm spares (see the module docstring)."""

    name = "ray"
    keeps_workers = True

    def __init__(self, spec, address: str | None = None, strategy: str = "PACK",
                 warm_spares: int | None = None, cpus_per_worker: float = 1.0,
                 gpus_per_worker: float = 0.0, out=None) -> None:
        if strategy not in STRATEGIES:
            raise UserError(f"--placement must be one of {', '.join(STRATEGIES)}, got {strategy}")
        if warm_spares is not None and warm_spares < 0:
            raise UserError(f"--warm-spares must be >= 0, got {warm_spares}")
        self.spec = spec
        self.address = address
        self.strategy = strategy
        self.warm_spares = warm_spares
        self.cpus = cpus_per_worker
        self.gpus = gpus_per_worker
        self.out = out or (lambda s: None)
        self.suspect_nodes: set[str] = set()
        self.group: RayGroup | None = None
        self._spares: list[Spare] = []  # warm actors running the worker up to its wait for a go
        self._pg = None
        self._reserved: tuple[Any, int] | None = None  # (placement group, size) kept for the restart
        self._servers: list[Any] = []
        self._connected = False
        self._checked = False
        self._n = 0
        self._world = 0
        self._launch: SegmentLaunch | None = None
        self._ahead: Ahead | None = None
        self._want_ahead: tuple[int, SegmentLaunch] | None = None  # spares were not up yet

    # ------------------------------------------------------------------ Ray
    def _connect(self) -> None:
        if self._connected:
            return
        import ray

        address = self.address or os.environ.get("RAY_ADDRESS") or None
        kw: dict[str, Any] = {"log_to_driver": False, "include_dashboard": False,
                              "ignore_reinit_error": True}
        if address is None:  # a local Ray, started here: a small object store (we store nothing)
            kw["object_store_memory"] = 100 * 1024 * 1024
        try:
            ray.init(address=address, **kw)
        except Exception as e:  # noqa: BLE001 - an unreachable address, a bad cluster
            raise UserError(f"cannot connect to Ray at {address or 'a new local cluster'}: "
                            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
        self._actor_cls = ray.remote(WorkerActor)
        self._sees = ray.remote(_sees)
        self._connected = True
        self._check_run_dir()

    # ------------------------------------------------------------------ Backend
    def start(self, launch: SegmentLaunch, log_path: Path) -> Started:
        """A fresh ring of ``launch.world`` actors in a placement group (a first start, or a
        restart after a failure: the previous actors and spares are ended first)."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self._connect()
        self._drop_all()
        if self._reserved is not None and self._reserved[1] == launch.world:  # a restart: placed by usable_slots
            pg, self._reserved = self._reserved[0], None
        else:
            self._release_reserved()
            pg = self._placed(launch.world, _READY_TIMEOUT_S)
            if pg is None:
                raise UserError(f"the Ray cluster has no room for {launch.world} worker(s) of {self._bundle()} "
                                f"({self.strategy}) within {_READY_TIMEOUT_S:.0f} s")
        self._pg = pg
        actors = [self._new_actor(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i))
                  for i in range(launch.world)]
        infos = ray.get([a.info.remote() for a in actors], timeout=_READY_TIMEOUT_S)
        members = [Member(self._name(), a, inf) for a, inf in zip(actors, infos)]
        envs = self._ring(members)
        members.sort(key=lambda m: m.rank)
        for m in members:
            self._run(m, launch, envs[m.name])
        self.group = RayGroup(self, members)
        self.group.pid = self._local_pid(members)
        self._note(log_path, self._describe(members, launch))
        self._top_up(launch.world, launch)
        return Started(self.group, self._command(launch))

    def report_ahead(self, world: int, launch: SegmentLaunch | None = None) -> None:
        """A scheduled resize to ``launch`` at the end of the running segment: form its ring now
        (spares taken, its rendezvous served, every member's environment) and write the action
        ahead, with the step it applies at and the joiners' go files. At the pause rank 0 takes it
        (:func:`elastic_ring.worker.api.take_ahead_action`) and the ring re-forms without waiting
        for the controller. Not done when a joiner would have to be a cold actor."""
        if launch is None or self.group is None or self._launch is None or self._ahead is not None:
            return
        cur, old = self._launch, self._serving()
        keep, leave = old[:launch.world], old[launch.world:]
        spares = self._ready_spares(launch.world - len(keep))
        self._want_ahead = (cur.segment, launch) if spares is None else None
        if spares is None:  # tried again at each poll until the spares are up
            return
        joiners = [Member(sp.name, sp.actor, sp.info, ref=sp.run_ref, go=sp.go) for sp in spares]
        members = keep + joiners
        envs = self._ring(members)
        go_files = {str(m.go): {"stop_at": launch.stop_at, "time": time.time(), "env": envs[m.name]}
                    for m in joiners}
        from elastic_ring.worker.api import inplace_action_file

        self._ahead = Ahead(cur.segment, launch, members, leave, joiners, spares, self._servers[-1])
        protocol.write_json_atomic(inplace_action_file(self.spec.run_dir, cur.segment), {
            "action": "resize", "to": launch.world, "segment": launch.segment, "stop_at": launch.stop_at,
            "time": time.time(), "members": envs, "at_step": cur.stop_at, "go_files": go_files})

    def retract_ahead(self, segment: int) -> bool:
        """Withdraw the action written ahead for ``segment`` (a live request or an interrupt came):
        True when withdrawn or none was written; False when rank 0 has already taken it (the
        workers go on at the scheduled size: the request waits for the next segment)."""
        if self._want_ahead is not None and self._want_ahead[0] == segment:
            self._want_ahead = None
        a = self._ahead
        if a is None or a.segment != segment:
            return True
        if not a.taken:
            from elastic_ring.worker.inplace import withdraw_action_ahead

            a.taken = not withdraw_action_ahead(self.spec.run_dir, segment)
        if a.taken:
            return False
        self._ahead = None
        self._spares[:0] = a.spares  # still waiting for their go
        a.server.stop()
        self._servers.remove(a.server)
        return True

    def resize_in_place(self, paused_segment: int, launch: SegmentLaunch, t_launch: float) -> None:
        group = self.group
        assert group is not None
        if self.retract_ahead(paused_segment):  # none ahead, or not taken: form the ring now
            members, leave, joiners = self._ring_now(paused_segment, launch, t_launch)
        else:  # rank 0 took the ring formed ahead: the workers are already on their way
            a = self._ahead
            assert a is not None
            if (a.launch.world, a.launch.segment, a.launch.stop_at) != (launch.world, launch.segment, launch.stop_at):
                raise RuntimeError(f"the workers took the resize to {a.launch.world} written ahead for "
                                   f"segment {a.launch.segment}, the controller decided {launch}")
            self._ahead = None
            members, joiners = a.members, a.joiners
            leave = [m for m in a.leave if m in group.members]  # those not retired yet
            for m in leave:
                m.retiring = True
        for s in self._servers[:-1]:  # the new ring is forming on the newest rendezvous
            s.stop()
        self._servers = self._servers[-1:]
        group.members = sorted(members, key=lambda m: m.rank) + leave
        group.pid = self._local_pid(sorted(members, key=lambda m: m.rank))
        log = self.spec.run_dir / "logs" / f"segment-{launch.segment:03d}-w{launch.world}.log"
        self._note(log, self._describe(sorted(members, key=lambda m: m.rank), launch)
                   + (f"; leaving: {', '.join(m.name for m in leave)}" if leave else "")
                   + (f"; joined: {', '.join(m.name + (' (warm spare)' if m.go else ' (cold)') for m in joiners)}"
                      if joiners else ""))
        self._world, self._launch = launch.world, launch
        if not leave:  # a shrink's leavers become the spares (_recycle) once they are out
            self._top_up(launch.world, launch)

    def ask_exit(self, paused_segment: int, t: float) -> None:
        from elastic_ring.worker.api import inplace_action_file

        protocol.write_json_atomic(inplace_action_file(self.spec.run_dir, paused_segment),
                                   {"action": "exit", "time": t})

    def usable_slots(self, want: int) -> int:
        """The largest ring (at most ``want`` and ``--slots``) the cluster's **free** resources hold
        now, reserved for the restart that follows (:meth:`start` takes it): this run's own actors,
        spares and placement group are released first; nodes whose actors became unavailable are
        left out, and so are resources another user's actors hold. A count from the resource view
        is checked by placing it: a node lost without Ray knowing it yet (it is marked dead ~12 s
        after its raylet is killed) cannot take a bundle, so the size steps down until one places."""
        self._connect()
        self._drop_all()
        self._release_reserved()  # an earlier one, not taken by a start
        want = min(want, self.spec.slots)
        t_end = time.time() + _FREE_WAIT_S
        k, cap = self._free_slots(), self._free_slots(total=True)
        while k < min(want, cap) and time.time() < t_end:  # what was just released shows within ~1 s
            time.sleep(0.2)
            k = max(k, self._free_slots())
        for n in range(min(k, want), 0, -1):
            pg = self._placed(n, _PLACE_TRY_S)
            if pg is not None:
                self._reserved = (pg, n)
                return n
        return 0

    def first_failed_rank(self, log_path: Path | None) -> int | None:
        g = self.group
        return None if g is None or g.failure is None else g.failure["rank"]

    def failure_detail(self) -> dict[str, Any] | None:
        g = self.group
        return None if g is None else g.failure

    def _drop_all(self) -> None:
        from ray.util.placement_group import remove_placement_group

        if self.group is not None:
            self.group.kill()
            self.group = None
        self._want_ahead = None
        if self._ahead is not None:  # a ring formed ahead: its joiners are not in the group yet
            self._spares += self._ahead.spares
            self._ahead = None
        for sp in self._spares:
            self._end_actor(sp.actor)
        self._spares = []
        for srv in self._servers:
            srv.stop()
        self._servers = []
        if self._pg is not None:
            try:
                remove_placement_group(self._pg)
            except Exception:  # noqa: BLE001
                pass
            self._pg = None

    def close(self) -> None:
        if not self._connected:
            return
        import ray

        self._drop_all()
        self._release_reserved()
        for s in self._servers:
            s.stop()
        self._servers = []
        ray.shutdown()
        self._connected = False


__all__ = ["RayBackend", "STRATEGIES", "check_answers"]
