"""The live scheduler's loop: the policies of :mod:`elastic_ring.sched`, applied to real jobs.

One :meth:`Scheduler.tick` (every ``poll_s``):

1. observe every job that has a controller (progress, exit, the end of a resize in flight);
   a job whose controller ended is settled (finished, failed, paused after a stop, cancelled)
   and gives back its slots — a *completion*;
2. take new submissions (*arrivals*) and cancellations from the store;
3. at every arrival, completion and cancellation, ask the policy for an allocation (a *decision*,
   recorded with its cause) — the same ``Policy.allocate`` the simulator calls, with each job's
   remaining work (Eq. 1's prediction when the job has a target loss, else its step budget) and
   its Eq. 5 speed model (its ``profile.json``);
4. move the jobs toward the allocation: stops and shrinks first, then grows and starts.

Invariants (what the unit tests check with a fake runner):

* at most one resize in flight per job (``resize_to`` set from the request until the controller
  reports the new size and the old workers' exit);
* a slot belongs to at most one job at any moment: a shrink gives back its slots only once the
  old workers have exited (the ``workers_exited`` event), a stopped job only once its controller
  has ended; a grow or a start takes only slots that are free then;
* state lives in the store (SQLite); after a crash, :meth:`recover` re-attaches to controllers that
  still run and settles the others (a paused job is resumed from its checkpoint later), so no job
  is lost or run twice (the run folder's lock refuses a second controller). A start stores the job
  as running with its slots *before* its controller exists (the slots are its own from then on), then
  the controller's pid: a crash in between leaves a running job whose controller never started, and
  recovery puts it back in the queue (it has nothing to lose). The fault point of
  :func:`injected_fault` lets a test kill the scheduler there, and after the start before the pid.

Exploration live (policy ``exploratory``): a job without a speed model first measures itself.
The policy gives it ``hold`` slots (8 in the paper; here the largest power of two <= min(8, S) on
S slots, :func:`explore_hold`); the scheduler starts it at 1 worker on them and resizes it through
1, 2, 4, ... up to ``hold`` (sizes below the job's --min-workers or above its --max-workers are
skipped), one resize at a time (the live resize path; on GPUs or several hosts a stop + resume at
the next size on the slots it holds). At each size it reads the job's own ``throughput`` windows,
skips the first window after each launch (warm-up) and takes ``EXPLORE_WINDOWS`` windows: steps/s
= their steps / their seconds (an ``explore_measured`` event). With every size measured it fits
Eq. 5 (:func:`~elastic_ring.perfmodel.speed.fit_speed_few`: the full fit from 4 worker counts;
from 1-3 counts, as on a node with < 8 slots, only as many of Eq. 5's terms as counts) on the
steps/s and on the steps/s per worker, and keeps the one that reproduces the measurement
(:func:`fit_explored`: a fixed per-worker or a fixed global batch), records an ``explore_fit``
event and decides again (cause ``explored``); the fitted steps/s is then the job's rate in the
policy's doubling. The measurements and the fit are events in the store, so a
restarted scheduler continues an exploration where it was. A job whose --min-workers exceeds
``hold`` is not explored (its profile, else linear speed-up).

Slots come from a :class:`~elastic_ring.cluster.ray_slots.SlotSource`, asked at every pass: fixed
hosts, or a Ray cluster's nodes. When the count changes (a Ray node joined or left), the policy
decides again (cause ``capacity``): a job grows onto a new node through the same live resize, and
a job whose Ray backend restarted on fewer workers after losing a node gives back the slots it no
longer uses (a ``restarted_smaller`` event) once its controller reports the restart's launch. A
failure its survivors went on from (``--survive``) is seen the same way (a restart at their
number), and the policy decides again; a job that then grew back by itself (a warm worker in the
failed one's place) takes free slots back (a ``resized`` event). A
Ray slot is a count (Ray places the workers), and a start or grow also waits until Ray could
place it (its free resources), whatever the scheduler's accounts say.

Side effects (processes, time, the slots) come from ``runner``, ``clock`` and ``slots``.
"""

from __future__ import annotations

import os
import signal
import statistics
import time
from typing import Any, Callable, Protocol

from elastic_ring import env
from elastic_ring.cluster.api import (ClusterConfig, ClusterError, JobRow, JobStartError, JobState, Observation,
                                     job_dir)
from elastic_ring.cluster.ray_slots import Capacity, FixedSlots, SlotSource
from elastic_ring.cluster.store import Store
from elastic_ring.controller.api import RunState
from elastic_ring.perfmodel.convergence import predict_remaining
from elastic_ring.perfmodel.speed import FitError, SpeedModel, fit_speed_few
from elastic_ring.sched.api import CostAwarePolicy, ExploringPolicy, JobView, Policy
from elastic_ring.sched.policies import EXPLORE_GPUS, Exploratory
from elastic_ring.sched.registry import make_policy
from elastic_ring.sched.resize_cost import ResizeCosts, default_resize_cost

_LIVE = (JobState.RUNNING, JobState.STOPPING)
EXPLORE_WINDOWS = 2  # steady throughput windows measured at each exploration size
FAULT_ENV = env.CLUSTER_FAULT
FAULT_POINTS = ("after_store_running", "after_start")
"""Where a start may be cut: after the job is stored as running (its controller not started yet),
and after its controller started (its pid not stored yet)."""


def injected_fault(environ: dict[str, str] | None = None) -> Callable[[str], None]:
    """The scheduler's fault point for tests: ``ELASTIC_RING_CLUSTER_FAULT=POINT[:N]`` (POINT one of
    :data:`FAULT_POINTS`) makes the scheduler kill itself with SIGKILL the N-th time (default 1) it
    passes POINT, as a kill -9 from outside would at that instant. Unset: nothing happens.

    Raises:
        ClusterError: the value names no fault point or its count is not a positive integer.
    """
    raw = env.cluster_fault(environ)
    if not raw:
        return lambda point: None
    point, _, n = raw.partition(":")
    if point not in FAULT_POINTS or not (n or "1").isdigit() or int(n or "1") < 1:
        raise ClusterError(f"{FAULT_ENV}={raw!r}: expected POINT[:N], POINT one of {', '.join(FAULT_POINTS)}")
    left = {"n": int(n or "1")}

    def fault(at: str) -> None:
        if at == point:
            left["n"] -= 1
            if left["n"] == 0:
                os.kill(os.getpid(), signal.SIGKILL)

    return fault


def explore_hold(slots: int) -> int:
    """Slots an exploring job holds on a node of ``slots``: the largest power of two <= min(8, slots)."""
    h = 1
    while h * 2 <= min(EXPLORE_GPUS, slots):
        h *= 2
    return h


def live_policy(name: str, slots: int, device: str = "cpu") -> Policy:
    """The policy ``name`` for a live node of ``slots`` (exploratory holds :func:`explore_hold`; a
    ``-rc`` policy starts from the device's default resize cost, then each job's measured one)."""
    if name == "exploratory":
        return Exploratory(explore_hold(slots))
    return make_policy(name, default_resize_cost(device)) if name.endswith("-rc") else make_policy(name)


def explore_sizes(hold: int, min_workers: int) -> list[int]:
    """Worker counts an exploring job is measured at: 1, 2, 4, ... <= ``hold``, >= ``min_workers``."""
    out, w = [], 1
    while w <= hold:
        if w >= min_workers:
            out.append(w)
        w *= 2
    return out


def fit_explored(ws: list[int], fs: list[float]) -> tuple[SpeedModel, str, bool, float]:
    """Eq. 5 for a job measured at ``ws`` workers, ``fs`` steps/s: (model, method, per_worker,
    rmse in steps/s). A job's step budget is counted in steps whatever its size, so its rate is
    steps/s; what a step is at w workers depends on the job. A fixed per-worker batch (this
    library's jobs): the same work per worker at every size, Eq. 5 on steps/s (``f(w)``, which
    cannot rise with w). A fixed global batch (the paper's t0·m/w with m global; examples/paced.py):
    the step's work is shared, Eq. 5 on steps/s per worker and the rate ``w·f(w)`` (the
    simulator's exploration, sim/engine.py). Both are fitted (b = n = 1: the predictions do not
    depend on them); the one that reproduces the measured steps/s better is kept (a tie, as from
    one count: the per-worker batch, no speed-up assumed)."""
    a, ma = fit_speed_few(ws, fs, 1.0, 1.0)
    b, mb = fit_speed_few(ws, [f / w for f, w in zip(fs, ws)], 1.0, 1.0)

    def rmse(rate: Callable[[int], float]) -> float:
        return (sum((rate(w) - f) ** 2 for w, f in zip(ws, fs)) / len(ws)) ** 0.5

    ea = rmse(lambda w: float(a.model.predict(w)))
    eb = rmse(lambda w: w * float(b.model.predict(w)))
    if eb < ea - 1e-9 * max(fs):
        return b.model, mb, True, eb
    return a.model, ma, False, ea


def fit_explored_accumulated(ws: list[int], fs: list[float], micro_batches: int) -> tuple[SpeedModel, str, float]:
    """Eq. 5 for a ``constant-batch`` job of ``micro_batches`` measured at ``ws`` workers, ``fs``
    (accumulated) steps/s, as the simulator's exploration fits one: Eq. 5 on the plain steps
    behind the measured ones (:meth:`~elastic_ring.perfmodel.accumulated.AccumulatedModel.plain_step_times`);
    its rate is the accumulated model's (:func:`explored_rate`). Returns (model, method, rmse)."""
    from elastic_ring.perfmodel.accumulated import AccumulatedModel

    plain = AccumulatedModel(None, micro_batches).plain_step_times(ws, [1.0 / max(f, 1e-12) for f in fs])
    fit, method = fit_speed_few(ws, [1.0 / t for t in plain], 1.0, 1.0)
    rate = explored_rate(fit.model, False, micro_batches)
    return fit.model, method, (sum((rate(w) - f) ** 2 for w, f in zip(ws, fs)) / len(ws)) ** 0.5


def explored_rate(model: SpeedModel, per_worker: bool, micro_batches: int = 0) -> Callable[[int], float]:
    """Steps/s of ``w`` from :func:`fit_explored`'s model (``micro_batches``: a constant-batch
    job's, :func:`fit_explored_accumulated`: the accumulated step of that many micro-batches)."""
    if micro_batches:
        from elastic_ring.perfmodel.accumulated import AccumulatedModel

        acc = AccumulatedModel(model, micro_batches)
        return lambda w: float(acc.predict(w))
    if per_worker:
        return lambda w: w * float(model.predict(w))
    return lambda w: float(model.predict(w))


class _Exploration:
    """One job's exploration: the sizes to measure, what is measured, the fitted model."""

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes
        self.measured: dict[int, float] = {}  # workers -> steps/s
        self.windows: dict[int, list[tuple[int, float]]] = {}  # workers -> (steps, seconds) so far
        self.warm: set[int] = set()  # launches whose first window was skipped
        self.model: SpeedModel | None = None
        self.per_worker = False  # the model is per worker: the rate is w·f(w) (fit_explored)
        self.micro_batches = 0  # a constant-batch job's: the model is of its plain step (fit_explored_accumulated)
        self.mark = -1  # launches seen when the last size was asked for: act only after a new launch

    @property
    def done(self) -> bool:
        return self.model is not None or not self.sizes

    def next_size(self) -> int | None:
        return next((w for w in self.sizes if w not in self.measured), None)


class Runner(Protocol):
    def start(self, job: JobRow, slots: list[int], workers: int, resume: bool) -> int: ...
    def request_resize(self, job: JobRow, to: int) -> bool: ...
    def stop(self, job: JobRow) -> None: ...
    def observe(self, job: JobRow) -> Observation: ...


RateFor = Callable[[JobRow], Callable[[int], float]]


class Scheduler:
    """Args:
        rate_for: job row -> its speed in steps/s as a function of its worker count.
        slots: where the slots come from (default: the config's fixed hosts).
        fault: called with each of :data:`FAULT_POINTS` as a start passes it (default:
            :func:`injected_fault`, from the environment); a test's hook may raise there.
    """

    def __init__(self, store: Store, config: ClusterConfig, policy: Policy, runner: Runner, rate_for: RateFor,
                 clock: Callable[[], float] = time.time, slots: SlotSource | None = None,
                 fault: Callable[[str], None] | None = None) -> None:
        self.store, self.config, self.policy, self.runner = store, config, policy, runner
        self.rate_for, self.clock = rate_for, clock
        self.fault = fault if fault is not None else injected_fault()
        self.source: SlotSource = slots if slots is not None else FixedSlots(config)
        self.capacity: Capacity = self.source.capacity()
        self._rates: dict[int, Callable[[int], float]] = {}
        self._limits: dict[int, int] = {}  # job -> the most workers it can run at (0: none)
        self._obs: dict[int, Observation] = {}
        self._marks: dict[int, int] = {}  # job -> its restarts (Observation.restarts) already handled
        self._unstarted: list[int] = []  # jobs whose start failed in the last pass: completions to decide on
        self.live_resize = self.source.live_resize
        self.explores = bool(policy.explores)
        self.hold = int(policy.explore_gpus) if isinstance(policy, ExploringPolicy) else EXPLORE_GPUS
        if self.explores and not self.source.elastic and self.hold > self.slots:
            raise ClusterError(f"policy {policy.name} holds {self.hold} slots per exploring job; the cluster "
                               f"has {self.slots}")
        self._explore: dict[int, _Exploration] = {}
        # each job's resize cost, from its resize_overhead events (the -rc policies weigh it)
        self.resize_costs = ResizeCosts(float(policy.resize_cost_s if isinstance(policy, CostAwarePolicy)
                                              else default_resize_cost(config.device)))

    @property
    def slots(self) -> int:
        """The slots now (fixed hosts: always the same; Ray: as of the last pass)."""
        return self.capacity.total

    # ------------------------------------------------------------------ helpers
    def _free(self, jobs: list[JobRow]) -> list[int]:
        """The lowest slot numbers nobody holds, as many as the slots not held (on fixed hosts:
        those of range(slots); a Ray job may hold numbers beyond the slots after a node left)."""
        held = {s for j in jobs for s in j.slots}
        n, out, s = self.slots - len(held), [], 0
        while len(out) < n:
            if s not in held:
                out.append(s)
            s += 1
        return out

    def _remaining(self, j: JobRow) -> float:
        """The job's remaining steps (a torchrun-form job counts none and has no known length:
        :meth:`decide` gives it the median of the other jobs' remaining work, 1 step alone)."""
        req = j.request
        total = j.total or req.steps or 0
        left = max(total - j.step, 1)
        obs = self._obs.get(j.id)
        if req.target_loss is None or obs is None or not obs.losses:
            return float(left)
        steps = [s for s, _ in obs.losses]
        losses = [l for _, l in obs.losses]
        return min(predict_remaining(float(j.step), steps, losses, req.target_loss, prior=left), float(left))

    def _most_workers(self, j: JobRow) -> int:
        """The most workers the job can run at (0: no limit but its own): a ``constant-batch`` job
        runs at most one worker per micro-batch of its global batch (``train`` refuses more): the
        count from its rate (:class:`~elastic_ring.cluster.daemon.AccumulatedRate`), else from its
        request's ``--global-batch`` and ``--batch-size`` where both are given."""
        if j.id not in self._limits:
            rule, g, b = j.request.batch_rule()
            limit = int(getattr(self.rate_for(j), "micro_batches", 0) or 0)
            if not limit and rule == "constant-batch" and g and b and g % b == 0:
                limit = g // b
            self._limits[j.id] = limit
        return self._limits[j.id]

    def _rate(self, j: JobRow) -> Callable[[int], float] | None:
        r = self._rates.get(j.id)
        if r is None:
            x = self._xs(j)
            if x is not None and not x.done:
                return None  # not measured yet
            if x is not None and x.model is not None:
                r = self._rates[j.id] = explored_rate(x.model, x.per_worker, x.micro_batches)
            else:
                r = self._rates[j.id] = self.rate_for(j)
        return r

    def _observe(self, j: JobRow) -> Observation:
        """Read the job's progress; keep its measured resize costs and exploration windows."""
        obs = self.runner.observe(j)
        self._obs[j.id] = obs
        for lost in obs.resize_lost_s:
            self.resize_costs.add(j.id, lost)
        self._explore_collect(j, obs)
        return obs

    # ------------------------------------------------------------------ exploration
    def _xs(self, j: JobRow) -> _Exploration | None:
        """The job's exploration (None unless the policy explores); rebuilt from the store's events."""
        if not self.explores or j.request.form == "torchrun":  # it reports no steps/s to explore with
            return None
        x = self._explore.get(j.id)
        if x is None:
            req = j.request
            hold = min(self.hold, req.max_workers or max(self.slots, 1), self._most_workers(j) or self.hold)
            x = self._explore[j.id] = _Exploration(explore_sizes(hold, req.min_workers))
            for e in self.store.events(j.id):
                if e.kind == "explore_measured":
                    x.measured[int(e.data["workers"])] = float(e.data["steps_per_s"])
                elif e.kind == "explore_fit":
                    x.model = SpeedModel.from_dict(e.data["model"])
                    x.per_worker = bool(e.data.get("per_worker", False))
                    x.micro_batches = int(e.data.get("micro_batches", 0))
        return x

    def _exploring(self, j: JobRow) -> bool:
        x = self._xs(j)
        return x is not None and not x.done

    def _explore_collect(self, j: JobRow, obs: Observation) -> None:
        """Take the job's new throughput windows; a size with EXPLORE_WINDOWS of them is measured."""
        x = self._xs(j)
        if x is None or x.done:
            return
        for launch, world, steps, secs in obs.throughput:
            if launch not in x.warm:  # the first window after each launch is warm-up
                x.warm.add(launch)
                continue
            if world not in x.sizes or world in x.measured or steps <= 0 or secs <= 0:
                continue
            win = x.windows.setdefault(world, [])
            win.append((steps, secs))
            if len(win) >= EXPLORE_WINDOWS:
                sps = sum(s for s, _ in win) / sum(t for _, t in win)
                x.measured[world] = sps
                self.store.event(j.id, "explore_measured", workers=world, steps_per_s=sps, windows=len(win))

    def _explore_act(self, jid: int, obs: Observation) -> str | None:
        """Move an exploring job on: to its next size, or fit Eq. 5. Returns "explored" after a fit."""
        j = self.store.job(jid)
        x = self._xs(j)
        if x is None or x.done or j.state != JobState.RUNNING or j.resize_to is not None:
            return None
        if obs.world_size <= 0 or obs.launches <= x.mark:
            return None  # the size asked for has not launched yet
        nxt = x.next_size()
        if nxt is None:
            ws = sorted(x.measured)
            fs = [x.measured[w] for w in ws]
            try:
                micro = self._most_workers(j)  # constant-batch: the plain steps behind the measured ones
                if micro:
                    (model, method, rmse), per_worker = fit_explored_accumulated(ws, fs, micro), False
                else:
                    model, method, per_worker, rmse = fit_explored(ws, fs)
            except FitError as e:
                x.sizes = []  # done: the job plans with its profile, else linear speed-up
                self.store.event(jid, "explore_fit_failed", error=str(e))
                return "explored"
            x.model, x.per_worker, x.micro_batches = model, per_worker, micro
            self._rates.pop(jid, None)
            self.store.event(jid, "explore_fit", method=method, model=model.to_dict(), rmse=rmse,
                             per_worker=per_worker, points=[[w, f] for w, f in zip(ws, fs)],
                             **({"micro_batches": micro} if micro else {}))
            return "explored"
        if obs.world_size == nxt or (obs.world_size in x.sizes and obs.world_size not in x.measured):
            return None  # still measuring this size
        if nxt > len(j.slots):
            return None  # holds fewer slots than the next size (the policy shrank it): wait
        held = obs.world_size
        if self.live_resize:
            if self.runner.request_resize(j, nxt):
                x.mark = obs.launches
                with self.store.transaction():
                    self.store.update(jid, resize_to=nxt, resize_mark=obs.exits)
                    self.store.event(jid, "explore_step", frm=held, to=nxt)
        else:  # a stop, then a resume at the next size on the slots it holds (see _apply)
            x.mark = obs.launches
            self.store.event(jid, "explore_step", frm=held, to=nxt)
            self._stop(j, "explore")
        return None

    # ------------------------------------------------------------------ decisions
    def decide(self, cause: str, jid: int | None) -> dict[int, int]:
        """Ask the policy and store each job's target (its allocation, clamped to its limits)."""
        jobs = [j for j in self.store.jobs(active_only=True)
                if not j.cancel and not (j.state == JobState.STOPPING and j.message in ("cancel", "down"))]
        views = []
        known = [self._remaining(j) for j in jobs if j.request.form != "torchrun"]
        unknown = float(statistics.median(known)) if known else 1.0  # see _remaining
        for j in jobs:
            unexplored = self._exploring(j)
            left = unknown if j.request.form == "torchrun" else self._remaining(j)
            views.append(JobView(j.id, left, self._rate(j), len(j.slots),
                                 needs_exploration=unexplored and not j.slots,
                                 exploring=unexplored and bool(j.slots), done=float(j.step)))
        current = {j.id: len(j.slots) for j in jobs}
        cost_aware = isinstance(self.policy, CostAwarePolicy)
        if cost_aware:  # a -rc policy: each job's measured resize cost
            self.policy.costs = self.resize_costs.table(current)
        alloc = self.policy.allocate(views, self.slots, current) if views and self.slots > 0 else {}
        out = {}
        for j in jobs:
            req = j.request
            w = int(alloc.get(j.id, 0))
            hi = min(req.max_workers or self.slots, self.slots, self._most_workers(j) or self.slots)
            w = min(w, hi)
            if 0 < w < req.min_workers:
                w = 0
            out[j.id] = w
        if sum(out.values()) > self.slots:
            raise RuntimeError(f"policy {self.policy.name} allocated {sum(out.values())} of {self.slots} slots")
        with self.store.transaction():
            for jid_, w in out.items():
                self.store.update(jid_, target=w)
            self.store.decision(cause, jid, out)
            for vid, w0, w1, gain, cost in self.policy.last_vetoed if views and cost_aware else ():
                c, src = self.resize_costs.cost(vid)
                self.store.event(vid, "grow_vetoed", held=w0, asked=w1, gain_steps=gain, cost_steps=cost,
                                 resize_cost_s=c, cost_source=src)
        return out

    # ------------------------------------------------------------------ the loop
    def recover(self) -> None:
        """After a restart: re-attach to controllers that still run, settle the others. A running
        job without a pid and without a controller was stored as running by a scheduler killed
        before it started the controller: it goes back to the queue (or to paused, when an earlier
        controller of it launched workers: resumed from its checkpoint), not to failed."""
        for j in self.store.jobs(active_only=True):
            if j.state in _LIVE:
                obs = self._observe(j)
                self._marks[j.id] = obs.restarts
                if obs.alive:
                    self.store.event(j.id, "adopted", pid=j.pid, workers=obs.world_size)
                else:
                    self._settle(j, obs, unstarted=j.state == JobState.RUNNING and not j.pid)
        self.decide("restart", None)

    def tick(self) -> bool:
        """One pass; False once `cluster down` has drained every job."""
        causes: list[tuple[str, int | None]] = [("completion", jid) for jid in self._unstarted]
        self._unstarted = []
        down = bool(self.store.get_meta("down"))
        if self._refresh():
            causes.append(("capacity", None))
        for j in self.store.jobs(active_only=True):
            if j.state not in _LIVE:
                continue
            obs = self._observe(j)
            if not obs.alive:
                cause = self._settle(j, obs)
                if cause != "paused":
                    causes.append((cause, j.id))
                continue
            self.store.update(j.id, step=obs.step, total=obs.total or j.total, workers=obs.world_size,
                              images_per_s=obs.images_per_s)
            if j.resize_to is not None and obs.world_size == j.resize_to and (
                    obs.exits > (j.resize_mark or 0) or self.source.elastic):
                # the old workers are gone: a shrink's slots are free now (an exploring job keeps
                # the slots it holds for its next sizes). On Ray the workers resize in place (no
                # exit): the new ring's launch ends the resize, and Ray's free resources tell when
                # a leaver's CPU or GPU can be placed again
                n = max(j.resize_to, j.target) if self._exploring(j) else j.resize_to
                keep = list(j.slots[:n])
                with self.store.transaction():
                    self.store.update(j.id, resize_to=None, resize_mark=None, slots=keep)
                    self.store.event(j.id, "resized", workers=obs.world_size, slots=keep)
                self._pin(j, keep)
            elif self._restarted(j, obs) or self._grew_back(j, obs):
                causes.append(("restart", j.id))
            if self.explores:
                c = self._explore_act(j.id, obs)
                if c:
                    causes.append((c, j.id))
        for j in self.store.jobs(active_only=True):
            if j.state == JobState.QUEUED and not any(e.kind == "arrived" for e in self.store.events(j.id)):
                self.store.event(j.id, "arrived")
                causes.append(("arrival", j.id))
            if j.cancel and j.state in (JobState.QUEUED, JobState.PAUSED):
                self.store.update(j.id, state=JobState.CANCELLED, finished=self.clock(), target=0)
                self.store.event(j.id, "cancelled")
                causes.append(("cancel", j.id))
            elif j.cancel and j.state == JobState.RUNNING:
                self._stop(j, "cancel")
        if down:
            live = [j for j in self.store.jobs(active_only=True) if j.state in _LIVE]
            for j in live:
                if j.state == JobState.RUNNING:
                    self._stop(j, "down")
            return bool(live)
        for cause, jid in causes:
            self.decide(cause, jid)
        self._apply()
        return True

    def _refresh(self) -> bool:
        """Ask the slot source for the slots now; True when their count changed (recorded in the
        store: meta ``nodes``, and a ``capacity`` event)."""
        old = self.capacity
        self.capacity = self.source.capacity()
        if self.capacity.nodes != old.nodes:
            self.store.set_meta("nodes", [[n.name, n.slots] for n in self.capacity.nodes])
        return self.capacity.total != old.total

    def _restarted(self, j: JobRow, obs: Observation) -> bool:
        """On nodes that may leave: the job's controller relaunched after a failure (its Ray backend
        lost a node), perhaps on fewer workers than it holds: a resize in flight is over, and the
        slots it no longer uses are given back. True when its slots changed."""
        jid = j.id
        if not self.source.elastic or obs.restarts <= self._marks.get(jid, 0) or self._exploring(j):
            return False
        self._marks[jid] = obs.restarts
        if obs.world_size >= len(j.slots) and j.resize_to is None:
            return False
        keep = list(j.slots[:min(obs.world_size, len(j.slots))])
        with self.store.transaction():
            self.store.update(jid, slots=keep, resize_to=None, resize_mark=None)
            self.store.event(jid, "restarted_smaller", workers=obs.world_size, slots=keep)
        return True

    def _grew_back(self, j: JobRow, obs: Observation) -> bool:
        """On nodes that may leave: a job whose survivors of a failure went on fewer grew back by
        itself (``--survive``: a warm worker took the failed one's place, on the resources its Ray
        placement group still held): it holds the slots it uses again, as far as slots are free (a
        ``resized`` event). True when its slots changed."""
        if not self.source.elastic or j.resize_to is not None or obs.world_size <= len(j.slots) or self._exploring(j):
            return False
        take = self._free(self.store.jobs(active_only=True))[:obs.world_size - len(j.slots)]
        if not take:
            return False
        keep = [*j.slots, *take]
        with self.store.transaction():
            self.store.update(j.id, slots=keep)
            self.store.event(j.id, "resized", workers=obs.world_size, slots=keep)
        return True

    def _settle(self, j: JobRow, obs: Observation, unstarted: bool = False) -> str:
        """The controller of ``j`` has ended: record how, give back its slots. Returns the cause.
        ``unstarted``: no controller of this start ever ran (found at recovery: see :meth:`recover`)."""
        now = self.clock()
        out = obs.outcome
        ended = RunState.read(out)  # (an older controller's words too: succeeded, interrupted)
        if ended is RunState.FINISHED:
            state, cause = JobState.FINISHED, "completion"
        elif j.cancel or j.message == "cancel":
            # cancelled by the user: whatever the controller managed to write (a summary after the
            # stop, or none when the stop came before its first launch), the job is cancelled
            state, cause = JobState.CANCELLED, "cancel"
        elif ended is RunState.STOPPED or (out is None and obs.launches > 0):
            # stopped by us, or a controller killed without a summary after it had launched
            # workers: resume from its last checkpoint (never from scratch, never twice at once)
            state, cause = JobState.PAUSED, "paused"
        elif out is None and j.message in ("preempt", "resize", "explore"):
            # stopped by us before its controller launched anything (a preemption seconds after
            # the start, seen live under srtf): back to the queue, not a failure
            state, cause = JobState.QUEUED, "paused"
        elif out is None and unstarted:
            # stored as running, but its controller never started (the scheduler was killed between
            # the two) and launched nothing: back to the queue, nothing lost
            state, cause = JobState.QUEUED, "paused"
        else:
            state, cause = JobState.FAILED, "completion"
        step = obs.total if state == JobState.FINISHED and obs.total else max(obs.step, j.step)
        fields: dict[str, Any] = dict(state=state, slots=[], resize_to=None, resize_mark=None, pid=None,
                                      step=step, workers=0)
        if state.terminal:
            fields["finished"] = now
        if state == JobState.FAILED:
            fields["message"] = obs.error or f"controller ended with {out or 'no summary'}"
        with self.store.transaction():
            self.store.update(j.id, **fields)
            self.store.event(j.id, state.value, step=fields["step"], outcome=out)
        return cause

    def _fail_start(self, j: JobRow, why: str) -> None:
        """The controller of ``j`` could not be started (:class:`JobStartError`): the job is failed
        with ``why`` and gives back its slots; the next pass decides again (a completion)."""
        with self.store.transaction():
            self.store.update(j.id, state=JobState.FAILED, slots=[], target=0, pid=None, workers=0,
                              finished=self.clock(), message=why)
            self.store.event(j.id, JobState.FAILED.value, step=j.step, outcome=None, error=why)
        self._unstarted.append(j.id)

    def _pin(self, j: JobRow, slots: list[int]) -> None:
        """The job's processes onto the cores of ``slots`` (a runner without ``pin``: nothing)."""
        pin = getattr(self.runner, "pin", None)
        if pin is not None:
            pin(j, slots)

    def _stop(self, j: JobRow, why: str) -> None:
        if j.state != JobState.RUNNING:
            return
        self.runner.stop(j)
        with self.store.transaction():
            self.store.update(j.id, state=JobState.STOPPING, message=why)
            self.store.event(j.id, "stop", why=why)

    def _apply(self) -> None:
        """Move jobs toward their targets: stops and shrinks first, then grows and starts."""
        jobs = self.store.jobs(active_only=True)
        for j in jobs:
            if j.state != JobState.RUNNING or j.resize_to is not None:
                continue
            held, want = len(j.slots), j.target
            if want == 0:
                self._stop(j, "preempt")
            elif want < held:
                if not self.live_resize:
                    self._stop(j, "resize")  # resumed at the new size on other slots
                else:
                    # the cores it keeps before the controller relaunches: its new workers take
                    # cpu_threads from their affinity at launch (pinned after the exit, a 2 -> 1
                    # shrink ran 2 threads on 1 core); the old workers share them until they stop
                    self._pin(j, list(j.slots[:want]))
                    if not self.runner.request_resize(j, want):
                        self._pin(j, list(j.slots))
                        continue
                    with self.store.transaction():
                        self.store.update(j.id, resize_to=want, resize_mark=self._obs[j.id].exits)
                        self.store.event(j.id, "resize_requested", frm=held, to=want)
        jobs = self.store.jobs(active_only=True)
        free = self._free(jobs)
        for j in jobs:  # in arrival order
            if j.cancel:
                # cancelled after this tick's decision (its target is stale): never started nor
                # grown; the next tick settles or stops it
                continue
            held, want = len(j.slots), j.target
            if (j.state == JobState.RUNNING and j.resize_to is None and want > held and len(free) >= want - held
                    and self.capacity.can_place(want - held)):
                if not self.live_resize:
                    self._stop(j, "resize")
                    continue
                obs = self._obs.get(j.id)
                if obs is None:
                    continue
                self._pin(j, [*j.slots, *free[: want - held]])  # before its new workers start
                if not self.runner.request_resize(j, want):
                    self._pin(j, list(j.slots))
                    continue
                take, free = free[: want - held], free[want - held:]
                self.capacity = self.capacity.placed(want - held)
                with self.store.transaction():
                    self.store.update(j.id, slots=[*j.slots, *take], resize_to=want, resize_mark=obs.exits)
                    self.store.event(j.id, "resize_requested", frm=held, to=want, slots=[*j.slots, *take])
            elif (j.state in (JobState.QUEUED, JobState.PAUSED) and want > 0 and len(free) >= want
                  and self.capacity.can_place(want)):
                take, free = free[:want], free[want:]
                self.capacity = self.capacity.placed(want)
                resume = j.state == JobState.PAUSED
                x = self._xs(j)
                workers = min(want, x.next_size() or want) if x is not None and not x.done else want
                if x is not None and j.id in self._obs:
                    x.mark = self._obs[j.id].launches
                if self.source.elastic:  # the restarts its run folder already records are not new
                    if j.id not in self._obs:
                        self._observe(j)
                    self._marks[j.id] = self._obs[j.id].restarts
                with self.store.transaction():  # slots are ours before the process exists
                    self.store.update(j.id, slots=take, state=JobState.RUNNING, message="",
                                      started=j.started or self.clock())
                self.fault("after_store_running")
                try:
                    pid = self.runner.start(j, take, workers, resume)
                except JobStartError as e:  # its folder is gone: failed, its slots free for the next pass
                    self._fail_start(j, str(e))
                    continue
                self.fault("after_start")
                with self.store.transaction():
                    self.store.update(j.id, pid=pid, run_dir=str(job_dir(self.store.dir.resolve(), j.id)))
                    self.store.event(j.id, "resumed" if resume else "started", workers=workers, slots=take,
                                     pid=pid)
                    if x is not None and not x.done:
                        self.store.event(j.id, "explore_step", frm=0, to=workers)
