"""Opt-in per-test CPU accounting (``ELASTIC_RING_TEST_CPU=FILE``): where the suite's time goes.

For each test, one JSON line appended to FILE:

- ``wall``: the test's seconds (set-up, call and tear-down);
- ``self``, ``children``: the CPU seconds (user + system) of the pytest process and of the child
  processes it waited for (``getrusage(RUSAGE_SELF / RUSAGE_CHILDREN)`` before and after). A waited
  for process's own waited for children are in it too: the controller, its horovodrun, the zygote
  and the workers it forked, as long as each parent waited for each child.
- ``pythons``: the Python interpreters the test started (any depth: the controller, horovodrun,
  the zygote, each worker command or its stand-in, ``status`` and other CLI calls);
  ``torch``: how many of them imported torch; ``forks``: the forks of a Python process that went
  on without exec (the zygote's forked workers, and any other ``os.fork``), ``forks_torch``: those
  with torch already imported (what a fork saves: the import).
- ``exited_cpu``: the CPU seconds of the test's Python processes that exited normally, each its
  own (``RUSAGE_SELF`` at ``atexit``): daemons included, whoever waited for them.
- ``starts``: the interpreters started, by what they ran (``-m MODULE`` and, for the CLI, its
  command; a script's name otherwise); ``torch_in``: the same for those that imported torch.

What ``children`` misses: a process that nobody in the chain up to pytest waited for before the
test ended (a daemon started with ``start_new_session`` and left to ``init``, a worker whose launcher
was killed with kill -9, a process still running when the test ends); and a process's children
count only once it waited for them. ``exited_cpu`` counts those that exited through Python's
normal exit, but not those killed by a signal (kill -9, a SIGTERM without a handler) or ended with
``os._exit`` (the zygote's forked workers) — their CPU is in their parent's ``children`` if it
waited. Neither counts non-Python processes' CPU beyond the waited for (``sh``, ``cat``, ``ssh``).
``scripts/suite_cpu.py`` samples every process of a marked suite from /proc instead (those not
waited for too, by kind; it misses those that live under its 0.1 s period).

The counts come from a ``sitecustomize`` module put first on the children's ``PYTHONPATH`` (an
interpreter started with ``-S``/``-I`` or a cleared environment is not counted); it only writes
lines to the file named in ``ELASTIC_RING_TEST_PROCS`` (one per test, set before each test).
"""

from __future__ import annotations

import atexit
import json
import os
import re
import resource
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path

import pytest

PROCS_ENV = "ELASTIC_RING_TEST_PROCS"

# Runs at the start of each child interpreter (as sitecustomize): a line at its start, one when it
# first imports torch, one at each fork that goes on without exec, one at its normal exit.
_SITECUSTOMIZE = '''
import os as _os
_f = _os.environ.get(%(env)r)
if _f:
    import json as _json, sys as _sys

    def _log(**rec):
        rec["pid"] = _os.getpid()
        try:
            with open(_f, "a") as out:
                out.write(_json.dumps(rec) + "\\n")
        except OSError:
            pass

    _log(event="start", ppid=_os.getppid(), argv=_sys.orig_argv[:5])

    class _TorchSeen:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name == "torch":
                _sys.meta_path.remove(_TorchSeen)
                _log(event="torch")
            return None

    _sys.meta_path.insert(0, _TorchSeen)
    _os.register_at_fork(after_in_child=lambda: _log(event="fork", ppid=_os.getppid(),
                                                     torch="torch" in _sys.modules))

    def _exit():
        import resource as _r
        s = _r.getrusage(_r.RUSAGE_SELF)
        _log(event="exit", cpu=s.ru_utime + s.ru_stime)

    import atexit as _atexit
    _atexit.register(_exit)
'''


def _kind(argv: list[str]) -> str:
    """What an interpreter ran, from its command line: ``elastic_ring.cli.main train``,
    ``elastic_ring.worker.run --zygote``, ``elastic_ring.worker.run``, ``script.py``, ``-c``."""
    args = [a for a in argv[1:] if a not in ("-u", "-B", "-E", "-s")]
    if args[:1] == ["-m"] and len(args) > 1:
        extra = args[2:3] if args[1] == "elastic_ring.cli.main" or args[2:3] == ["--zygote"] else []
        return " ".join([args[1], *extra])
    if args and not args[0].startswith("-"):
        return re.sub(r".*/", "", args[0])
    return args[0] if args else "(interactive)"


def install(log: str):
    """Set up the accounting into ``log``; returns the ``pytest_runtest_protocol`` hook wrapper."""
    site = Path(tempfile.mkdtemp(prefix="er-test-cpu-"))
    atexit.register(shutil.rmtree, site, True)  # (a late line of a process still running is lost)
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE % {"env": PROCS_ENV})
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)

    def cpu(who: int) -> float:
        u = resource.getrusage(who)
        return u.ru_utime + u.ru_stime

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        procs = site / f"procs-{os.getpid()}-{time.monotonic_ns()}.jsonl"
        os.environ[PROCS_ENV] = str(procs)
        t0, s0, c0 = time.time(), cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN)
        yield
        wall, s1, c1 = time.time() - t0, cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN)
        os.environ.pop(PROCS_ENV, None)
        recs = [json.loads(ln) for ln in procs.read_text().splitlines() if ln] if procs.exists() else []
        started = {r["pid"] for r in recs if r["event"] == "start"}
        forks = [r for r in recs if r["event"] == "fork"]
        with open(log, "a") as f:
            f.write(json.dumps({
                "test": item.nodeid, "wall": round(wall, 2), "self": round(s1 - s0, 2),
                "children": round(c1 - c0, 2), "pythons": len(started),
                "torch": len({r["pid"] for r in recs if r["event"] == "torch" and r["pid"] in started}),
                "forks": len(forks), "forks_torch": sum(1 for r in forks if r["torch"]),
                "exited_cpu": round(sum(r["cpu"] for r in recs if r["event"] == "exit"), 2),
                "starts": dict(Counter(_kind(r["argv"]) for r in recs if r["event"] == "start").most_common()),
                "torch_in": dict(Counter(_kind(r["argv"]) for r in recs if r["event"] == "start"
                                         and r["pid"] in {t["pid"] for t in recs if t["event"] == "torch"})),
            }) + "\n")

    return pytest_runtest_protocol
