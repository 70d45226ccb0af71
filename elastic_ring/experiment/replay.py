"""Replay of a measured job trace in the simulator (the simulator-against-live check).

A live trace is a list of jobs (arrival time in seconds from the first arrival, steps) and a
measured speed table (steps/s at each worker count). Work is counted in steps and speed in
steps/s (the live scheduler's units: a job's step budget does not depend on its worker count),
so the table is handed to the engine as a "model" whose ``samples_per_s`` is steps/s.

Exploratory is replayed as the live scheduler runs it on a node of S slots: an explorer holds the
largest power of two <= min(8, S) slots and is measured at 1, 2, 4, ... up to it; a phase lasts the
launch at that size plus ``explore_steps`` steps (the live scheduler's warm-up window and measured
windows; ``SimConfig.explore_phase_work``).
"""

from __future__ import annotations

import heapq
import math
from typing import Mapping, Sequence

from elastic_ring.cluster.scheduler import live_policy
from elastic_ring.errors import ConfigError
from elastic_ring.perfmodel.speed import SpeedModel
from elastic_ring.sched.api import DEFAULT_RESIZE_OVERHEAD_S, Policy
from elastic_ring.sched.registry import make_policy
from elastic_ring.sched.resize_cost import ResizeCosts
from elastic_ring.sim.api import JobSpec, JobState, RunResult, SimConfig
from elastic_ring.sim.engine import Simulator
from elastic_ring.sim.job import SimJob


class TableSpeed:
    """Measured steps/s by worker count; sizes between or beyond the measured ones take the
    nearest measured size at or below (a job never runs faster than measured)."""

    m = 1.0
    n = 1.0  # b = n = 1 in an exploration's fit, as the live scheduler's (predictions do not depend on them)

    def __init__(self, steps_per_s: Mapping[int, float]) -> None:
        if not steps_per_s or any(w < 1 or not (r > 0 and math.isfinite(r)) for w, r in steps_per_s.items()):
            raise ConfigError(f"a speed table needs worker counts >= 1 with speeds > 0, got {dict(steps_per_s)}")
        self.table = {int(w): float(r) for w, r in steps_per_s.items()}
        self._ws = sorted(self.table)

    def samples_per_s(self, w: int) -> float:
        below = [x for x in self._ws if x <= w]
        return self.table[below[-1] if below else self._ws[0]]

    predict = samples_per_s


def shared_launch_ends(launches: Sequence[tuple[float, float, int, int, float]], cores: int) -> list[float]:
    """When each launch ends if the launches in flight share the node's ``cores`` (processor sharing).

    ``launches``: (begin s, seconds it takes alone, worker processes W, index of the launch it
    follows or -1, killed at s or inf). A launch that follows another (a resize asked of a job
    still launching) begins when that one ends. A launch alone gets its W processes' share of the
    cores it had in the calibration; with D processes launching on the node, each gets
    min(1, cores / D) of a core, so a launch progresses at max(cores, W) / max(cores, D) of its
    speed alone: launches on fewer processes than cores do not slow each other, and past that every
    launch in flight slows, the earlier ones too. The launch's seconds alone are all CPU work (a
    start of W workers alone is W processes importing torch and Horovod).
    """
    n = len(launches)
    end: list[float | None] = [None] * n
    rem = [max(0.0, x[1]) for x in launches]
    started = [False] * n
    active: list[int] = []
    t = -math.inf
    while True:
        ready = [(launches[i][0] if launches[i][3] < 0 else end[launches[i][3]], i) for i in range(n)
                 if not started[i] and (launches[i][3] < 0 or end[launches[i][3]] is not None)]
        d = sum(launches[i][2] for i in active)
        rate = {i: max(cores, launches[i][2]) / max(cores, d) for i in active}
        t_next = min([b for b, _ in ready] + [t + rem[i] / rate[i] for i in active]
                     + [launches[i][4] for i in active], default=math.inf)
        if t_next == math.inf:
            break
        for i in active:
            rem[i] -= rate[i] * (t_next - t) if t > -math.inf else 0.0
        t = t_next
        for i in [i for i in active if rem[i] <= 1e-9 * max(1.0, launches[i][1]) or launches[i][4] <= t]:
            end[i] = t
            active.remove(i)
        for b, i in ready:
            if b <= t:
                started[i] = True
                if rem[i] <= 0.0 or launches[i][4] <= t:
                    end[i] = t
                else:
                    active.append(i)
    return [e if e is not None else math.inf for e in end]


class LiveHandover:
    """The simulator's launch model (:class:`~elastic_ring.sim.engine.Launches`) of the live
    scheduler: each decision handed to the jobs as
    :meth:`Scheduler._apply <elastic_ring.cluster.scheduler.Scheduler._apply>` hands it, and the
    seconds each resize of a running job cost it kept.

    1. A change is asked of a job only once its previous change has begun (live: a job with a
       resize in flight is skipped until its relaunch begins) and, for a start or a grow, once the
       slots it needs are free (live: a start or grow waits for free slots). Until then it is only
       the job's target: a later decision replaces it at no cost, and a job waiting to grow trains
       on at its size. (Committed at each decision, a start waiting for slots at 2 workers and set
       to 1 by the next arrival would pay a relaunch it never had live, and a job set to 2, 3, 4,
       then 2 workers by four decisions within one launch would pay four resizes in a row, where
       live asks one and, once its relaunch has begun, the latest target.)
    2. The ``-rc`` gate weighs what the live scheduler knew at each decision
       (:class:`~elastic_ring.sched.resize_cost.ResizeCosts`, the live code): the default until a
       resize is measured, then each resize's seconds lost (from its request to the end of its
       relaunch, as ``total_lost_s``) from when live reads them (one throughput window of
       ``window_steps`` steps at the new size later).
    3. With ``cores``, the launches in flight share the node's cores (:func:`shared_launch_ends`);
       without, a launch costs the engine's :meth:`~elastic_ring.sim.engine.Simulator.launch_cost`.
    """

    def __init__(self, lost: list | None = None, window_steps: int = 20, live_costs: bool = True,
                 changes: list | None = None, cores: int | None = None, launch_extra: float = 0.0) -> None:
        self.lost, self.changes = lost, changes
        self.window_steps = window_steps
        self.want_live_costs = live_costs
        self.cores = cores  # launches share these cores (shared_launch_ends); None: the engine's cost
        self.launch_extra = launch_extra  # processes a launch keeps busy besides its workers

    def reset(self, sim: Simulator) -> None:
        self.live_costs = self.want_live_costs and hasattr(sim.policy, "costs")
        self._begin: dict[int, float] = {}  # job -> when its last change began
        self._want: dict[int, int] = {}  # job -> its target, not yet asked of it
        self._wakes: set[tuple[int, float]] = set()  # (job, time) of the wake-ups asked
        self._known: list[tuple[float, int, float]] = []  # heap: (read live at, job, seconds lost)
        self._touched: set[int] = set()
        self.costs = ResizeCosts(float(getattr(sim.policy, "resize_cost_s", DEFAULT_RESIZE_OVERHEAD_S)))
        self._launches: list[list] = []  # [begin, seconds alone, workers, follows, killed at]
        self._ends: list[float] = []  # each launch's end, launches sharing the cores
        self._last: dict[int, int] = {}  # job -> its latest launch

    def cost(self, sim: Simulator, j: SimJob, w: int, base: float, t0: float) -> float:
        """With ``cores``: the launch's seconds alone (the engine's overhead + per worker), stretched
        while the launches in flight have more worker processes than the node has cores
        (:func:`shared_launch_ends`); the launches it overlaps end later too."""
        if self.cores is None:
            return sim.launch_cost(w, base, t0, j)
        prev = self._last.get(j.id)
        follows = prev if prev is not None and self._ends[prev] >= t0 - 1e-9 else -1
        self._launches.append([t0, base + sim.config.overhead_per_worker_s * (w - 1), w + self.launch_extra,
                               follows, math.inf])
        self._last[j.id] = len(self._launches) - 1
        self._share(sim, t0, j)
        return self._ends[-1] - t0

    def _share(self, sim: Simulator, now: float, caller: SimJob | None = None) -> None:
        """Recompute every launch's end; a job (other than ``caller``) whose latest launch now ends
        at another time trains from then (its completion, or its exploration phase's end, moves)."""
        old, self._ends = self._ends, shared_launch_ends([tuple(x) for x in self._launches], self.cores)
        active = sim.active
        for jid, k in self._last.items():
            o = active.get(jid)
            if o is None or o is caller or k >= len(old) or abs(self._ends[k] - old[k]) < 1e-9 \
                    or self._launches[k][4] < math.inf or o.gpus_held == 0:
                continue
            sim.retime(o, self._ends[k], now)

    def deciding(self, sim: Simulator, now: float) -> None:
        if self.live_costs:
            while self._known and self._known[0][0] <= now:
                _, jid, s = heapq.heappop(self._known)
                self.costs.add(jid, s)
            sim.policy.costs = self.costs.table(list(sim.active))
        self._touched = set()

    def decided(self, sim: Simulator, now: float) -> None:
        for jid in [k for k in self._want if k not in self._touched]:
            del self._want[jid]  # the decision left it at its size: nothing to ask

    def _ready_at(self, sim: Simulator, j: SimJob, w: int, now: float) -> float:
        """When the live scheduler would ask ``j`` to change to ``w``: once its previous change has
        begun and, for a start or grow, once the slots it needs are free (inf: not before another
        change is asked)."""
        t = max(now, self._begin.get(j.id, now))
        need = (sim.explore_hold if sim.explores and not j.explored else w) - j.gpus_held
        if need <= 0:
            return t
        pending = sim.pending(now)
        need -= sim.gpus - sim.gpus_in_use - sum(n for _, n in pending)
        at = now
        for p_at, n in pending:
            if need <= 0:
                break
            need, at = need - n, p_at
        return max(t, at) if need <= 0 else float("inf")

    def ask(self, sim: Simulator, j: SimJob, w: int, now: float) -> bool:
        self._touched.add(j.id)
        if j.state == JobState.EXPLORING:
            return True  # refused by the engine
        at = self._ready_at(sim, j, w, now) if sim.config.resize_after_launch else now  # else: the paper's hand-over
        if at > now:
            self._want[j.id] = w
            if at < float("inf") and (j.id, at) not in self._wakes:
                self._wakes.add((j.id, at))
                sim.wake_at(at, j)
            return False
        self._want.pop(j.id, None)
        k = self._last.get(j.id) if self.cores is not None and w == 0 else None
        if k is not None and self._ends[k] > now and self._launches[k][4] == math.inf:
            self._launches[k][4] = now  # stopped while launching: its processes are gone
            self._share(sim, now, j)
        return True

    def began(self, sim: Simulator, j: SimJob, held: int, w: int, now: float, t0: float) -> None:
        self._begin[j.id] = t0
        if self.changes is not None:  # (asked at, job, from, to, trains from)
            self.changes.append((now, j.id, held, w, j.paused_until))
        if held > 0 and w > 0:
            self._resized(j, j.paused_until - now)

    def _resized(self, j: SimJob, lost: float) -> None:
        """A resize of ``j`` asked now, lost ``lost`` s (to the end of its relaunch)."""
        if self.lost is not None:
            self.lost.append(lost)
        if self.live_costs and j.speed > 0:
            heapq.heappush(self._known, (j.paused_until + self.window_steps / j.speed, j.id, lost))

    def explored(self, sim: Simulator, j: SimJob, now: float) -> None:
        self._begin[j.id] = now  # the next size of its exploration
        if self.lost is not None:
            self.lost.append(j.paused_until - now)

    def wake(self, sim: Simulator, j: SimJob, now: float) -> None:
        """The waiting changes, in arrival order, until none can be asked."""
        self._wakes.discard((j.id, now))
        active = sim.active
        moved = True
        while moved:
            moved = False
            for o in sorted((active[k] for k in self._want if k in active), key=lambda o: o.pos):
                w = self._want.get(o.id)
                if w is None or w == o.gpus_held:
                    self._want.pop(o.id, None)
                    continue
                sim.change(o, w, now)
                moved = moved or o.id not in self._want
        sim.account(now)


def live_simulator(config: SimConfig, policy: Policy, true_models: Mapping[str, SpeedModel],
                   plan_models: Mapping[str, SpeedModel] | None = None, **kw) -> Simulator:
    """A :class:`~elastic_ring.sim.engine.Simulator` with the live scheduler's hand-over
    (:class:`LiveHandover`; ``kw``: its arguments)."""
    return Simulator(config, policy, true_models, plan_models, launches=LiveHandover(**kw))


def explore_sizes(slots: int) -> tuple[int, ...]:
    """1, 2, 4, ... up to the largest power of two <= min(8, ``slots``) (the live exploration)."""
    out = [1]
    while out[-1] * 2 <= min(8, slots):
        out.append(out[-1] * 2)
    return tuple(out)


def replay(jobs: Sequence[tuple[float, int]], policy: str, slots: int, speed: Mapping[int, float] | Sequence[Mapping[int, float]],
           start_overhead_s: float, resize_overhead_s: float, plan: Mapping[int, float] | None = None,
           overhead_per_worker_s: float = 0.0, explore_steps: int = 60,
           resize_after_launch: bool = True, resize_cost_s: float | None = None,
           launches_share_node: bool = True, lost: list | None = None, window_steps: int = 20,
           live_costs: bool = True, changes: list | None = None, cores: int | None = None,
           launch_extra: float = 0.0) -> RunResult:
    """Simulate ``jobs`` ((arrival s, steps), in submission order) on ``slots`` under ``policy``.

    ``speed``: the true steps/s table of every job, or one per job. ``plan``: the table the
    planner sees (the live scheduler's profile; default: each job's true table). Remaining work is
    the oracle (steps left of the budget, as the live scheduler without a target loss). A start or
    resize to W workers costs its overhead + ``overhead_per_worker_s`` x (W - 1). With
    ``resize_after_launch`` (the live scheduler's hand-over) a resize of a job still launching
    begins when that launch is done and the slots it gives back are free only then, and each
    decision is handed to the jobs as live (:class:`LiveHandover`); with ``launches_share_node`` the
    per-worker cost counts the workers of every launch in progress (the node's cores are shared by
    the launches side by side). The policy is the live node's (:func:`live_policy`); a ``NAME-rc``
    policy's gate starts from ``resize_cost_s`` (default: the live scheduler's, 3.5 s on CPU
    slots) and, with ``live_costs``, weighs each job's simulated resizes as the live scheduler
    weighs its measured ones (read ``window_steps`` steps after the relaunch). ``lost``: a list
    to append the seconds each resize lost to (request to the end of its relaunch); ``changes``: a
    list to append each start, resize and stop to (asked at s, job index, from, to workers, trains
    from s), exploration steps aside. ``cores``: the launches in flight share the node's cores
    instead (:func:`shared_launch_ends`: each launch's cost above is its time alone, and every
    launch overlapping others slows while their worker processes outnumber the cores;
    ``launches_share_node`` is then ignored); a launch of W workers counts as W + ``launch_extra``
    processes (its launcher and controller, measured by the calibration's starts side by side).
    """
    if cores is not None and cores < 1 or not launch_extra >= 0:
        raise ConfigError(f"need cores >= 1 and launch_extra >= 0, got {cores}, {launch_extra}")
    tables = list(speed) if isinstance(speed, (list, tuple)) else [speed] * len(jobs)
    if len(tables) != len(jobs):
        raise ConfigError("one speed table per job, or one for all")
    models = {f"job{i}": TableSpeed(t) for i, t in enumerate(tables)}
    plans = {k: TableSpeed(plan) for k in models} if plan is not None else None
    specs = [JobSpec(id=i, arrival=float(a), work=float(s), workload=f"job{i}") for i, (a, s) in enumerate(jobs)]
    sizes = explore_sizes(slots)
    cfg = SimConfig(gpus=slots, jobs=len(specs), resize_overhead_s=resize_overhead_s,
                    start_overhead_s=start_overhead_s, overhead_per_worker_s=overhead_per_worker_s,
                    resize_after_launch=resize_after_launch,
                    launches_share_node=launches_share_node and cores is None,
                    explore_gpus=sizes, explore_phase_work=float(explore_steps), remaining="oracle")
    pol = live_policy(policy, slots, "cpu") if resize_cost_s is None or not policy.endswith("-rc") else \
        make_policy(policy, resize_cost_s)
    return live_simulator(cfg, pol, models, plans, lost=lost, window_steps=window_steps, live_costs=live_costs,
                          changes=changes, cores=cores, launch_extra=launch_extra).run(specs)
