"""The scheduler for real: ``elastic-ring cluster`` runs a queue of jobs on a node's slots and
resizes them live with the policies of :mod:`elastic_ring.sched` (the simulator's policies).

* :mod:`.api` — value types: :class:`JobRequest` (blueprint), :class:`JobState` (lifecycle),
  :class:`ClusterConfig`, :class:`Observation`.
* :mod:`.store` — the durable state: SQLite (WAL) in the cluster folder.
* :mod:`.scheduler` — :class:`Scheduler`, the loop (side effects passed in, unit-tested with fakes).
* :mod:`.runner` — :class:`ProcessRunner`, which runs each job under its own ``train`` controller.
* :mod:`.daemon` — ``cluster up`` and ``cluster down``: the scheduler's process (lock, config, loop, drain).
* :mod:`.client` — what any shell does to the folder: submit, cancel, the job table.
"""
