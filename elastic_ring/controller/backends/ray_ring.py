"""The Ray backend's rings: a rendezvous served by the controller for a ring's members and each
member's Horovod environment, the worker entry's arguments, and a paused ring re-formed now at a
resize (:class:`RingMixin`, mixed into :class:`~elastic_ring.controller.backends.ray.RayBackend`,
whose attributes it uses).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from elastic_ring import protocol
from elastic_ring.controller.backends.api import BUILTIN_TARGET, SegmentLaunch
from elastic_ring.controller.backends.ray_actor import _handler
from elastic_ring.controller.backends.ray_group import Member


class RingMixin:
    """Rings and their members' environments (part of :class:`~elastic_ring.controller.backends.ray.RayBackend`)."""

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
