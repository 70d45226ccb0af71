#!/usr/bin/env python
"""Where the test suite's CPU goes, by process kind.

    ERT_SUITE=1 ELASTIC_RING_TEST_CPU=tests.jsonl pytest -n 2 tests &   # the suite, marked
    python scripts/suite_cpu.py sample procs.json                     # until procs.json.stop exists
    python scripts/suite_cpu.py summary procs.json tests.jsonl [--label L] [--out FILE]

``sample`` reads /proc every 0.1 s and keeps, for every process whose environment has
``ERT_SUITE=1`` (every process the marked suite starts inherits it), its last CPU seconds (user +
system), its command line and the test it was started under (``PYTEST_CURRENT_TEST``, inherited).
Processes that live less than 0.1 s are missed. ``summary`` adds them up by kind (workers, the
zygotes with their forked children, Ray's workers, controllers, the rest) and per test, with the
per-test wall and CPU that ``ELASTIC_RING_TEST_CPU`` (tests/conftest.py) recorded.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import time
from pathlib import Path


def sample(out: str) -> None:
    seen: dict[str, dict | None] = {}
    tick = os.sysconf("SC_CLK_TCK")
    while not os.path.exists(out + ".stop"):
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                if pid not in seen:
                    env = open(f"/proc/{pid}/environ", "rb").read()
                    if b"ERT_SUITE=1\0" not in env:
                        seen[pid] = None
                        continue
                    test = next((kv.split(b"=", 1)[1].decode(errors="replace") for kv in env.split(b"\0")
                                 if kv.startswith(b"PYTEST_CURRENT_TEST=")), "")
                    seen[pid] = {"cmd": "", "cpu": 0.0, "test": test}
                rec = seen[pid]
                if rec is None:
                    continue
                f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
                rec["cpu"] = (int(f[11]) + int(f[12])) / tick
                cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")[:300]
                if cmd:
                    rec["cmd"] = cmd
            except (OSError, IndexError):
                pass
        time.sleep(0.1)
    Path(out).write_text(json.dumps({p: v for p, v in seen.items() if v}))


def kind(cmd: str) -> str:
    if "--zygote" in cmd:
        return "zygote (and its forked workers)"
    if "elastic_ring.worker.run" in cmd:
        return "worker command"
    if "default_worker" in cmd or "ray::" in cmd:
        return "Ray worker"
    if "cli.main train" in cmd or "elastic-ring train" in cmd:
        return "train controller"
    return "other"


def summary(procs_file: str, tests_file: str) -> dict:
    procs = json.loads(Path(procs_file).read_text())
    tests = [json.loads(line) for line in Path(tests_file).read_text().splitlines()]
    by_kind: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    for p in procs.values():
        k = by_kind[kind(p["cmd"])]
        k[0] += 1
        k[1] += p["cpu"]
    return {"processes": len(procs), "cpu_s": round(sum(p["cpu"] for p in procs.values()), 1),
            "pytest_workers_own_cpu_s": round(sum(t["self"] for t in tests), 1),
            "tests": len(tests), "test_wall_s_sum": round(sum(t["wall"] for t in tests), 1),
            "by_kind": {k: {"processes": v[0], "cpu_s": round(v[1], 1)} for k, v in sorted(by_kind.items())}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample")
    s.add_argument("out")
    m = sub.add_parser("summary")
    m.add_argument("procs")
    m.add_argument("tests")
    m.add_argument("--label", default="")
    m.add_argument("--out", default=None, help="append the summary to this JSON list file")
    a = ap.parse_args()
    if a.cmd == "sample":
        sample(a.out)
        return
    res = {"label": a.label, **summary(a.procs, a.tests)}
    print(json.dumps(res, indent=2))
    if a.out:
        path = Path(a.out)
        runs = json.loads(path.read_text()) if path.exists() else []
        path.write_text(json.dumps([*runs, res], indent=2) + "\n")


if __name__ == "__main__":
    main()
