"""Discrete-event simulator of a GPU cluster under the Table 3 scheduling policies."""

from elastic_ring.sim.api import CONTENTION, JobSpec, JobState, RunResult, SimConfig
from elastic_ring.sim.engine import simulate
from elastic_ring.sim.workload import Workload, builtin_workloads, load_workload, make_jobs

__all__ = ["CONTENTION", "JobSpec", "JobState", "RunResult", "SimConfig", "simulate", "Workload",
           "builtin_workloads", "load_workload", "make_jobs"]
