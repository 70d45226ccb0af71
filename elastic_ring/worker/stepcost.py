"""The library's own cost per step, measured on the training thread (``ELASTIC_RING_STEP_COST``).

Off (the default) nothing here runs. On (``1``), :func:`install` wraps the library's entry points,
the places where the training thread goes from the script's code into the library's, in
``time.perf_counter_ns`` timers (:meth:`Meter.entry`): the loop generators' ``next()``
(``job.steps()``, ``job.epochs()``, the samplers' iterations where they run code of ours, and
``job.micro_batches()``), ``job.record``, the registered optimizer's pre- and post-hooks, the
samplers' ``next_batch``, and the Horovod Elastic adapter's hooks and commit point. Only the
outermost entry counts (one entry inside another, a hook inside a step of ours, is counted once),
and what runs inside them that is not per-step work is taken out and counted apart (``aside``): the
script's evaluation hook and checkpoints. The steps are those the job counted: from the end of the
entry that counted the segment's second step to the end of the one that counted its last (a
segment's first step holds its start-up, its end the final checkpoint and barrier), so the figures
are per step of a steady segment: the library's nanoseconds on the training thread, and the step's
own wall time, both less the aside; and the training thread's CPU time in the entries
(``time.thread_time_ns``, ``library_cpu_us_per_step_net``): the wall figure less the time the
thread was off its core (taken by another thread, waiting), which on a loaded machine inflates the
wall figure's mean. :meth:`Meter.write` leaves, at each segment's end,
``RUN_DIR/stepcost/seg<n>-rank<r>.json``; its ``library`` section holds them (see
:meth:`Meter.library`), with the timers' own bias measured at the start (:func:`calibrate`) and
taken out (``library_us_per_step_net``).

``parts`` also times each part of the step boundary (the stop vote's start and read, heartbeats,
throughput windows, the between-steps work, the optimizer hooks, the RNG capture of an epoch loop,
the loop generators themselves) and reports them under ``parts``: per part its calls, total and
per-step microseconds. Parts nest (``boundary`` and ``after_step``, the step boundary's one call a
step, hold others; ``hooks.before`` holds ``between``...), so they are not to be summed, and their
timers (about a microsecond a call) are inside the library's figure: read it at ``1``. What runs on
other threads (the collective's background work for the vote, the heartbeat and progress writers)
is not seen here: ``scripts/bench_step_cost.py`` also measures the whole cost end to end.
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
# the entry points of a job (the tool's and the no-tool mode's alike: attribute -> entry name) and of
# its sampler (Job.sampler); the loops are wrapped where they are made (Job.steps...)
JOB_ENTRIES = {"record": "record", "_before_optimizer_step": "hooks.before",
               "_after_optimizer_step": "hooks.after"}
SAMPLER_ENTRIES = {"next_batch": "sampler.next_batch", "next_micro_batches": "sampler.next_micro_batches"}


class Meter:
    """Accumulated nanoseconds and calls per named part of the step boundary (``parts``), and the
    library's own time per step on the training thread (:meth:`entry`, :meth:`library`)."""

    def __init__(self, bias_ns: float = 0.0) -> None:
        self.ns: dict[str, int] = defaultdict(int)
        self.calls: dict[str, int] = defaultdict(int)
        self.each: dict[str, list[int]] = defaultdict(list)  # (``parts``) every call's nanoseconds
        self.bias_ns = bias_ns  # what one entry's timer adds to its own figure (calibrate())
        self.cpu_bias_ns = 0.0  # the same for the thread-CPU figure (calibrate())
        self.seg: Any = None  # the job's counters (Segment): a change of its step is a step counted
        self.parts = False  # each part timed too (``parts``)
        self.lists = env.step_cost_lists()  # plain list iterators timed too (the old meter)
        self._reset_library()

    def _reset_library(self) -> None:
        self.depth = 0  # inside an entry (nested entries are counted by the outermost)
        self.lib_ns = 0  # the library's time on the training thread, aside taken out
        self.lib_cpu_ns = 0  # the training thread's CPU time in the entries, aside taken out
        self.aside_ns = 0  # evaluations and checkpoints inside the entries
        self.aside_cpu_ns = 0  # their CPU time
        self.entries = 0  # outermost entries
        self.entry_ns: dict[str, int] = defaultdict(int)
        self.entry_calls: dict[str, int] = defaultdict(int)
        self.steps_seen = 0  # steps counted in this segment
        self._step_seen: int | None = None
        self._seg_start = 0  # the step the segment started after
        self._first: tuple | None = None  # (t, lib_ns, aside_ns, entries, step, lib_cpu_ns) after the 2nd step
        self._last: tuple | None = None  # the same after the last step so far
        self.per_step: list[int] = []  # the library's nanoseconds of each step after the 2nd

    # ------------------------------------------------------------------ the library's own time
    def begin_segment(self) -> None:
        """A segment's steps start: its steps are counted afresh (the figures are per segment)."""
        self.steps_seen, self._first, self._last, self.per_step = 0, None, None, []
        self._step_seen = self.seg.step if self.seg is not None else None
        self._seg_start = self._step_seen or 0

    def entry(self, fn: Callable[..., Any], name: str) -> Callable[..., Any]:
        """``fn``, a place where the script's code calls into the library, timed when outermost."""
        clock, cpu, meter = time.perf_counter_ns, time.thread_time_ns, self

        def run(*args: Any, **kwargs: Any) -> Any:
            if meter.depth:  # inside another entry: counted there
                return fn(*args, **kwargs)
            meter.depth = 1
            a0, ac0 = meter.aside_ns, meter.aside_cpu_ns
            c0 = cpu()
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                t1 = clock()
                meter.lib_cpu_ns += cpu() - c0 - (meter.aside_cpu_ns - ac0)
                meter.left(name, t0, t1, a0)

        return run

    def left(self, name: str, t0: int, t1: int, aside0: int) -> None:
        """An outermost entry ``name`` ran from ``t0`` to ``t1`` (``aside0``: the aside before it)."""
        self.depth = 0
        ns = t1 - t0 - (self.aside_ns - aside0)
        self.lib_ns += ns
        self.entries += 1
        self.entry_ns[name] += ns
        self.entry_calls[name] += 1
        step = self.seg.step if self.seg is not None else None
        if step != self._step_seen:  # this entry counted a step: the figures' ends are taken here
            self._step_seen = step
            self.steps_seen += 1
            snap = (t1, self.lib_ns, self.aside_ns, self.entries, step, self.lib_cpu_ns)
            if self.steps_seen == 2:
                self._first = snap
            elif self.steps_seen > 2:
                self.per_step.append(self.lib_ns - self._last[1])
            if self.steps_seen >= 2:
                self._last = snap

    def entry_iter(self, it: Iterator[Any], name: str) -> Iterator[Any]:
        """``it``, with each ``next()`` an entry (the library's part of a loop the script runs)."""
        step = self.entry(it.__next__, name)
        try:
            while True:
                try:
                    v = step()
                except StopIteration:
                    return
                yield v
        finally:  # a loop left early: its generator's own cleanup (a context it yields in) now
            close = getattr(it, "close", None)
            if close is not None:
                close()

    def aside(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, work inside the entries that is no step's (an evaluation, a checkpoint): its time
        is counted apart, not in the library's per-step time nor in the step's."""
        clock, cpu, meter = time.perf_counter_ns, time.thread_time_ns, self

        def run(*args: Any, **kwargs: Any) -> Any:
            t0, c0 = clock(), cpu()
            try:
                return fn(*args, **kwargs)
            finally:
                meter.aside_ns += clock() - t0
                meter.aside_cpu_ns += cpu() - c0

        return run

    def library(self) -> dict[str, Any]:
        """The segment's figures, per step between the ends of its second and last steps:
        ``step_us`` the step's wall time on the training thread, ``library_us_per_step`` the time
        in the library's entries (both less the aside), ``library_us_per_step_net`` that less the
        timers' own bias (``timer_bias_us`` an entry), ``share`` the net over the step, ``target_us``
        the issue's bound (1% of the step or 100 us, whichever is larger), ``aside_us_per_step``
        the evaluations and checkpoints apart, ``entries`` per entry point (outermost); the median
        and 90th percentile over the steps of the library's time in each (raw: a loaded machine's
        preemptions inflate single steps, the mean holds them and the votes every K steps)."""
        if self._first is None or self._last is None or self._last[4] == self._first[4]:
            return {"steps": 0}
        (t0, l0, a0, e0, s0, c0), (t1, l1, a1, e1, s1, c1) = self._first, self._last
        n = s1 - s0
        step_us = ((t1 - t0) - (a1 - a0)) / 1e3 / n
        lib_us = (l1 - l0) / 1e3 / n
        per = (e1 - e0) / n
        net = max(0.0, lib_us - per * self.bias_ns / 1e3)
        cpu_net = max(0.0, (c1 - c0) / 1e3 / n - per * self.cpu_bias_ns / 1e3)
        each = sorted(self.per_step) or [0]
        return {"steps": n, "step_us": round(step_us, 2), "library_us_per_step": round(lib_us, 2),
                "entries_per_step": round(per, 2), "timer_bias_us": round(self.bias_ns / 1e3, 3),
                "library_us_per_step_net": round(net, 2), "share": round(net / step_us, 5) if step_us > 0 else None,
                "library_cpu_us_per_step_net": round(cpu_net, 2), "cpu_timer_bias_us": round(self.cpu_bias_ns / 1e3, 3),
                "target_us": round(max(0.01 * step_us, 100.0), 2), "within_target": net <= max(0.01 * step_us, 100.0),
                "aside_us_per_step": round((a1 - a0) / 1e3 / n, 2),
                "median_step_library_us": round(each[len(each) // 2] / 1e3, 2),
                "p90_step_library_us": round(each[min(len(each) - 1, int(0.9 * len(each)))] / 1e3, 2),
                "entries": {k: {"calls": self.entry_calls[k], "total_us": round(v / 1e3, 1)}
                            for k, v in sorted(self.entry_ns.items())}}

    # ------------------------------------------------------------------ the parts (``parts``)
    def timed(self, fn: Callable[..., Any], name: str) -> Callable[..., Any]:
        clock, ns, calls, each = time.perf_counter_ns, self.ns, self.calls, self.each[name]

        def run(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                t = clock() - t0
                ns[name] += t
                calls[name] += 1
                each.append(t)

        return run

    def wrap(self, obj: Any, attr: str, name: str) -> None:
        """Time ``obj.attr`` as a part (a method: set on the instance, a function: on the module)."""
        setattr(obj, attr, self.timed(getattr(obj, attr), name))

    def wrap_entry(self, obj: Any, attr: str, name: str) -> None:
        """``obj.attr`` as an entry point of the library (:meth:`entry`)."""
        setattr(obj, attr, self.entry(getattr(obj, attr), name))

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
                t = clock() - t0
                self.ns[name] += t
                self.calls[name] += 1
                self.each[name].append(t)
            first = False
            yield v

    def loop(self, it: Iterator[Any], name: str, parts: bool) -> Iterator[Any]:
        """A loop generator of the library as the script sees it: an entry each ``next()``, and
        with ``parts`` also the part ``name``."""
        return self.entry_iter(self.iterate(it, name) if parts else it, name)

    def report(self, steps: int) -> dict[str, Any]:
        per = max(steps, 1)
        return {"steps": steps, "parts": {k: {"calls": self.calls[k], "total_us": round(v / 1e3, 1),
                                              "per_step_us": round(v / 1e3 / per, 2), **_spread(self.each.get(k))}
                                          for k, v in sorted(self.ns.items())}}

    def write(self, run_dir: Path, segment: int, rank: int, steps: int | None = None, name: str | None = None,
              **extra: Any) -> None:
        """The segment's report (``steps``: what the parts are counted per; default the segment's
        steps done; ``name``: the file's, in ``run_dir`` itself), then everything counted afresh."""
        path = Path(run_dir) / name if name else Path(run_dir) / "stepcost" / f"seg{segment:03d}-rank{rank}.json"
        if steps is None:
            steps = (self.seg.step if self.seg is not None else 0) - self._seg_start
        rep = {**self.report(steps), "segment": segment, "rank": rank, "library": self.library(), **extra}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(rep, indent=1))
        except OSError:
            pass
        self.ns.clear()
        self.calls.clear()
        for each in self.each.values():  # (the timers hold these lists)
            each.clear()
        self._reset_library()


def _spread(each: list[int] | None) -> dict[str, float]:
    """A part's median and largest call, in microseconds (the mean hides a dear first call)."""
    if not each:
        return {}
    s = sorted(each)
    return {"median_us": round(s[len(s) // 2] / 1e3, 1), "max_us": round(s[-1] / 1e3, 1)}


def calibrate(rounds: int = 5, n: int = 2000) -> tuple[float, float]:
    """What an outermost entry's timers add to its own figures, in nanoseconds: (the wall figure's,
    the thread-CPU figure's), each the least, over ``rounds``, of the mean figure of ``n`` entries
    into a function that does nothing."""
    wall = cpu = float("inf")
    for _ in range(rounds):
        m = Meter()
        nothing = m.entry(lambda: None, "nothing")
        for _ in range(n):
            nothing()
        wall, cpu = min(wall, m.lib_ns / n), min(cpu, m.lib_cpu_ns / n)
    return wall, cpu


def _calibrated() -> "Meter":
    wall, cpu = calibrate()
    m = Meter(wall)
    m.cpu_bias_ns = cpu
    return m


def enabled() -> bool:
    return env.step_cost()


def current() -> "Meter | None":
    return _METER


def install(job: Any) -> "Meter | None":
    """Wrap ``job``'s entry points (and with ``parts`` its step-boundary parts) in timers, when
    ``ELASTIC_RING_STEP_COST`` is set."""
    global _METER
    if not enabled():
        return None
    from elastic_ring.worker import hooked

    m = _METER = _METER or _calibrated()
    m.seg, m.parts = job.seg, env.step_cost_parts()
    if m.parts:
        m.wrap(job.vote, "start", "vote.start")
        m.wrap(job.vote, "result", "vote.read")
        m.wrap(job.progress, "beat", "heartbeat")
        m.wrap(job.progress, "close_window", "window.close")
        m.wrap(job.progress, "window_rode", "window.read")  # (a window carried by a vote: its event)
        m.wrap(job.boundary, "after_step", "after_step")
        m.wrap(job.boundary, "between", "between_steps")
        for attr, name in JOB_ENTRIES.items():
            m.wrap(job, attr, name)
        m.wrap(job.hooked, "between", "hooked.between")
        if not getattr(hooked, "_timed_rng", False):
            hooked._rng_state, hooked._timed_rng = m.timed(hooked._rng_state, "rng_capture"), True
    # the library's entry points (outermost)
    for attr, name in JOB_ENTRIES.items():
        m.wrap_entry(job, attr, name)
    # not per-step work: counted apart
    job.progress.evaluate = m.aside(job.progress.evaluate)
    job.checkpoints.write = m.aside(job.checkpoints.write)
    begin = job.boundary.begin

    def begun(*args: Any, **kwargs: Any) -> None:
        begin(*args, **kwargs)
        m.begin_segment()

    job.boundary.begin = begun
    return m


def install_plain(job: Any) -> "Meter | None":
    """The same measure for the library's no-tool mode (:class:`~elastic_ring.worker.plain.PlainJob`,
    a script run by plain ``torchrun`` or ``horovodrun``), when ``ELASTIC_RING_STEP_COST`` and
    ``ELASTIC_RING_STEP_COST_DIR`` are set: the same entry points (the loops, ``record``, the
    optimizer's hooks, the samplers) timed at the same places in the script, their steps counted
    by ``job.step``; the report written at the process's exit to ``DIR/plain-rank<r>.json``. What
    the script spends in them there is what the tool's figure would hold without the tool (the
    indices a step takes, and the first microseconds after a step whoever runs them), so the
    tool's cost is its figure less this one (``scripts/bench_step_cost.py``)."""
    global _METER
    where = env.step_cost_dir()
    if not enabled() or where is None:
        return None
    import atexit

    m = _METER = _calibrated()
    m.seg = job  # (its ``step``: the steps counted)
    for attr, name in JOB_ENTRIES.items():
        m.wrap_entry(job, attr, name)
    job._evaluate = m.aside(job._evaluate)  # (the script's evaluation hook: apart, as the tool's)
    m.begin_segment()
    atexit.register(lambda: m.write(Path(where), 0, job.rank, form="plain", name=f"plain-rank{job.rank}.json"))
    return m


_LIST_ITERATOR = type(iter([]))


def loop(it: Iterator[Any], name: str) -> Iterator[Any]:
    """``it``, a loop generator of the library, metered when a meter is installed. A plain list
    iterator (``elastic.DistributedSampler``'s indices where no survivors' copy can be kept, what
    torch's own sampler hands a loader too) is handed over as it is: no code of ours runs in its
    ``next()``, and its timers, an entry per index, would cost more than what they time
    (``ELASTIC_RING_STEP_COST_LISTS=1``: timed as before, for a comparison)."""
    m = _METER
    if m is None or (type(it) is _LIST_ITERATOR and not m.lists):
        return it
    return m.loop(it, name, m.parts)


def entries(obj: Any, names: dict[str, str]) -> None:
    """``obj``'s methods (attribute -> entry name) as entry points, when a meter is installed."""
    m = _METER
    if m is not None:
        for attr, name in names.items():
            if m.parts:  # (its calls' spread too)
                m.wrap(obj, attr, name)
            m.wrap_entry(obj, attr, name)
