"""The worker library for elastic Horovod scripts: ``import elastic_ring.worker as elastic``.

``elastic.init()`` returns the :class:`Job`; see :mod:`elastic_ring.worker.api` for the loop.
Importing this package imports neither torch nor Horovod.
"""

from elastic_ring.worker.api import Job, NotLaunchedError, Sampler, init

__all__ = ["Job", "NotLaunchedError", "Sampler", "init"]
