"""The Ray backend of ``elastic-ring train --backend ray``: workers are Ray actors, and they stay warm.

- **Start.** N one-worker bundles placed together (``PACK``: fewest nodes, or ``SPREAD``), each
  then held by a placement group of its own (:meth:`~.ray_cluster.RayCluster.place`), an actor per
  bundle. The actor imports torch and Horovod when it is created, then runs the same
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
  (``Retired``) and its actor is ended, and its placement group removed: its resources are free
  for others (another job of `elastic-ring cluster`) at once; a joiner comes from a pool of spare
  actors that already imported torch and the collective (``warm_spares``), else is a new actor in a new
  placement group of its own; it runs the worker entry and syncs from rank 0.
- **Formed ahead.** For a scheduled resize the next ring (spares taken, rendezvous served, every
  member's environment) is formed while the segment trains and its action written ahead
  (:meth:`RayBackend.report_ahead`): rank 0 takes it at the pause, or the controller withdraws it
  (:meth:`RayBackend.retract_ahead`): one rename decides.
- **Failures.** ``ActorDiedError``, ``ActorUnavailableError`` or ``RayTaskError`` of any member is a
  failed segment: the controller restarts from the newest checkpoint at the largest size the
  cluster's free resources hold now, placed before it is chosen (:meth:`RayBackend.usable_slots`);
  the node and rank are named in the restart.
- **Survivors go on** (``--survive``). The workers keep their last two completed steps' state in
  memory (:mod:`elastic_ring.worker.survive`); after a failure the others say which steps they
  hold, and when they hold one in common (:meth:`RayBackend.survivors`) the failure is a shrink:
  the failed members are ended, the survivors keep their processes, and the in-place resize that
  follows re-forms their ring and rolls them back to that step (``rollback_to`` in the action); a
  lost node's members have all failed, those on the other nodes go on. A new actor in each failed
  member's bundle then grows the ring back once it waits for its go (:meth:`RayBackend.heal_target`).
  Otherwise (no answer, no common step) the restart from the checkpoint above.
- **Follows its cluster** (:meth:`RayBackend.cluster_change`, asked at every poll). A node that
  joins is grown onto at the next step boundary, up to ``--slots`` (cause ``hosts``; the spares
  that start there are waited for, so that the joiners are warm); not under `elastic-ring
  cluster`, whose scheduler grows its jobs (:data:`elastic_ring.env.RAY_FOLLOW`). A node Ray drains
  (``ray drain-node``, an autoscaler's preemption notice) is shrunk off at the next step boundary,
  in place (cause ``drained``: nothing redone, no checkpoint read); its members leave first and are
  ended, as are the spares there, so that Ray can let the node go.
- **Run folder.** Checked at start from a task on every alive node: it must be one folder every
  node sees (a shared filesystem on a real cluster).

Not built: GPU bundles are requested (``gpus_per_worker``) but were not tried here (no GPU);
warm spares are actors outside the placement groups (they hold their own CPUs), and with
``--warm-spares 0`` (`elastic-ring cluster`) a grow's joiner is a cold actor.

The parts, each given to the backend, which orchestrates them: :class:`~.ray_cluster.RayCluster`
(nodes, free slots, placement, the run-folder check), :class:`~.ray_actors.ActorPool` (actors and
the warm spares), :class:`~.ray_ring.RingFormer` (members -> ranks, rendezvous and environments)
and :class:`~.ray_group.RayGroup` (the running ring: poll, kill, the failure); :mod:`.ray_members`
holds their records and :mod:`.ray_worker` what runs on the nodes.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from elastic_ring import protocol, seam
from elastic_ring.controller.backends import survival
from elastic_ring.controller.backends.api import (Backend, SegmentLaunch, Started, Survival, describe, note,
                                                  serve_source)
from elastic_ring.controller.backends.ray_actors import ActorPool, actor_infos, worker_argv
from elastic_ring.controller.backends.ray_cluster import RayCluster, remove_pg
from elastic_ring.controller.backends.ray_group import RayGroup
from elastic_ring.controller.backends.ray_members import Ahead, Member
from elastic_ring.controller.backends.ray_ring import RingFormer
from elastic_ring.controller.backends.ray_worker import READY_TIMEOUT_S
from elastic_ring.env import SURVIVE as SURVIVE_ENV
from elastic_ring.env import ray_follow
from elastic_ring.errors import UserError

if TYPE_CHECKING:
    from elastic_ring.controller.membership import Cause, StateSource

_FREE_WAIT_S = 3.0  # at a restart, how long released resources may take to show as free
_PLACE_TRY_S = 5.0  # at a restart, how long a placement of a size may take before one fewer is tried
LOOK_EVERY_S = 0.5  # how often a running ring looks at the cluster's nodes (joined, draining)
JOIN_WARM_S = 60.0  # after a node joined, how long the grow waits for spares starting there to be warm


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


def _local_pid(members: list[Member]) -> int:
    """Rank 0's process where it runs on this host (telemetry), else the controller's."""
    m = members[0]
    return int(m.info["pid"]) if m.info.get("host") == socket.gethostname() else os.getpid()


def _describe(members: list[Member], launch: SegmentLaunch) -> str:
    return describe("ray", launch.segment, [f"rank {m.rank}: {m.name} pid {m.info['pid']} node "
                                            f"{m.info['node_id'][:12]} ({m.info['ip']}, {m.info['iface']})"
                                            for m in members])


def _by_rank(members: list[Member]) -> list[Member]:
    return sorted(members, key=lambda m: m.rank)


class _RingHandle:
    """The controller's handle of a Ray ring: :class:`RayGroup`'s poll, after which the backend
    does what waits for a poll (a ring ahead whose spares are now up; members that left the ring
    recycled; a lost node left out of later placements)."""

    def __init__(self, backend: "RayBackend", group: RayGroup) -> None:
        self.backend, self.group = backend, group

    @property
    def pid(self) -> int:
        return self.group.pid

    def poll(self) -> int | None:
        g = self.group
        if g.rc is not None:
            return g.rc
        self.backend._form_wanted_ahead(g)
        rc = g.poll()
        self.backend._after_poll(g)
        return rc

    def kill(self) -> None:
        self.group.kill()


class RayBackend(Backend):
    """Workers as Ray actors; resizes in place with warm spares (see the module docstring). An
    :class:`~.api.InPlaceRing`; its parts are passed in (:func:`make_ray_backend` builds them)."""

    name = "ray"

    def __init__(self, spec, cluster: RayCluster, pool: ActorPool, rings: RingFormer | None = None,
                 survive: bool = False, follow: bool = True) -> None:
        self.spec, self.cluster, self.pool, self.rings = spec, cluster, pool, rings or RingFormer()
        self.follow = follow  # grow onto nodes that join (not under `elastic-ring cluster`: its scheduler's)
        self._nodes: set[str] | None = None  # the live nodes seen (a node not among them joined)
        self._joined: float | None = None  # when a node joined that the ring has not grown onto yet
        self._draining: set[str] = set()  # nodes Ray is draining: the ring shrinks off them, no spare stays
        self._t_look = 0.0
        self.survive = survive  # survivors of a failure go on from their copy in memory
        self.refused: str | None = None  # why the last failure's survivors did not go on from memory
        self._rollback: int | None = None  # the step the next in-place resize rolls the survivors back to
        self._freed: list[int] = []  # bundles of failed members, refilled at the survivors' resize
        self._heal_to: int | None = None  # the size the ring had before a failure, until it is back
        self.group: RayGroup | None = None
        self.launch: SegmentLaunch | None = None  # the running segment's
        self._pgs: dict[int, Any] = {}  # bundle -> its placement group (one worker's resources each)
        self._next_bundle = 0
        self._ahead: Ahead | None = None
        self._want_ahead: tuple[int, SegmentLaunch] | None = None  # spares were not up yet

    def _connect(self) -> None:
        self.cluster.connect(self.spec.run_dir)

    # ------------------------------------------------------------------ Backend
    def start(self, launch: SegmentLaunch, log_path: Path) -> Started:
        """A fresh ring of ``launch.world`` actors in a placement group (a first start, or a
        restart after a failure: the previous actors and spares are ended first)."""
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self._connect()
        self._drop_all()
        pgs = self.cluster.take_reserved(launch.world)  # a restart: placed by usable_slots
        if pgs is None:
            pgs = self.cluster.place(launch.world, READY_TIMEOUT_S)
            if pgs is None:
                raise UserError(f"the Ray cluster has no room for {launch.world} worker(s) of "
                                f"{self.cluster.bundle()} ({self.cluster.strategy}) within {READY_TIMEOUT_S:.0f} s")
        self._pgs, self._next_bundle = dict(enumerate(pgs)), len(pgs)
        actors = [self.pool.new_actor(scheduling_strategy=PlacementGroupSchedulingStrategy(
            pg, placement_group_bundle_index=0)) for pg in pgs]
        infos = actor_infos(actors)
        members = [Member(self.pool.name(), a, inf, bundle=i) for i, (a, inf) in enumerate(zip(actors, infos))]
        envs = self.rings.form(members)
        members = _by_rank(members)
        for m in members:
            self.pool.run(m, launch, envs[m.name])
        self.group = RayGroup(self.cluster, self.spec.run_dir, self.pool.end, members, pid=_local_pid(members))
        self._freed, self._heal_to = [], None
        self._nodes, self._joined = None, None  # (a node that joined before this start is in use, or not usable)
        note(log_path, _describe(members, launch))
        self.launch = launch
        self.pool.top_up(launch)
        return Started(_RingHandle(self, self.group), self._command(launch))

    def usable_slots(self, want: int) -> int:
        """The largest ring (at most ``want`` and ``--slots``) the cluster's **free** resources hold
        now, reserved for the restart that follows (:meth:`start` takes it): this run's own actors,
        spares and placement group are released first; nodes whose actors became unavailable are
        left out, and so are resources another user's actors hold. A count from the resource view
        is checked by placing it: a node lost without Ray knowing it yet (it is marked dead ~12 s
        after its raylet is killed) cannot take a bundle, so the size steps down until one places."""
        self._connect()
        self._drop_all()
        self.cluster.release_reserved()  # an earlier one, not taken by a start
        want = min(want, self.spec.slots)
        t_end = time.time() + _FREE_WAIT_S
        k, cap = self.cluster.free_slots(), self.cluster.free_slots(total=True)
        while k < min(want, cap) and time.time() < t_end:  # what was just released shows within ~1 s
            time.sleep(0.2)
            k = max(k, self.cluster.free_slots())
        for n in range(min(k, want), 0, -1):
            pg = self.cluster.place(n, _PLACE_TRY_S)
            if pg is not None:
                self.cluster.reserve(pg, n)
                return n
        return 0

    def first_failed_rank(self, log_path: Path | None) -> int | None:
        f = self.failure_detail()
        return None if f is None else f.rank

    def failure_detail(self) -> protocol.Failure | None:
        return None if self.group is None else self.group.failure

    def survivors(self, wait_s: float = survival.WAIT_S) -> Survival | None:
        """After a failure of the running ring: whether the other members go on in their processes,
        from the last step they all hold in memory (:func:`~.survival.hear`). None (the restart
        from the checkpoint) when the run does not keep survivors (``--survive``), the failure names
        no rank, a ring formed ahead was already taken, or they do not agree: a survivor spoke of
        another segment, one more died, one is silent, none is left, or they hold no step in
        common (:attr:`refused` says why).
        Otherwise the ring goes on with them (the failed members ended), and the in-place resize
        the controller asks next rolls them back to that step; warm spares that are up now take the
        failed members' places (up to the size the ring had), synced from the survivors' rank 0; a
        spare whose worker still imports joins later, as the new actors do. The failure is the one
        the ring blamed; a lost node is blamed as a whole: every member on it has failed (all named),
        those on the other nodes go on. The failed members' bundles get new actors at that resize
        (:meth:`heal_target`)."""
        g = self.group
        self.refused = None
        if not self.survive or g is None or g.failure is None or g.failure.rank is None:
            if self.survive and g is not None and g.failure is not None:
                self.refused = "the failure names no rank"
            return None
        if self.launch is not None and not self.retract_ahead(self.launch.segment):
            self.refused = survival.TAKEN_AHEAD
            return None  # rank 0 took a scheduled resize before the failure: the restart
        lost = g.lost_node
        alive = [m for m in g.running() if lost is None or m.info.get("node_id") != lost]
        members = [survival.Member(m.name, m.rank, lambda info=m.info: self.cluster.process_gone(info),
                                   pid=m.info.get("pid"), who=m) for m in alive]
        heard = survival.hear(self.spec.run_dir, members, self.launch.segment if self.launch is not None else None,
                              g.t_start, wait_s, known_gone=1, gone_refuses=True)
        self.refused = heard.refused
        if heard.step is None:
            if heard.silent:  # where each silent one stood, into its log, before the restart ends it
                here = socket.gethostname()
                silent = [m for m in members if m not in heard.alive and m not in heard.gone
                          and m.pid and m.who.info.get("host") == here]
                for m in silent:
                    note(self.pool.log(m.name), f"[controller] rank {m.rank} said nothing within {wait_s:g} s of "
                         "the failure: its threads' stacks follow")
                survival.dump_stacks([m.pid for m in silent])
            return None
        on = sorted(m.rank for m in g.members if m.info.get("node_id") == lost) if lost is not None else []
        failure = survival.blame([], [], blamed=g.failure, lost=on)
        self._freed += [m.bundle for m in g.members if m not in alive and m.bundle is not None]
        g.go_on(alive)
        self._rollback = heard.step
        want = self.launch.world if self.launch is not None else len(alive)
        # warm spares (waiting for their go: imports and build done) take the dead's places now; one
        # still starting joins later, once it waits (heal_target), and the survivors go on meanwhile
        joiners = min(max(0, want - len(alive)), self.pool.waiting())
        self._heal_to = want if len(alive) + joiners < want else None
        return Survival(heard.step, len(alive) + joiners, failure, joiners, time.time() - heard.t0)

    def heal_target(self) -> int | None:
        """After a failure the survivors went on fewer: the size to grow back to now, because a
        warm worker waits for its go (imports and build done) for a failed member's place (a new
        actor in its bundle, or a spare that came up since), or None. The controller asks it at
        every poll and grows the ring at the next step boundary, as a live resize: the joiner is
        synced from rank 0 over the ring. Under `elastic-ring cluster` too (``--warm-spares 0``):
        the actor runs on the bundle the ring still holds, and the scheduler sees the grow."""
        if self._heal_to is None or self.launch is None or self.group is None or self.group.failing:
            return None
        if self.launch.world >= self._heal_to:
            self._heal_to = None
            return None
        k = self.pool.waiting()
        return min(self._heal_to, self.launch.world + k) if k else None

    def cluster_change(self, world: int) -> tuple[Cause, int, str] | None:
        """The running ring follows the cluster (looked at every :data:`LOOK_EVERY_S`): when Ray
        drains a node that holds members (``ray drain-node``, an autoscaler's preemption notice),
        the ring shrinks off it at the next step boundary, in place (nothing redone; cause
        ``drained``; its spares there are ended, so that Ray can let the node go); when a node
        joins (and ``follow``), it grows onto the room there up to ``--slots``: onto spares that wait
        for their go (warm; those starting there are waited for, up to :data:`JOIN_WARM_S`), else
        onto new actors (cause ``hosts``). None while a failure, a ring formed ahead or nothing."""
        from elastic_ring.controller.membership import Cause

        g, now = self.group, time.time()
        if g is None or self.launch is None or g.failing or self._ahead is not None \
                or now - self._t_look < LOOK_EVERY_S:
            return None
        self._t_look = now
        draining = self.cluster.draining()
        self._draining = set(draining)
        self.pool.end_on(self._draining)
        serving = self._serving()
        on = [m for m in serving if m.info.get("node_id") in self._draining]
        if on and len(on) < len(serving):  # (a ring all on draining nodes goes on: nowhere to go yet)
            nodes = ", ".join(sorted({m.info["node_id"][:12] for m in on}))
            return (Cause.DRAINED, len(serving) - len(on),
                    f"Ray node {nodes} is draining: {len(serving)} -> {len(serving) - len(on)} workers at the "
                    f"next step boundary (rank(s) {', '.join(str(m.rank) for m in on)} leave)")
        try:
            alive = {n["NodeID"] for n in self.cluster.alive_nodes()}
        except Exception:  # noqa: BLE001 - the GCS did not answer: look again later
            return None
        joined = alive - self._nodes if self._nodes is not None else set()
        self._nodes = (self._nodes or set()) | alive
        if joined and self.follow:
            self._joined = now
        if self._joined is None:
            return None
        if world >= self.spec.slots:
            self._joined = None
            return None
        waiting, young = self.pool.waiting(), now - self._joined < JOIN_WARM_S
        if self.pool.ready() > waiting and young:
            return None  # a spare is up but still imports: it joins warm
        target = min(self.spec.slots, world + waiting + self.cluster.free_slots())
        if target <= world:  # no room seen yet (a spare placed there is not up yet): looked at again
            if not young:
                self._joined = None
            return None
        self._joined = None
        return Cause.HOSTS, target, f"a Ray node joined: {world} -> {target} workers at the next step boundary"

    def end_ranks(self, ranks: list[int]) -> bool:
        """End these ranks' actors only (a stall the watchdog found: the others lose a peer and go on
        as after its death, :meth:`survivors`); False when the run does not keep survivors."""
        g = self.group
        if not self.survive or g is None:
            return False
        ending = [m for m in g.running() if m.rank in ranks]
        if len(ending) != len(set(ranks)):
            return False
        for m in ending:
            if m.info.get("host") == socket.gethostname():  # at once: a stopped process answers no RPC
                try:
                    os.kill(int(m.info["pid"]), signal.SIGKILL)
                except (OSError, KeyError, ValueError):
                    pass
            g.end(m.actor)
        return True

    def close(self) -> None:
        if not self.cluster.connected:
            return
        self._drop_all()
        self.cluster.disconnect()

    # ------------------------------------------------------------------ InPlaceRing
    def report_ahead(self, launch: SegmentLaunch) -> None:
        """A scheduled resize to ``launch`` at the end of the running segment: form its ring now
        (spares taken, its rendezvous served, every member's environment) and write the action
        ahead, with the step it applies at and the joiners' go files. At the pause rank 0 takes it
        (:func:`elastic_ring.seam.take_ahead_action`) and the ring re-forms without waiting
        for the controller. Not done while a joiner would have to be a cold actor: tried again at
        each poll until the spares are up."""
        if self.group is None or self.launch is None or self._ahead is not None:
            return
        cur, old = self.launch, self._serving()
        keep, leave = old[:launch.world], old[launch.world:]
        spares = self.pool.take_ready(launch.world - len(keep))
        self._want_ahead = (cur.segment, launch) if spares is None else None
        if spares is None:
            return
        joiners = [sp.member() for sp in spares]
        members = keep + joiners
        envs = self.rings.form(members)
        go_files = {str(m.go): seam.Go(launch.stop_at, time.time(), envs[m.name]) for m in joiners}
        self._ahead = Ahead(cur.segment, launch, members, leave, joiners, spares, self.rings.newest)
        seam.write_resize_action(self.spec.run_dir, cur.segment, launch, time.time(), members=envs, at_step=cur.stop_at,
                            go_files=go_files)

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
            a.taken = not seam.withdraw_action_ahead(self.spec.run_dir, segment)
        if a.taken:
            return False
        self._ahead = None
        self.pool.give_back(a.spares)
        self.rings.withdraw(a.server)
        return True

    def resize_in_place(self, paused_segment: int, launch: SegmentLaunch, t_launch: float,
                        source: StateSource) -> None:
        serve_source(self.name, source)  # memory or peer: from the checkpoint is a new group (start)
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
        self.rings.in_use()
        ring = _by_rank(members)
        group.members = ring + leave
        group.pid = _local_pid(ring)
        log = self.spec.run_dir / "logs" / f"segment-{launch.segment:03d}-w{launch.world}.log"
        note(log, _describe(ring, launch)
             + (f"; leaving: {', '.join(m.name for m in leave)}" if leave else "")
             + (f"; joined: {', '.join(m.name + (' (warm spare)' if m.go else ' (cold)') for m in joiners)}"
                if joiners else ""))
        self.launch = launch
        self._refill(launch)
        if not leave:  # a shrink's leavers become the spares (recycled) once they are out
            self.pool.top_up(launch)

    def _refill(self, launch: SegmentLaunch) -> None:
        """The survivors' ring of a failure is forming: a new actor in each failed member's bundle
        (its resources are the ring's already), pre-started as a spare, while the ring is below the
        size it had; the other failed members' bundles are given back."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        freed, self._freed = self._freed, []
        n = max(0, self._heal_to - launch.world) if self._heal_to is not None else 0
        for b in freed[:n]:
            if b in self._pgs:
                self.pool.refill(b, PlacementGroupSchedulingStrategy(self._pgs[b], placement_group_bundle_index=0),
                                 launch)
        for b in freed[n:]:
            self._free_bundle(b)

    def ask_exit(self, paused_segment: int, t: float) -> None:
        seam.write_exit_action(self.spec.run_dir, paused_segment, t)

    # ------------------------------------------------------------------ between polls
    def _form_wanted_ahead(self, group: RayGroup) -> None:
        """A ring ahead that waited for its spares: form it once they are up."""
        want = self._want_ahead
        if want is not None and not group.failing and self.launch is not None and want[0] == self.launch.segment:
            self.report_ahead(want[1])

    def _after_poll(self, group: RayGroup) -> None:
        world = self._ahead.launch.world if self._ahead is not None else (self.launch.world if self.launch else 0)
        while group.left:  # left the ring at a shrink: a spare again if one is wanted (not on a draining node)
            m = group.left.pop(0)
            if m.info.get("node_id") in self._draining:
                self.pool.end(m.actor)
                self._free_bundle(m.bundle)
            elif not self.pool.recycle(m, self.launch, world):  # ended: its resources go back to Ray
                self._free_bundle(m.bundle)
        if group.lost_node is not None:
            self.cluster.suspect_nodes.add(group.lost_node)

    # ------------------------------------------------------------------ bundles
    def _new_bundle(self) -> tuple[Any, int]:
        """A cold joiner's place: a new placement group of one bundle (waited for up to
        ``READY_TIMEOUT_S``); its scheduling strategy and bundle number.

        Raises:
            UserError: Ray cannot place it in time (one line: what, and how long it was waited for).
        """
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        pg = self.cluster.place_one(READY_TIMEOUT_S)
        if pg is None:
            raise UserError(f"the Ray cluster has no room for one more worker of {self.cluster.bundle()} "
                            f"within {READY_TIMEOUT_S:.0f} s")
        b, self._next_bundle = self._next_bundle, self._next_bundle + 1
        self._pgs[b] = pg
        return PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0), b

    def _free_bundle(self, bundle: int | None) -> None:
        """Give ``bundle``'s resources back to Ray (its actor has ended): its placement group removed."""
        pg = self._pgs.pop(bundle, None) if bundle is not None else None
        if pg is not None:
            try:
                remove_pg(pg)
            except Exception:  # noqa: BLE001 - already gone (Ray shut down)
                pass

    # ------------------------------------------------------------------ rings
    def _serving(self) -> list[Member]:
        assert self.group is not None
        return _by_rank([m for m in self.group.members if not m.retiring])

    def _ring_now(self, paused_segment: int, launch: SegmentLaunch, t_launch: float):
        """The paused workers' new ring, formed now: (members, leavers, joiners). Members on a node
        Ray is draining leave first."""
        old = self._serving()
        old = [m for m in old if m.info.get("node_id") not in self._draining] + \
              [m for m in old if m.info.get("node_id") in self._draining]
        keep, leave = old[:launch.world], old[launch.world:]
        joiners = self.pool.take(launch.world - len(keep), cold=self._new_bundle) if launch.world > len(keep) else []
        for m in leave:
            m.retiring = True
        members = keep + joiners
        envs = self.rings.form(members)
        extra = {"members": envs}
        if self._rollback is not None:  # survivors of a failure: the step they all hold in memory
            extra["rollback_to"], self._rollback = self._rollback, None
        seam.write_resize_action(self.spec.run_dir, paused_segment, launch, t_launch, **extra)
        for m in joiners:
            if m.go is not None:  # a pre-started spare: its go brings its place in the ring
                seam.write_go(m.go, seam.Go(launch.stop_at, t_launch, envs[m.name]))
            else:
                self.pool.run(m, launch, envs[m.name])
        return members, leave, joiners

    def _command(self, launch: SegmentLaunch) -> list[str]:
        return ["ray", f"--address={self.cluster.where()}", "-np", str(launch.world),
                "--placement", self.cluster.strategy, *worker_argv(self.spec, launch)]

    def _drop_all(self) -> None:
        """End this run's actors (the ring, a ring formed ahead, the spares), rendezvous and
        placement group."""
        if self.group is not None:
            self.group.kill()
            self.group = None
        self._want_ahead = None
        if self._ahead is not None:  # a ring formed ahead: its joiners are not in the group yet
            self.pool.give_back(self._ahead.spares)
            self._ahead = None
        self.pool.end_spares()
        self.rings.stop_all()
        for b in list(self._pgs):
            self._free_bundle(b)


def make_ray_backend(spec, address: str | None = None, strategy: str = "PACK", warm_spares: int | None = None,
                     cpus_per_worker: float = 1.0, gpus_per_worker: float = 0.0, survive: bool = False,
                     collective: str = "horovod", survive_env: str = "1") -> RayBackend:
    """The Ray backend of a run, its parts built from the options (checked at the request:
    :func:`elastic_ring.controller.requests.check`). ``collective="torch"``: the controller forms a
    ``torch.distributed`` process group per segment (:class:`~.torch_ring.TorchRingFormer`: a
    store it serves, each member's rank), and a spare waits with a placeholder rank."""
    cluster = RayCluster(address, strategy, cpus_per_worker, gpus_per_worker)
    env = {SURVIVE_ENV: survive_env} if survive else {}  # "auto": the workers time their copy first
    rings = None
    if collective == "torch":
        from elastic_ring.controller.backends.ray_ring import _controller_ip
        from elastic_ring.controller.backends.torch_ring import TorchRingFormer

        rings = TorchRingFormer(_controller_ip)
        env.update(RANK="1", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")  # a spare's placeholder
    pool = ActorPool(spec, cpus_per_worker, gpus_per_worker, warm_spares, strategy, env=env or None,
                     collective=collective)
    return RayBackend(spec, cluster, pool, rings=rings, survive=survive, follow=ray_follow())


__all__ = ["RayBackend", "check_answers", "make_ray_backend"]
