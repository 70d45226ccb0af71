#!/usr/bin/env python
"""The tool's CPU beside the training thread (issue 50): where the CPU of a steady run goes, the
same script with and without the tool, alternating rounds.

Each run is the ``job.steps()`` case of ``scripts/bench_step_cost.py`` (``examples/mlp_digits.py``
with a timer around each block of 40 steps and nothing else changed, 2 workers,
``OMP_NUM_THREADS=1``, Horovod's cycle time 5 ms), run in these modes:

* ``plain``: ``horovodrun -np 2 --gloo`` (the library's no-tool mode);
* ``tool``: ``elastic-ring train --script ... --gpus 2``;
* ``tool_every_event``: the tool with ``ELASTIC_RING_TELEMETRY_EVERY_S=0``: the controller samples
  the workers' processes at every throughput event, as it did before it sampled at most once a
  second;
* ``tool_nozygote``: the tool with ``ELASTIC_RING_NO_ZYGOTE=1``: each worker a new interpreter
  started by its worker command, in the session (so the scheduler's autogroup) of Horovod's
  middleman, as plain Horovod's are, where the fork server's workers share the fork server's one.

Per thread name and kind (``threads``), in the same window: the wake-ups a second (voluntary
context switches: each a sleep that ended), the times a second it was taken off its core while it
could run (involuntary switches), its CPU % and how many such threads.

In a steady window (from the end of the third block to the end of the third-to-last), the CPU
seconds of every thread of every process the run started (``/proc``, psutil) over the window's
wall time, in % of one core, by kind: the ranks' training threads (the thread whose id is the
process's: the script's own), the ranks' other threads (Horovod's background thread, gloo's, the
library's heartbeat, progress and vote threads), the controller (``elastic-ring train``), the
launchers (horovodrun, the tool's ``hvdrun``, the worker commands that wait on a forked worker)
and the rest (the fork server, Horovod's middlemen). A rank is a process that wrote a block time.
The machine has 2 cores: the two training threads want both.

Per mode the medians over the rounds, and per round the paired ratio of the median block time
(tool over plain, same round); the load before and after every round.

    .venv/bin/python scripts/bench_tool_cpu.py --rounds 3        # results/bench_tool_cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_step_cost as bsc  # noqa: E402  (the same case, its timer and commands)
from benchlib import ROOT, spread, write_results  # noqa: E402

OUT = ROOT / "results" / "bench_tool_cpu.json"
MODES = ("plain", "tool", "tool_every_event", "tool_nozygote")
KINDS = ("rank_training_thread", "rank_other_threads", "controller", "launchers", "other")


def _blocks_done(out: Path) -> int:
    """How many blocks some rank has timed so far (a line being written is left for later)."""
    try:
        lines = out.read_text().splitlines()
    except OSError:
        return 0
    done = set()
    for ln in lines:
        try:
            done.add(json.loads(ln)["epoch"])
        except ValueError:
            continue
    return len(done)


def _pids(out: Path) -> set[int]:
    return {json.loads(ln)["pid"] for ln in out.read_text().splitlines() if ln.strip()}


def _switches(pid: int, tid: int) -> tuple[str, int, int]:
    """A thread's name and its voluntary and involuntary context switches so far (its
    ``/proc/PID/task/TID`` files: a voluntary switch is a sleep, so one wake-up after it; an
    involuntary one, the thread taken off its core while it could run)."""
    base = f"/proc/{pid}/task/{tid}/"
    try:
        name = Path(base + "comm").read_text().strip()
        vol = inv = 0
        for ln in Path(base + "status").read_text().splitlines():
            if ln.startswith("voluntary_ctxt_switches:"):
                vol = int(ln.split()[1])
            elif ln.startswith("nonvoluntary_ctxt_switches:"):
                inv = int(ln.split()[1])
        return name, vol, inv
    except (OSError, ValueError):
        return "?", 0, 0


def _threads(root: psutil.Process) -> dict[tuple[int, int], tuple[str, float, str, int, int]]:
    """(pid, tid) -> (the process's command line, the thread's CPU seconds, its name, its voluntary
    and involuntary context switches) under ``root``."""
    snap: dict[tuple[int, int], tuple[str, float, str, int, int]] = {}
    for p in [root, *root.children(recursive=True)]:
        try:
            cmd = " ".join(p.cmdline())
            for t in p.threads():
                snap[(p.pid, t.id)] = (cmd, t.user_time + t.system_time, *_switches(p.pid, t.id))
        except psutil.Error:
            continue
    return snap


def kind_of(cmd: str, pid: int, tid: int, ranks: set[int]) -> str:
    if pid in ranks:
        return "rank_training_thread" if tid == pid else "rank_other_threads"
    if "elastic_ring.cli.main train" in cmd:
        return "controller"
    if "horovodrun" in cmd or "elastic_ring.controller.hvdrun" in cmd or "elastic_ring.worker.run" in cmd:
        return "launchers"
    return "other"


def one_run(mode: str, blocks: int, work: Path) -> dict:
    folder = Path(tempfile.mkdtemp(dir=work))
    name, edits, extra = bsc.CASES[("steps", "horovod")]
    script = bsc.timed_copy(name, edits, folder)
    out, run = folder / "times.jsonl", folder / "run"
    env = bsc.env_for("plain" if mode == "plain" else "tool", out, False)
    env.pop("ELASTIC_RING_TELEMETRY_EVERY_S", None)
    if mode == "tool_every_event":
        env["ELASTIC_RING_TELEMETRY_EVERY_S"] = "0"
    env.pop("ELASTIC_RING_NO_ZYGOTE", None)
    if mode == "tool_nozygote":
        env["ELASTIC_RING_NO_ZYGOTE"] = "1"
    if mode == "plain":
        env["ELASTIC_RING_STEPS"] = str(bsc.BLOCK * blocks)
    cmd = bsc.command("steps", "horovod", "plain" if mode == "plain" else "tool", script,
                      [*bsc.SIZES["small"], *extra], blocks, run)
    log = open(folder / "out.log", "w")
    p = subprocess.Popen(cmd, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT)
    root = psutil.Process(p.pid)
    try:
        def wait_blocks(n: int) -> None:
            t0 = time.monotonic()
            while _blocks_done(out) < n:
                if p.poll() is not None or time.monotonic() - t0 > 600:
                    raise bsc.BenchError(f"{mode}: the run ended (or stalled) before block {n}: "
                                         f"{(folder / 'out.log').read_text()[-1500:]}")
                time.sleep(0.01)

        wait_blocks(3)
        a, ta = _threads(root), time.perf_counter()
        wait_blocks(blocks - 2)
        b, tb = _threads(root), time.perf_counter()
        rc = p.wait(timeout=600)
    finally:
        if p.poll() is None:
            p.kill()
        log.close()
    if rc != 0:
        raise bsc.BenchError(f"{mode}: exit {rc}: {(folder / 'out.log').read_text()[-1500:]}")
    window = tb - ta
    ranks = _pids(out)
    cpu = dict.fromkeys(KINDS, 0.0)
    sw: dict[str, list[float]] = {}  # "kind/thread name" -> [wake-ups, preemptions, CPU s, threads]
    for key, (cmdline, s1, name, v1, i1) in b.items():
        _, s0, _, v0, i0 = a.get(key, (cmdline, 0.0, name, 0, 0))
        kind = kind_of(cmdline, key[0], key[1], ranks)
        cpu[kind] += max(0.0, s1 - s0)
        row = sw.setdefault(f"{kind}/{name}", [0.0, 0.0, 0.0, 0])
        row[0] += v1 - v0
        row[1] += i1 - i0
        row[2] += max(0.0, s1 - s0)
        row[3] += 1
    return {"block_s": statistics.median(bsc.epoch_times(out)), "window_s": window,
            "cpu_percent": {k: 100.0 * v / window for k, v in cpu.items()},
            "cpu_percent_total": 100.0 * sum(cpu.values()) / window, "ranks": len(ranks),
            "threads": {k: {"wakeups_per_s": v / window, "preempted_per_s": i / window,
                            "cpu_percent": 100.0 * c / window, "threads": n}
                        for k, (v, i, c, n) in sorted(sw.items())}}


SWITCHES = ("training_preempted", "other_preempted", "other_wakeups")


def _switch_sum(run: dict, what: str) -> float:
    """A run's switches a second, added up over both ranks: ``training_preempted`` (the training
    threads taken off their cores), ``other_preempted`` and ``other_wakeups`` (the ranks' other
    threads)."""
    kind, field = {"training_preempted": ("rank_training_thread/", "preempted_per_s"),
                   "other_preempted": ("rank_other_threads/", "preempted_per_s"),
                   "other_wakeups": ("rank_other_threads/", "wakeups_per_s")}[what]
    return sum(v[field] for k, v in run["threads"].items() if k.startswith(kind))


def summarise(rounds: list[dict]) -> dict:
    modes = sorted({m for r in rounds for m in r["runs"]}, key=MODES.index)
    out: dict = {"modes": {}, "paired_block_ratio": {}}
    for m in modes:
        runs = [r["runs"][m] for r in rounds if m in r["runs"]]
        out["modes"][m] = {"block_s": spread([x["block_s"] for x in runs]),
                           "cpu_percent_total": spread([x["cpu_percent_total"] for x in runs]),
                           "cpu_percent": {k: spread([x["cpu_percent"][k] for x in runs]) for k in KINDS}}
        names = sorted({k for x in runs for k in x.get("threads", {})})
        if names:  # (files written before the thread rates have none)
            out["modes"][m]["switches_per_s"] = {f: spread([_switch_sum(x, f) for x in runs]) for f in SWITCHES}
            out["modes"][m]["threads"] = {
                k: {f: statistics.median(x["threads"].get(k, {}).get(f, 0.0) for x in runs)
                    for f in ("wakeups_per_s", "preempted_per_s", "cpu_percent")} for k in names}
    for m in modes:
        if m != "plain" and "plain" in modes:
            out["paired_block_ratio"][f"{m}/plain"] = spread(
                [r["runs"][m]["block_s"] / r["runs"]["plain"]["block_s"] for r in rounds])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--blocks", type=int, default=40, help="blocks of %d steps a run" % bsc.BLOCK)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    modes = [m for m in a.modes.split(",") if m]
    if not modes or not set(modes) <= set(MODES):
        ap.error(f"--modes: {a.modes!r}: a comma-separated list of {', '.join(MODES)}")
    if a.rounds < 1 or a.blocks < 8:
        ap.error("--rounds must be at least 1 and --blocks at least 8")
    load_start = os.getloadavg()[0]
    rounds = []
    with tempfile.TemporaryDirectory(prefix="bench-tool-cpu-") as work:
        for i in range(a.rounds):
            order = modes if i % 2 == 0 else modes[::-1]
            rnd: dict = {"load_before": os.getloadavg()[0], "order": order, "runs": {}}
            for m in order:
                r = rnd["runs"][m] = one_run(m, a.blocks, Path(work))
                print(f"round {i + 1} {m}: {r['block_s'] * 1e3:.1f} ms a block; CPU % of a core: "
                      + ", ".join(f"{k} {v:.1f}" for k, v in r["cpu_percent"].items()), flush=True)
            rnd["load_after"] = os.getloadavg()[0]
            rounds.append(rnd)
    out = {"settings": {"rounds": a.rounds, "blocks": a.blocks, "block_steps": bsc.BLOCK, "modes": modes,
                        "case": "steps/horovod/small", "workers": 2},
           "summary": summarise(rounds), "rounds": rounds}
    write_results(a.out, out, load_start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
