#!/usr/bin/env python
"""When each test ran, on which pytest worker, and how busy the machine was meanwhile.

    python scripts/suite_timeline.py run DIR [-- PYTEST ARGS]   # make test's pytest, timed, into DIR
    python scripts/suite_timeline.py summary DIR [--label L] [--top N] [--out FILE]

``run`` runs ``python -m pytest -q -n 2 --dist worksteal --durations=60 --basetemp=/tmp/ert.XXXX tests``
(make test's command; other arguments after ``--`` replace ``-n 2 ... tests``, the short
temporary folder kept unless they name one) with this module as a pytest
plugin: every pytest process (each xdist worker) appends one JSON line per test start and end to
``DIR/tests-<worker>.jsonl``, and the machine's CPU counters (``/proc/stat``'s first line) and
1-minute load are written to ``DIR/stat.txt`` once a second while it runs; pytest's output goes to
``DIR/suite.log``. Several pytest commands can write into one DIR at once (each process its own
file): the summary reads them all. Nothing else should run.

``summary`` reads DIR and prints (and with ``--out`` appends to a JSON list file): the machine's
busy CPU seconds over the run and their share of its cores, the time to the first test (the
collection), per pytest process its tests, the end of its last test and its tests' summed
durations by folder (``unit``, ``integration``), pytest's own last line of each ``DIR/*.log``
(its counts and seconds), and the idle core-seconds while each test ran
(each second's idle split evenly among the tests running in it; ``--top N`` of them). What it
shows: whether the workers end together (the work stealing's balance), and whether the cores
are left idle and by which tests.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIR_ENV = "SUITE_TIMELINE_DIR"
MAKE_TEST = ["-n", "2", "--dist", "worksteal", "tests"]

# ---------------------------------------------------------------- the pytest plugin (in each worker)
_out = None
_relay = [False]  # pytest-xdist's controller: it only relays its workers' reports (not logged twice)


def pytest_configure(config):
    # (-n N with N workers, and this process not one of them: it has no ``workerinput``)
    _relay[0] = bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


def _log(nodeid: str, ev: str) -> None:
    global _out
    where = os.environ.get(DIR_ENV)
    if not where or _relay[0]:
        return
    if _out is None:
        name = os.environ.get("PYTEST_XDIST_WORKER", f"main{os.getpid()}")
        _out = open(Path(where) / f"tests-{name}.jsonl", "a", buffering=1)  # noqa: SIM115 - kept open
    _out.write(json.dumps({"id": nodeid, "ev": ev, "t": time.time()}) + "\n")


def pytest_runtest_logstart(nodeid, location):
    _log(nodeid, "start")


def pytest_runtest_logfinish(nodeid, location):
    _log(nodeid, "end")


# ---------------------------------------------------------------- run
def _stat_line() -> str:
    with open("/proc/stat") as f:
        cpu = f.readline().split()
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    return f"{time.time():.3f} {' '.join(cpu)} {load}\n"


def run(out: Path, pytest_args: list[str]) -> int:
    out.mkdir(parents=True, exist_ok=True)
    (out / "machine.json").write_text(json.dumps({"cores": os.cpu_count(), "load_before": os.getloadavg()[0]}))
    done = threading.Event()

    def sample() -> None:
        with open(out / "stat.txt", "a", buffering=1) as f:
            while True:
                f.write(_stat_line())
                if done.wait(1.0):
                    f.write(_stat_line())
                    return

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    # a short temporary folder of its own, as make test gives (Ray's socket paths under it must stay
    # short: the Ray tests skip under pytest's default), kept when a test fails
    own = not any(a.startswith("--basetemp") for a in pytest_args)
    base = tempfile.mkdtemp(prefix="ert.", dir="/tmp") if own else None
    env = dict(os.environ, **{DIR_ENV: str(out.resolve())})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "scripts"), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "suite_timeline", "--durations=60",
           *([f"--basetemp={base}"] if own else []), *(pytest_args or MAKE_TEST)]
    with open(out / "suite.log", "w") as log:
        rc = subprocess.call(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    done.set()
    sampler.join()
    if own and rc == 0:
        shutil.rmtree(base, ignore_errors=True)
    elif own:
        print(f"suite_timeline: pytest exited with {rc}; the tests' files are kept in {base}", file=sys.stderr)
    return rc


# ---------------------------------------------------------------- summary
def _samples(path: Path) -> list[tuple[float, float, float, float]]:
    """(time, busy CPU s, idle CPU s, load) per line of stat.txt: the counters as they stand."""
    tick = os.sysconf("SC_CLK_TCK")
    rows = []
    for line in path.read_text().splitlines():
        f = line.split()
        if len(f) < 13 or f[1] != "cpu":
            continue
        v = [int(x) for x in f[2:12]]
        idle = v[3] + v[4]
        rows.append((float(f[0]), (sum(v) - idle) / tick, idle / tick, float(f[-1])))
    return rows


def _tests(folder: Path) -> dict[str, list[tuple[float, float, str]]]:
    """Per pytest process (its file's name), its tests' (start, end, node id), in order."""
    procs = {}
    for path in sorted(folder.glob("tests-*.jsonl")):
        started, done = {}, []
        for line in path.read_text().splitlines():
            e = json.loads(line)
            if e["ev"] == "start":
                started[e["id"]] = e["t"]
            elif e["id"] in started:
                done.append((started.pop(e["id"]), e["t"], e["id"]))
        if done:
            procs[path.stem.removeprefix("tests-")] = done
    return procs


def summary(folder: Path, top: int = 0) -> dict:
    stat, procs = _samples(folder / "stat.txt"), _tests(folder)
    if len(stat) < 2 or not procs:
        raise ValueError("no stat.txt samples or no tests-*.jsonl records")
    machine = folder / "machine.json"  # (else this machine's: a folder made by hand)
    cores = json.loads(machine.read_text())["cores"] if machine.exists() else os.cpu_count() or 1
    first = min(t[0] for ts in procs.values() for t in ts)
    last = max(t[1] for ts in procs.values() for t in ts)
    inside = [s for s in stat if s[0] <= last + 1.5]
    t0, t1 = stat[0], inside[-1]
    busy, idle_all = t1[1] - t0[1], t1[2] - t0[2]
    span = t1[0] - t0[0]
    # each sampled second's idle core-seconds, split among the tests running in it
    every = [t for ts in procs.values() for t in ts]
    idle_by: collections.Counter = collections.Counter()
    for a, b in zip(inside, inside[1:]):
        idle = b[2] - a[2]
        running = [t for t in every if t[0] < b[0] and t[1] > a[0]]
        for t in running:
            idle_by[t[2]] += idle / len(running)
        if not running and idle:
            idle_by["(no test running)"] += idle
    loads = sorted(s[3] for s in inside)
    res = {
        "cores": cores,
        "span_s": round(span, 1),
        "busy_cpu_s": round(busy, 1),
        "busy_share": round(busy / (busy + idle_all), 3),  # (of the counters: the clock's jitter aside)
        "idle_core_s": round(idle_all, 1),
        "load_median": loads[len(loads) // 2],
        "first_test_after_s": round(first - t0[0], 1),
        "processes": {},
    }
    for name, ts in procs.items():
        by = collections.defaultdict(lambda: [0, 0.0])
        for a, b, nodeid in ts:
            part = nodeid.split("/")[1] if nodeid.startswith("tests/") and nodeid.count("/") >= 2 else "other"
            by[part][0] += 1
            by[part][1] += b - a
        res["processes"][name] = {"tests": len(ts), "last_end_s": round(ts[-1][1] - t0[0], 1),
                                  "durations_s": {k: {"tests": v[0], "sum_s": round(v[1], 1)}
                                                  for k, v in sorted(by.items())}}
    for log in sorted(folder.glob("*.log")):  # pytest's own last line: its count and seconds
        tail = re.findall(r"^=*\s*(\d+ (?:passed|failed).*?) in ([\d.]+)s\b", log.read_text(errors="replace"), re.M)
        if tail:
            res.setdefault("pytest", {})[log.name] = {"result": tail[-1][0], "seconds": float(tail[-1][1])}
    if top:
        res["idle_by_test"] = [{"test": k, "idle_core_s": round(v, 1)} for k, v in idle_by.most_common(top)]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run make test's pytest command, timed, into DIR")
    r.add_argument("dir")
    r.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: pytest's arguments instead")
    m = sub.add_parser("summary", help="the machine's busy share, the workers' ends, the idle by test")
    m.add_argument("dir")
    m.add_argument("--label", default="")
    m.add_argument("--top", type=int, default=0, help="also the N tests with the most idle core-seconds")
    m.add_argument("--out", default=None, help="append the summary to this JSON list file")
    a = ap.parse_args()
    if a.cmd == "run":
        args = a.pytest_args[1:] if a.pytest_args[:1] == ["--"] else a.pytest_args
        sys.exit(run(Path(a.dir), args))
    try:
        res = {"label": a.label, **summary(Path(a.dir), a.top)}
    except (OSError, ValueError, KeyError, TypeError) as e:  # (a missing, cut or foreign folder)
        print(f"suite_timeline: error: cannot read {a.dir} as a run's folder: {type(e).__name__}: {e}",
              file=sys.stderr)
        sys.exit(2)
    print(json.dumps(res, indent=2))
    if a.out:
        from benchlib import append_result  # (here: the tests load this file by its path, without scripts/ on sys.path)

        append_result(a.out, res)


if __name__ == "__main__":
    main()
