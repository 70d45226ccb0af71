"""Policies by name, for the CLI, the simulator and the live scheduler: the Table 3 policies
(:data:`~elastic_ring.sched.policies.POLICIES`), the literature's anchors
(:data:`~elastic_ring.sched.anchors.ANCHORS`), and either wrapped to weigh a resize's cost (``NAME-rc``).

Its own module because the anchors build on the policies' allocators: the name table needs both,
and neither needs the table."""

from __future__ import annotations

from elastic_ring.errors import ConfigError
from elastic_ring.sched.anchors import ANCHORS
from elastic_ring.sched.api import DEFAULT_RESIZE_OVERHEAD_S, NOT_RESIZE_AWARE
from elastic_ring.sched.policies import POLICIES, ResizeAware


def make_policy(name: str, resize_cost_s: float | None = None):
    """A policy by name (one of :data:`POLICIES`, or an anchor of :mod:`elastic_ring.sched.anchors`:
    ``las``, ``pollux``); ``NAME-rc`` wraps it in :class:`ResizeAware` with ``resize_cost_s``
    (default: :data:`~elastic_ring.sched.api.DEFAULT_RESIZE_OVERHEAD_S`).

    Raises:
        ConfigError: unknown name.
    """
    known = {**POLICIES, **ANCHORS}
    if name.endswith("-rc") and name[:-3] in known and name[:-3] not in NOT_RESIZE_AWARE:
        cost = DEFAULT_RESIZE_OVERHEAD_S if resize_cost_s is None else resize_cost_s
        return ResizeAware(known[name[:-3]](), cost)
    try:
        return known[name]()
    except KeyError:
        raise ConfigError(f"unknown strategy {name!r}; choose from {', '.join(known)}") from None


def policy_names() -> list[str]:
    """Every name :func:`make_policy` takes: the policies, the anchors, and ``NAME-rc`` for each
    that has a resize-aware wrapper."""
    base = [*POLICIES, *ANCHORS]
    return [*base, *(f"{n}-rc" for n in base if n not in NOT_RESIZE_AWARE)]
