#!/usr/bin/env python
"""Where the test suite's CPU goes, by process kind.

    ERT_SUITE=1 ELASTIC_RING_TEST_CPU=tests.jsonl pytest -n 2 tests &   # the suite, marked
    python scripts/suite_cpu.py sample procs.json                     # until procs.json.stop exists
    python scripts/suite_cpu.py summary procs.json tests.jsonl [--label L] [--out FILE]

``sample`` reads /proc every 0.1 s and keeps, for every process whose environment has
``ERT_SUITE=1`` (every process the marked suite starts inherits it), its last CPU seconds (user +
system), its first command line, when it was first and last seen, the test it was started under
(``PYTEST_CURRENT_TEST``, inherited) and the test folder it works in (``where``: the first folder
under pytest's ``popen-gwN`` in its working directory or among its open files). The folder is what
tells a forked worker's test: a fork server shared by the session (the zygote) and Ray's nodes hand
their own environment, that of the test that started them, to every process they start.
Processes that live less than 0.1 s are missed. A process is its pid with its start time (a pid
used again later in a long run is another process; before 2026-12-08 it was the pid alone, so a
reused pid's record took the later process's CPU in place of the earlier one's, under the earlier
one's command, test and folder: the entries of ``results/ci/suite_cpu.json`` up to [7] were sampled
so, and undercount). ``summary`` adds them up by kind (workers, the
zygotes with their forked children, Ray's workers, controllers, the rest), with the per-test wall
and CPU that ``ELASTIC_RING_TEST_CPU`` (tests/conftest.py) recorded; ``--top N`` also prints the N
test folders whose processes took the most CPU, by kind (Ray's own folder is ``ray``).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time
from pathlib import Path


def _where(pid: str) -> str:
    """The test folder (under pytest's ``popen-gwN``) that ``pid`` works in or has a file open in."""
    paths = []
    try:
        paths.append(os.readlink(f"/proc/{pid}/cwd"))
        paths += [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")[:40]]
    except OSError:
        pass
    for path in paths:
        parts = path.split("/")
        for i, part in enumerate(parts[:-1]):
            if part.startswith("popen-gw"):
                return parts[i + 1]
    return ""


def sample(out: str) -> None:
    seen: dict[str, dict | None] = {}
    tick = os.sysconf("SC_CLK_TCK")
    while not os.path.exists(out + ".stop"):
        now = time.time()
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
                key = f"{pid}:{f[19]}"  # with its start time: a pid used again later is another process
                if key not in seen:
                    env = open(f"/proc/{pid}/environ", "rb").read()
                    if b"ERT_SUITE=1\0" not in env:
                        seen[key] = None
                        continue
                    test = next((kv.split(b"=", 1)[1].decode(errors="replace") for kv in env.split(b"\0")
                                 if kv.startswith(b"PYTEST_CURRENT_TEST=")), "")
                    seen[key] = {"cmd": "", "cpu": 0.0, "test": test, "t0": now, "t1": now, "where": "", "looks": 0}
                rec = seen[key]
                if rec is None:
                    continue
                rec["cpu"] = (int(f[11]) + int(f[12])) / tick
                rec["t1"] = now
                if not rec["cmd"]:  # the first (Ray renames its workers' processes later)
                    rec["cmd"] = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(
                        errors="replace")[:300]
                if not rec["where"] and rec["looks"] < 30:  # (a forked worker opens its log soon)
                    rec["looks"] += 1
                    rec["where"] = _where(pid)
            except (OSError, IndexError):
                pass
        time.sleep(0.1)
    Path(out).write_text(json.dumps({p: v for p, v in seen.items() if v}))


def kind(cmd: str) -> str:
    if "--zygote" in cmd:
        return "zygote (and its forked workers)"
    if "elastic_ring.controller.hvdrun" in cmd or "bin/horovodrun" in cmd:  # (their commands name the workers.)
        return "launchers (hvdrun, horovodrun, their middlemen)"
    if "elastic_ring.worker.run" in cmd:
        return "worker command"
    if "default_worker" in cmd or "ray::" in cmd:
        return "Ray worker"
    if "cli.main train" in cmd or "elastic-ring train" in cmd:
        return "train controller"
    return "other"


def by_folder(procs: dict, top: int) -> list[dict]:
    """The ``top`` test folders whose processes (``sample``'s records) took the most CPU (a process
    with no folder counts under its test's name, from its environment), by kind."""
    folders: dict[str, dict] = collections.defaultdict(lambda: {"processes": 0, "cpu_s": 0.0,
                                                                "by_kind": collections.Counter()})
    for p in procs.values():
        name = p.get("where") or (p["test"].split(" ")[0].split("::")[-1] if p["test"] else "(none)")
        f = folders[name]
        f["processes"] += 1
        f["cpu_s"] += p["cpu"]
        f["by_kind"][kind(p["cmd"])] += p["cpu"]
    rows = sorted(folders.items(), key=lambda kv: -kv[1]["cpu_s"])[:top]
    return [{"folder": k, "processes": v["processes"], "cpu_s": round(v["cpu_s"], 1),
             "by_kind": {kk: round(vv, 1) for kk, vv in v["by_kind"].most_common()}} for k, v in rows]


def summary(procs: dict, tests_file: str) -> dict:
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
    m.add_argument("--top", type=int, default=0, help="also the N test folders that took the most CPU")
    a = ap.parse_args()
    if a.cmd == "sample":
        sample(a.out)
        return
    try:
        procs = json.loads(Path(a.procs).read_text())
        res = {"label": a.label, **summary(procs, a.tests)}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:  # (a missing, cut or foreign file)
        print(f"suite_cpu: error: cannot read {a.procs} and {a.tests} as sample's and the accounting's files: "
              f"{type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(2)
    if a.top:
        res["top_folders"] = by_folder(procs, a.top)
    print(json.dumps(res, indent=2))
    if a.out:
        from benchlib import append_result  # (here: the tests load this file by its path, without scripts/ on sys.path)

        append_result(a.out, res)


if __name__ == "__main__":
    main()
