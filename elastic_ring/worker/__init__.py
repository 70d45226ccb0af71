"""The worker library for elastic Horovod scripts: ``import elastic_ring.worker as elastic``.

``elastic.init()`` returns the :class:`Job`; see :mod:`elastic_ring.worker.api` for the flat loop
(``job.steps()``) and :mod:`elastic_ring.worker.hooked` for a script's own epoch loop
(``job.epochs()`` with ``elastic.DistributedSampler``, :mod:`elastic_ring.worker.data`).
Importing this package imports neither torch nor Horovod.
"""

from elastic_ring.worker.api import Job, NotLaunchedError, Sampler, StopReason, init
from elastic_ring.worker.data import DistributedSampler

__all__ = ["DistributedSampler", "Job", "NotLaunchedError", "Sampler", "StopReason", "init"]
