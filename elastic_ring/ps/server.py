"""The parameter server (rank 0): Algorithm 1's server loop over MPI.

For each push: apply the gradient (SGD with momentum and weight decay, one update per push),
feed the push to the pure :class:`~elastic_ring.ps.controllers.Gate`, and send OK with the new
weights (the pull) to the pusher and to every held worker the push released. Test accuracy is
evaluated on the server every ``eval_every_s`` seconds / ``eval_every_updates`` updates (the
evaluation pauses the server; its time is logged as ``eval_s``). With ``eval_deferred`` the server
only keeps a copy of the weights at those points and evaluates them after the run: training is
never paused, and the time axis holds nothing but training.

Clocks. ``clock: wall`` (default): times are seconds of the machine's clock, pushes are handled as
they arrive, and a worker's speed is its compute padded to its target by sleeping (so it depends on
the load whenever the compute exceeds the target). ``clock: virtual``: the server draws each step's
length itself (``base_step_s * slowdown * (1 + noise * z)``, the same seeded draws) and handles the
pushes in order of their virtual arrival, waiting for the worker whose push is due next; the
workers do not sleep. Gradients, weights and the gate are the same; only time is emulated, so a
run's events are a function of its config and seed, whatever the machine's load. At a stop condition (time budget,
max pushes, stop accuracy) the server sends STOP to every worker (a held worker is blocked in its
receive, so STOP releases it), drains the pushes in flight and collects each worker's totals.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from elastic_ring.data import load_dataset
from elastic_ring.events.api import EventLog
from elastic_ring.nn.resnet import count_parameters
from elastic_ring.ps.api import PSConfig
from elastic_ring.ps.controllers import Gate
from elastic_ring.ps.events import (PSAccuracy, PSController, PSFinished, PSHold, PSLaunch, PSPush,
                                    PSRelease, PSWorkerSummary)
from elastic_ring.ps.model import (build_model, evaluate, get_buffers, get_params, set_buffers, set_grads,
                                   set_params)
from elastic_ring.ps.worker import TAG_FINAL, TAG_OK, TAG_PUSH, TAG_STOP, recv_idle, step_plan


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


def run_server(cfg: PSConfig, run_dir: Path, comm=None, transport=None) -> None:
    """Serve one run. ``transport``: how pushes arrive and OKs leave (default: MPI over ``comm``;
    :mod:`elastic_ring.ps.inprocess` passes one that computes the workers' gradients in-process)."""
    if transport is None:
        transport = MPITransport(comm)
    torch.set_num_threads(1)
    log = EventLog(Path(run_dir) / "events.jsonl")
    policy = cfg.policy
    K = cfg.workers
    workers = list(range(1, K + 1))
    model = build_model(cfg)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    test = load_dataset(cfg.dataset, False, cfg.data_dir, cfg.synthetic_size, cfg.seed)
    gate = Gate(policy, workers)
    bound = policy.release_bound
    log.write(PSLaunch(cfg.sync, policy.label(), policy.lower, policy.upper, policy.controller, K,
                       list(cfg.slowdowns), cfg.to_dict(), count_parameters(model)))
    transport.barrier()
    t0 = time.monotonic()
    version = 0
    weights, buffers = get_params(model), get_buffers(model)

    virtual = cfg.clock == "virtual"
    # virtual clock: the server draws every step length (the same seeded draws a worker would) and
    # handles the pushes in order of their virtual arrival, so nothing depends on the machine's speed
    step_rng = {w: np.random.default_rng(cfg.seed * 7919 + w) for w in workers}
    arrival: dict[int, float] = {}  # running worker -> virtual time of its next push
    planned: dict[int, float] = {}  # running worker -> length of the step it is computing
    buffered: dict[int, dict] = {}  # pushes received, not yet due

    def ok(w: int, now: float) -> None:
        if virtual:
            planned[w] = max(1e-9, step_plan(0.0, cfg, cfg.slowdowns[w - 1], step_rng[w])[1])
            arrival[w] = now + planned[w]
        transport.send_ok(w, (version, weights, buffers))

    def next_push() -> tuple[int, dict, float]:
        if not virtual:
            src, msg = transport.recv_push()
            return src, msg, time.monotonic() - t0
        if not arrival:
            raise RuntimeError("every worker is held")
        p = min(arrival, key=lambda w: (arrival[w], w))
        while p not in buffered:
            src, msg = transport.recv_push(p)
            buffered[src] = msg
        return p, buffered.pop(p), arrival.pop(p)

    for w in workers:
        ok(w, 0.0)
    held_at: dict[int, float] = {}
    held_s = {w: 0.0 for w in workers}
    stale: dict[int, list[int]] = {w: [] for w in workers}
    max_release_gap = max_push_gap = max_staleness = 0
    last_eval_t, last_eval_v = 0.0, 0
    last_acc: float | None = None
    best_acc: float | None = None
    reason = ""

    snapshots: list[tuple[float, int, np.ndarray, np.ndarray, dict[str, int]]] = []

    def evaluate_and_log(now: float, v: int, pushes: dict[str, int]) -> float:
        nonlocal last_acc, best_acc
        e0 = time.monotonic()
        acc, loss = evaluate(model, test, cfg.max_test_samples)
        model.train()
        last_acc = acc
        best_acc = acc if best_acc is None else max(best_acc, acc)
        log.write(PSAccuracy(now, v, acc, loss, pushes, time.monotonic() - e0))
        return acc

    def run_eval(now: float) -> float | None:
        nonlocal last_eval_t, last_eval_v
        last_eval_t, last_eval_v = now, version
        pushes = {str(w): gate.count[w] for w in workers}
        if cfg.eval_deferred:  # weights and buffers are fresh arrays after every update: no copy needed
            snapshots.append((now, version, weights, buffers, pushes))
            return None
        return evaluate_and_log(now, version, pushes)

    run_eval(0.0)
    now = 0.0
    while not reason:
        p, msg, now = next_push()
        if virtual:  # evaluations on the grid of eval_every_s, with the weights as they were then
            while cfg.eval_every_s and last_eval_t + cfg.eval_every_s <= min(now, cfg.time_budget_s or now):
                acc = run_eval(last_eval_t + cfg.eval_every_s)
                if cfg.stop_accuracy and acc is not None and acc >= cfg.stop_accuracy:
                    reason = "stop_accuracy"
                    break
            if not reason and cfg.time_budget_s and now > cfg.time_budget_s:
                reason = "time_budget"
            if reason:
                now = last_eval_t if reason == "stop_accuracy" else cfg.time_budget_s
                break
        staleness = version - int(msg["version"])
        set_grads(model, msg["grad"])
        opt.step()
        set_buffers(model, msg["buffers"])
        applied_to = version
        version += 1
        weights, buffers = get_params(model), get_buffers(model)
        d = gate.on_push(p, now)
        stale[p].append(staleness)
        max_staleness = max(max_staleness, staleness)
        max_push_gap = max(max_push_gap, d.gap)
        log.write(PSPush(now, p, d.t_p, d.t_min, d.gap, d.action.value, d.allowance_left, int(msg["version"]),
                         applied_to, staleness, float(msg["loss"]), float(msg["compute_s"]), float(msg["sleep_s"]),
                         float(planned.pop(p) if virtual else msg.get("target_s", 0.0))))
        if d.controller is not None:
            c = d.controller
            log.write(PSController(now, p, gate.controller.name, d.t_p, d.t_min, c.r, c.r_cap, c.reason,
                                   list(c.objective), c.a_p, c.i_p, c.a_s, c.i_s))
        if d.action.released:
            max_release_gap = max(max_release_gap, d.gap)
            ok(p, now)
        else:
            held_at[p] = now
            log.write(PSHold(now, p, d.t_p, d.gap))
        for q in d.releases:
            gap_q = gate.count[q] - gate.t_min
            max_release_gap = max(max_release_gap, gap_q)
            dt = now - held_at.pop(q)
            held_s[q] += dt
            log.write(PSRelease(now, q, dt, gap_q, p))
            ok(q, now)
        if (cfg.eval_every_s and not virtual and now - last_eval_t >= cfg.eval_every_s) or \
                (cfg.eval_every_updates and version - last_eval_v >= cfg.eval_every_updates):
            acc = run_eval(now)
            if cfg.stop_accuracy and acc is not None and acc >= cfg.stop_accuracy:
                reason = "stop_accuracy"
        if cfg.max_pushes and version >= cfg.max_pushes:
            reason = "max_pushes"
        elif cfg.time_budget_s and not virtual and time.monotonic() - t0 >= cfg.time_budget_s:
            reason = reason or "time_budget"

    real_s = time.monotonic() - t0
    end = now if virtual else real_s
    if last_eval_v != version:
        run_eval(end)
    finals = transport.stop(workers)
    for w in list(held_at):
        held_s[w] += end - held_at.pop(w)
    for t, v, wts, bufs, pushes in snapshots:  # eval_deferred: evaluate after the run
        set_params(model, wts)
        set_buffers(model, bufs)
        evaluate_and_log(t, v, pushes)
    for w in workers:
        f, s = finals[w], stale[w]
        log.write(PSWorkerSummary(w, cfg.slowdowns[w - 1], gate.count[w], f["compute_s"], f["sleep_s"],
                                  f["blocked_s"], held_s[w], f["wall_s"], max(s, default=0),
                                  float(np.mean(s)) if s else 0.0, int(f.get("overruns", 0)),
                                  float(f.get("max_compute_s", 0.0))))
    log.write(PSFinished(reason, end, version, {str(w): gate.count[w] for w in workers}, max_release_gap,
                         max_push_gap, max_staleness, None if bound == float("inf") else bound, last_acc, best_acc,
                         cfg.clock, real_s))
