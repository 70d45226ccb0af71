"""Reference simulator for the tests: the event engine as it was before its decisions became arrays.

It is kept here, unchanged in behaviour, as the oracle the current engine (elastic_ring/sim) must
reproduce exactly: a test runs both on the machine it runs on and compares their results, so that
no test depends on a constant a floating-point computation produced on another CPU. Only its
imports changed (the policies are tests/oracle/policies.py, the same era's code).

Original description:
The event-driven cluster simulator: :class:`Simulator` (and :func:`simulate`, one run in a call).

Events (:class:`Event`: a job's completion, the end of one of its exploration phases) live in a
heap, with lazy deletion by stamp, next to the sorted arrival list. The policy decides at every
arrival, every completion and every end of an exploration; between events each job progresses at
its TRUE speed at its GPU count, except during a resize overhead (no progress, GPUs held). A job's
completion time only changes when its allocation changes, so one decision costs the policy's time
plus O(changed jobs · log events).

Resize accounting: any change of the GPU count of a job that has already started (including a
preemption to 0 and each step of an exploration) counts as one resize. A resize, or a resume from
a checkpoint after a preemption, costs ``resize_overhead_s`` without progress; a job's very first
start costs ``start_overhead_s`` (0 by default: the same for every policy; the live check sets the
measured launch time).

Exploration (``policy.explores``): the job holds 8 GPUs and trains ``explore_phase_s`` at each of
``explore_gpus`` (1, 2, 4, 8) in turn, measuring its speed (true speed times 1 + N(0, noise));
then Eq. 5 is fitted (:func:`~elastic_ring.perfmodel.speed.fit_speed`) and the policy plans with
the fit.

Remaining work (``config.remaining``): ``oracle`` tells the policy each job's true remaining Q;
``eq1`` tells it the Eq. 1 prediction from the job's loss curve observed so far
(:func:`~elastic_ring.perfmodel.convergence.predict_remaining`, the function the live scheduler
uses): ``loss_points`` noisy losses spread over the work done, refitted when the work done grew by
``refit_growth``; a job with too little curve gets the prior, the mean job size of its workload.

Simultaneous events: all jobs arriving at the same instant arrive before one decision, and all
jobs completing at the same instant are completed before the one decision that follows (none is resized at a completion whose remaining work is already 0).

Speeds come from :class:`~elastic_ring.perfmodel.speed.SpeedModel` through
:func:`~elastic_ring.sched.api.model_rate` (samples/s, cached per GPU count); the engine never
writes Eq. 5 itself.
"""

from __future__ import annotations

import heapq
import itertools
from enum import IntEnum
from typing import Mapping, NamedTuple, Sequence

import numpy as np

from elastic_ring.errors import ElasticRingError
from elastic_ring.perfmodel.convergence import predict_remaining
from elastic_ring.perfmodel.speed import SpeedModel, fit_speed
from elastic_ring.sched.api import JobView, Policy, Rate, model_rate
from elastic_ring.sim.api import JobSpec, JobState, RunResult, SimConfig

_INF = float("inf")


class SimError(ElasticRingError):
    """The simulation went wrong: a policy over-allocated, or jobs can never run (deadlock)."""


class EventKind(IntEnum):
    """What happens at an :class:`Event`. At equal times a completion is handled first."""

    COMPLETION = 0  # the job's work is done (at its current speed and pause)
    PHASE_END = 1  # the end of one of the job's exploration phases


class Event(NamedTuple):
    """One heap entry, ordered as a tuple: by time, then kind, then push order (``seq``).

    ``stamp`` is the job's allocation version (COMPLETION) or exploration phase (PHASE_END) when
    the event was pushed; an event whose stamp no longer matches its job is stale and skipped.
    """

    time: float
    kind: EventKind
    seq: int
    job_id: int
    stamp: int


_COMPLETION = EventKind.COMPLETION
_PHASE_END = EventKind.PHASE_END


class SimJob:
    """Runtime state of one job in the simulator (its blueprint is a :class:`JobSpec`).

    work_done: samples processed up to ``advanced_to`` (s).
    gpus_held: GPUs the job holds (8 while exploring); gpus_training: GPUs it trains on now (the
        current exploration phase's count while exploring, else ``gpus_held``).
    speed: true samples/s at ``gpus_training`` (0 when not training); no progress before
        ``paused_until`` (a resize or resume overhead).
    version: bumped at every change of ``gpus_training``; stamps COMPLETION events.
    true_model / true_rate: the speed curve the job really runs at, and its cached samples/s.
    plan_rate: the planner's samples/s (None while unexplored).
    phase: index of the current exploration phase (-1 when not exploring); measured: (workers,
        measured steps/s) of each phase so far.
    """

    __slots__ = ("id", "arrival", "work", "work_done", "advanced_to", "gpus_held", "gpus_training",
                 "speed", "true_model", "true_rate", "plan_rate", "paused_until", "version", "state",
                 "explored", "phase", "measured", "finished_at", "resizes", "curve", "target_loss",
                 "q_done", "q_total", "q_fits")

    def __init__(self, spec: JobSpec, true_model: SpeedModel, true_rate: Rate, plan_rate: Rate | None,
                 explored: bool):
        self.id, self.arrival, self.work = spec.id, spec.arrival, spec.work
        self.work_done = 0.0
        self.advanced_to = spec.arrival
        self.gpus_held = self.gpus_training = 0
        self.speed = 0.0
        self.true_model = true_model
        self.true_rate = true_rate
        self.plan_rate = plan_rate
        self.paused_until = 0.0
        self.version = 0
        self.state = JobState.QUEUED
        self.explored = explored
        self.phase = -1
        self.measured: list[tuple[int, float]] = []
        self.finished_at = float("nan")
        self.resizes = 0
        self.curve, self.target_loss = spec.curve, spec.target_loss
        self.q_done = 0.0  # work done at the last Eq. 1 fit
        self.q_total = float("nan")  # the total work that fit predicted
        self.q_fits = 0

    def advance(self, t: float) -> None:
        """Add the work done between ``advanced_to`` and ``t`` (none before ``paused_until``)."""
        if self.speed > 0:
            start = self.advanced_to if self.advanced_to > self.paused_until else self.paused_until
            if t > start:
                self.work_done = min(self.work, self.work_done + self.speed * (t - start))
        self.advanced_to = t

    def remaining_at(self, t: float) -> float:
        """Samples still to process at time ``t`` (without advancing)."""
        if self.speed <= 0:
            return self.work - self.work_done
        start = self.advanced_to if self.advanced_to > self.paused_until else self.paused_until
        return max(0.0, self.work - self.work_done - (self.speed * (t - start) if t > start else 0.0))


class Simulator:
    """One simulated cluster of ``config.gpus`` GPUs under ``policy``; :meth:`run` plays a job list.

    Args:
        true_models: workload name -> the speed curve jobs really run at.
        plan_models: workload name -> the model the planner believes (default: the true ones;
            the held-out check passes another workload's fitted model here).
        trace: if a list, (time, GPUs in use) is appended after every decision.

    Raises:
        SimError: exploration needs more GPUs than the cluster has.
    """

    def __init__(self, config: SimConfig, policy: Policy, true_models: Mapping[str, SpeedModel],
                 plan_models: Mapping[str, SpeedModel] | None = None, trace: list | None = None):
        self.config = config
        self.policy = policy
        self.gpus = config.gpus
        self.explores = bool(getattr(policy, "explores", False))
        self.explore_hold = max(config.explore_gpus)
        if self.explores and self.gpus < self.explore_hold:
            raise SimError(f"exploration needs {self.explore_hold} GPUs, cluster has {self.gpus}")
        self.true_models = true_models
        self.true_rates = {k: model_rate(m) for k, m in true_models.items()}
        plan_models = plan_models if plan_models is not None else true_models
        self.plan_rates = {k: model_rate(m) for k, m in plan_models.items()}
        self.trace = trace
        self._noise_rng = np.random.default_rng([config.seed, 1])
        # runtime state, (re)set by run()
        self._heap: list[Event] = []
        self._seq = itertools.count(1)
        self._active: dict[int, SimJob] = {}
        self.gpus_in_use = 0
        self.max_gpus_in_use = 0
        self.gpu_seconds = 0.0
        self.resizes = 0

    # ------------------------------------------------------------------------------ the loop
    def run(self, jobs: Sequence[JobSpec]) -> RunResult:
        """Play ``jobs`` to the end.

        Raises:
            SimError: a policy allocates more GPUs than exist, or no job can ever run.
        """
        config = self.config
        self._heap = heap = []
        self._seq = itertools.count(1)
        self._active = active = {}
        self._noise_rng = np.random.default_rng([config.seed, 1])
        self.gpus_in_use = self.max_gpus_in_use = self.resizes = 0
        self.gpu_seconds = 0.0

        arrivals = sorted(jobs, key=lambda s: (s.arrival, s.id))
        n_jobs = len(arrivals)
        finished: list[SimJob] = []
        t_first = arrivals[0].arrival if arrivals else 0.0
        accounted_to = t_first
        next_arrival = 0
        while len(finished) < n_jobs:
            while heap:  # drop stale events
                ev = heap[0]
                j = active.get(ev.job_id)
                if j is None or (ev.kind == _COMPLETION and ev.stamp != j.version) or \
                        (ev.kind == _PHASE_END and (j.state != JobState.EXPLORING or ev.stamp != j.phase)):
                    heapq.heappop(heap)
                    continue
                break
            t_arr = arrivals[next_arrival].arrival if next_arrival < n_jobs else _INF
            t_ev = heap[0].time if heap else _INF
            if t_arr == _INF and t_ev == _INF:
                raise SimError(f"deadlock: {n_jobs - len(finished)} jobs can never run under {self.policy.name}")
            if t_arr <= t_ev:
                now = t_arr
                self.gpu_seconds += self.gpus_in_use * (now - accounted_to)
                accounted_to = now
                while next_arrival < n_jobs and arrivals[next_arrival].arrival == now:
                    self._arrive(arrivals[next_arrival], now)  # jobs arriving together: one decision
                    next_arrival += 1
                self._decide(now)
                continue
            ev = heapq.heappop(heap)
            now = ev.time
            self.gpu_seconds += self.gpus_in_use * (now - accounted_to)
            accounted_to = now
            j = active[ev.job_id]
            if ev.kind == _COMPLETION:
                self._complete(j, now)
                finished.append(j)
                while heap and heap[0].time == now and heap[0].kind == _COMPLETION:
                    ev2 = heapq.heappop(heap)  # another job done at this instant: before deciding
                    j2 = active.get(ev2.job_id)
                    if j2 is not None and ev2.stamp == j2.version:
                        self._complete(j2, now)
                        finished.append(j2)
                if active or next_arrival < n_jobs:
                    self._decide(now)
            else:
                self._end_phase(j, now)
        return self._result(finished, n_jobs, t_first)

    # ------------------------------------------------------------------------------ event handlers
    def _arrive(self, spec: JobSpec, now: float) -> None:
        plan = None if self.explores else self.plan_rates[spec.workload]
        self._active[spec.id] = SimJob(spec, self.true_models[spec.workload], self.true_rates[spec.workload],
                                       plan, explored=not self.explores)

    def _complete(self, j: SimJob, now: float) -> None:
        j.work_done = j.work
        j.advanced_to = now
        j.finished_at = now
        j.state = JobState.DONE
        self.gpus_in_use -= j.gpus_held
        j.gpus_held = j.gpus_training = 0
        j.speed = 0.0
        del self._active[j.id]

    def _end_phase(self, j: SimJob, now: float) -> None:
        """Record the phase's measured speed; start the next phase, or fit Eq. 5 and decide."""
        j.advance(now)
        phases = self.config.explore_gpus
        w = phases[j.phase]
        steps_per_s = j.true_rate(w) / (j.true_model.m * w)
        noise = self.config.explore_noise * self._noise_rng.standard_normal()
        j.measured.append((w, steps_per_s * (1.0 + noise)))
        if j.phase + 1 < len(phases):
            j.phase += 1
            j.resizes += 1
            self.resizes += 1
            j.paused_until = now + self.config.resize_overhead_s
            self._set_training(j, phases[j.phase], now)
            self._push_phase_end(j, now)
            return
        ws = [m[0] for m in j.measured]
        fs = [max(m[1], 1e-12) for m in j.measured]
        j.plan_rate = model_rate(fit_speed(ws, fs, j.true_model.m, j.true_model.n).model)
        j.explored = True
        j.state = JobState.RUNNING
        j.phase = -1
        self._decide(now)

    # ------------------------------------------------------------------------------ decisions
    def _decide(self, now: float) -> None:
        """Ask the policy, check its answer, apply it (shrinks first, so GPUs in use never exceed G)."""
        active, policy, explores, G = self._active, self.policy, self.explores, self.gpus
        exploring = JobState.EXPLORING
        views = []
        current = {}
        eq1 = self.config.remaining == "eq1"
        for j in active.values():
            current[j.id] = j.gpus_held
            q = j.remaining_at(now)
            if eq1 and j.curve is not None:
                q = self._predicted_remaining(j, j.work - q)
            views.append(JobView(j.id, q, j.plan_rate, j.gpus_held,
                                 explores and not j.explored and j.state != exploring,
                                 j.state == exploring))
        new = policy.allocate(views, G, current)
        total = 0
        for jid, w in new.items():
            if jid not in active or w < 0 or int(w) != w:
                raise SimError(f"policy {policy.name} returned a bad allocation {jid}: {w}")
            total += w
        if total > G:
            raise SimError(f"policy {policy.name} allocated {total} GPUs of {G}")
        # An unchanged count (w == gpus_held) is a no-op for every job, so only changes are applied.
        jobs = list(active.values())
        for j in jobs:
            w = int(new.get(j.id, 0))
            if w < j.gpus_held and j.state != exploring:
                self._apply(j, w, now)
        for j in jobs:
            w = int(new.get(j.id, 0))
            if w != j.gpus_held and (w > j.gpus_held or j.state == exploring):
                self._apply(j, w, now)
        if self.gpus_in_use > G:
            raise SimError(f"{self.gpus_in_use} GPUs in use of {G}")
        if self.gpus_in_use > self.max_gpus_in_use:
            self.max_gpus_in_use = self.gpus_in_use
        if self.trace is not None:
            self.trace.append((now, self.gpus_in_use))

    def _predicted_remaining(self, j: SimJob, done: float) -> float:
        """Eq. 1's Q for ``j`` from its curve observed up to ``done`` samples (refitted only when
        ``done`` grew by ``refit_growth`` since the last fit; in between, the last predicted total
        minus the work done)."""
        cfg = self.config
        if done > 0 and (j.q_fits == 0 or done >= j.q_done * cfg.refit_growth):
            n = cfg.loss_points
            xs = done * np.arange(1, n + 1) / n
            b0, b1, b2 = j.curve
            rng = np.random.default_rng([cfg.seed, 3, j.id, j.q_fits])
            ls = (1.0 / (b0 * xs + b1) + b2) * (1.0 + cfg.loss_noise * rng.standard_normal(n))
            ls = np.maximum(ls, 1e-6)
            q = predict_remaining(done, xs, ls, j.target_loss, self._prior(j), min_points=3)
            j.q_done, j.q_total, j.q_fits = done, done + q, j.q_fits + 1
        if j.q_fits == 0:
            return self._prior(j)
        return max(j.q_total - done, 0.05 * done)

    def _prior(self, j: SimJob) -> float:
        """The mean job size of ``j``'s workload (samples): what is expected of an unknown job."""
        return self.config.mean_hours_at_8 * 3600.0 * j.true_rate(8)

    def _apply(self, j: SimJob, w: int, now: float) -> None:
        """Give job ``j`` ``w`` GPUs (``w != j.gpus_held``): a start, resize, preemption or exploration."""
        if j.state == JobState.EXPLORING:
            raise SimError(f"policy {self.policy.name} changed exploring job {j.id} to {w} GPUs")
        if self.explores and not j.explored:
            if w != self.explore_hold:
                raise SimError(f"policy {self.policy.name} gave unexplored job {j.id} {w} GPUs, "
                               f"not {self.explore_hold}")
            j.advance(now)
            self._start_exploring(j, now)
            return
        j.advance(now)
        if j.gpus_held > 0:
            j.resizes += 1
            self.resizes += 1
            if w > 0:
                j.paused_until = now + self.config.resize_overhead_s
        elif w > 0:
            j.paused_until = (now + self.config.start_overhead_s if j.work_done == 0
                              else now + self.config.resize_overhead_s)
        j.state = JobState.RUNNING if w > 0 else JobState.QUEUED
        self.gpus_in_use += w - j.gpus_held
        j.gpus_held = w
        self._set_training(j, w, now)

    def _start_exploring(self, j: SimJob, now: float) -> None:
        j.state = JobState.EXPLORING
        j.phase = 0
        self.gpus_in_use += self.explore_hold - j.gpus_held
        j.gpus_held = self.explore_hold
        j.paused_until = now if j.work_done == 0 else now + self.config.resize_overhead_s
        self._set_training(j, self.config.explore_gpus[0], now)
        self._push_phase_end(j, now)

    def _set_training(self, j: SimJob, gpus: int, now: float) -> None:
        """Train on ``gpus`` from ``now`` (after any pause): new speed, new completion event."""
        j.gpus_training = gpus
        j.speed = j.true_rate(gpus) if gpus > 0 else 0.0
        j.version += 1
        if j.speed > 0:
            start = now if now > j.paused_until else j.paused_until
            heapq.heappush(self._heap, Event(start + (j.work - j.work_done) / j.speed, _COMPLETION,
                                             next(self._seq), j.id, j.version))

    def _push_phase_end(self, j: SimJob, now: float) -> None:
        heapq.heappush(self._heap, Event(now + self.config.explore_phase_s, _PHASE_END, next(self._seq),
                                         j.id, j.phase))

    # ------------------------------------------------------------------------------ result
    def _result(self, finished: list[SimJob], n_jobs: int, t_first: float) -> RunResult:
        jct = np.array([j.finished_at - j.arrival for j in sorted(finished, key=lambda j: j.id)])
        makespan = max(j.finished_at for j in finished) - t_first if finished else 0.0
        return RunResult(strategy=self.policy.name, seed=self.config.seed, jobs=n_jobs,
                         avg_jct_s=float(jct.mean()) if n_jobs else 0.0,
                         p99_jct_s=float(np.percentile(jct, 99)) if n_jobs else 0.0,
                         makespan_s=float(makespan),
                         utilisation=float(self.gpu_seconds / (self.gpus * makespan)) if makespan > 0 else 0.0,
                         resizes=self.resizes, max_gpus_in_use=self.max_gpus_in_use, completed=len(finished),
                         jct_s=tuple(float(x) for x in jct))


def simulate(config: SimConfig, policy: Policy, jobs: Sequence[JobSpec],
             true_models: Mapping[str, SpeedModel], plan_models: Mapping[str, SpeedModel] | None = None,
             trace: list | None = None) -> RunResult:
    """Run ``jobs`` on ``config.gpus`` GPUs under ``policy``: ``Simulator(...).run(jobs)``.

    Raises:
        SimError: a policy allocates more GPUs than exist, or no job can ever run.
    """
    return Simulator(config, policy, true_models, plan_models, trace).run(jobs)
