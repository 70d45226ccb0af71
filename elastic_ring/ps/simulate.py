"""A discrete-event simulation of the gate with given step times (no MPI, no training).

Each worker computes for ``step_time(worker, i)`` seconds (its i-th step), pushes, and goes on when
the gate releases it; the server's own latency is zero. Used by the unit tests (the refill lets the
paper's DSSP exceed hi; the hard cap holds for dssp-exact) and to explain the MPI runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from elastic_ring.ps.api import GateDecision, SyncPolicy
from elastic_ring.ps.controllers import Gate


@dataclass
class SimResult:
    decisions: list[tuple[float, GateDecision]] = field(default_factory=list)
    release_gaps: list[int] = field(default_factory=list)  # gap of the released worker at each OK
    wait_s: dict[int, float] = field(default_factory=dict)
    pushes: dict[int, int] = field(default_factory=dict)
    end: float = 0.0

    @property
    def max_release_gap(self) -> int:
        return max(self.release_gaps, default=0)

    @property
    def max_push_gap(self) -> int:
        return max((d.gap for _, d in self.decisions), default=0)


def simulate(policy: SyncPolicy, step_time: Callable[[int, int], float], workers: Sequence[int],
             total_pushes: int, controller=None) -> SimResult:
    """Run the gate until ``total_pushes`` pushes; return decisions, gaps at release and waits."""
    gate = Gate(policy, workers, controller)
    steps = {w: 0 for w in workers}
    next_push = {w: step_time(w, 0) for w in workers}
    res = SimResult(wait_s={w: 0.0 for w in workers}, pushes={w: 0 for w in workers})
    held_since: dict[int, float] = {}
    for _ in range(total_pushes):
        ready = [w for w in workers if w not in gate.held]
        if not ready:
            raise RuntimeError("deadlock: every worker is held")
        p = min(ready, key=lambda w: (next_push[w], w))
        now = next_push[p]
        d = gate.on_push(p, now)
        res.decisions.append((now, d))
        res.pushes[p] += 1
        steps[p] += 1
        if d.action.released:
            res.release_gaps.append(d.t_p - d.t_min)
            next_push[p] = now + step_time(p, steps[p])
        for q in d.releases:
            res.release_gaps.append(gate.count[q] - gate.t_min)
            res.wait_s[q] += now - held_since.pop(q)
            next_push[q] = now + step_time(q, steps[q])
        if not d.action.released:
            held_since[p] = now
        res.end = now
    return res

