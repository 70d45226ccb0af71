"""The hosts a job runs on, as the cluster gives them (issue 45's building blocks).

* :mod:`.api` — value types: :class:`HostSet` (host -> slots, ordered) and its :class:`HostDiff`;
  :class:`WorkerBounds` (``--min-workers``/``--max-workers``) and the target-size rule.
* :mod:`.discovery` — Horovod Elastic's ``--host-discovery-script`` run with a timeout, and
  :class:`HostPoller`, which asks every interval and keeps the last good answer.
* :mod:`.exclusion` — :class:`Exclusions`: failed hosts left out for a growing cooldown.
* :mod:`.slurm` — the hosts and slots of a Slurm allocation (``SLURM_JOB_NODELIST``, ...).
* :mod:`.manager` — :class:`~.manager.HostManager`: the three together, the one object the
  controller would hold (usable hosts, their changes, the size to run at, waiting and giving up).
"""

from elastic_ring.hosts.api import HostDiff, HostSet, HostsError, WorkerBounds, parse_workers, resolve_bounds

__all__ = ["HostDiff", "HostSet", "HostsError", "WorkerBounds", "parse_workers", "resolve_bounds"]
