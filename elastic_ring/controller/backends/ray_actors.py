"""The Ray backend's actors (:class:`ActorPool`): it starts and ends worker actors, runs the worker
entry in them, and keeps a pool of warm spares: actors that already imported torch and their
collective (Horovod, or torch.distributed) and ran the worker entry up to its wait for a go, so that
joining a ring is its collective's init and a sync from rank 0.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from elastic_ring import protocol
from elastic_ring.controller.backends.api import BUILTIN_TARGET, SegmentLaunch, start_args, threads_env
from elastic_ring.controller.backends.ray_members import Member, Spare
from elastic_ring.controller.backends.ray_worker import READY_TIMEOUT_S, WorkerActor
from elastic_ring.errors import UserError


def worker_argv(spec, launch: SegmentLaunch, spare_go: Path | None = None) -> list[str]:
    """The worker entry's arguments of a Ray member in segment ``launch`` (its launch, a
    :class:`~elastic_ring.seam.Start`); ``spare_go``: a warm spare's, which waits for that go and
    learns its segment with the sync from rank 0."""
    segment = launch.segment if spare_go is None else -1
    return ["--run-dir", str(spec.run_dir), *start_args(segment, launch.stop_at, launch.owner, spare_go),
            "--ring-by-controller", "--", spec.script or BUILTIN_TARGET, *spec.script_args]


def actor_infos(actors: list) -> list[dict]:
    """Each new actor's :meth:`~.ray_worker.WorkerActor.info`; an actor whose creation raised (its
    collective or the package does not import on its node) is one line naming the error
    (:class:`~elastic_ring.errors.UserError`), not Ray's traceback of it; another actor error (a
    node lost meanwhile) is raised as it is."""
    import ray

    try:
        return ray.get([a.info.remote() for a in actors], timeout=READY_TIMEOUT_S)
    except ray.exceptions.RayActorError as e:
        if not getattr(e, "actor_init_failed", False):
            raise
        last = next((ln.strip() for ln in reversed(str(e).splitlines()) if ln.strip()), type(e).__name__)
        raise UserError(f"a Ray worker actor could not start: {last} (the package, torch and the collective "
                        f"must import on every Ray node)") from None


def base_env(spec, cpus: float) -> dict[str, str]:
    """A member's environment before its ring's: its threads are its bundle's CPUs (several Ray
    nodes may share one machine, and a worker cannot see how many of its node's cores others hold)."""
    threads = protocol.cpu_threads(1, cores=max(1.0, cpus))
    env = {"PYTHONUNBUFFERED": "1", **spec.extra_env, protocol.CPU_THREADS_ENV: str(threads)}
    for k, v in threads_env(spec.device, threads).items():
        env[k] = env.get(k, v) if k == "HOROVOD_CYCLE_TIME" else v
    return env


class ActorPool:
    """Worker actors of ``cpus``/``gpus`` each, named ``w1``, ``w2``, ...; ``warm_spares`` of them
    kept warm (None: enough for any grow up to the run's slots); ``env``: more environment for
    every worker (the run's worker-library switches); ``collective``: the workers' (``horovod`` or
    ``torch``), whose modules each actor imports at its creation."""

    def __init__(self, spec, cpus: float = 1.0, gpus: float = 0.0, warm_spares: int | None = None,
                 strategy: str = "PACK", env: dict[str, str] | None = None, collective: str = "horovod") -> None:
        self.spec, self.cpus, self.gpus, self.warm_spares = spec, cpus, gpus, warm_spares
        self.collective = collective  # what the actors import at their creation (WorkerActor)
        self.env = dict(env or {})
        self.spread = strategy == "SPREAD"
        self.spares: list[Spare] = []  # warm actors running the worker up to its wait for a go
        self._n = 0
        self._cls: Any = None

    # ------------------------------------------------------------------ actors
    def new_actor(self, **opts):
        import ray

        if self._cls is None:
            self._cls = ray.remote(WorkerActor)
        res: dict[str, Any] = {"num_cpus": self.cpus, "max_restarts": 0}
        if self.gpus:
            res["num_gpus"] = self.gpus
        res.update(opts)
        target = self.spec.script or BUILTIN_TARGET
        preload = () if target.endswith(".py") or os.sep in target else (target,)
        return self._cls.options(**res).remote(preload, self.collective)

    def end(self, actor) -> None:
        import ray

        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass

    def name(self) -> str:
        self._n += 1
        return f"w{self._n}"

    def log(self, name: str) -> Path:
        return self.spec.run_dir / "logs" / f"ray-{name}.log"

    def run(self, m: Member, launch: SegmentLaunch, env: dict[str, str]) -> None:
        """Run the worker entry of segment ``launch`` in ``m``'s actor with its ring's ``env``."""
        m.ref = m.actor.run.remote(worker_argv(self.spec, launch),
                                   {**base_env(self.spec, self.cpus), **self.env, **env}, str(self.log(m.name)))

    # ------------------------------------------------------------------ spares
    def wanted(self, world: int) -> int:
        if self.warm_spares is not None:
            return self.warm_spares
        return max(0, self.spec.slots - world)  # enough for any grow up to the run's slots

    def top_up(self, launch: SegmentLaunch) -> None:
        """Keep the spares wanted at ``launch.world`` (new actors, pre-started for ``launch``)."""
        while len(self.spares) < self.wanted(launch.world):
            a = self.new_actor(scheduling_strategy="SPREAD" if self.spread else "DEFAULT")
            self.spares.append(self._prestart(self.name(), a, a.info.remote(), launch))

    def _prestart(self, name: str, actor, info_ref, launch: SegmentLaunch) -> Spare:
        """Run the worker entry in ``actor`` with a placeholder rank up to its wait for a go
        (imports, the script's model and data done), so that joining a ring is an ``hvd.init()``
        and a sync from rank 0."""
        go = protocol.control_dir(self.spec.run_dir) / f"spare-{name}.json"
        go.unlink(missing_ok=True)
        protocol.waiting_file(go).unlink(missing_ok=True)
        env = {**base_env(self.spec, self.cpus), **self.env, "HOROVOD_RANK": "1", "HOROVOD_SIZE": "2",
               "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "1", "ELASTIC_RING_MEMBER": name}
        argv = worker_argv(self.spec, launch, spare_go=go)
        return Spare(name, actor, info_ref, actor.run.remote(argv, env, str(self.log(name))), go)

    def refill(self, bundle: int, strategy, launch: SegmentLaunch) -> None:
        """A new actor in a failed member's ``bundle`` of the placement group (``strategy`` places it
        there), pre-started for ``launch`` and first in line: the warm worker that takes the failed
        one's place, on the resources the ring already holds."""
        a = self.new_actor(scheduling_strategy=strategy)
        sp = self._prestart(self.name(), a, a.info.remote(), launch)
        sp.bundle = bundle
        self.spares.insert(0, sp)

    def recycle(self, m: Member, launch: SegmentLaunch | None, world: int) -> bool:
        """A worker that left the ring at a shrink: a spare again (for ``launch``, the spares wanted
        at ``world``) if one is wanted (no new process, no imports; True), else ended (False)."""
        if launch is not None and len(self.spares) < self.wanted(world):
            import ray

            sp = self._prestart(self.name(), m.actor, ray.put(m.info), launch)
            sp.bundle = m.bundle
            self.spares.append(sp)
            return True
        self.end(m.actor)
        return False

    def take(self, k: int, cold: Callable[[], tuple[Any, int | None]] | None = None) -> list[Member]:
        """``k`` warm actors: pre-started spares that are ready first (waited for, if none is),
        then cold new ones (``cold``: where each goes, its scheduling strategy and bundle)."""
        import ray

        got: list[Member] = []
        pending, self.spares = self.spares, []
        while pending and len(got) < k:
            refs = [sp.info_ref for sp in pending]
            ready, _ = ray.wait(refs, num_returns=1, timeout=READY_TIMEOUT_S)
            if not ready:
                break
            sp = pending.pop(refs.index(ready[0]))
            done, _ = ray.wait([sp.run_ref], timeout=0)
            try:
                if done:  # it ended while waiting (an error): not usable
                    raise RuntimeError("spare ended")
                got.append(Member(sp.name, sp.actor, ray.get(sp.info_ref), ref=sp.run_ref, go=sp.go,
                                  bundle=sp.bundle))
            except Exception:  # noqa: BLE001 - a spare that died: skip it
                self.end(sp.actor)
        self.spares = pending
        while len(got) < k:  # no spare left: a cold actor
            strategy, bundle = cold() if cold is not None else ("DEFAULT", None)
            a = self.new_actor(scheduling_strategy=strategy)
            got.append(Member(self.name(), a, actor_infos([a])[0], bundle=bundle))
        return got

    def take_ready(self, k: int) -> list[Spare] | None:
        """``k`` spares whose actor is up now (taken out of the pool; those whose worker waits for its
        go first), or None if fewer are."""
        import ray

        if k <= 0:
            return []
        ready, _ = ray.wait([sp.info_ref for sp in self.spares], num_returns=len(self.spares), timeout=0)
        done = set(ready)
        up = [sp for sp in self.spares if sp.info_ref in done]
        got = sorted(up, key=lambda sp: not protocol.waiting_file(sp.go).exists())[:k]  # warm ones first
        if len(got) < k:
            return None
        for sp in got:
            sp.info = ray.get(sp.info_ref)
        self.spares = [sp for sp in self.spares if sp not in got]
        return got

    def ready(self) -> int:
        """How many spares are up now (their actor answered; not taken)."""
        import ray

        if not self.spares:
            return 0
        done, _ = ray.wait([sp.info_ref for sp in self.spares], num_returns=len(self.spares), timeout=0)
        return len(done)

    def waiting(self) -> int:
        """How many spares wait for their go now (their worker's imports and build done: joining is
        an ``hvd.init()`` and a sync)."""
        return sum(protocol.waiting_file(sp.go).exists() for sp in self.spares)

    def end_on(self, nodes) -> int:
        """End the spares whose actor runs on one of ``nodes`` (draining: Ray shuts a drained node
        down once nothing runs there); how many."""
        import ray

        if not nodes or not self.spares:
            return 0
        ready, _ = ray.wait([sp.info_ref for sp in self.spares], num_returns=len(self.spares), timeout=0)
        done, ending = set(ready), []
        for sp in self.spares:
            if sp.info_ref in done:
                try:
                    if ray.get(sp.info_ref).get("node_id") in nodes:
                        ending.append(sp)
                except Exception:  # noqa: BLE001 - an actor that died: the next take skips it
                    pass
        for sp in ending:
            self.end(sp.actor)
        self.spares = [sp for sp in self.spares if sp not in ending]
        return len(ending)

    def give_back(self, spares: list[Spare]) -> None:
        """Spares taken for a ring that was withdrawn: first in line again (still waiting for their go)."""
        self.spares[:0] = spares

    def end_spares(self) -> None:
        for sp in self.spares:
            self.end(sp.actor)
        self.spares = []
