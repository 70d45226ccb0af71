"""Policies of the scheduling literature, in our model: the anchors our own policies are compared with.

LAS (Tiresias)  least attained service, for when remaining work is unknown (Gu et al., NSDI 2019).
                A job's attained service is the work it has done, in seconds of one GPU
                (``done / f(1)``, so jobs of different workloads compare); jobs are queued by
                Tiresias's discretised priority: queue 0 below ``first_queue_s`` of attained
                service, then one queue per doubling of it; FIFO (arrival order) within a queue, so
                a job is not reranked at every event. The first G in that order get 1 GPU, and the
                rest of the GPUs go by Eq. 6 doubling with each job's speed-up gain
                ``(1/f(w) - 1/f(2w)) / w`` weighted by ``(N - rank)^power`` (no remaining work: it is
                unknown to LAS). Tiresias gives each job its requested GPUs; the doubling here is
                what makes it elastic. ``power`` is tuned on training seeds like srtf's;
                ``first_queue_s`` (1 GPU-hour, about 1/16 of the mean job) is a fixed choice.
Pollux          goodput re-optimisation (Qiao et al., OSDI 2021; AdaptDL). Pollux maximises the power
                mean (p = -1) of every job's speed-up over its fair share, ``goodput_j(w) /
                goodput_j(G/N)``, re-optimised periodically (every 60 s in the paper; here at every
                event, which is at least as often). Goodput = throughput x statistical efficiency;
                in this workload model a job's work in samples does not depend on its batch (fixed
                per-worker batch, Eq. 1 in samples), so statistical efficiency is 1 and goodput is
                throughput. Maximising the p = -1 mean is minimising ``sum_j f_j(G/N) / f_j(w_j)``:
                a unit-step greedy on that sum's marginal decrease (first G jobs in arrival order at
                1 GPU each). No remaining work is used: Pollux optimises throughput fairness, not JCT.

heSRPT          SRPT generalised to concave speed-ups (Berg, Vesilo, Harchol-Balter, 2020): for jobs
                all present at once with speed-up ``k^p``, the optimal split gives the job of size
                rank i (1 = the largest of m) the fraction ``(i/m)^a - ((i-1)/m)^a`` of the GPUs with
                ``a = 1/(1-p)``. Here p is read off each job's curve (``f(G)/f(1) = G^p``), jobs are
                ranked by predicted remaining time on one GPU (as srtf), at most G of them get >= 1
                GPU, fractions are rounded to whole GPUs (largest remainders), and ``a`` is scaled
                by ``scale`` (tuned on training seeds: with arrivals the static optimum starves the
                later jobs, and scale 1 does worse than Eight at moderate load).

All have ``allocate`` only (the simulator's per-job path); neither changes the policies of
:mod:`elastic_ring.sched.policies`.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from elastic_ring.errors import ConfigError
from elastic_ring.sched.api import JobView
from elastic_ring.sched.policies import _planned, doubling_allocate, unit_greedy_allocate

LAS_FIRST_QUEUE_S = 3600.0  # attained service (1-GPU seconds) that ends queue 0


def las_queue(attained_s: float, first_queue_s: float = LAS_FIRST_QUEUE_S) -> int:
    """Tiresias-style priority queue of a job with ``attained_s`` 1-GPU seconds of service:
    0 below ``first_queue_s``, then one more per doubling."""
    if attained_s < first_queue_s:
        return 0
    return 1 + int(math.floor(math.log2(attained_s / first_queue_s)))


class LAS:
    """Least attained service (Tiresias), discretised, with rank-weighted doubling."""

    name = "las"
    explores = False

    # default power 1: chosen from 1, 2, 3, 5, 8 on seeds 0-4 (ResNet-110, load 0.9) by scripts/sim_bound.py
    def __init__(self, power: float = 1.0, first_queue_s: float = LAS_FIRST_QUEUE_S):
        if not (power >= 0 and first_queue_s > 0):
            raise ConfigError(f"las needs power >= 0 and first_queue_s > 0, got {power}, {first_queue_s}")
        self.power = power
        self.first_queue_s = first_queue_s

    def allocate(self, jobs: Sequence[JobView], total_gpus: int, current: Mapping[int, int]) -> dict[int, int]:
        planned = _planned(jobs)
        order = sorted(range(len(jobs)), key=lambda i: (las_queue(jobs[i].done / planned[i][2](1),
                                                                  self.first_queue_s), i))[:total_gpus]
        n = len(order)
        chosen = [(planned[i][0], 1.0, planned[i][2]) for i in order]
        return doubling_allocate(chosen, total_gpus, weights=[(n - r) ** self.power for r in range(n)])


class Pollux:
    """Goodput re-optimisation: the power mean (p = -1) of speed-ups over the fair share."""

    name = "pollux"
    explores = False

    def allocate(self, jobs: Sequence[JobView], total_gpus: int, current: Mapping[int, int]) -> dict[int, int]:
        planned = _planned(jobs)[:total_gpus]
        if not planned:
            return {}
        fair = max(1, total_gpus // len(planned))
        return unit_greedy_allocate([(jid, rate(fair), rate) for jid, _, rate in planned], total_gpus)


class HeSRPT:
    """heSRPT's split of the GPUs by size rank, with its exponent scaled by ``scale``."""

    name = "hesrpt"
    explores = False

    # default 0.25: chosen from 0.125, 0.25, 0.5, 1 on seeds 0-4 (ResNet-110, load 0.9) by scripts/sim_bound.py
    def __init__(self, scale: float = 0.25):
        if not (scale > 0 and math.isfinite(scale)):
            raise ConfigError(f"hesrpt needs a finite scale > 0, got {scale}")
        self.scale = scale

    def allocate(self, jobs: Sequence[JobView], total_gpus: int, current: Mapping[int, int]) -> dict[int, int]:
        planned = sorted(_planned(jobs), key=lambda x: (x[1] / x[2](1), x[0]))[:total_gpus]
        m = len(planned)
        if m == 0:
            return {}
        raw = []
        for rank, (_, _, rate) in enumerate(planned):
            p = math.log(rate(total_gpus) / rate(1)) / math.log(total_gpus) if total_gpus > 1 else 0.0
            a = self.scale / max(1.0 - min(p, 1.0), 1e-9)
            i = m - rank  # 1 = the largest job
            raw.append(total_gpus * ((i / m) ** a - ((i - 1) / m) ** a))
        w = [max(1, int(math.floor(x))) for x in raw]
        while sum(w) > total_gpus:  # the 1-GPU floors overshot: take from the largest share
            w[max(range(m), key=lambda k: (w[k], -k))] -= 1
        for k in sorted(range(m), key=lambda k: (-(raw[k] - w[k]), k)):
            if sum(w) >= total_gpus:
                break
            w[k] += 1
        return {planned[k][0]: w[k] for k in range(m)}


ANCHORS = {"las": LAS, "pollux": Pollux, "hesrpt": HeSRPT}
