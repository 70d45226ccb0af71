#!/usr/bin/env python
"""make test in two lanes against one lane: the whole suite's wall time, alternating runs.

    python scripts/bench_test_lanes.py [--pairs 2] [--label L] [--out results/ci/test_lanes.json]

Each pair runs ``scripts/run_tests.py --one-lane`` (the unit and integration tests in one
pytest-xdist run on 2 workers, the unit tests after the integration tests: make test before) and
``scripts/run_tests.py`` (the integration tests on 2 workers and the unit tests beside them in one
process at nice 10: make test now), in turns (one lane first in odd pairs, two lanes first in even
ones), 20 s apart. Per run: the wall time of the tests (run_tests.py's last line), pytest's counts,
its exit status, the machine's CPU counters over the run (``/proc/stat``: user, nice, system,
idle, iowait, steal, in core-seconds) and the 1-minute load before and after. Per mode the median
wall time and its range, and per pair the ratio two lanes / one lane, with their median. Appended
to ``--out`` (a JSON list), one entry per invocation. Nothing else should run meanwhile; each run
takes about 10 minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import ROOT, STAT_FIELDS, append_result, cpu_counters  # noqa: E402

MODES = {"one_lane": ["--one-lane"], "two_lanes": []}
_LAST = re.compile(r"^make test: (passed|FAILED): (.*) in (\d+\.\d+) s of tests")


def parse_last(text: str) -> tuple[str, str, float] | None:
    """run_tests.py's last line: (passed or FAILED, pytest's counts, the tests' seconds)."""
    for line in reversed(text.splitlines()):
        m = _LAST.match(line)
        if m:
            return m.group(1), m.group(2), float(m.group(3))
    return None


def one_run(mode: str, log: Path) -> dict:
    load0, c0 = os.getloadavg()[0], cpu_counters()
    t0 = time.monotonic()
    with open(log, "w") as out:
        rc = subprocess.call([sys.executable, str(ROOT / "scripts" / "run_tests.py"), *MODES[mode]], cwd=ROOT,
                             stdout=out, stderr=subprocess.STDOUT)
    wall = time.monotonic() - t0
    c1, load1 = cpu_counters(), os.getloadavg()[0]
    last = parse_last(log.read_text(errors="replace"))
    cpu = {k: round(c1[k] - c0[k], 1) for k in STAT_FIELDS}
    busy = sum(v for k, v in cpu.items() if k not in ("idle", "iowait"))
    return {"mode": mode, "exit": rc, "result": last[0] if last else None, "counts": last[1] if last else None,
            "tests_s": last[2] if last else None, "command_s": round(wall, 2), "cpu_core_s": cpu,
            "busy_core_s": round(busy, 1), "load_before": round(load0, 2), "load_after": round(load1, 2)}


def summarize(runs: list[dict]) -> dict:
    out: dict = {}
    for mode in MODES:
        w = [r["tests_s"] for r in runs if r["mode"] == mode and r["tests_s"] is not None]
        if w:
            out[mode] = {"runs": len(w), "median_s": round(statistics.median(w), 2), "min_s": min(w), "max_s": max(w)}
    ratios = []
    for i in range(0, len(runs) - 1, 2):
        pair = {r["mode"]: r["tests_s"] for r in runs[i:i + 2]}
        if pair.get("one_lane") and pair.get("two_lanes"):
            ratios.append(round(pair["two_lanes"] / pair["one_lane"], 3))
    out["pair_ratios_two_over_one"] = ratios
    if ratios:
        out["median_ratio"] = round(statistics.median(ratios), 3)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--label", default="")
    ap.add_argument("--logs", type=Path, default=None, help="folder for each run's output (default: a new one in /tmp)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "ci" / "test_lanes.json")
    a = ap.parse_args(argv)
    if a.pairs < 1:
        ap.exit(2, f"bench_test_lanes.py: --pairs must be at least 1, got {a.pairs}\n")
    if a.out.exists():  # (checked before the runs, which take about 45 minutes; appended after them)
        try:
            ok = isinstance(json.loads(a.out.read_text()), list)
        except ValueError:
            ok = False
        if not ok:
            ap.exit(2, f"bench_test_lanes.py: {a.out} is not a JSON list\n")
    logs = a.logs or Path(tempfile.mkdtemp(prefix="lanes."))
    logs.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    runs: list[dict] = []
    for p in range(a.pairs):
        order = ["one_lane", "two_lanes"] if p % 2 == 0 else ["two_lanes", "one_lane"]
        for mode in order:
            if runs:
                time.sleep(20)
            r = one_run(mode, logs / f"pair{p + 1}-{mode}.log")
            r["pair"] = p + 1
            runs.append(r)
            print(f"pair {p + 1} {mode}: {r['tests_s']} s of tests ({r['result']}: {r['counts']}), busy "
                  f"{r['busy_core_s']} core-s, load {r['load_before']} -> {r['load_after']}", flush=True)
    entry = {"label": a.label, "commit": commit, "time": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
             "cores": os.cpu_count(), "runs": runs, "summary": summarize(runs)}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    append_result(a.out, entry)
    print(json.dumps(entry["summary"], indent=1))
    print(f"wrote {a.out} (logs in {logs})")
    return 0 if all(r["exit"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
