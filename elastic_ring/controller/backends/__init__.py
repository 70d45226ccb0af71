"""How the controller starts and reshapes workers: one module per launch backend.

:mod:`.api` holds the interface (:class:`~.api.Backend`) and its value types; :mod:`.horovodrun`
starts one ``horovodrun`` per segment (``--relaunch prelaunch|overlap|sequential``, also on
``--hosts``/``--hostfile``); :mod:`.elastic` keeps one Horovod Elastic job alive across resizes
(``--relaunch inplace``). The controller (:mod:`elastic_ring.controller.controller`) decides when;
a backend only does what it is told.
"""

from __future__ import annotations

from elastic_ring.controller.backends.api import Backend, Handle, Launcher, SegmentLaunch, Started


def make_backend(relaunch: str, spec, launcher: Launcher | None = None,
                 network_interface: str | None = None, host_probe=None) -> Backend:
    """The backend of a relaunch mode: ``inplace`` runs on Horovod Elastic, the others on one
    ``horovodrun`` per segment."""
    if relaunch == "inplace":
        from elastic_ring.controller.backends.elastic import ElasticBackend

        return ElasticBackend(spec, launcher=launcher, network_interface=network_interface)
    from elastic_ring.controller.backends.horovodrun import HorovodrunBackend

    return HorovodrunBackend(spec, launcher=launcher, network_interface=network_interface,
                             host_probe=host_probe)


__all__ = ["Backend", "Handle", "Launcher", "SegmentLaunch", "Started", "make_backend"]
