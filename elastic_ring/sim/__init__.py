"""Discrete-event simulator of a GPU cluster under the Table 3 scheduling policies.

* :mod:`.api` — value types: :class:`SimConfig` (blueprint), :class:`JobSpec`, :class:`JobState`,
  :class:`RunResult`, the contention levels.
* :mod:`.engine` — :class:`Simulator` (the event loop; :func:`simulate` runs one in a call) and
  :class:`Launches`, how decisions reach the jobs when not at once (the live replay's hand-over).
* :mod:`.state` — the engine's per-job state as arrays and the compiled steps on it (numba).
* :mod:`.workload` — workload profiles (true Eq. 5 curves) and the seeded job stream.
* :mod:`.bound` — lower bounds on any policy's average JCT (SRPT at linear speed-up, each job alone).

Speeds come from :class:`elastic_ring.perfmodel.speed.SpeedModel`; policies from
:mod:`elastic_ring.sched`.
"""

from elastic_ring.sim.api import CONTENTION, JobSpec, JobState, RunResult, SimConfig
from elastic_ring.sim.engine import Launches, Simulator, simulate
from elastic_ring.sim.workload import Workload, builtin_workloads, load_workload, make_jobs

__all__ = ["CONTENTION", "JobSpec", "JobState", "Launches", "RunResult", "SimConfig", "Simulator", "simulate",
           "Workload", "builtin_workloads", "load_workload", "make_jobs"]
