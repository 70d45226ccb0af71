#!/usr/bin/env python
"""make test's runner: the test suite in two lanes at once.

    python scripts/run_tests.py [--workers 2] [--unit-nice 10] [--one-lane] [--basetemp DIR]

The integration tests (real horovodrun, mpirun, torchrun and Ray runs: nearly all of the suite's
time, much of it spent waiting on their processes) run on ``--workers`` pytest-xdist workers with
work stealing, longest first (``tests/conftest.py``), their output streamed. Beside them the unit
tests run in one pytest process at the lower priority ``--unit-nice``, their output kept and
printed once the integration lane has ended: they take the cores where the integration tests
leave them idle instead of running after them (docs/reports/test-time.md). The last line gives
both lanes' counts and the whole wall time. Exit status 0 when both lanes pass, 1 when either
fails, 2 for bad options.

The tests' temporary folder is short (``/tmp/ert.XXXXXXXX``, each lane's under it in ``i`` and
``u``): Ray's socket paths under it must stay under 107 characters, so the Ray tests skip where the
folder of their cluster is longer than 40 (``tests/integration/ray_cluster.py``), and pytest's
default grows with each run. It is removed when both lanes pass, and kept and named when one fails
or is interrupted.

``--one-lane`` runs the whole suite in one pytest-xdist run instead (unit tests after the
integration tests, on the same workers): the way make test ran before.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
UNIT, INTEGRATION = "tests/unit", "tests/integration"
_COUNT = re.compile(r"(\d+) (passed|failed|skipped|errors?|warnings?|xfailed|xpassed|deselected)\b")
_SECONDS = re.compile(r" in (\d+(?:\.\d+)?)s\b")
ORDER = ("failed", "passed", "skipped", "xfailed", "xpassed", "deselected", "error", "warning")


def summary(text: str) -> tuple[dict[str, int], float | None]:
    """pytest's counts (``passed``, ``failed``, ``error``, ``warning``...) and seconds from its last
    summary line in ``text`` ("3 failed, 170 passed, 1 skipped in 577.20s (0:09:37)"); ({}, None)
    where there is none (a run that never got that far)."""
    for line in reversed(text.splitlines()):
        seconds = _SECONDS.search(line)
        counts = _COUNT.findall(line)
        if seconds and counts:
            got: dict[str, int] = {}
            for n, word in counts:
                key = word.rstrip("s") if word in ("errors", "warnings") else word
                got[key] = got.get(key, 0) + int(n)
            return got, float(seconds.group(1))
    return {}, None


def counts_text(counts: dict[str, int]) -> str:
    """``counts`` as pytest words them, in pytest's order ("1 failed, 1845 passed, 5 skipped, 16 warnings")."""
    parts = []
    for key in sorted(counts, key=lambda k: ORDER.index(k) if k in ORDER else len(ORDER)):
        n = counts[key]
        word = key + ("s" if key in ("error", "warning") and n != 1 else "")
        parts.append(f"{n} {word}")
    return ", ".join(parts) or "no result"


def _pytest(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-q", *args]


def _lower_priority(nice: int):
    def pre() -> None:
        os.nice(nice)
    return pre


def run(workers: int, unit_nice: int, basetemp: Path, one_lane: bool, durations: int,
        unit: str = UNIT, integration: str = INTEGRATION) -> int:
    t0 = time.monotonic()
    if one_lane:
        rc, tail = _streamed(_xdist(workers, durations, basetemp, unit, integration))
        return _last_line(rc == 0, Counter(summary(tail)[0]), time.monotonic() - t0,
                          f"one lane on {workers} workers, exit {rc}")
    log = basetemp / "unit.log"
    with open(log, "w") as out:
        unit_proc = subprocess.Popen(_pytest("--durations=10", f"--basetemp={basetemp / 'u'}", unit), cwd=ROOT,
                                     stdout=out, stderr=subprocess.STDOUT, preexec_fn=_lower_priority(unit_nice))
    print(f"make test: the unit tests run beside the integration tests at nice {unit_nice}; their output "
          f"follows the integration tests'", flush=True)
    try:
        irc, itail = _streamed(_xdist(workers, durations, basetemp / "i", integration))
        t_int = time.monotonic() - t0
        if unit_proc.poll() is None:
            print("make test: the integration lane has ended; waiting for the unit tests", flush=True)
        urc = unit_proc.wait()
    except KeyboardInterrupt:
        if unit_proc.poll() is None:
            unit_proc.send_signal(signal.SIGINT)
            try:
                unit_proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                unit_proc.kill()
        raise
    wall = time.monotonic() - t0
    text = log.read_text(errors="replace")
    print("\n---- the unit tests (beside the integration tests) ----", flush=True)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    ucounts, usec = summary(text)
    return _last_line(irc == 0 and urc == 0, Counter(summary(itail)[0]) + Counter(ucounts), wall,
                      f"integration lane {t_int:.2f} s on {workers} workers, exit {irc}; unit lane "
                      f"{'%.2f s' % usec if usec is not None else 'no summary'} at nice {unit_nice}, exit {urc}")


def _xdist(workers: int, durations: int, basetemp: Path, *folders: str) -> list[str]:
    """pytest over ``folders`` on ``workers`` pytest-xdist workers with work stealing."""
    return _pytest("-n", str(workers), "--dist", "worksteal", f"--durations={durations}", f"--basetemp={basetemp}",
                   *folders)


def _last_line(ok: bool, counts: Counter, wall: float, detail: str) -> int:
    """The runner's last line (what scripts/bench_test_lanes.py reads); the exit status: 0 if ``ok``."""
    print(f"make test: {'passed' if ok else 'FAILED'}: {counts_text(counts)} in {wall:.2f} s of tests ({detail})",
          flush=True)
    return 0 if ok else 1


def _streamed(cmd: list[str]) -> tuple[int, str]:
    """Run ``cmd``, its output passed on to ours as it comes; its exit status and the last 64 KiB
    of its output (where pytest's summary is)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    tail = b""
    out = sys.stdout.buffer
    while True:
        chunk = os.read(proc.stdout.fileno(), 65536)
        if not chunk:
            break
        out.write(chunk)
        out.flush()
        tail = (tail + chunk)[-65536:]
    proc.stdout.close()
    return proc.wait(), tail.decode(errors="replace")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2, help="pytest-xdist workers of the integration lane (2)")
    ap.add_argument("--unit-nice", type=int, default=10, help="the unit lane's niceness, 0-19 (10)")
    ap.add_argument("--one-lane", action="store_true", help="the whole suite in one pytest-xdist run")
    ap.add_argument("--durations", type=int, default=60, help="the slowest integration tests listed (60)")
    ap.add_argument("--basetemp", type=Path, help="the tests' temporary folder (default: a new /tmp/ert.XXXXXXXX)")
    ap.add_argument("--unit", default=UNIT, help=argparse.SUPPRESS)
    ap.add_argument("--integration", default=INTEGRATION, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.workers < 1:
        ap.exit(2, f"run_tests.py: --workers must be at least 1, got {a.workers}\n")
    if not 0 <= a.unit_nice <= 19:
        ap.exit(2, f"run_tests.py: --unit-nice must be 0-19, got {a.unit_nice}\n")
    for folder in (a.unit, a.integration):
        if not (ROOT / folder).is_dir():
            ap.exit(2, f"run_tests.py: no test folder {folder}\n")
    if a.basetemp is not None:
        if a.basetemp.exists() and any(a.basetemp.iterdir()):
            ap.exit(2, f"run_tests.py: --basetemp {a.basetemp} is not empty\n")
        a.basetemp.mkdir(parents=True, exist_ok=True)
        basetemp = a.basetemp
    else:
        basetemp = Path(tempfile.mkdtemp(prefix="ert.", dir="/tmp"))
    rc = 130
    try:
        rc = run(a.workers, a.unit_nice, basetemp, a.one_lane, a.durations, a.unit, a.integration)
    finally:
        if rc == 0:
            shutil.rmtree(basetemp, ignore_errors=True)
        else:
            print(f"make test: failed; the tests' files are kept in {basetemp}", flush=True)
    return rc

if __name__ == "__main__":
    sys.exit(main())
