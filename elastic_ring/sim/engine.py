"""The event-driven cluster simulator.

Events live in a heap (job completions and the ends of exploration phases, with lazy deletion by
version) next to the sorted arrival list. The policy decides at every arrival, every completion
and every end of an exploration; between events each job progresses at its TRUE speed at its
GPU count, except during a resize overhead (no progress, GPUs held). A job's completion time only
changes when its allocation changes, so one decision costs the policy's time plus
O(changed jobs · log events).

Resize accounting: any change of the GPU count of a job that has already started (including a
preemption to 0 and each step of an exploration) counts as one resize. A resize, or a resume from
a checkpoint after a preemption, costs ``resize_overhead_s`` without progress; a job's very first
start costs nothing (it is the same for every policy).

Exploration (``policy.explores``): the job holds 8 GPUs and trains ``explore_phase_s`` at each of
``explore_gpus`` (1, 2, 4, 8) in turn, measuring its speed (true speed times 1 + N(0, noise));
then Eq. 5 is fitted (:func:`~elastic_ring.perfmodel.speed.fit_speed`) and the policy plans with
the fit.
"""

from __future__ import annotations

import heapq
from typing import Mapping, Sequence

import numpy as np

from elastic_ring.errors import ElasticRingError
from elastic_ring.perfmodel.speed import SpeedModel, fit_speed
from elastic_ring.sched.api import JobView, Policy, Rate, model_rate
from elastic_ring.sim.api import JobSpec, JobState, RunResult, SimConfig


class SimError(ElasticRingError):
    """The simulation went wrong: a policy over-allocated, or jobs can never run (deadlock)."""


class _Job:
    __slots__ = ("id", "arrival", "work", "done", "last_t", "held", "width", "rate", "true", "plan",
                 "b", "n", "pause_until", "version", "state", "explored", "phase", "measured",
                 "finish", "resizes")

    def __init__(self, spec: JobSpec, true: SpeedModel, plan: Rate | None, explored: bool):
        self.id, self.arrival, self.work = spec.id, spec.arrival, spec.work
        self.done = 0.0
        self.last_t = spec.arrival
        self.held = self.width = 0
        self.true = model_rate(true)
        self.b, self.n = true.m, true.n
        self.rate = 0.0
        self.plan = plan
        self.pause_until = 0.0
        self.version = 0
        self.state = JobState.QUEUED
        self.explored = explored
        self.phase = -1
        self.measured: list[tuple[int, float]] = []
        self.finish = float("nan")
        self.resizes = 0

    def advance(self, t: float) -> None:
        if self.rate > 0:
            start = self.last_t if self.last_t > self.pause_until else self.pause_until
            if t > start:
                self.done = min(self.work, self.done + self.rate * (t - start))
        self.last_t = t

    def remaining_at(self, t: float) -> float:
        if self.rate <= 0:
            return self.work - self.done
        start = self.last_t if self.last_t > self.pause_until else self.pause_until
        return max(0.0, self.work - self.done - (self.rate * (t - start) if t > start else 0.0))


def simulate(config: SimConfig, policy: Policy, jobs: Sequence[JobSpec],
             true_models: Mapping[str, SpeedModel], plan_models: Mapping[str, SpeedModel] | None = None,
             trace: list | None = None) -> RunResult:
    """Run ``jobs`` on ``config.gpus`` GPUs under ``policy``.

    Args:
        true_models: workload name -> the speed curve jobs really run at.
        plan_models: workload name -> the model the planner believes (default: the true ones;
            the held-out check passes another workload's fitted model here).
        trace: if a list, (time, GPUs in use) is appended after every decision.

    Raises:
        SimError: a policy allocates more GPUs than exist, or no job can ever run.
    """
    G = config.gpus
    explores = bool(getattr(policy, "explores", False))
    if explores and G < max(config.explore_gpus):
        raise SimError(f"exploration needs {max(config.explore_gpus)} GPUs, cluster has {G}")
    plan_models = plan_models if plan_models is not None else true_models
    plan_rates = {k: model_rate(m) for k, m in plan_models.items()}
    noise_rng = np.random.default_rng([config.seed, 1])
    overhead = config.resize_overhead_s
    phases = config.explore_gpus
    phase_s = config.explore_phase_s
    explore_hold = max(phases)

    order = sorted(jobs, key=lambda s: (s.arrival, s.id))
    n_jobs = len(order)
    active: dict[int, _Job] = {}
    heap: list[tuple[float, int, int, int, int]] = []  # (time, kind, seq, id, version|phase)
    seq = 0
    COMPLETE, PHASE = 0, 1
    used = 0
    max_used = 0
    gpu_s = 0.0
    t_first = order[0].arrival if order else 0.0
    last_acc = t_first
    resizes = 0
    finished: list[_Job] = []

    def push_completion(j: _Job, now: float) -> None:
        nonlocal seq
        if j.rate > 0:
            start = now if now > j.pause_until else j.pause_until
            seq += 1
            heapq.heappush(heap, (start + (j.work - j.done) / j.rate, COMPLETE, seq, j.id, j.version))

    def set_width(j: _Job, width: int, now: float) -> None:
        j.width = width
        j.rate = j.true(width) if width > 0 else 0.0
        j.version += 1
        push_completion(j, now)

    def start_exploring(j: _Job, now: float) -> None:
        nonlocal used, seq
        j.state = JobState.EXPLORING
        j.phase = 0
        used += explore_hold - j.held
        j.held = explore_hold
        j.pause_until = now if j.done == 0 else now + overhead
        set_width(j, phases[0], now)
        seq += 1
        heapq.heappush(heap, (now + phase_s, PHASE, seq, j.id, 0))

    def apply(j: _Job, w: int, now: float) -> None:
        nonlocal used, resizes
        if j.state == JobState.EXPLORING:
            if w != j.held:
                raise SimError(f"policy {policy.name} changed exploring job {j.id} to {w} GPUs")
            return
        if explores and not j.explored:
            if w == 0:
                return
            if w != explore_hold:
                raise SimError(f"policy {policy.name} gave unexplored job {j.id} {w} GPUs, not {explore_hold}")
            j.advance(now)
            start_exploring(j, now)
            return
        if w == j.held:
            return
        j.advance(now)
        if j.held > 0:
            j.resizes += 1
            resizes += 1
            if w > 0:
                j.pause_until = now + overhead
        elif w > 0:
            j.pause_until = now if j.done == 0 else now + overhead
        j.state = JobState.RUNNING if w > 0 else JobState.QUEUED
        used += w - j.held
        j.held = w
        set_width(j, w, now)

    def decide(now: float) -> None:
        nonlocal max_used
        views = []
        current = {}
        for j in active.values():
            current[j.id] = j.held
            views.append(JobView(j.id, j.remaining_at(now), j.plan, j.held,
                                 explores and not j.explored and j.state != JobState.EXPLORING,
                                 j.state == JobState.EXPLORING))
        new = policy.allocate(views, G, current)
        total = 0
        for jid, w in new.items():
            if jid not in active or w < 0 or int(w) != w:
                raise SimError(f"policy {policy.name} returned a bad allocation {jid}: {w}")
            total += w
        if total > G:
            raise SimError(f"policy {policy.name} allocated {total} GPUs of {G}")
        for j in list(active.values()):  # shrink first, then grow, so `used` never exceeds G
            w = int(new.get(j.id, 0))
            if w < j.held and j.state != JobState.EXPLORING:
                apply(j, w, now)
        for j in list(active.values()):
            w = int(new.get(j.id, 0))
            if w >= j.held or j.state == JobState.EXPLORING:
                apply(j, w, now)
        if used > G:
            raise SimError(f"{used} GPUs in use of {G}")
        max_used = max(max_used, used)
        if trace is not None:
            trace.append((now, used))

    i_arr = 0
    while len(finished) < n_jobs:
        while heap:
            t, kind, _, jid, tag = heap[0]
            j = active.get(jid)
            if j is None or (kind == COMPLETE and tag != j.version) or \
                    (kind == PHASE and (j.state != JobState.EXPLORING or tag != j.phase)):
                heapq.heappop(heap)
                continue
            break
        t_arr = order[i_arr].arrival if i_arr < n_jobs else float("inf")
        t_ev = heap[0][0] if heap else float("inf")
        if t_arr == float("inf") and t_ev == float("inf"):
            raise SimError(f"deadlock: {n_jobs - len(finished)} jobs can never run under {policy.name}")
        if t_arr <= t_ev:
            now = t_arr
            gpu_s += used * (now - last_acc)
            last_acc = now
            spec = order[i_arr]
            i_arr += 1
            plan = None if explores else plan_rates[spec.workload]
            active[spec.id] = _Job(spec, true_models[spec.workload], plan, explored=not explores)
            decide(now)
            continue
        now, kind, _, jid, tag = heapq.heappop(heap)
        gpu_s += used * (now - last_acc)
        last_acc = now
        j = active[jid]
        if kind == COMPLETE:
            j.done = j.work
            j.last_t = now
            j.finish = now
            j.state = JobState.DONE
            used -= j.held
            j.held = j.width = 0
            j.rate = 0.0
            del active[jid]
            finished.append(j)
            if active or i_arr < n_jobs:
                decide(now)
            continue
        # PHASE: the end of one exploration phase
        j.advance(now)
        w = phases[j.phase]
        sps = j.true(w) / (j.b * w)  # true steps/s
        j.measured.append((w, sps * (1.0 + config.explore_noise * noise_rng.standard_normal())))
        if j.phase + 1 < len(phases):
            j.phase += 1
            j.resizes += 1
            resizes += 1
            j.pause_until = now + overhead
            set_width(j, phases[j.phase], now)
            seq += 1
            heapq.heappush(heap, (now + phase_s, PHASE, seq, j.id, j.phase))
            continue
        ws = [m[0] for m in j.measured]
        fs = [max(m[1], 1e-12) for m in j.measured]
        j.plan = model_rate(fit_speed(ws, fs, j.b, j.n).model)
        j.explored = True
        j.state = JobState.RUNNING
        j.phase = -1
        decide(now)

    jct = np.array([j.finish - j.arrival for j in sorted(finished, key=lambda j: j.id)])
    makespan = max(j.finish for j in finished) - t_first if finished else 0.0
    return RunResult(strategy=policy.name, seed=config.seed, jobs=n_jobs,
                     avg_jct_s=float(jct.mean()) if n_jobs else 0.0,
                     p99_jct_s=float(np.percentile(jct, 99)) if n_jobs else 0.0,
                     makespan_s=float(makespan),
                     utilisation=float(gpu_s / (G * makespan)) if makespan > 0 else 0.0,
                     resizes=resizes, max_gpus_in_use=max_used, completed=len(finished),
                     jct_s=tuple(float(x) for x in jct))
