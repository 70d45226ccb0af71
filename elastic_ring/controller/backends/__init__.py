"""How the controller starts and reshapes workers: one module per launch backend, and the one
factory that builds a run's backend and resize strategy from its options (:func:`make_launch`).

:mod:`.api` holds the interfaces (:class:`~.api.Backend`, :class:`~.api.InPlaceRing`) and their
value types; :mod:`.survival` the one survivor agreement and blame of the backends that keep the
survivors of a failure (``--survive``); :mod:`.resize` the resize strategies; :mod:`.horovodrun`
starts one ``horovodrun`` per segment (``--relaunch prelaunch|overlap|sequential``, also on
``--hosts``/``--hostfile``);
:mod:`.elastic` keeps one Horovod Elastic job alive across resizes (``--relaunch inplace``);
:mod:`.ray` runs the workers as Ray actors that stay across resizes (``--backend ray``);
:mod:`.local` starts one process per worker on this host for ``--collective torch``, and
:mod:`.torch_hosts` has horovodrun launch them on ``--hosts``/``--hostfile``. The
controller (:mod:`elastic_ring.controller.controller`) decides when; a backend only does what it
is told.
"""

from __future__ import annotations

from dataclasses import dataclass

from elastic_ring.controller.backends.api import Backend, Handle, InPlaceRing, Launcher, SegmentLaunch, Started
from elastic_ring.controller.backends.resize import InPlace, Relaunch, ResizeStrategy


@dataclass(frozen=True)
class LaunchOptions:
    """How a run's workers are launched, as checked at the request (``RunRequest.check``):
    ``relaunch`` is a resolved mode (``prelaunch``, ``overlap``, ``sequential``, ``inplace``; the
    Ray backend resizes in place)."""

    relaunch: str = "prelaunch"
    backend: str = "horovodrun"  # or "ray"
    network_interface: str | None = None
    ray_address: str | None = None
    placement: str = "PACK"
    warm_spares: int | None = None
    gpus_per_worker: float = 0.0
    survive: bool = False  # Ray, inplace: the survivors of a failed worker go on from their copy in memory
    survive_env: str = "1"  # the workers' ELASTIC_RING_SURVIVE: "auto" times the copy first (the default)
    collective: str = "horovod"  # or "torch": the local launcher (backends.local), no horovodrun
    stop_grace: float | None = None  # a torchrun-form script: SIGTERM -> SIGKILL at a stop (None: torchrun's 30 s)
    max_restarts: int = 3  # told to a torchrun-form script (TORCHELASTIC_MAX_RESTARTS)
    discovered: bool = False  # the hosts come from --host-discovery-script (the controller's use_hosts)


def make_launch(options: LaunchOptions, spec, launcher: Launcher | None = None,
                host_probe=None) -> tuple[Backend, ResizeStrategy]:
    """The backend and the resize strategy of a run: Ray actors (in place), the local launcher per
    segment (``--collective torch``; with ``inplace`` its processes stay and re-form their
    process group; on several hosts or discovered ones horovodrun launches them, :mod:`.torch_hosts`), one
    Horovod Elastic job (``inplace``), or one ``horovodrun`` per segment (the relaunch modes)."""
    if options.backend == "ray":
        from elastic_ring.controller.backends.ray import make_ray_backend

        ray = make_ray_backend(spec, address=options.ray_address, strategy=options.placement,
                               warm_spares=options.warm_spares, gpus_per_worker=options.gpus_per_worker,
                               survive=options.survive, collective=options.collective,
                               survive_env=options.survive_env)
        return ray, InPlace(ray)
    over_hosts = spec.hosts or spec.hostfile or (options.discovered and options.relaunch != "inplace")
    if options.collective == "torch" and over_hosts:  # horovodrun launches, torch reduces (in place: refused)
        from elastic_ring.controller.backends.torch_hosts import TorchHostsBackend

        return (TorchHostsBackend(spec, launcher=launcher, network_interface=options.network_interface,
                                  host_probe=host_probe), Relaunch(options.relaunch))
    if options.collective == "torch":
        from elastic_ring.controller.backends.local import LocalBackend, LocalRingBackend

        if options.relaunch == "inplace":
            ring = LocalRingBackend(spec, launcher=launcher, survive=options.survive)
            ring.survive_env = options.survive_env
            return ring, InPlace(ring)
        return (LocalBackend(spec, launcher=launcher, stop_grace=options.stop_grace, max_restarts=options.max_restarts),
                Relaunch(options.relaunch))
    if options.relaunch == "inplace":
        from elastic_ring.controller.backends.elastic import ElasticBackend

        elastic = ElasticBackend(spec, launcher=launcher, network_interface=options.network_interface,
                                 survive=options.survive)
        elastic.survive_env = options.survive_env
        return elastic, InPlace(elastic)
    from elastic_ring.controller.backends.horovodrun import HorovodrunBackend

    return (HorovodrunBackend(spec, launcher=launcher, network_interface=options.network_interface,
                              host_probe=host_probe), Relaunch(options.relaunch))


__all__ = ["Backend", "Handle", "InPlace", "InPlaceRing", "Launcher", "LaunchOptions", "Relaunch",
           "ResizeStrategy", "SegmentLaunch", "Started", "make_launch"]
