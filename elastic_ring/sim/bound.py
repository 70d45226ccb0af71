"""Lower bounds on the average JCT of any policy: how much better than Eight a policy could do at all.

Both bounds use the true remaining work (an oracle), zero resize cost, and speed-ups no policy
can beat; so Eight's average JCT divided by a bound is an upper bound on any policy's gain.

:func:`srpt_bound`  Preemptive SRPT on one server as fast as the whole cluster with LINEAR speed-up
                    from one GPU: every job's rate at w GPUs is at most ``w·f(1)`` (the curves are
                    concave: ``f(w)/w`` never grows), so the cluster never processes more than ``G``
                    one-GPU-seconds of work per second, and SRPT minimises the average response time
                    of a single server (Schrage 1968) — any split of that capacity between jobs does
                    no better. A job's size is its work in one-GPU seconds, ``work / f(1)``.
:func:`alone_bound` Every job alone on the whole cluster from its arrival: ``work / f(G)``.

Neither is achievable on a concave curve (a job cannot get the whole cluster at 1-GPU efficiency);
the gap between a policy and the bound is what the speed-up curve and the remaining-work
prediction cost together.
"""

from __future__ import annotations

import heapq
from typing import Mapping, Sequence

import numpy as np

from elastic_ring.perfmodel.speed import SpeedModel
from elastic_ring.sim.api import JobSpec


def srpt_bound(jobs: Sequence[JobSpec], gpus: int, models: Mapping[str, SpeedModel]) -> np.ndarray:
    """Per-job JCTs (s, in job id order) under preemptive SRPT on one server of ``gpus`` one-GPU
    seconds per second (module docstring)."""
    arrivals = sorted((j.arrival, j.work / models[j.workload].samples_per_s(1), j.id) for j in jobs)
    jct: dict[int, float] = {}
    heap: list[list[float]] = []  # [remaining one-GPU seconds, arrival, id]
    t, i, n = 0.0, 0, len(arrivals)
    while i < n or heap:
        if not heap:
            t = max(t, arrivals[i][0])
        while i < n and arrivals[i][0] <= t:
            a, size, jid = arrivals[i]
            heapq.heappush(heap, [size, a, jid])
            i += 1
        rem, a, jid = heap[0]
        t_done = t + rem / gpus
        t_next = arrivals[i][0] if i < n else float("inf")
        if t_done <= t_next:
            heapq.heappop(heap)
            t = t_done
            jct[int(jid)] = t - a
        else:
            heap[0][0] = rem - (t_next - t) * gpus  # the smallest stays the smallest: heap intact
            t = t_next
    return np.array([jct[j.id] for j in sorted(jobs, key=lambda j: j.id)])


def alone_bound(jobs: Sequence[JobSpec], gpus: int, models: Mapping[str, SpeedModel]) -> np.ndarray:
    """Per-job JCTs (s, in job id order) if every job had the whole cluster from its arrival."""
    return np.array([j.work / models[j.workload].samples_per_s(gpus) for j in sorted(jobs, key=lambda j: j.id)])
