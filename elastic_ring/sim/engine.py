"""The event-driven cluster simulator: :class:`Simulator` (and :func:`simulate`, one run in a call).

Events: arrivals (the sorted job list), completions (each active job's completion time, kept in
the per-job arrays of :mod:`.state`; the next one is the minimum over the active jobs) and the
ends of exploration phases (:class:`Event` s in a heap, with lazy deletion by stamp). The policy
decides at every arrival, every completion and every end of an exploration; between events each
job progresses at its TRUE speed at its GPU count, except during a resize overhead (no progress,
GPUs held). A job's completion time only changes when its allocation changes. From
``batch_min_jobs`` active jobs on, decisions go through the policy's ``allocate_batch`` and are
applied on the arrays in one compiled call (:func:`.state.apply_batch`), the same floating-point
operations per job as the per-job code below.

Resize accounting: any change of the GPU count of a job that has already started (including a
preemption to 0 and each step of an exploration) counts as one resize. A resize, or a resume from
a checkpoint after a preemption, costs ``resize_overhead_s`` without progress; a job's very first
start costs ``start_overhead_s`` (0 by default: the same for every policy; the live check sets the
measured launch time). Either cost grows by ``overhead_per_worker_s`` per worker of the new size
beyond the first (0 by default; on a CPU node launching W worker processes takes longer with W).
``resize_after_launch`` (off by default): a resize of a job still launching begins when that
launch is done, and the GPUs it gives back are free only then (what the live scheduler does).
``launches_share_node`` (off by default): the per-worker cost counts the workers of every other
job still launching at that moment too (launches on one CPU node share its cores).

Exploration (``policy.explores``): the job holds 8 GPUs and trains ``explore_phase_s`` (or, with
``explore_phase_work``, its launch and then that much work, as the live scheduler) at each of
``explore_gpus`` (1, 2, 4, 8) in turn, measuring its speed (true speed times 1 + N(0, noise));
then Eq. 5 is fitted (:func:`~elastic_ring.perfmodel.speed.fit_speed_few`: :func:`fit_speed` from 4
worker counts, fewer terms from fewer, as the live scheduler does) and the policy plans with
the fit. A constant-batch job (:class:`~elastic_ring.perfmodel.accumulated.AccumulatedModel`)
measures its accumulated steps; Eq. 5 is fitted to the plain steps behind them
(:meth:`~elastic_ring.perfmodel.accumulated.AccumulatedModel.plain_step_times`) and the policy
plans with the accumulated model of that fit.

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
from typing import Mapping, NamedTuple, Protocol, Sequence

import numpy as np

from elastic_ring.errors import ElasticRingError
from elastic_ring.perfmodel.accumulated import AccumulatedModel
from elastic_ring.perfmodel.convergence import predict_remaining
from elastic_ring.perfmodel.speed import SpeedModel
from elastic_ring.sched.api import JobBatch, JobView, Policy, Rate, model_rate
from elastic_ring.sched.fast import gain_table
from elastic_ring.sim import state
from elastic_ring.sim.api import JobSpec, JobState, RunResult, SimConfig
from elastic_ring.sim.job import SimJob, _fit_model, _row_monotone
from elastic_ring.sim.state import ADV, DONE_W, EXPLORED, HELD, PAUSE, RESIZES, ROW, SPEED, STATE, TC, TRAIN

_INF = float("inf")


def _step_samples(model, w: int) -> float:
    """Samples of one step of ``model`` at ``w`` workers: ``b·w`` (Eq. 7's fixed per-worker batch),
    the global batch under constant-batch (:class:`AccumulatedModel`)."""
    if isinstance(model, AccumulatedModel):
        return model.global_batch
    return model.m * w
# Decide on arrays (the policy's allocate_batch) from this many active jobs: below it, the
# per-job Python loop is faster than the fixed cost of the array calls. Same answer either way.
BATCH_MIN_JOBS = 64


class SimError(ElasticRingError):
    """The simulation went wrong: a policy over-allocated, or jobs can never run (deadlock)."""


class EventKind(IntEnum):
    """What happens at an :class:`Event`. At equal times a completion is handled first (completions
    are no longer heap events: :mod:`.state` keeps each job's completion time), then wake-ups, then
    phase ends."""

    COMPLETION = 0  # the job's work is done (at its current speed and pause)
    WAKE = 1  # a wake-up asked by the launch model (Simulator.wake_at): Launches.wake handles it
    PHASE_END = 2  # the end of one of the job's exploration phases


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


_PHASE_END = EventKind.PHASE_END
_WAKE = EventKind.WAKE
_STATES = {state.QUEUED: JobState.QUEUED, state.RUNNING: JobState.RUNNING, state.EXPLORING: JobState.EXPLORING,
           state.DONE: JobState.DONE}
_CODE = {v: k for k, v in _STATES.items()}


class Launches(Protocol):
    """How a decision reaches the jobs and what a launch costs, when it is not the engine's own way
    (each change applied at the decision; a start or resize to W workers costs its overhead +
    ``overhead_per_worker_s`` (W - 1): :meth:`Simulator.launch_cost`). The engine calls these at
    fixed points and nowhere else; a model acts on the engine through its public methods
    (:meth:`~Simulator.change`, :meth:`~Simulator.wake_at`, :meth:`~Simulator.retime`,
    :meth:`~Simulator.account`). With a model, decisions are applied one job at a time (never by the
    compiled step). The live replay (:mod:`elastic_ring.experiment.replay`) is one.
    """

    def reset(self, sim: Simulator) -> None:
        """A run begins (forget the previous one's state)."""

    def cost(self, sim: Simulator, j: SimJob, w: int, base: float, t0: float) -> float:
        """Seconds without progress of ``j``'s start or resize to ``w`` workers beginning at ``t0``
        (``base``: the start or resize overhead)."""

    def deciding(self, sim: Simulator, now: float) -> None:
        """The policy is about to decide at ``now``."""

    def decided(self, sim: Simulator, now: float) -> None:
        """The decision at ``now`` has been handed to the jobs."""

    def ask(self, sim: Simulator, j: SimJob, w: int, now: float) -> bool:
        """A decision changes ``j`` to ``w`` GPUs: True applies it now; False keeps it for later
        (the model then asks the engine for a wake-up and applies it with :meth:`Simulator.change`)."""

    def began(self, sim: Simulator, j: SimJob, held: int, w: int, now: float, t0: float) -> None:
        """``j``'s change from ``held`` to ``w`` GPUs, asked at ``now``, began at ``t0``."""

    def explored(self, sim: Simulator, j: SimJob, now: float) -> None:
        """The exploring job ``j`` moved on to its next size at ``now``."""

    def wake(self, sim: Simulator, j: SimJob, now: float) -> None:
        """A wake-up of ``j`` asked with :meth:`Simulator.wake_at` is due."""


class Simulator:
    """One simulated cluster of ``config.gpus`` GPUs under ``policy``; :meth:`run` plays a job list.

    Args:
        true_models: workload name -> the speed curve jobs really run at.
        plan_models: workload name -> the model the planner believes (default: the true ones;
            the held-out check passes another workload's fitted model here).
        trace: if a list, (time, GPUs in use) is appended after every decision.
        launches: how decisions reach the jobs and what launches cost (:class:`Launches`);
            default: each change at once, at the engine's cost.

    Raises:
        SimError: exploration needs more GPUs than the cluster has.
    """

    def __init__(self, config: SimConfig, policy: Policy, true_models: Mapping[str, SpeedModel],
                 plan_models: Mapping[str, SpeedModel] | None = None, trace: list | None = None,
                 batch_min_jobs: int = BATCH_MIN_JOBS, launches: Launches | None = None):
        self.config = config
        self.launches = launches
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
        self.batch = getattr(policy, "allocate_batch", None) is not None
        self.batch_min_jobs = batch_min_jobs
        # A decision on arrays is applied by the compiled step (state.apply_batch) unless a job's
        # change depends on other jobs (hand-over after a launch, launches sharing a node) or a
        # launch model decides how a change is applied; then by _apply, one job at a time.
        self._compiled_apply = not (config.resize_after_launch or config.launches_share_node) and launches is None
        # speed models the planner uses, one row each (a workload's, or a job's fitted one)
        self._rates: list[Rate] = []
        self._tables = np.zeros((0, gain_table(lambda w: 1.0, self.gpus).size))
        self._rate1 = np.zeros(0)
        self._monotone = np.zeros(0, dtype=bool)
        self._plan_row = {k: self._add_rate(r) for k, r in self.plan_rates.items()}
        self._noise_rng = np.random.default_rng([config.seed, 1])
        # runtime state, (re)set by run()
        self._heap: list[Event] = []  # phase ends, wake-ups (completions: the F[TC] column of each job)
        self._due: dict[int, float] = {}  # exploring job -> the end of its current phase
        self._seq = itertools.count(1)
        self._active: dict[int, SimJob] = {}
        self.gpus_in_use = 0
        self.max_gpus_in_use = 0
        self._pending: list[list] = []  # [time, GPUs]: given back by launching jobs, free from time
        self.gpu_seconds = 0.0
        self.resizes = 0

    # ------------------------------------------------------------------------------ the loop
    def run(self, jobs: Sequence[JobSpec]) -> RunResult:
        """Play ``jobs`` to the end.

        Raises:
            SimError: a policy allocates more GPUs than exist, or no job can ever run.
        """
        config = self.config
        if self.launches is not None:
            self.launches.reset(self)
        self._heap = heap = []
        self._due = {}
        self._seq = itertools.count(1)
        self._active = active = {}
        self._noise_rng = np.random.default_rng([config.seed, 1])
        self.gpus_in_use = self.max_gpus_in_use = self.resizes = 0
        self.gpu_seconds = 0.0
        self._pending = []

        arrivals = sorted(jobs, key=lambda s: (s.arrival, s.id))
        n_jobs = len(arrivals)
        self._alloc_arrays(arrivals)
        finished: list[SimJob] = []
        t_first = arrivals[0].arrival if arrivals else 0.0
        accounted_to = t_first
        next_arrival = 0
        while len(finished) < n_jobs:
            while heap:  # drop stale events (wake-ups of active jobs are kept)
                ev = heap[0]
                j = active.get(ev.job_id)
                if j is None or (ev.kind == _PHASE_END and (j.state != JobState.EXPLORING or ev.stamp != j.phase)):
                    heapq.heappop(heap)
                    continue
                break
            if self._t_dirty:
                self._t_next = state.next_completion(self._act, self._n_act, self._F)
                self._t_dirty = False
            t_arr = arrivals[next_arrival].arrival if next_arrival < n_jobs else _INF
            t_done = self._t_next
            t_ev = heap[0].time if heap else _INF
            if t_arr == _INF and t_done == _INF and t_ev == _INF:
                raise SimError(f"deadlock: {n_jobs - len(finished)} jobs can never run under {self.policy.name}")
            now = min(t_arr, t_done, t_ev)
            self.gpu_seconds += self.gpus_in_use * (now - accounted_to)
            accounted_to = now
            if t_arr == now:  # arrivals first at equal times, then completions, then phase ends
                while next_arrival < n_jobs and arrivals[next_arrival].arrival == now:
                    self._arrive(arrivals[next_arrival], now)  # jobs arriving together: one decision
                    next_arrival += 1
                self._decide(now)
            elif t_done == now:  # every job done at this instant, before one decision
                self._n_act, done = state.pop_completed(self._act, self._n_act, self._F, now)
                self._t_dirty = True
                for p in done.tolist():
                    j = self._by_pos[p]
                    self._complete(j, now)
                    finished.append(j)
                if active or next_arrival < n_jobs:
                    self._decide(now)
            else:
                ev = heapq.heappop(heap)
                if ev.kind == _WAKE:
                    self.launches.wake(self, active[ev.job_id], now)
                else:
                    self._end_phase(active[ev.job_id], now)
        return self._result(finished, n_jobs, t_first)

    # ------------------------------------------------------------------------------ for launch models
    @property
    def active(self) -> Mapping[int, SimJob]:
        """The jobs arrived and not done, by id, in arrival order (read only)."""
        return self._active

    def pending(self, now: float) -> list[tuple[float, int]]:
        """(time, GPUs) given back by launching jobs and free only from that time, after ``now``."""
        return sorted((p[0], p[1]) for p in self._pending if p[0] > now)

    def change(self, j: SimJob, w: int, now: float) -> None:
        """Give ``j`` ``w`` GPUs now, as a decision does (the launch model is asked again)."""
        self._apply(j, w, now)

    def wake_at(self, t: float, j: SimJob) -> None:
        """Call the launch model's ``wake`` for ``j`` at ``t`` (after completions at ``t``, before
        phase ends), unless ``j`` is done by then."""
        heapq.heappush(self._heap, Event(t, _WAKE, next(self._seq), j.id, 0))

    def retime(self, j: SimJob, paused_until: float, now: float) -> None:
        """``j``'s launch in progress ends at ``paused_until`` instead: it trains from then (its
        completion, or the end of its exploration phase, moves)."""
        j.paused_until = paused_until
        self._set_training(j, j.gpus_training, now)
        if j.state == JobState.EXPLORING:
            self._push_phase_end(j, now, j.speed, j.paused_until)
        self._store(j)

    def account(self, now: float) -> None:
        """After changes made outside a decision: the capacity check, the peak and the GPU trace."""
        self._account(now)

    # ------------------------------------------------------------------------------ job state
    def _add_rate(self, rate: Rate, model: SpeedModel | None = None) -> int:
        """A row of the planner's tables for ``rate`` (``model_rate(model)`` when a model is given:
        the table is then made from the model's own ``samples_per_s``, the numbers the rate caches,
        without the cache's lookups)."""
        of = rate if model is None else model.samples_per_s
        table, rate1 = gain_table(of, self.gpus), of(1)
        row = len(self._rates)
        if row >= self._tables.shape[0]:  # grow by doubling: amortised O(1) per row
            cap = max(8, 2 * row)
            grown = np.zeros((cap, table.size))
            grown[:row] = self._tables[:row]
            self._tables = grown
            self._rate1 = np.concatenate([self._rate1, np.zeros(cap - self._rate1.size)])
            self._monotone = np.concatenate([self._monotone, np.zeros(cap - self._monotone.size, dtype=bool)])
        self._tables[row] = table
        self._rates.append(rate)
        self._rate1[row] = rate1
        self._monotone[row] = _row_monotone(table)
        return row

    def _alloc_arrays(self, arrivals: Sequence[JobSpec]) -> None:
        """Per-job arrays (by arrival index, see :mod:`.state`) and the active list."""
        n = len(arrivals)
        self._by_pos: list[SimJob | None] = [None] * n
        self._wrow = {k: i for i, k in enumerate(self.true_rates)}
        plan = self._plan_row if not self.explores else {}
        self._F, self._I = state.new_state([s.id for s in arrivals], [s.arrival for s in arrivals],
                                           [s.work for s in arrivals], [self._wrow[s.workload] for s in arrivals],
                                           [plan.get(s.workload, -1) for s in arrivals], not self.explores)
        self._act = np.zeros(n, dtype=np.int64)  # act[:n_act]: columns of the active jobs, in order
        self._n_act = 0
        self._next_pos = 0
        self._t_next, self._t_dirty = _INF, False  # the next completion time (dirty: to recompute)
        self._speed_tab: np.ndarray | None = None  # true samples/s by (workload row, GPUs)
        # While decisions go through arrays ("live": from batch_min_jobs active jobs on, until fewer
        # than half that many remain) F and I are written from the SimJobs on the way in and after
        # every per-job change (_store). With the compiled apply they are then the truth ("_truth")
        # and a SimJob is brought up to date (_load) only where per-job code reads it; otherwise
        # (hand-over, shared launches, a launch model) the SimJobs stay the truth and the
        # arrays mirror them, as before. F[TC] and the active list are always kept.
        self._live = self._truth = False

    def _store(self, j: SimJob) -> None:
        """Write ``j``'s runtime state into the arrays (while they are the truth)."""
        if not self._live:
            return
        p, F, I = j.pos, self._F, self._I
        F[DONE_W, p] = j.work_done
        F[ADV, p] = j.advanced_to
        F[PAUSE, p] = j.paused_until
        F[SPEED, p] = j.speed
        I[HELD, p] = j.gpus_held
        I[TRAIN, p] = j.gpus_training
        I[STATE, p] = _CODE[j.state]
        I[RESIZES, p] = j.resizes
        I[EXPLORED, p] = j.explored

    def _load(self, j: SimJob) -> None:
        """Bring ``j`` up to date from the arrays (while they are the truth)."""
        if not self._truth:
            return
        p, F, I = j.pos, self._F, self._I
        j.work_done, j.advanced_to, j.paused_until, j.speed = F[DONE_W:SPEED + 1, p].tolist()
        j.gpus_held, j.gpus_training, code, j.resizes = I[HELD:RESIZES + 1, p].tolist()
        j.state = _STATES[code]

    def _go_live(self, live: bool) -> None:
        if live:
            if self._speed_tab is None:
                self._speed_tab = state.speed_table(list(self.true_rates.values()), self.gpus)
            self._live = True
            for j in self._active.values():
                self._store(j)
            self._truth = self._compiled_apply
        else:
            for j in self._active.values():
                self._load(j)
            self._live = self._truth = False

    # ------------------------------------------------------------------------------ event handlers
    def _arrive(self, spec: JobSpec, now: float) -> None:
        plan = None if self.explores else self.plan_rates[spec.workload]
        j = self._active[spec.id] = SimJob(spec, self.true_models[spec.workload], self.true_rates[spec.workload],
                                           plan, explored=not self.explores)
        j.pos = p = self._next_pos
        self._next_pos += 1
        self._by_pos[p] = j
        self._act[self._n_act] = p  # columns grow with arrival order: act stays in arrival order
        self._n_act += 1

    def _complete(self, j: SimJob, now: float) -> None:
        """``j`` is done (already out of the active list)."""
        self._load(j)
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
        if now < self._due.get(j.id, now) - 1e-9:
            return  # a phase end its launch model has moved later (pushed again): stale
        phases = self.config.explore_gpus
        w = phases[j.phase]
        steps_per_s = j.true_rate(w) / _step_samples(j.true_model, w)
        noise = self.config.explore_noise * self._noise_rng.standard_normal()
        j.measured.append((w, steps_per_s * (1.0 + noise)))
        if j.phase + 1 < len(phases):
            j.phase += 1
            self.resizes += 1
            w = phases[j.phase]
            if self._truth:  # the arrays are the truth: the step in one compiled call
                speed, paused, tc0, tc1 = state.next_phase(j.pos, w, now, self._F, self._I, self._speed_tab,
                                                           self.config.resize_overhead_s,
                                                           self.config.overhead_per_worker_s)
                j.version += 1
                if not self._t_dirty and tc0 > self._t_next:  # it was not the next to complete
                    self._t_next = min(self._t_next, tc1)  # (next_completion's answer: the first least)
                else:
                    self._t_dirty = True
                self._push_phase_end(j, now, speed, paused)
                return
            j.advance(now)
            j.resizes += 1
            j.paused_until = now + self._launch_cost(w, self.config.resize_overhead_s, now, j)
            self._set_training(j, w, now)
            self._push_phase_end(j, now, j.speed, j.paused_until)
            self._store(j)
            if self.launches is not None:
                self.launches.explored(self, j, now)
            return
        self._load(j)
        j.advance(now)
        ws = [m[0] for m in j.measured]
        fs = [max(m[1], 1e-12) for m in j.measured]
        if isinstance(j.true_model, AccumulatedModel):  # fit Eq. 5 to the plain steps behind the accumulated ones
            plain = j.true_model.plain_step_times(ws, [1.0 / f for f in fs])
            model = AccumulatedModel(_fit_model(ws, [1.0 / t for t in plain], j.true_model.m, j.true_model.n),
                                     j.true_model.micro_batches)
        else:
            model = _fit_model(ws, fs, j.true_model.m, j.true_model.n)
        j.plan_rate = model_rate(model)
        j.explored = True
        j.state = JobState.RUNNING
        j.phase = -1
        if self.batch:
            self._I[ROW, j.pos] = self._add_rate(j.plan_rate, model)
        self._store(j)
        self._decide(now)

    # ------------------------------------------------------------------------------ decisions
    def _decide(self, now: float) -> None:
        """Ask the policy, check its answer, apply it (shrinks first, so GPUs in use never exceed G)."""
        launches = self.launches
        if launches is None:
            self._decide_now(now)
            return
        launches.deciding(self, now)
        self._decide_now(now)
        launches.decided(self, now)

    def _decide_now(self, now: float) -> None:
        if self.batch:
            n = len(self._active)
            if not self._live and n >= self.batch_min_jobs:
                self._go_live(True)
            elif self._live and 2 * n < self.batch_min_jobs:
                self._go_live(False)
            if self._live:
                self._decide_batch(now)
                return
        active, policy, explores, G = self._active, self.policy, self.explores, self.gpus
        exploring = JobState.EXPLORING
        views = []
        current = {}
        eq1 = self.config.remaining == "eq1"
        for j in active.values():
            current[j.id] = j.gpus_held
            q = j.remaining_at(now)
            done = j.work - q
            if eq1 and j.curve is not None:
                q = self._predicted_remaining(j, done)
            views.append(JobView(j.id, q, j.plan_rate, j.gpus_held,
                                 explores and not j.explored and j.state != exploring,
                                 j.state == exploring, done))
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
        self._account(now)

    def _account(self, now: float) -> None:
        """After a decision: the capacity check, the peak and the GPU trace."""
        if self.gpus_in_use > self.gpus:
            raise SimError(f"{self.gpus_in_use} GPUs in use of {self.gpus}")
        if self.gpus_in_use > self.max_gpus_in_use:
            self.max_gpus_in_use = self.gpus_in_use
        if self.trace is not None:
            self.trace.append((now, self.gpus_in_use))

    def _decide_batch(self, now: float) -> None:
        """:meth:`_decide` through the policy's ``allocate_batch``: arrays in, arrays out, and the
        changes applied on the arrays in one compiled call (no Python step per job)."""
        policy, G, act, n = self.policy, self.gpus, self._act, self._n_act
        q, ids, held, rows, needs, exploring = state.batch_arrays(act, n, self._F, self._I, now)
        if not getattr(policy, "uses_remaining", True):
            q = None
        elif self.config.remaining == "eq1":
            by_pos = self._by_pos
            for i in range(n):
                j = by_pos[act[i]]
                if j.curve is not None:
                    q[i] = self._predicted_remaining(j, j.work - float(q[i]))
        batch = JobBatch(ids, q, held, rows, needs, exploring, self._tables, self._rates, self._rate1,
                         self._monotone)
        new = np.asarray(policy.allocate_batch(batch, G))
        if new.shape != (n,):
            raise SimError(f"policy {policy.name} returned a bad allocation {new!r}")
        if not self._compiled_apply or new.dtype.kind not in "iu":
            self._apply_listed(new, held, exploring, now)
            return
        cfg = self.config
        code, idx, val, dg, nres, t_next, starts = state.apply_batch(
            act, n, new.astype(np.int64, copy=False), self._F, self._I, self._speed_tab, now, G, self.explores,
            self.explore_hold, cfg.resize_overhead_s, cfg.start_overhead_s, cfg.overhead_per_worker_s)
        if code != state.OK:
            self._refuse(code, new, int(ids[idx]), int(val))
        self.gpus_in_use += int(dg)
        self.resizes += int(nres)
        self._t_next, self._t_dirty = t_next, False
        for p in starts.tolist():  # jobs starting to explore, in the order the per-job code takes them
            self._apply(self._by_pos[p], self.explore_hold, now)
        self._account(now)

    def _refuse(self, code: int, new: np.ndarray, job_id: int, w: int) -> None:
        """The SimError of a decision that ``state.apply_batch`` refused (the per-job code's words)."""
        name = self.policy.name
        if code == state.BAD:
            raise SimError(f"policy {name} returned a bad allocation {new!r}")
        if code == state.OVER:
            raise SimError(f"policy {name} allocated {w} GPUs of {self.gpus}")
        if code == state.CHANGED_EXPLORING:
            raise SimError(f"policy {name} changed exploring job {job_id} to {w} GPUs")
        raise SimError(f"policy {name} gave unexplored job {job_id} {w} GPUs, not {self.explore_hold}")

    def _apply_listed(self, new: np.ndarray, held: np.ndarray, exploring: np.ndarray, now: float) -> None:
        """A decision on arrays applied by :meth:`_apply`, one changed job at a time (the cases
        ``state.apply_batch`` leaves out)."""
        policy, G, act = self.policy, self.gpus, self._act[:self._n_act]
        if act.size and new.min() < 0:
            raise SimError(f"policy {policy.name} returned a bad allocation {new!r}")
        total = int(new.sum())
        if total > G:
            raise SimError(f"policy {policy.name} allocated {total} GPUs of {G}")
        by_pos, apply = self._by_pos, self._apply
        if self.explores:
            shrink = np.flatnonzero((new < held) & ~exploring)
            grow = np.flatnonzero((new != held) & ((new > held) | exploring))
        else:
            shrink, grow = np.flatnonzero(new < held), np.flatnonzero(new > held)
        for idx in (shrink, grow):
            for p, w in zip(act[idx].tolist(), new[idx].astype(np.int64).tolist()):
                apply(by_pos[p], w, now)
        self._account(now)

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
        """Give job ``j`` ``w`` GPUs (``w != j.gpus_held``): a start, resize, preemption or exploration
        (with a launch model: when it says so)."""
        launches = self.launches
        if launches is None:
            self._load(j)
            self._apply_job(j, w, now)
            self._store(j)
            return
        if not launches.ask(self, j, w, now):
            return
        self._load(j)
        held = j.gpus_held
        t0 = self._apply_job(j, w, now)
        self._store(j)
        launches.began(self, j, held, w, now, t0)

    def _apply_job(self, j: SimJob, w: int, now: float) -> float:
        """The change of :meth:`_apply`; returns when it begins (``now``, or later at a hand-over)."""
        if j.state == JobState.EXPLORING:
            raise SimError(f"policy {self.policy.name} changed exploring job {j.id} to {w} GPUs")
        t0 = self._handover(j, w, now) if self.config.resize_after_launch else now
        if self.explores and not j.explored:
            if w != self.explore_hold:
                raise SimError(f"policy {self.policy.name} gave unexplored job {j.id} {w} GPUs, "
                               f"not {self.explore_hold}")
            j.advance(now)
            self._start_exploring(j, t0)
            return t0
        j.advance(now)
        if j.gpus_held > 0:
            j.resizes += 1
            self.resizes += 1
            if w > 0:
                j.paused_until = t0 + self._launch_cost(w, self.config.resize_overhead_s, t0, j)
        elif w > 0:
            j.paused_until = t0 + self._launch_cost(w, self.config.start_overhead_s if j.work_done == 0
                                                    else self.config.resize_overhead_s, t0, j)
        j.state = JobState.RUNNING if w > 0 else JobState.QUEUED
        self.gpus_in_use += w - j.gpus_held
        j.gpus_held = w
        self._set_training(j, w, now)
        return t0

    def _handover(self, j: SimJob, w: int, now: float) -> float:
        """``config.resize_after_launch``: when the change of ``j`` to ``w`` GPUs can begin. A job
        still launching (or resizing) acts on a resize only once that launch is done, and the GPUs
        a shrink or preemption gives back are free from then on (``_pending``); a start or grow
        takes free GPUs first, then pending ones in the order they are released, and begins when
        the last one it needs is free (the live scheduler's slot hand-over)."""
        pending = [p for p in self._pending if p[0] > now]
        t0 = now if now > j.paused_until or j.gpus_held == 0 else j.paused_until
        if w < j.gpus_held:
            if t0 > now:
                pending.append([t0, j.gpus_held - w])
            self._pending = pending
            return t0
        need = w - j.gpus_held - max(0, self.gpus - self.gpus_in_use - sum(n for _, n in pending))
        for p in sorted(pending):
            if need <= 0:
                break
            k = min(need, p[1])
            p[1] -= k
            need -= k
            t0 = max(t0, p[0])
        self._pending = [p for p in pending if p[1] > 0]
        return t0

    def _start_exploring(self, j: SimJob, now: float) -> None:
        j.state = JobState.EXPLORING
        j.phase = 0
        self.gpus_in_use += self.explore_hold - j.gpus_held
        j.gpus_held = self.explore_hold
        first = self.config.explore_gpus[0]
        j.paused_until = now + self._launch_cost(first, self.config.start_overhead_s if j.work_done == 0
                                                 else self.config.resize_overhead_s, now, j)
        self._set_training(j, first, now)
        self._push_phase_end(j, now, j.speed, j.paused_until)

    def _launch_cost(self, w: int, base: float, t0: float, j: SimJob) -> float:
        if self.launches is not None:
            return self.launches.cost(self, j, w, base, t0)
        return self.launch_cost(w, base, t0, j)

    def launch_cost(self, w: int, base: float, t0: float | None = None, j: SimJob | None = None) -> float:
        """The engine's seconds without progress of a start or resize to ``w`` workers (``base``: the
        start or resize overhead). With ``config.launches_share_node`` the workers of every other job
        still launching at ``t0`` count too (launches on one node share its cores)."""
        per = self.config.overhead_per_worker_s
        if not per:
            return base
        if self.config.launches_share_node and t0 is not None:  # (never with the arrays the truth)
            w += sum(o.gpus_training for o in self._active.values() if o is not j and o.paused_until > t0)
        return base + per * (w - 1)

    def _set_training(self, j: SimJob, gpus: int, now: float) -> None:
        """Train on ``gpus`` from ``now`` (after any pause): new speed, new completion time."""
        j.gpus_training = gpus
        j.speed = j.true_rate(gpus) if gpus > 0 else 0.0
        j.version += 1
        if j.speed > 0:
            start = now if now > j.paused_until else j.paused_until
            self._F[TC, j.pos] = start + (j.work - j.work_done) / j.speed
        else:
            self._F[TC, j.pos] = _INF
        self._t_dirty = True

    def _push_phase_end(self, j: SimJob, now: float, speed: float, paused_until: float) -> None:
        """The end of the phase begun at ``now`` (``j`` trains at ``speed`` from ``paused_until``):
        ``explore_phase_s`` later, or, with ``explore_phase_work``, once its launch is done and that
        much work is trained."""
        work = self.config.explore_phase_work
        if work > 0 and speed > 0:
            end = (now if now > paused_until else paused_until) + work / speed
        else:
            end = now + self.config.explore_phase_s
        self._due[j.id] = end
        heapq.heappush(self._heap, Event(end, _PHASE_END, next(self._seq), j.id, j.phase))

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
             trace: list | None = None, batch_min_jobs: int = BATCH_MIN_JOBS) -> RunResult:
    """Run ``jobs`` on ``config.gpus`` GPUs under ``policy``: ``Simulator(...).run(jobs)``.

    Raises:
        SimError: a policy allocates more GPUs than exist, or no job can ever run.
    """
    return Simulator(config, policy, true_models, plan_models, trace, batch_min_jobs).run(jobs)
