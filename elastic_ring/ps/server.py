"""The parameter server (rank 0): Algorithm 1's server loop, one :class:`Server` per run.

For each push: apply the gradient (SGD with momentum and weight decay, one update per push),
feed the push to the pure :class:`~elastic_ring.ps.controllers.Gate`, and send OK with the new
weights (the pull) to the pusher and to every held worker the push released. Test accuracy is
evaluated on the server every ``eval_every_s`` seconds / ``eval_every_updates`` updates (the
evaluation pauses the server; its time is logged as ``eval_s``). With ``eval_deferred`` the server
only keeps a copy of the weights at those points and evaluates them after the run: training is
never paused, and the time axis holds nothing but training.

How pushes arrive and OKs leave is a :class:`Transport`: :class:`MPITransport` (workers are ranks
1..K) or :class:`~elastic_ring.ps.inprocess.InProcessTransport` (the workers' gradients computed in
this process); the loop is the same, so both write the same events.

Clocks. ``clock: wall`` (default): times are seconds of the machine's clock, pushes are handled as
they arrive, and a worker's speed is its compute padded to its target by sleeping (so it depends on
the load whenever the compute exceeds the target). ``clock: virtual``: the server draws each step's
length itself (``base_step_s * slowdown * (1 + noise * z)``, the same seeded draws) and handles the
pushes in order of their virtual arrival (:class:`VirtualArrivals`), waiting for the worker whose
push is due next; the workers do not sleep. Gradients, weights and the gate are the same; only time
is emulated, so a run's events are a function of its config and seed, whatever the machine's load.
At a stop condition (time budget, max pushes, stop accuracy) the server sends STOP to every worker
(a held worker is blocked in its receive, so STOP releases it), drains the pushes in flight and
collects each worker's totals.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from elastic_ring.data import load_dataset
from elastic_ring.events.api import EventLog
from elastic_ring.nn.resnet import count_parameters
from elastic_ring.ps.api import GateDecision, PSConfig
from elastic_ring.ps.controllers import Gate
from elastic_ring.ps.events import (PSAccuracy, PSController, PSFinished, PSHold, PSLaunch, PSPush,
                                    PSRelease, PSWorkerSummary)
from elastic_ring.ps.model import (build_model, evaluate, get_buffers, get_params, set_buffers, set_grads,
                                   set_params)
from elastic_ring.ps.worker import TAG_FINAL, TAG_OK, TAG_PUSH, TAG_STOP, recv_idle, step_plan


class Transport(Protocol):
    """The server's side of the messages with workers 1..K."""

    def barrier(self) -> None:
        """Wait until every worker is ready (serving time starts after it)."""

    def send_ok(self, w: int, payload: tuple) -> None:
        """OK to worker ``w`` with the pull ``(version, weights, buffers)``."""

    def recv_push(self, due: int | None = None) -> tuple[int, dict]:
        """The next push ``(worker, message)``; ``due``: the worker whose push the virtual clock
        waits for (None on the wall clock: whichever arrives)."""

    def stop(self, workers: list[int]) -> dict[int, dict]:
        """Stop every worker; each worker's totals (compute_s, sleep_s, blocked_s, wall_s, ...)."""


class MPITransport:
    """The server's side of the messages, over MPI (the workers are ranks 1..K)."""

    def __init__(self, comm) -> None:
        from mpi4py import MPI

        self.comm, self.any, self.status = comm, MPI.ANY_SOURCE, MPI.Status()
        self.any_tag = MPI.ANY_TAG

    def barrier(self) -> None:
        self.comm.Barrier()

    def send_ok(self, w: int, payload: tuple) -> None:
        self.comm.send(payload, dest=w, tag=TAG_OK)

    def recv_push(self, due: int | None = None) -> tuple[int, dict]:
        """The next push to arrive, from any worker (``due`` is only a hint)."""
        msg = recv_idle(self.comm, self.any, TAG_PUSH, self.status)
        return self.status.Get_source(), msg

    def stop(self, workers: list[int]) -> dict[int, dict]:
        """Send STOP to every worker (a held one is blocked in its receive), drain the pushes in
        flight and return each worker's totals."""
        for w in workers:
            self.comm.send(None, dest=w, tag=TAG_STOP)
        finals: dict[int, dict] = {}
        while len(finals) < len(workers):
            msg = recv_idle(self.comm, self.any, self.any_tag, self.status)
            if self.status.Get_tag() == TAG_FINAL:
                finals[self.status.Get_source()] = msg
        return finals


class VirtualArrivals:
    """The virtual clock's schedule: each OK starts a step whose length the server draws (the same
    seeded draws a worker would make); pushes are handed out in order of their virtual arrival
    (ties: the lower rank), so nothing depends on the machine's speed."""

    def __init__(self, cfg: PSConfig, workers: list[int]) -> None:
        self.cfg = cfg
        self.rng = {w: np.random.default_rng(cfg.seed * 7919 + w) for w in workers}
        self.arrival: dict[int, float] = {}  # running worker -> virtual time of its next push
        self.planned: dict[int, float] = {}  # running worker -> length of the step it is computing
        self.buffered: dict[int, dict] = {}  # pushes received, not yet due

    def start_step(self, w: int, now: float) -> None:
        self.planned[w] = max(1e-9, step_plan(0.0, self.cfg, self.cfg.slowdowns[w - 1], self.rng[w])[1])
        self.arrival[w] = now + self.planned[w]

    def next_push(self, transport: Transport) -> tuple[int, dict, float]:
        """(worker, message, virtual time) of the push due next.

        Raises:
            RuntimeError: every worker is held (no push can come).
        """
        if not self.arrival:
            raise RuntimeError("every worker is held")
        p = min(self.arrival, key=lambda w: (self.arrival[w], w))
        while p not in self.buffered:
            src, msg = transport.recv_push(p)
            self.buffered[src] = msg
        return p, self.buffered.pop(p), self.arrival.pop(p)

    def step_length(self, w: int) -> float:
        """The drawn length of the step whose push just arrived (its ``target_s``)."""
        return self.planned.pop(w)


class Server:
    """One run of the server loop: :meth:`serve` writes ``RUN_DIR/events.jsonl`` from ``ps_launch``
    to ``ps_finished`` (see :mod:`elastic_ring.ps.events` for the order).

    Each concern is one method: :meth:`on_push` applies a gradient and asks the gate, :meth:`act`
    carries out its decision (OK, hold, releases), :meth:`eval_point` / :meth:`evaluate_and_log`
    evaluate, :meth:`stop_after_push` and :meth:`catch_up_virtual` decide the end, :meth:`finish`
    stops the workers and writes the totals.
    """

    def __init__(self, cfg: PSConfig, run_dir: Path, transport: Transport) -> None:
        self.cfg, self.transport = cfg, transport
        self.log = EventLog(Path(run_dir) / "events.jsonl")
        self.workers = list(range(1, cfg.workers + 1))
        self.model = build_model(cfg)
        self.model.train()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                                   weight_decay=cfg.weight_decay)
        self.test = load_dataset(cfg.dataset, False, cfg.data_dir, cfg.synthetic_size, cfg.seed)
        self.gate = Gate(cfg.policy, self.workers)
        self.arrivals = VirtualArrivals(cfg, self.workers) if cfg.clock == "virtual" else None
        # the weights: version = updates applied; weights and buffers are fresh arrays after each
        self.version = 0
        self.weights, self.buffers = get_params(self.model), get_buffers(self.model)
        self.t0 = 0.0  # monotonic time serving started (after the barrier)
        # holds and staleness
        self.held_at: dict[int, float] = {}  # held worker -> time held
        self.held_s = {w: 0.0 for w in self.workers}
        self.stale: dict[int, list[int]] = {w: [] for w in self.workers}
        self.max_release_gap = self.max_push_gap = self.max_staleness = 0
        # evaluations
        self.last_eval_t, self.last_eval_v = 0.0, 0
        self.last_acc: float | None = None
        self.best_acc: float | None = None
        self.snapshots: list[tuple[float, int, np.ndarray, np.ndarray, dict[str, int]]] = []  # eval_deferred

    # ----------------------------------------------------------------------------- the loop
    def serve(self) -> None:
        cfg, policy = self.cfg, self.cfg.policy
        self.log.write(PSLaunch(sync=cfg.sync, label=policy.label(), lower=policy.lower, upper=policy.upper,
                                controller=policy.controller, workers=cfg.workers,
                                slowdown=list(cfg.slowdowns), config=cfg.to_dict(),
                                parameters=count_parameters(self.model)))
        self.transport.barrier()
        self.t0 = time.monotonic()
        for w in self.workers:
            self.send_ok(w, 0.0)
        self.eval_point(0.0)
        reason, now = "", 0.0
        while not reason:
            p, msg, now = self.next_push()
            if self.arrivals is not None:
                reason, cut = self.catch_up_virtual(now)
                if reason:
                    now = cut
                    break
            self.on_push(p, msg, now)
            reason = self.stop_after_push(now)
        self.finish(reason, now)

    def next_push(self) -> tuple[int, dict, float]:
        """(worker, message, time) of the next push to handle."""
        if self.arrivals is not None:
            return self.arrivals.next_push(self.transport)
        src, msg = self.transport.recv_push()
        return src, msg, time.monotonic() - self.t0

    def send_ok(self, w: int, now: float) -> None:
        if self.arrivals is not None:
            self.arrivals.start_step(w, now)
        self.transport.send_ok(w, (self.version, self.weights, self.buffers))

    # ----------------------------------------------------------------------------- a push
    def on_push(self, p: int, msg: dict, now: float) -> None:
        """Apply p's gradient (one SGD step), then gate the push."""
        pulled = int(msg["version"])
        staleness = self.version - pulled
        set_grads(self.model, msg["grad"])
        self.opt.step()
        set_buffers(self.model, msg["buffers"])
        applied_to = self.version
        self.version += 1
        self.weights, self.buffers = get_params(self.model), get_buffers(self.model)
        d = self.gate.on_push(p, now)
        self.stale[p].append(staleness)
        self.max_staleness = max(self.max_staleness, staleness)
        self.max_push_gap = max(self.max_push_gap, d.gap)
        target = self.arrivals.step_length(p) if self.arrivals is not None else float(msg.get("target_s", 0.0))
        self.log.write(PSPush(t=now, worker=p, push=d.t_p, t_min=d.t_min, gap=d.gap, action=d.action.value,
                              allowance_left=d.allowance_left, version_pulled=pulled, version_applied=applied_to,
                              staleness=staleness, loss=float(msg["loss"]), compute_s=float(msg["compute_s"]),
                              sleep_s=float(msg["sleep_s"]), target_s=float(target)))
        self.act(d, now)

    def act(self, d: GateDecision, now: float) -> None:
        """Carry out the gate's decision: log the controller's, send OK or hold the pusher, release."""
        p = d.worker
        if d.controller is not None:
            c = d.controller
            self.log.write(PSController(t=now, worker=p, controller=self.gate.controller.name, t_p=d.t_p,
                                        t_slowest=d.t_min, r=c.r, r_cap=c.r_cap, reason=c.reason,
                                        objective=list(c.objective), a_p=c.a_p, i_p=c.i_p, a_s=c.a_s, i_s=c.i_s))
        if d.action.released:
            self.max_release_gap = max(self.max_release_gap, d.gap)
            self.send_ok(p, now)
        else:
            self.held_at[p] = now
            self.log.write(PSHold(t=now, worker=p, push=d.t_p, gap=d.gap))
        for q in d.releases:
            gap_q = self.gate.count[q] - self.gate.t_min
            self.max_release_gap = max(self.max_release_gap, gap_q)
            dt = now - self.held_at.pop(q)
            self.held_s[q] += dt
            self.log.write(PSRelease(t=now, worker=q, held_s=dt, gap=gap_q, by=p))
            self.send_ok(q, now)

    # ----------------------------------------------------------------------------- evaluation
    def pushes(self) -> dict[str, int]:
        return {str(w): self.gate.count[w] for w in self.workers}

    def eval_point(self, now: float) -> float | None:
        """An evaluation of the current weights at time ``now``: done now (its accuracy), or, with
        ``eval_deferred``, the weights kept for :meth:`finish` (None)."""
        self.last_eval_t, self.last_eval_v = now, self.version
        if self.cfg.eval_deferred:  # fresh arrays after every update: no copy needed
            self.snapshots.append((now, self.version, self.weights, self.buffers, self.pushes()))
            return None
        return self.evaluate_and_log(now, self.version, self.pushes())

    def evaluate_and_log(self, now: float, version: int, pushes: dict[str, int]) -> float:
        e0 = time.monotonic()
        acc, loss = evaluate(self.model, self.test, self.cfg.max_test_samples)
        self.model.train()
        self.last_acc = acc
        self.best_acc = acc if self.best_acc is None else max(self.best_acc, acc)
        self.log.write(PSAccuracy(t=now, version=version, test_accuracy=acc, test_loss=loss, pushes=pushes,
                                  eval_s=time.monotonic() - e0))
        return acc

    def reached(self, acc: float | None) -> bool:
        return bool(self.cfg.stop_accuracy and acc is not None and acc >= self.cfg.stop_accuracy)

    # ----------------------------------------------------------------------------- the end
    def catch_up_virtual(self, now: float) -> tuple[str, float]:
        """Virtual clock, before handling a push due at ``now``: the evaluations on the grid of
        ``eval_every_s`` up to ``now`` (with the weights as they were then), and
        ``(reason, end time)`` when the run ended before this push (``("", now)`` otherwise)."""
        cfg = self.cfg
        horizon = min(now, cfg.time_budget_s or now)
        while cfg.eval_every_s and self.last_eval_t + cfg.eval_every_s <= horizon:
            if self.reached(self.eval_point(self.last_eval_t + cfg.eval_every_s)):
                return "stop_accuracy", self.last_eval_t
        if cfg.time_budget_s and now > cfg.time_budget_s:
            return "time_budget", cfg.time_budget_s
        return "", now

    def stop_after_push(self, now: float) -> str:
        """An evaluation if one is due; the stop reason after this push ("" to go on)."""
        cfg, wall = self.cfg, self.arrivals is None
        reason = ""
        if (cfg.eval_every_s and wall and now - self.last_eval_t >= cfg.eval_every_s) or \
                (cfg.eval_every_updates and self.version - self.last_eval_v >= cfg.eval_every_updates):
            if self.reached(self.eval_point(now)):
                reason = "stop_accuracy"
        if cfg.max_pushes and self.version >= cfg.max_pushes:
            return "max_pushes"
        if cfg.time_budget_s and wall and time.monotonic() - self.t0 >= cfg.time_budget_s:
            return reason or "time_budget"
        return reason

    def finish(self, reason: str, now: float) -> None:
        """Final evaluation, STOP to every worker, deferred evaluations, the totals."""
        cfg = self.cfg
        real_s = time.monotonic() - self.t0
        end = real_s if self.arrivals is None else now
        if self.last_eval_v != self.version:
            self.eval_point(end)
        finals = self.transport.stop(self.workers)
        for w in list(self.held_at):
            self.held_s[w] += end - self.held_at.pop(w)
        for t, v, wts, bufs, pushes in self.snapshots:  # eval_deferred: evaluate after the run
            set_params(self.model, wts)
            set_buffers(self.model, bufs)
            self.evaluate_and_log(t, v, pushes)
        for w in self.workers:
            f, s = finals[w], self.stale[w]
            self.log.write(PSWorkerSummary(
                worker=w, slowdown=cfg.slowdowns[w - 1], pushes=self.gate.count[w], compute_s=f["compute_s"],
                sleep_s=f["sleep_s"], blocked_s=f["blocked_s"], held_s=self.held_s[w], wall_s=f["wall_s"],
                max_staleness=max(s, default=0), mean_staleness=float(np.mean(s)) if s else 0.0,
                overruns=int(f.get("overruns", 0)), max_compute_s=float(f.get("max_compute_s", 0.0))))
        bound = cfg.policy.release_bound
        self.log.write(PSFinished(
            reason=reason, wall_s=end, version=self.version, pushes=self.pushes(),
            max_release_gap=self.max_release_gap, max_push_gap=self.max_push_gap, max_staleness=self.max_staleness,
            release_bound=None if bound == float("inf") else bound, test_accuracy=self.last_acc,
            best_accuracy=self.best_acc, clock=cfg.clock, real_s=real_s))


def run_server(cfg: PSConfig, run_dir: Path, comm=None, transport: Transport | None = None) -> None:
    """Serve one run. ``transport``: how pushes arrive and OKs leave (default: MPI over ``comm``;
    :mod:`elastic_ring.ps.inprocess` passes one that computes the workers' gradients in-process)."""
    torch.set_num_threads(1)
    Server(cfg, Path(run_dir), transport if transport is not None else MPITransport(comm)).serve()
