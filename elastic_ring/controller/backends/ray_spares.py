"""The Ray backend's actors and its pool of warm spares: actors that already imported torch and
Horovod and ran the worker entry up to its wait for a go, so that joining a ring is an
``hvd.init()`` and a sync from rank 0 (:class:`SparePoolMixin`, mixed into
:class:`~elastic_ring.controller.backends.ray.RayBackend`, whose attributes it uses).
"""

from __future__ import annotations

import os
from typing import Any

from elastic_ring import protocol
from elastic_ring.controller.backends.api import BUILTIN_TARGET, SegmentLaunch
from elastic_ring.controller.backends.ray_actor import _READY_TIMEOUT_S
from elastic_ring.controller.backends.ray_group import Member, Spare


class SparePoolMixin:
    """New and ended actors, and the warm spares (part of :class:`~elastic_ring.controller.backends.ray.RayBackend`)."""

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
