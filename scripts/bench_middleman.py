#!/usr/bin/env python
"""What each command horovodrun starts costs in its middleman: Horovod's spawned middleman against
the forked one of the launcher's patch ``middleman`` (:mod:`elastic_ring.hvd_patches`).

Horovod's launcher starts every command (a worker, the ssh of a remote one) through
``safe_shell_exec.execute``, which first starts a middleman process that runs the command and
ends it with its launcher. Horovod spawns that middleman (a new interpreter that imports Horovod's
runner and the launcher's main module); the controller's horovodrun forks it from a server process
started once. Each round runs, alternating, one child process per way; each child runs
``--commands`` commands (``true``) one after the other through ``execute``, as a launcher started
with ``python -m`` does (so that the spawned middleman imports that main module, as in
``elastic_ring.controller.hvdrun``). Per way: the wall time of each command (the first apart: the
forked way starts its server there) and the machine's busy CPU time over the child's commands
(``/proc/stat``, every process's, divided by the commands: the middlemen are not the child's
waited-for children in the forked way). Medians over the rounds and the ratios.

    .venv/bin/python scripts/bench_middleman.py --rounds 5     # results/bench_middleman.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import ROOT, spread, write_results  # noqa: E402

OUT = ROOT / "results" / "bench_middleman.json"
WAYS = ("spawned", "forked")


def _busy_s() -> float:
    """The machine's busy CPU seconds so far (every core, every process: /proc/stat)."""
    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def child(way: str, commands: int) -> None:
    """Run ``commands`` commands through Horovod's ``execute`` (patched for ``forked``); print a
    JSON line: each command's wall seconds and the machine's busy CPU over commands 2..N."""
    import io

    from horovod.runner.common.util import safe_shell_exec

    if way == "forked":
        from elastic_ring.hvd_patches import apply

        apply("middleman")
    walls, busy0 = [], None
    for i in range(commands):
        if i == 1:
            busy0 = _busy_s()
        out = io.StringIO()
        t0 = time.perf_counter()
        rc = safe_shell_exec.execute("true", env=dict(os.environ), stdout=out, stderr=out)
        walls.append(time.perf_counter() - t0)
        if rc != 0:
            raise SystemExit(f"the command failed ({rc}): {out.getvalue()}")
    busy = _busy_s() - busy0
    print(json.dumps({"walls_s": walls, "busy_cpu_s_per_command": busy / (commands - 1)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--commands", type=int, default=8, help="commands per child (the first is counted apart)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--child", choices=WAYS, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.commands)
        return
    if a.commands < 2 or a.rounds < 1:
        ap.error("--commands must be at least 2 and --rounds at least 1")
    load_before = os.getloadavg()[0]
    rounds = []
    for r in range(a.rounds):
        order = WAYS if r % 2 == 0 else WAYS[::-1]
        res: dict = {"load_before": os.getloadavg()[0], "order": list(order)}
        for way in order:
            # run as a module (python -m), as the controller's horovodrun is
            p = subprocess.run([sys.executable, "-m", "scripts.bench_middleman", "--child", way, "--commands",
                                str(a.commands)], cwd=ROOT, capture_output=True, text=True, timeout=600)
            if p.returncode != 0:
                raise SystemExit(f"bench_middleman: the {way} child failed: {p.stderr.strip()[-500:]}")
            got = json.loads(p.stdout.strip().splitlines()[-1])
            res[way] = {"first_ms": got["walls_s"][0] * 1e3,
                        "median_ms": statistics.median(got["walls_s"][1:]) * 1e3,
                        "busy_cpu_ms_per_command": got["busy_cpu_s_per_command"] * 1e3}
            print(f"round {r + 1} {way}: first {res[way]['first_ms']:.1f} ms, then {res[way]['median_ms']:.1f} ms "
                  f"a command, {res[way]['busy_cpu_ms_per_command']:.1f} ms of the machine's CPU", flush=True)
        res["load_after"] = os.getloadavg()[0]
        rounds.append(res)
    summary = {way: {k: spread([r[way][k] for r in rounds]) for k in ("first_ms", "median_ms",
                                                                     "busy_cpu_ms_per_command")} for way in WAYS}
    ratios = {k: spread([r["forked"][k] / r["spawned"][k] for r in rounds])
              for k in ("median_ms", "busy_cpu_ms_per_command")}
    write_results(a.out, {"settings": {"rounds": a.rounds, "commands": a.commands},
                          "summary": summary, "forked_over_spawned": ratios, "rounds": rounds}, load_before)


if __name__ == "__main__":
    main()
