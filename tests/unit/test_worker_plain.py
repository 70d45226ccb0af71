"""The worker library outside the tool (``elastic_ring.worker.plain``): the thread count it takes
by the tool's rule, and its own errors ending a script in one line."""

from __future__ import annotations

import os
import sys

from elastic_ring.worker import plain
from elastic_ring.worker.errors import ContractError, NotLaunchedError


def test_plain_threads_follow_the_tool_s_rule():
    cores = len(os.sched_getaffinity(0))
    assert plain.plain_threads(1, {}) == (cores, f"this host's {cores} core(s) shared by its 1 worker(s)")
    assert plain.plain_threads(2 * cores, {})[0] == 1  # never 0
    assert plain.plain_threads(4, {"ELASTIC_RING_CPU_THREADS": "3"}) == (3, "ELASTIC_RING_CPU_THREADS=3")
    assert plain.plain_threads(4, {"ELASTIC_RING_CPU_THREADS": "3", "OMP_NUM_THREADS": "8"})[0] == 3  # ours is named
    assert plain.plain_threads(1, {"OMP_NUM_THREADS": "2"}) is None  # the user's (or torchrun's) stands
    assert plain.plain_threads(1, {"ELASTIC_RING_CPU_THREADS": "x"})[0] == cores  # not a count: the rule


def test_the_library_s_errors_end_a_plain_script_in_one_line(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(sys, "excepthook", lambda *a: seen.append(a[0]))
    plain.one_line_errors()
    plain.one_line_errors()  # once: not wrapped twice
    for exc in (NotLaunchedError("set ELASTIC_RING_STEPS=N"), ContractError("register the optimizer")):
        sys.excepthook(type(exc), exc, None)
    sys.excepthook(ValueError, ValueError("x"), None)  # any other: the hook before
    assert capsys.readouterr().err.splitlines() == ["elastic-ring: error: set ELASTIC_RING_STEPS=N",
                                                     "elastic-ring: error: register the optimizer"]
    assert seen == [ValueError]
