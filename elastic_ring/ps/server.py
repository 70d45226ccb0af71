"""The parameter server (rank 0): Algorithm 1's server loop over MPI.

For each push: apply the gradient (SGD with momentum and weight decay, one update per push),
feed the push to the pure :class:`~elastic_ring.ps.controllers.Gate`, and send OK with the new
weights (the pull) to the pusher and to every held worker the push released. Test accuracy is
evaluated on the server every ``eval_every_s`` seconds / ``eval_every_updates`` updates (the
evaluation pauses the server; its time is logged as ``eval_s``). At a stop condition (time budget,
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
from elastic_ring.ps.model import build_model, evaluate, get_buffers, get_params, set_buffers, set_grads
from elastic_ring.ps.worker import TAG_FINAL, TAG_OK, TAG_PUSH, TAG_STOP, recv_idle


def run_server(cfg: PSConfig, run_dir: Path, comm) -> None:
    from mpi4py import MPI

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
    comm.Barrier()
    t0 = time.monotonic()
    version = 0
    weights, buffers = get_params(model), get_buffers(model)

    def ok(w: int) -> None:
        comm.send((version, weights, buffers), dest=w, tag=TAG_OK)

    for w in workers:
        ok(w)
    held_at: dict[int, float] = {}
    held_s = {w: 0.0 for w in workers}
    stale: dict[int, list[int]] = {w: [] for w in workers}
    max_release_gap = max_push_gap = max_staleness = 0
    last_eval_t, last_eval_v = 0.0, 0
    last_acc: float | None = None
    best_acc: float | None = None
    reason = ""
    status = MPI.Status()

    def run_eval(now: float) -> float:
        nonlocal last_eval_t, last_eval_v, last_acc, best_acc
        e0 = time.monotonic()
        acc, loss = evaluate(model, test, cfg.max_test_samples)
        model.train()
        dt = time.monotonic() - e0
        last_eval_t, last_eval_v, last_acc = now, version, acc
        best_acc = acc if best_acc is None else max(best_acc, acc)
        log.write(PSAccuracy(now, version, acc, loss, {str(w): gate.count[w] for w in workers}, dt))
        return acc

    run_eval(0.0)
    while not reason:
        msg = recv_idle(comm, MPI.ANY_SOURCE, TAG_PUSH, status)
        p = status.Get_source()
        now = time.monotonic() - t0
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
                         applied_to, staleness, float(msg["loss"]), float(msg["compute_s"]), float(msg["sleep_s"])))
        if d.controller is not None:
            c = d.controller
            log.write(PSController(now, p, gate.controller.name, d.t_p, d.t_min, c.r, c.r_cap, c.reason,
                                   list(c.objective), c.a_p, c.i_p, c.a_s, c.i_s))
        if d.action.released:
            max_release_gap = max(max_release_gap, d.gap)
            ok(p)
        else:
            held_at[p] = now
            log.write(PSHold(now, p, d.t_p, d.gap))
        for q in d.releases:
            gap_q = gate.count[q] - gate.t_min
            max_release_gap = max(max_release_gap, gap_q)
            dt = now - held_at.pop(q)
            held_s[q] += dt
            log.write(PSRelease(now, q, dt, gap_q, p))
            ok(q)
        if (cfg.eval_every_s and now - last_eval_t >= cfg.eval_every_s) or \
                (cfg.eval_every_updates and version - last_eval_v >= cfg.eval_every_updates):
            acc = run_eval(now)
            if cfg.stop_accuracy and acc >= cfg.stop_accuracy:
                reason = "stop_accuracy"
        if cfg.max_pushes and version >= cfg.max_pushes:
            reason = "max_pushes"
        elif cfg.time_budget_s and time.monotonic() - t0 >= cfg.time_budget_s:
            reason = reason or "time_budget"

    end = time.monotonic() - t0
    if last_eval_v != version:
        run_eval(end)
    for w in workers:
        comm.send(None, dest=w, tag=TAG_STOP)
    for w in list(held_at):
        held_s[w] += end - held_at.pop(w)
    finals: dict[int, dict] = {}
    while len(finals) < K:
        msg = recv_idle(comm, MPI.ANY_SOURCE, MPI.ANY_TAG, status)
        if status.Get_tag() == TAG_FINAL:
            finals[status.Get_source()] = msg
    for w in workers:
        f, s = finals[w], stale[w]
        log.write(PSWorkerSummary(w, cfg.slowdowns[w - 1], gate.count[w], f["compute_s"], f["sleep_s"],
                                  f["blocked_s"], held_s[w], f["wall_s"], max(s, default=0),
                                  float(np.mean(s)) if s else 0.0))
    log.write(PSFinished(reason, end, version, {str(w): gate.count[w] for w in workers}, max_release_gap,
                         max_push_gap, max_staleness, None if bound == float("inf") else bound, last_acc, best_acc))
