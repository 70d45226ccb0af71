"""The library's own cost per step, measured on the training thread (``ELASTIC_RING_STEP_COST=1``).

Off (the default) nothing here runs. On, :func:`install` wraps the parts of a worker that run at the
step boundary (the stop vote's start and read, heartbeats, throughput windows, the between-steps
work, the optimizer hooks, the RNG capture of an epoch loop, the loop generators themselves) in
``time.perf_counter_ns`` accumulators, and :meth:`Meter.write` leaves, at each segment's end,
``RUN_DIR/stepcost/seg<n>-rank<r>.json``: per part its calls, total and per-step microseconds.
Parts nest (``boundary`` and ``after_step``, the step boundary's one call a step, hold others;
``hooks.before`` holds ``between``...), so they are not to be summed. What runs on other threads
(the collective's background work for the vote, the progress writer) is not seen here:
``scripts/bench_step_cost.py`` measures the whole cost end to end.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Iterator

from elastic_ring import env

ENV = env.STEP_COST

_METER: "Meter | None" = None


class Meter:
    """Accumulated nanoseconds and calls per named part of the step boundary."""

    def __init__(self) -> None:
        self.ns: dict[str, int] = defaultdict(int)
        self.calls: dict[str, int] = defaultdict(int)

    def timed(self, fn: Callable[..., Any], name: str) -> Callable[..., Any]:
        clock, ns, calls = time.perf_counter_ns, self.ns, self.calls

        def run(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                ns[name] += clock() - t0
                calls[name] += 1

        return run

    def wrap(self, obj: Any, attr: str, name: str) -> None:
        """Time ``obj.attr`` (a method: set on the instance, a function: on the module)."""
        setattr(obj, attr, self.timed(getattr(obj, attr), name))

    def iterate(self, it: Iterator[Any], name: str) -> Iterator[Any]:
        """``it``, with the time spent inside its ``next()`` (the library's part of a loop) counted."""
        clock, first = time.perf_counter_ns, True
        while True:
            t0 = clock()
            try:
                v = next(it)
            except StopIteration:  # (the segment's end: its checkpoint and barrier, not a step's)
                return
            if not first:  # (the first: the segment's start)
                self.ns[name] += clock() - t0
                self.calls[name] += 1
            first = False
            yield v

    def report(self, steps: int) -> dict[str, Any]:
        per = max(steps, 1)
        return {"steps": steps, "parts": {k: {"calls": self.calls[k], "total_us": round(v / 1e3, 1),
                                              "per_step_us": round(v / 1e3 / per, 2)}
                                          for k, v in sorted(self.ns.items())}}

    def write(self, run_dir: Path, segment: int, rank: int, steps: int, **extra: Any) -> None:
        path = Path(run_dir) / "stepcost" / f"seg{segment:03d}-rank{rank}.json"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({**self.report(steps), **extra}, indent=1))
        except OSError:
            pass
        self.ns.clear()
        self.calls.clear()


def enabled() -> bool:
    return env.step_cost()


def current() -> "Meter | None":
    return _METER


def install(job: Any) -> "Meter | None":
    """Wrap ``job``'s step-boundary parts in timers, when ``ELASTIC_RING_STEP_COST`` is set."""
    global _METER
    if not enabled():
        return None
    from elastic_ring.worker import hooked

    m = _METER = _METER or Meter()
    m.wrap(job.vote, "start", "vote.start")
    m.wrap(job.vote, "result", "vote.read")
    m.wrap(job.progress, "heartbeat", "heartbeat")
    m.wrap(job.progress, "close_window", "window.close")
    m.wrap(job.boundary, "after_step", "after_step")
    m.wrap(job.boundary, "between", "between_steps")
    m.wrap(job, "record", "record")
    m.wrap(job, "_before_optimizer_step", "hooks.before")
    m.wrap(job, "_after_optimizer_step", "hooks.after")
    m.wrap(job.hooked, "between", "hooked.between")
    if not getattr(hooked, "_timed_rng", False):
        hooked._rng_state, hooked._timed_rng = m.timed(hooked._rng_state, "rng_capture"), True
    return m
