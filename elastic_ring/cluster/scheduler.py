"""The live scheduler's loop: the policies of :mod:`elastic_ring.sched`, applied to real jobs.

One :meth:`Scheduler.tick` (every ``poll_s``):

1. observe every job that has a controller (progress, exit, the end of a resize in flight);
   a job whose controller ended is settled (succeeded, failed, paused after a stop, cancelled)
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
  is lost or run twice (the run folder's lock refuses a second controller).

Side effects (processes, time) come from ``runner`` and ``clock``.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Protocol

from elastic_ring.cluster.api import ClusterConfig, JobState, Observation
from elastic_ring.cluster.store import Store
from elastic_ring.perfmodel.convergence import predict_remaining
from elastic_ring.sched.api import JobView

_LIVE = (JobState.RUNNING, JobState.STOPPING)


class Runner(Protocol):
    def start(self, job: dict[str, Any], slots: list[int], workers: int, resume: bool) -> int: ...
    def request_resize(self, job: dict[str, Any], to: int) -> bool: ...
    def stop(self, job: dict[str, Any]) -> None: ...
    def observe(self, job: dict[str, Any]) -> Observation: ...


RateFor = Callable[[dict[str, Any]], Callable[[int], float]]


class Scheduler:
    """Args:
        rate_for: job row -> its speed in steps/s as a function of its worker count.
    """

    def __init__(self, store: Store, config: ClusterConfig, policy: Any, runner: Runner, rate_for: RateFor,
                 clock: Callable[[], float] = time.time) -> None:
        self.store, self.config, self.policy, self.runner = store, config, policy, runner
        self.rate_for, self.clock = rate_for, clock
        self._rates: dict[int, Callable[[int], float]] = {}
        self._obs: dict[int, Observation] = {}
        self.live_resize = config.device == "cpu" and not config.multi_host

    # ------------------------------------------------------------------ helpers
    def _free(self, jobs: list[dict[str, Any]]) -> list[int]:
        held = {s for j in jobs for s in j["slots"]}
        return [s for s in range(self.config.slots) if s not in held]

    def _remaining(self, j: dict[str, Any]) -> float:
        req = j["request"]
        total = j["total"] or req.steps or 0
        left = max(total - j["step"], 1)
        obs = self._obs.get(j["id"])
        if req.target_loss is None or obs is None or not obs.losses:
            return float(left)
        steps = [s for s, _ in obs.losses]
        losses = [l for _, l in obs.losses]
        return min(predict_remaining(float(j["step"]), steps, losses, req.target_loss, prior=left), float(left))

    def _rate(self, j: dict[str, Any]) -> Callable[[int], float]:
        r = self._rates.get(j["id"])
        if r is None:
            r = self._rates[j["id"]] = self.rate_for(j)
        return r

    # ------------------------------------------------------------------ decisions
    def decide(self, cause: str, jid: int | None) -> dict[int, int]:
        """Ask the policy and store each job's target (its allocation, clamped to its limits)."""
        jobs = [j for j in self.store.jobs(active_only=True)
                if not j["cancel"] and not (j["state"] == JobState.STOPPING and j["message"] in ("cancel", "down"))]
        views = [JobView(j["id"], self._remaining(j), self._rate(j), len(j["slots"])) for j in jobs]
        current = {j["id"]: len(j["slots"]) for j in jobs}
        alloc = self.policy.allocate(views, self.config.slots, current) if views else {}
        out = {}
        for j in jobs:
            req = j["request"]
            w = int(alloc.get(j["id"], 0))
            hi = min(req.max_workers or self.config.slots, self.config.slots)
            w = min(w, hi)
            if 0 < w < req.min_workers:
                w = 0
            out[j["id"]] = w
        if sum(out.values()) > self.config.slots:
            raise RuntimeError(f"policy {self.policy.name} allocated {sum(out.values())} of {self.config.slots} slots")
        with self.store.transaction():
            for jid_, w in out.items():
                self.store.update(jid_, target=w)
            self.store.decision(cause, jid, out)
        return out

    # ------------------------------------------------------------------ the loop
    def recover(self) -> None:
        """After a restart: re-attach to controllers that still run, settle the others."""
        for j in self.store.jobs(active_only=True):
            if j["state"] in _LIVE:
                obs = self.runner.observe(j)
                self._obs[j["id"]] = obs
                if obs.alive:
                    self.store.event(j["id"], "adopted", pid=j["pid"], workers=obs.world_size)
                else:
                    self._settle(j, obs)
        self.decide("restart", None)

    def tick(self) -> bool:
        """One pass; False once `cluster down` has drained every job."""
        causes: list[tuple[str, int | None]] = []
        down = bool(self.store.get_meta("down"))
        for j in self.store.jobs(active_only=True):
            if j["state"] not in _LIVE:
                continue
            obs = self.runner.observe(j)
            self._obs[j["id"]] = obs
            if not obs.alive:
                cause = self._settle(j, obs)
                if cause != "paused":
                    causes.append((cause, j["id"]))
                continue
            self.store.update(j["id"], step=obs.step, total=obs.total or j["total"], workers=obs.world_size,
                              images_per_s=obs.images_per_s)
            if j["resize_to"] is not None and obs.world_size == j["resize_to"] and obs.exits > (j["resize_mark"] or 0):
                keep = j["slots"][: j["resize_to"]]  # the old workers are gone: a shrink's slots are free now
                with self.store.transaction():
                    self.store.update(j["id"], resize_to=None, resize_mark=None, slots=keep)
                    self.store.event(j["id"], "resized", workers=obs.world_size, slots=keep)
        for j in self.store.jobs(active_only=True):
            if j["state"] == JobState.QUEUED and not any(e["kind"] == "arrived" for e in self.store.events(j["id"])):
                self.store.event(j["id"], "arrived")
                causes.append(("arrival", j["id"]))
            if j["cancel"] and j["state"] in (JobState.QUEUED, JobState.PAUSED):
                self.store.update(j["id"], state=JobState.CANCELLED, finished=self.clock(), target=0)
                self.store.event(j["id"], "cancelled")
                causes.append(("cancel", j["id"]))
            elif j["cancel"] and j["state"] == JobState.RUNNING:
                self._stop(j, "cancel")
        if down:
            live = [j for j in self.store.jobs(active_only=True) if j["state"] in _LIVE]
            for j in live:
                if j["state"] == JobState.RUNNING:
                    self._stop(j, "down")
            return bool(live)
        for cause, jid in causes:
            self.decide(cause, jid)
        self._apply()
        return True

    def _settle(self, j: dict[str, Any], obs: Observation) -> str:
        """The controller of ``j`` has ended: record how, give back its slots. Returns the cause."""
        now = self.clock()
        out = obs.outcome
        if out in ("succeeded", "finished"):
            state, cause = JobState.SUCCEEDED, "completion"
        elif out == "interrupted" and (j["cancel"] or j["message"] == "cancel"):
            state, cause = JobState.CANCELLED, "cancel"
        elif out == "interrupted" or (out is None and obs.launches > 0):
            # stopped by us, or a controller killed without a summary after it had launched
            # workers: resume from its last checkpoint (never from scratch, never twice at once)
            state, cause = JobState.PAUSED, "paused"
        else:
            state, cause = JobState.FAILED, "completion"
        step = obs.total if state == JobState.SUCCEEDED and obs.total else max(obs.step, j["step"])
        fields: dict[str, Any] = dict(state=state, slots=[], resize_to=None, resize_mark=None, pid=None,
                                      step=step, workers=0)
        if state.terminal:
            fields["finished"] = now
        if state == JobState.FAILED:
            fields["message"] = f"controller ended with {out or 'no summary'}"
        with self.store.transaction():
            self.store.update(j["id"], **fields)
            self.store.event(j["id"], state.value, step=fields["step"], outcome=out)
        return cause

    def _stop(self, j: dict[str, Any], why: str) -> None:
        if j["state"] != JobState.RUNNING:
            return
        self.runner.stop(j)
        with self.store.transaction():
            self.store.update(j["id"], state=JobState.STOPPING, message=why)
            self.store.event(j["id"], "stop", why=why)

    def _apply(self) -> None:
        """Move jobs toward their targets: stops and shrinks first, then grows and starts."""
        jobs = self.store.jobs(active_only=True)
        for j in jobs:
            if j["state"] != JobState.RUNNING or j["resize_to"] is not None:
                continue
            held, want = len(j["slots"]), j["target"]
            if want == 0:
                self._stop(j, "preempt")
            elif want < held:
                if not self.live_resize:
                    self._stop(j, "resize")  # resumed at the new size on other slots
                elif self.runner.request_resize(j, want):
                    with self.store.transaction():
                        self.store.update(j["id"], resize_to=want, resize_mark=self._obs[j["id"]].exits)
                        self.store.event(j["id"], "resize_requested", frm=held, to=want)
        jobs = self.store.jobs(active_only=True)
        free = self._free(jobs)
        for j in jobs:  # in arrival order
            held, want = len(j["slots"]), j["target"]
            if j["state"] == JobState.RUNNING and j["resize_to"] is None and want > held and len(free) >= want - held:
                if not self.live_resize:
                    self._stop(j, "resize")
                    continue
                obs = self._obs.get(j["id"])
                if obs is None or not self.runner.request_resize(j, want):
                    continue
                take, free = free[: want - held], free[want - held:]
                with self.store.transaction():
                    self.store.update(j["id"], slots=j["slots"] + take, resize_to=want, resize_mark=obs.exits)
                    self.store.event(j["id"], "resize_requested", frm=held, to=want, slots=j["slots"] + take)
            elif j["state"] in (JobState.QUEUED, JobState.PAUSED) and want > 0 and len(free) >= want:
                take, free = free[:want], free[want:]
                resume = j["state"] == JobState.PAUSED
                with self.store.transaction():  # slots are ours before the process exists
                    self.store.update(j["id"], slots=take, state=JobState.RUNNING, message="",
                                      started=j["started"] or self.clock())
                pid = self.runner.start(j, take, want, resume)
                with self.store.transaction():
                    self.store.update(j["id"], pid=pid)
                    self.store.event(j["id"], "resumed" if resume else "started", workers=want, slots=take, pid=pid)
