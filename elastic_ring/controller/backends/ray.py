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
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elastic_ring import protocol
from elastic_ring.controller.backends.api import BUILTIN_TARGET, SegmentLaunch, Started
from elastic_ring.errors import UserError

STRATEGIES = ("PACK", "SPREAD")
RETIRED = 3  # elastic_ring.worker.run.RETIRED (not imported here: that module is the workers')
_READY_TIMEOUT_S = 120.0
_GRACE_S = 5.0  # after a member fails, how long to wait for the one that caused it to show
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


def _iface_of(ip: str) -> str:
    """The network interface that carries ``ip`` (``lo`` for a loopback address)."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.address == ip for a in addrs):
            return name
    return "lo" if ip.startswith("127.") else "eth0"


class WorkerActor:
    """One warm worker process: torch and Horovod imported at creation; ``run`` runs the worker
    entry in this process (output appended to ``log_path``)."""

    def __init__(self, preload: tuple[str, ...] = ()) -> None:
        t0 = time.time()
        import importlib

        import horovod.torch  # noqa: F401
        import torch  # noqa: F401

        for mod in ("elastic_ring.worker.api", "elastic_ring.worker.run", *preload):
            try:  # a module target's own imports, so that a joiner only runs its code
                importlib.import_module(mod)
            except Exception:  # noqa: BLE001 - the run itself will report it
                pass
        self.import_s = time.time() - t0

    def info(self) -> dict[str, Any]:
        import ray

        ip = ray.util.get_node_ip_address()
        return {"node_id": ray.get_runtime_context().get_node_id(), "ip": ip, "iface": _iface_of(ip),
                "pid": os.getpid(), "host": socket.gethostname(), "import_s": self.import_s}

    def run(self, argv: list[str], env: dict[str, str], log_path: str) -> int:
        from elastic_ring.worker import api

        api._JOB, api._INIT_CALLED = None, False  # a retired worker's process serving again
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        os.environ.update(env)
        from elastic_ring.worker import run

        return run.main(argv, in_process=True)


def _handler(slots: dict[tuple[str, int], Any]):
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


def _sees(path: str, token: str) -> dict[str, Any]:
    import ray

    try:
        ok = Path(path).read_text() == token
    except OSError:
        ok = False
    return {"ok": ok, "node_id": ray.get_runtime_context().get_node_id(),
            "ip": ray.util.get_node_ip_address()}


def _record_of(m: "Member", records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """``m``'s crash record: the one its process wrote (host and pid), else its rank's."""
    pid, host = m.info.get("pid"), m.info.get("host")
    for r in reversed(records):
        if r.get("pid") == pid and (host is None or r.get("host") in (None, host)):
            return r
    for r in reversed(records):
        if r.get("pid") is None and r.get("rank") == m.rank:
            return r
    return None


def _peer_loss(rec: dict[str, Any]) -> bool:
    return bool(rec.get("peer_loss") or protocol.is_peer_loss(rec.get("type"), rec.get("message")))


@dataclass
class Member:
    name: str
    actor: Any
    info: dict[str, Any]
    rank: int = -1
    ref: Any = None  # the running ``run`` call
    retiring: bool = False
    go: Path | None = None  # a pre-started spare: it waits for this file, which brings its env


@dataclass
class Spare:
    name: str
    actor: Any
    info_ref: Any
    run_ref: Any
    go: Path
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Ahead:
    """The next ring, formed while the running segment trains (a scheduled resize): its action is
    written ahead, and rank 0 takes it at the pause (or the controller withdraws it)."""

    segment: int  # the running segment, at whose last step it applies
    launch: SegmentLaunch  # the next segment
    members: list[Member]  # the next ring: survivors, then joiners
    leave: list[Member]
    joiners: list[Member]
    spares: list[Spare]  # the joiners as they were (given back if withdrawn)
    server: Any
    taken: bool = False


@dataclass
class RayGroup:
    """The workers of the running ring (a controller ``Handle``): ``poll`` is None while they run,
    0 when all finished, 1 when any member failed (``failure`` says which)."""

    backend: "RayBackend"
    members: list[Member] = field(default_factory=list)
    pid: int = 0
    failure: dict[str, Any] | None = None
    rc: int | None = None
    t_start: float = field(default_factory=time.time)
    _failed_seen: list[tuple[Member, Exception | None, float]] = field(default_factory=list)

    def poll(self) -> int | None:
        if self.rc is not None:
            return self.rc
        import ray

        want = self.backend._want_ahead
        if want is not None and not self._failed_seen and self.backend._launch is not None \
                and want[0] == self.backend._launch.segment:
            self.backend.report_ahead(want[1].world, want[1])
        refs = [m.ref for m in self.members if m.ref is not None]
        if not refs and not self._failed_seen:
            return None
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0) if refs else ([], [])
        done = set(ready)
        for m in list(self.members):
            if m.ref is None or m.ref not in done:
                continue
            try:
                out = ray.get(m.ref)
            except Exception as e:  # noqa: BLE001 - ActorDiedError, ActorUnavailableError, RayTaskError
                self._failed_seen.append((m, e, time.time()))
                m.ref = None
                continue
            if out == RETIRED or m.retiring:
                self.members.remove(m)
                self.backend._recycle(m)  # its process (imports done) becomes a spare
                continue
            m.ref = None  # finished
        now = time.time()
        for m in self.members:  # Ray can be slow to report a dead actor on a loaded machine (seen:
            # minutes): a member whose process is gone on this host has failed, reported or not
            if m.ref is not None and self.backend._process_gone(m):
                self._failed_seen.append((m, None, now))
                m.ref = None
        if self._failed_seen:
            return self._judge()
        if all(m.ref is None for m in self.members):
            self.rc = 0
        return self.rc

    def _judge(self) -> int | None:
        """The failure that caused the others, the same rule as the controller's
        (:func:`elastic_ring.protocol.first_failure`): a member whose node is gone; else one that
        failed with an error of its own (a crash record that is not a peer loss); else one that
        died without any record (kill -9, the OOM killer), whether Ray reported it yet or its
        process is seen gone on this host. A member whose record says it only lost a peer
        (HorovodInternalError, "Connection reset/closed by peer") is never the cause: while only
        such members have failed, the others are given up to ``_GRACE_S`` to show; after that the
        cause is a member that never reported (or no rank, when all of them only lost a peer)."""
        records = protocol.read_error_records(self.backend.spec.run_dir, since=self.t_start)
        seen = self._failed_seen
        for m, e, _ in seen:
            if (e is not None and "ActorUnavailableError" in type(e).__name__) or not self.backend._node_alive(m.info["node_id"]):
                self._failed(m, e)
                return self.rc
        running = [m for m in self.members if m.ref is not None]
        # failed members: those Ray reported, and those whose process is seen gone on this host
        failed = [(m, e) for m, e, _ in seen] + [(m, None) for m in running if self.backend._process_gone(m)]
        for m, e in failed:
            r = _record_of(m, records)
            if r is not None and not _peer_loss(r):
                self._failed(m, e)
                return self.rc
        waited = time.time() - seen[0][2]
        silent = [(m, e) for m, e in failed if _record_of(m, records) is None]
        if silent:  # after 0.5 s: a lost node surfaces ~2.5 s after its processes (see above)
            if waited > 0.5:
                self._failed(*silent[0])
                return self.rc
            return None
        if waited > _GRACE_S or not running:
            if running:  # a member that never reported while its peers lost it
                self._failed(running[0], None)
            else:  # every member only lost a peer: no rank to blame
                self._failed(None, seen[0][1])
            return self.rc
        return None

    def _failed(self, m: Member | None, e: Exception | None) -> None:
        if m is None:  # every member that failed only lost a peer (a kill elsewhere, not seen)
            self.failure = {"rank": None, "node": None, "type": "PeerLost",
                            "message": "every worker that failed only lost a peer (no rank to blame): "
                                       f"{type(e).__name__ if e is not None else 'lost'}"}
            self.rc = 1
            return
        node = m.info.get("node_id", "?")
        kind = type(e).__name__ if e is not None else "ActorDiedError"
        lost = "ActorUnavailableError" in kind or not self.backend._node_alive(node)
        if lost:
            self.backend.suspect_nodes.add(node)
        how = " (node lost)" if lost else (" (its process is gone; no error reported)" if e is None else "")
        self.failure = {"rank": m.rank, "node": f"{node[:12]} ({m.info.get('ip', '?')})", "type": kind,
                        "message": f"worker rank {m.rank} on Ray node {node[:12]} ({m.info.get('ip', '?')}) "
                                   f"failed: {kind}{how}"}
        self.rc = 1

    def kill(self) -> None:
        for m in self.members:
            self.backend._end_actor(m.actor)
        if self.rc is None:
            self.rc = -9


class RayBackend:
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

    def _new_actor(self, **opts):
        res: dict[str, Any] = {"num_cpus": self.cpus, "max_restarts": 0}
        if self.gpus:
            res["num_gpus"] = self.gpus
        res.update(opts)
        target = self.spec.script or BUILTIN_TARGET
        preload = () if target.endswith(".py") or os.sep in target else (target,)
        return self._actor_cls.options(**res).remote(preload)

    def _end_actor(self, actor) -> None:
        import ray

        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass

    def _name(self) -> str:
        self._n += 1
        return f"w{self._n}"

    # ------------------------------------------------------------------ spares
    def _spares_wanted(self, world: int) -> int:
        if self.warm_spares is not None:
            return self.warm_spares
        return max(0, self.spec.slots - world)  # enough for any grow up to the run's slots

    def _top_up(self, world: int, launch: SegmentLaunch) -> None:
        """Keep the spares wanted at ``world`` (new actors)."""
        self._world, self._launch = world, launch
        strategy = "SPREAD" if self.strategy == "SPREAD" else "DEFAULT"
        while len(self._spares) < self._spares_wanted(world):
            a = self._new_actor(scheduling_strategy=strategy)
            self._spares.append(self._prestart(self._name(), a, a.info.remote()))

    def _prestart(self, name: str, actor, info_ref) -> Spare:
        """Run the worker entry in ``actor`` with a placeholder rank up to its wait for a go
        (imports, the script's model and data done), so that joining a ring is an ``hvd.init()``
        and a sync from rank 0."""
        world, launch = self._world, self._launch
        go = protocol.control_dir(self.spec.run_dir) / f"spare-{name}.json"
        go.unlink(missing_ok=True)
        env = {**self._base_env(world), "HOROVOD_RANK": "1", "HOROVOD_SIZE": "2",
               "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "1", "ELASTIC_RING_MEMBER": name}
        argv = self._argv(launch)
        argv[argv.index("--segment") + 1] = "-1"  # its segment comes with the sync from rank 0
        cut = argv.index("--")
        argv[cut:cut] = ["--go-file", str(go)]
        log = self.spec.run_dir / "logs" / f"ray-{name}.log"
        return Spare(name, actor, info_ref, actor.run.remote(argv, env, str(log)), go)

    def _recycle(self, m: Member) -> None:
        """A worker that left the ring at a shrink: a spare again if one is wanted (no new
        process, no imports), else ended."""
        world = self._ahead.launch.world if self._ahead is not None else self._world
        if self._launch is not None and len(self._spares) < self._spares_wanted(world):
            import ray

            self._spares.append(self._prestart(self._name(), m.actor, ray.put(m.info)))
        else:
            self._end_actor(m.actor)

    def _take_spares(self, k: int) -> list[Member]:
        """``k`` warm actors: pre-started spares that are ready first (waited for, if none is),
        then cold new ones."""
        import ray

        got: list[Member] = []
        pending = list(self._spares)
        self._spares = []
        while pending and len(got) < k:
            refs = [sp.info_ref for sp in pending]
            ready, _ = ray.wait(refs, num_returns=1, timeout=_READY_TIMEOUT_S)
            if not ready:
                break
            sp = pending.pop(refs.index(ready[0]))
            done, _ = ray.wait([sp.run_ref], timeout=0)
            try:
                if done:  # it ended while waiting (an error): not usable
                    raise RuntimeError("spare ended")
                got.append(Member(sp.name, sp.actor, ray.get(sp.info_ref), ref=sp.run_ref, go=sp.go))
            except Exception:  # noqa: BLE001 - a spare that died: skip it
                self._end_actor(sp.actor)
        self._spares = pending
        while len(got) < k:  # no spare left: a cold actor
            a = self._new_actor()
            got.append(Member(self._name(), a, ray.get(a.info.remote(), timeout=_READY_TIMEOUT_S)))
        return got

    # ------------------------------------------------------------------ rings
    def _argv(self, launch: SegmentLaunch) -> list[str]:
        spec = self.spec
        return ["--run-dir", str(spec.run_dir), "--segment", str(launch.segment), "--stop-at",
                str(launch.stop_at), "--owner", launch.owner, "--controller-pid", str(os.getpid()),
                "--controller-host", socket.gethostname(), "--ring-by-controller",
                "--", spec.script or BUILTIN_TARGET, *spec.script_args]

    def _ring(self, members: list[Member]) -> dict[str, dict[str, str]]:
        """A new rendezvous for ``members`` (in rank order as far as nodes allow): each member's
        Horovod environment. One Horovod host per Ray node ID."""
        import ray
        from horovod.runner.common.util.hosts import HostInfo, get_host_assignments
        from horovod.runner.gloo_run import create_run_env_vars, create_slot_env_vars
        from horovod.runner.http.http_server import RendezvousServer

        order: list[str] = []
        by_node: dict[str, list[Member]] = {}
        for m in members:
            node = m.info["node_id"]
            if node not in by_node:
                order.append(node)
                by_node[node] = []
            by_node[node].append(m)
        slots = get_host_assignments([HostInfo(n, len(by_node[n])) for n in order], len(members))
        server = RendezvousServer()
        port = server.start(_handler({(s.hostname, s.local_rank): s for s in slots}))
        server.init(slots)
        self._servers.append(server)  # the older ones are stopped once this ring is in use
        ip = ray.util.get_node_ip_address()
        envs: dict[str, dict[str, str]] = {}
        taken = {n: 0 for n in order}
        for slot in slots:
            m = by_node[slot.hostname][taken[slot.hostname]]
            taken[slot.hostname] += 1
            m.rank = slot.rank
            # elastic=True: Horovod asks the rendezvous for its rank (served by _handler), and a
            # DistributedOptimizer made at size 1 still allreduces once the ring grows
            env = {k: str(v) for k, v in create_run_env_vars(ip, [m.info["iface"]], port, elastic=True).items()}
            env.update({k: str(v) for k, v in create_slot_env_vars(slot).items()})
            env["ELASTIC_RING_MEMBER"] = m.name
            envs[m.name] = env
        return envs

    def _base_env(self, world: int) -> dict[str, str]:
        env = {"PYTHONUNBUFFERED": "1", **self.spec.extra_env}
        # a worker's intra-op threads: its bundle's CPUs (several Ray nodes may share one machine,
        # and a worker cannot see how many of its node's cores other workers hold)
        threads = os.environ.get(protocol.CPU_THREADS_ENV) or str(max(1, int(self.cpus)))
        env[protocol.CPU_THREADS_ENV] = threads
        if self.spec.device == "cpu":
            env["OMP_NUM_THREADS"] = threads
            env.setdefault("HOROVOD_CYCLE_TIME", "5")
        return env

    def _run(self, m: Member, launch: SegmentLaunch, env: dict[str, str]) -> None:
        log = self.spec.run_dir / "logs" / f"ray-{m.name}.log"
        m.ref = m.actor.run.remote(self._argv(launch), {**self._base_env(launch.world), **env}, str(log))

    def _note(self, log_path: Path, text: str) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "a") as f:
            f.write(text + "\n")

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

    def _local_pid(self, members: list[Member]) -> int:
        """Rank 0's process where it runs on this host (telemetry), else the controller's."""
        m = members[0]
        return int(m.info["pid"]) if m.info.get("host") == socket.gethostname() else os.getpid()

    def _command(self, launch: SegmentLaunch) -> list[str]:
        return ["ray", f"--address={self.address or os.environ.get('RAY_ADDRESS') or 'local'}",
                "-np", str(launch.world), "--placement", self.strategy, *self._argv(launch)]

    def _describe(self, members: list[Member], launch: SegmentLaunch) -> str:
        rows = ", ".join(f"rank {m.rank}: {m.name} pid {m.info['pid']} node {m.info['node_id'][:12]} "
                         f"({m.info['ip']}, {m.info['iface']})" for m in members)
        return f"[ray] segment {launch.segment}: {len(members)} worker(s): {rows}"

    def _ring_now(self, paused_segment: int, launch: SegmentLaunch, t_launch: float):
        """The paused workers' new ring, formed now: (members, leavers, joiners)."""
        old = self._serving()
        keep, leave = old[:launch.world], old[launch.world:]
        joiners = self._take_spares(launch.world - len(keep)) if launch.world > len(keep) else []
        for m in leave:
            m.retiring = True
        members = keep + joiners
        envs = self._ring(members)
        action = {"action": "resize", "to": launch.world, "segment": launch.segment,
                  "stop_at": launch.stop_at, "time": t_launch, "members": envs}
        from elastic_ring.worker.api import inplace_action_file

        protocol.write_json_atomic(inplace_action_file(self.spec.run_dir, paused_segment), action)
        for m in joiners:
            if m.go is not None:  # a pre-started spare: its go brings its place in the ring
                protocol.write_json_atomic(m.go, {"stop_at": launch.stop_at, "time": t_launch,
                                                  "env": envs[m.name]})
            else:
                self._run(m, launch, envs[m.name])
        return members, leave, joiners

    def _serving(self) -> list[Member]:
        return sorted((m for m in self.group.members if not m.retiring), key=lambda m: m.rank)

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

    def _ready_spares(self, k: int) -> list[Spare] | None:
        """``k`` spares whose actor is up now (taken out of the pool), or None if fewer are."""
        import ray

        if k <= 0:
            return []
        ready, _ = ray.wait([sp.info_ref for sp in self._spares], num_returns=len(self._spares), timeout=0)
        done = set(ready)
        got = [sp for sp in self._spares if sp.info_ref in done][:k]
        if len(got) < k:
            return None
        for sp in got:
            sp.info = ray.get(sp.info_ref)
        self._spares = [sp for sp in self._spares if sp not in got]
        return got

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
            from elastic_ring.worker.api import inplace_action_file

            src = inplace_action_file(self.spec.run_dir, segment)
            try:
                os.rename(src, src.with_name(f"inplace-{segment}.withdrawn.json"))
            except FileNotFoundError:
                a.taken = True
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
