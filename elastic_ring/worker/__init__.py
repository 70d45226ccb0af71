"""The worker library for elastic Horovod scripts: ``import elastic_ring.worker as elastic``.

``elastic.init()`` returns the :class:`Job`; see :mod:`elastic_ring.worker.api` for the flat loop
(``job.steps()``) and :mod:`elastic_ring.worker.hooked` for a script's own epoch loop
(``job.epochs()`` with ``elastic.DistributedSampler``, :mod:`elastic_ring.worker.data`).
Importing this package imports neither torch nor Horovod; its names are imported at their first
use, so that a module of it (the entry point ``python -m elastic_ring.worker.run``, whose process
hands the worker over to the fork server before it needs them) starts without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from elastic_ring.worker.api import Job, NotLaunchedError, Sampler, StopReason, init
    from elastic_ring.worker.data import DistributedSampler

_FROM = {"DistributedSampler": "data", "Job": "api", "NotLaunchedError": "api", "Sampler": "api",
         "StopReason": "api", "init": "api"}  # each name: the module of this package it comes from
__all__ = sorted(_FROM)


def __getattr__(name: str) -> Any:
    module = _FROM.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # (once: the next use is a plain lookup)
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
