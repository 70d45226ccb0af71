"""The server's gating logic, pure: no MPI, no clock of its own (times are passed in).

:class:`Gate` is Algorithm 1's server side (arXiv 1908.11848), fed one push at a time; it answers
OK or hold for the pusher and lists the held workers that push releases. BSP, ASP and SSP are the
same gate without a controller (thresholds 0, inf, s). DSSP adds a controller:

- :class:`PaperController` is Algorithm 2 exactly: ``Sim_p[i] = A_p + i*I_p``,
  ``Sim_s[k] = A_s + I_s + k*I_s`` for i, k in 0..r_max; return the r minimising
  ``min_k |Sim_s[k] - Sim_p[r]|`` (ties: the smallest r, as ``argmin`` does). With fewer than two
  pushes of p or of the slowest there is no interval; the paper does not say what to do: we return 0.
- :class:`ExactController` returns the r minimising the wait p would suffer at its *next check*
  if it were held there (:func:`real_wait`), over r in ``0..min(r_max, hi - gap)``: the bound makes
  the gap at every release <= hi (the hard cap), refills included. Ties: the largest r (same wait,
  more progress). This is not the wait p really suffers under Algorithm 1: at that check the
  controller runs again and may refill the allowance, so p is often not held there at all. It is
  the wait at the next check assuming no refill; the paper's Algorithm 2, whose refills are
  unbounded, can wait less in total by letting the gap pass hi (see docs/ps.md, "What dssp-exact
  minimises").

Algorithm 1's allowance semantics, which both controllers share: a decision at p's push (the
push that took the gap over lo) with r > 0 sends OK at once, and the next r pushes each spend one
unit and are sent OK; the push after those is checked again. So an allowance r lets p push at
``Sim_p[1..r+1]`` without waiting, and the check that may hold it comes after the push at
``Sim_p[r+1]``; with r = 0 p is held now, at ``Sim_p[0]``. If p is still the fastest and over lo
at that check, the controller is asked again and may grant a new allowance: the *refill*. With the
paper's controller nothing bounds the gap (see ``tests/unit/test_ps_controllers.py``); even one
allowance of r_max gives a release at gap lo + 1 + r_max = hi + 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from elastic_ring.ps.api import (Action, ControllerDecision, ControllerInput, GateDecision,
                                 PushRecord, SyncPolicy)


# ---------------------------------------------------------------------------------------------
# The wait at the next check (no refill assumed)


def check_index(r: int) -> int:
    """Index i of p's push after which p is checked (may be held) under allowance r."""
    return 0 if r == 0 else r + 1


def real_wait(r: int, p_times: Sequence[float], s_times: Sequence[float], t_p: int, t_s: int,
              lower: int) -> float:
    """The wait p suffers at its next check under allowance r, if it is held there (closed form).

    "If it is held": the controller is not asked again at that check (no refill). Under Algorithm 1
    it is, when p is still the fastest, so this is the wait of one allowance decision in isolation,
    not the total wait p suffers over a run.

    ``p_times[i]``: p's i-th push from now (``p_times[0]`` the push being decided, i.e. now);
    ``s_times[k]``: the slowest's (k+1)-th push after now. p is checked after push
    ``j = check_index(r)`` at count ``t_p + j``; it goes on once the slowest's count reaches
    ``t_p + j - lower``, i.e. after the slowest's ``n = t_p + j - lower - t_s``-th push.

    Raises:
        ValueError: the sequences are too short for r.
    """
    j = check_index(r)
    if j >= len(p_times):
        raise ValueError(f"need {j + 1} push times of p, got {len(p_times)}")
    n = t_p + j - lower - t_s
    if n <= 0:
        return 0.0
    if n > len(s_times):
        raise ValueError(f"need {n} push times of the slowest, got {len(s_times)}")
    return max(0.0, float(s_times[n - 1]) - float(p_times[j]))


# ---------------------------------------------------------------------------------------------
# Forecasts and controllers


def constant_interval_forecast(inp: ControllerInput, n_p: int, n_s: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Algorithm 2's model: ``Sim_p[i] = A_p + i*I_p``, ``Sim_s[k] = A_s + (k+1)*I_s``.

    ``None`` when p or the slowest has fewer than two pushes (no interval).
    """
    i_p, i_s = inp.fastest.interval, inp.slowest.interval
    if i_p is None or i_s is None:
        return None
    a_p, a_s = float(inp.fastest.latest), float(inp.slowest.latest)
    return a_p + np.arange(n_p) * i_p, a_s + (np.arange(n_s) + 1) * i_s


def _record_fields(inp: ControllerInput) -> dict:
    return dict(a_p=inp.fastest.latest, i_p=inp.fastest.interval, a_s=inp.slowest.latest,
                i_s=inp.slowest.interval)


@dataclass
class PaperController:
    """Algorithm 2 of arXiv 1908.11848, unchanged."""

    name: str = "paper"

    def decide(self, inp: ControllerInput) -> ControllerDecision:
        r_max = inp.upper - inp.lower
        i_p, i_s = inp.fastest.interval, inp.slowest.interval
        if i_p is None or i_s is None:
            return ControllerDecision(0, r_max, "no_interval", (), **_record_fields(inp))
        r = np.arange(r_max + 1)
        sim_p = inp.fastest.latest + r * i_p
        sim_s = inp.slowest.latest + i_s + r * i_s
        dist = np.abs(sim_s[None, :] - sim_p[:, None]).min(axis=1)  # per r, over all k
        best = int(np.argmin(dist))
        return ControllerDecision(best, r_max, "argmin", tuple(float(x) for x in dist), **_record_fields(inp))


@dataclass
class ExactController:
    """Allowance minimising the wait at p's next check assuming no refill (:func:`real_wait`),
    capped so the gap stays <= hi.

    ``forecast`` predicts the push times; the default is Algorithm 2's constant-interval model, so
    the two controllers see the same information and differ only in the objective and the cap.
    """

    forecast: Callable[..., tuple[np.ndarray, np.ndarray] | None] = constant_interval_forecast
    name: str = "exact"
    tie_tol: float = 1e-9

    def r_cap(self, inp: ControllerInput) -> int:
        gap = inp.t_p - inp.t_slowest
        return max(0, min(inp.upper - inp.lower, inp.upper - gap))

    def waits(self, inp: ControllerInput) -> list[float] | None:
        cap = self.r_cap(inp)
        n_p = check_index(cap) + 1
        n_s = max(1, inp.t_p + check_index(cap) - inp.lower - inp.t_slowest)
        f = self.forecast(inp, n_p, n_s)
        if f is None:
            return None
        p_times, s_times = f
        return [real_wait(r, p_times, s_times, inp.t_p, inp.t_slowest, inp.lower) for r in range(cap + 1)]

    def decide(self, inp: ControllerInput) -> ControllerDecision:
        cap = self.r_cap(inp)
        w = self.waits(inp)
        if w is None:
            return ControllerDecision(0, cap, "no_interval", (), **_record_fields(inp))
        return ControllerDecision(argmin_last(w, self.tie_tol), cap, "argmin", tuple(w), **_record_fields(inp))


def argmin_last(values: Sequence[float], tol: float = 1e-9) -> int:
    """Largest index whose value is within ``tol`` of the minimum."""
    m = min(values)
    return max(i for i, v in enumerate(values) if v <= m + tol)


def make_controller(policy: SyncPolicy, forecast: Callable | None = None):
    """The controller a policy names (``None`` for bsp/asp/ssp)."""
    if policy.controller == "paper":
        return PaperController()
    if policy.controller == "exact":
        return ExactController(forecast=forecast or constant_interval_forecast)
    return None


# ---------------------------------------------------------------------------------------------
# The gate


class Gate:
    """Algorithm 1, server side. Feed every push with :meth:`on_push`; act on the decision.

    The gate holds the counts, the two latest push times per worker, the allowances r_p and the
    set of held workers. A held worker q is released by a later push of another worker once
    ``t_q - t_min <= lower``.
    """

    def __init__(self, policy: SyncPolicy, workers: Sequence[int], controller=None) -> None:
        self.policy = policy
        self.workers = list(workers)
        self.controller = controller if controller is not None else make_controller(policy)
        self.count = {w: 0 for w in self.workers}
        self.latest: dict[int, float | None] = {w: None for w in self.workers}
        self.previous: dict[int, float | None] = {w: None for w in self.workers}
        self.allowance = {w: 0 for w in self.workers}
        self.held: dict[int, float] = {}  # worker -> time held

    def record(self, w: int) -> PushRecord:
        return PushRecord(self.count[w], self.latest[w], self.previous[w])

    @property
    def t_min(self) -> int:
        return min(self.count.values())

    def slowest(self) -> int:
        """The slowest worker (smallest count; ties: the one whose latest push is oldest)."""
        return min(self.workers, key=lambda w: (self.count[w], self.latest[w] if self.latest[w] is not None else -math.inf, w))

    def on_push(self, p: int, now: float) -> GateDecision:
        if p in self.held:
            raise RuntimeError(f"worker {p} pushed while held")
        self.count[p] += 1
        self.previous[p], self.latest[p] = self.latest[p], now
        t_p, t_min = self.count[p], self.t_min
        gap = t_p - t_min
        lower = self.policy.lower
        ctl = None
        if self.allowance[p] > 0:
            # dssp-exact's cap holds here without a check: its r <= hi - gap at the decision, and
            # each push spending a unit raises the gap by at most one (t_min never falls)
            self.allowance[p] -= 1
            action = Action.OK_ALLOWANCE
        elif gap <= lower:
            action = Action.OK_WITHIN
        elif self.controller is not None and t_p == max(self.count.values()):
            s = self.slowest()
            inp = ControllerInput(p, now, t_p, self.count[s], int(lower), int(self.policy.upper),
                                  self.record(p), self.record(s))
            ctl = self.controller.decide(inp)
            self.allowance[p] = ctl.r
            action = Action.OK_CONTROLLER if ctl.r > 0 else Action.HOLD
        else:
            action = Action.HOLD
        if action is Action.HOLD:
            self.held[p] = now
        releases = tuple(q for q in sorted(self.held) if q != p and self.count[q] - t_min <= lower)
        for q in releases:
            del self.held[q]
        return GateDecision(p, t_p, t_min, gap, action, self.allowance[p], releases, ctl)
