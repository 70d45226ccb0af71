#!/usr/bin/env python
"""The library's own cost per step: the same script with and without the tool, per form and
collective, small and large steps, alternating rounds (issue 50).

Each case is one example script, given a timer and nothing else (a copy in a temporary folder with
``perf_counter`` around each epoch's training loop, or around each block of ``BLOCK`` steps of a
``job.steps()`` loop; every rank appends its times to ``BENCH_OUT``), run with 2 workers and
``OMP_NUM_THREADS=1`` in these modes:

* ``plain``: the library's no-tool mode (``torchrun --standalone --nproc-per-node 2`` for the
  ``--collective torch`` script, ``horovodrun -np 2 --gloo`` for the Horovod ones, with the
  tool's Horovod cycle time on CPUs, ``HOROVOD_CYCLE_TIME=5``, unless the environment sets one:
  the library's cost, not its tuning, is measured);
* ``tool``: ``elastic-ring train --script ... --gpus 2`` with no resize (the stop vote's period
  adapting to the step time);
* ``tool_k1``: the same with ``ELASTIC_RING_STOP_LATENCY_MS=0`` (a stop vote after every step,
  the library before issue 50);
* ``tool_spin``: ``tool`` with ``ELASTIC_RING_HOROVOD_WAIT=spin`` (a Horovod worker waits for its
  collectives as Horovod does, even on a machine whose load says crowded), and ``tool_nozygote``:
  ``tool`` with ``ELASTIC_RING_NO_ZYGOTE=1`` (each worker a process of its own, not forked from the
  fork server): not in the default modes; each takes one of the tool's differences away;
* ``timed``: ``tool`` with ``ELASTIC_RING_STEP_COST=1``: the in-process measure below. Not part of
  the paired ratios (its timers are in its time), and not run with ``--modes`` lacking it;
* ``timed_nozygote``: ``timed`` with ``ELASTIC_RING_NO_ZYGOTE=1``: the same measure with each
  worker in a process of its own (so, as plain Horovod's, in a session and a scheduler group of
  its own: docs/reports/worker.md); its figures in ``in_process_nozygote``. Not in the defaults;
* ``timed_lists``: ``timed`` with ``ELASTIC_RING_STEP_COST_LISTS=1``: the meter as it was before
  it stopped timing plain list iterators (the epoch loops' sampler hands the loader one: an entry
  per index, no code of ours in it); its figures in ``in_process_lists``. Not in the defaults;
* ``plain_timed``: ``plain`` with the same measure (``ELASTIC_RING_STEP_COST=1`` and
  ``ELASTIC_RING_STEP_COST_DIR``): the same entry points timed in the library's no-tool mode, for
  the scripts of our library (not ``hvd_elastic``, whose plain run is Horovod's own).

The forms: ``epochs`` (``examples/ddp_epochs.py`` on torch.distributed, ``examples/mlp_epochs.py``
on Horovod: optimizer hooks, the sampler), ``steps`` (``examples/mlp_digits.py``: ``job.steps()``),
``hvd_elastic`` (``examples/hvd_elastic_mlp.py``: the Horovod Elastic adapter, a commit a step;
its plain run is Horovod's own ``hvd.elastic``, whose commit also broadcasts the host updates, a
blocking collective the tool's ``state.commit()`` replaces by its stop vote);
``small`` is ``--hidden 512 --batch-size 16``, ``large`` ``--hidden 4096 --batch-size 32``. The
built-in trainer (``builtin``, no plain mode: ``tool`` against ``tool_k1`` only) is timed by its
throughput events, and a live resize of it (``latency``: 2 workers -> 1 by ``elastic-ring resize``)
gives the seconds from the request, and from the controller's stop file, to the workers' agreement
on the stop step. A run's figure is the median epoch (block) time of epochs 2..N, the slowest
rank's; per case the medians over the rounds, and the paired ratios (tool / plain in the same
round). The machine's load (``os.getloadavg``) is recorded before and after each round. With
``ELASTIC_RING_STEP_COST=parts`` in the ``tool`` and ``tool_k1`` runs (``--profile``) every rank's
timed parts of the step boundary (:mod:`elastic_ring.worker.stepcost`) are kept in the results too
(they add a microsecond or so per timed call).

The end-to-end ratios compare whole runs, so they carry the machine's noise between runs (on a
shared 2-core machine the rounds of one case spread by up to 0.6). The ``in_process`` section does
not: in the ``timed`` runs every rank measures itself, on its training thread, in the same run
(:mod:`elastic_ring.worker.stepcost`). Per case and round, the rank with the most library time:

* ``library_us_per_step``: the time the training thread spent inside the library's entry points
  (the loop's ``next()``, the optimizer's hooks, the samplers, ``job.record``, the Horovod
  Elastic adapter's hooks and commits; the outermost counted once), per step of the steady
  segment (from the end of its second step to the end of its last), evaluations and checkpoints
  taken out (``aside_us_per_step``, apart); less the timers' own bias, calibrated in the process
  (``library_us_per_step_net``, the figure judged); ``median_step_library_us`` and
  ``p90_step_library_us``: the library's time of the median and the 90th-percentile step (a
  loaded machine's preemptions inflate single steps: the mean holds them);
* ``step_us``: the step's own wall time on the training thread over the same steps (the library's
  part included, the aside not);
* ``share``: the net library time over the step; ``target_us``: the issue's bound, the larger of 1%
  of the step and 100 us; ``within_target``: the net figure at most that.
* ``library_cpu_us_per_step_net``: the training thread's CPU time in the same entries
  (``time.thread_time_ns``, the clocks' own bias taken out): the wall figure less the time the
  thread was off its core inside them (another thread run in its place, a wait); per case its
  median over the rounds and ``cpu_within_target`` (every round at most the target).

Per case the medians over the rounds, and whether every round was within the target. What runs on
the collectives' own threads and the heartbeat and progress writers' threads is not in it (the
end-to-end ratios hold it).

What the tool adds (``added_us_per_step``): the same script calls the same entry points without
the tool (``plain_timed``): the sampler's batches, ``job.record``, the loops' ``next()``, the
optimizer's hooks. What they take there is the script's work that the tool's figure also holds:
taking a step's indices, and the first microseconds after a step, when the caches hold the step's
tensors and whatever code runs first runs several times slower (docs/reports/worker.md, "The first
microseconds after a step"). Per round and rank the tool's net figure less the plain run's of the
same rank, the largest over the ranks; per case the median over the rounds and whether every round
was within the target (``added_within_target``). Cases with no plain run of our library
(``hvd_elastic``, ``builtin``) have none.

    .venv/bin/python scripts/bench_step_cost.py --rounds 3          # results/bench_step_cost.json
    .venv/bin/python scripts/bench_step_cost.py --quick             # one round, small steps, fewer epochs
    .venv/bin/python scripts/bench_step_cost.py --rounds 1 --modes timed,plain_timed   # the in-process figures only
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import BIN, ROOT, exit_on_sigterm, write_results  # noqa: E402

OUT = ROOT / "results" / "bench_step_cost.json"
SIZES = {"small": ["--hidden", "512", "--batch-size", "16"], "large": ["--hidden", "4096", "--batch-size", "32"]}
BLOCK = 40  # steps per timed block of a job.steps() loop
TRIES = 3  # runs of a case that fails (then the benchmark stops)
TOOL_TIMED = ("timed", "timed_nozygote", "timed_lists")  # the tool's runs timed in the process (in_process())
TIMED = (*TOOL_TIMED, "plain_timed")  # every mode timed in the process

_TIMER = '''import json as _bench_json, os as _bench_os, time as _bench_time


def _bench_mark(epoch, t0):
    with open(_bench_os.environ["BENCH_OUT"], "a") as _f:
        _f.write(_bench_json.dumps({"pid": _bench_os.getpid(), "epoch": int(epoch),
                                    "s": _bench_time.perf_counter() - t0}) + "\\n")


'''

# (example, where the timer goes: [(text, replacement)], the script's own arguments)
CASES = {
    ("epochs", "torch"): ("ddp_epochs.py", [
        ("        train(epoch)\n",
         "        _t0 = _bench_time.perf_counter()\n        train(epoch)\n        _bench_mark(epoch, _t0)\n")],
        ["--log-interval", "100000"]),
    ("epochs", "horovod"): ("mlp_epochs.py", [
        ("        train(epoch)\n",
         "        _t0 = _bench_time.perf_counter()\n        train(epoch)\n        _bench_mark(epoch, _t0)\n")],
        ["--log-interval", "100000"]),
    ("steps", "horovod"): ("mlp_digits.py", [
        ("    for step in job.steps():\n",
         "    _t0 = _bench_time.perf_counter()\n    for step in job.steps():\n"),
        ("        job.record(loss, samples=len(idx))\n",
         "        job.record(loss, samples=len(idx))\n"
         f"        if step % {BLOCK} == 0:\n"
         f"            _bench_mark(step // {BLOCK}, _t0)\n"
         "            _t0 = _bench_time.perf_counter()\n")],
        []),
    ("hvd_elastic", "horovod"): ("hvd_elastic_mlp.py", [
        ("        while state.epoch < a.epochs:\n",
         "        while state.epoch < a.epochs:\n            _t0 = _bench_time.perf_counter()\n"),
        ("            state.epoch, state.batch = state.epoch + 1, 0\n",
         "            _bench_mark(state.epoch + 1, _t0)\n"
         "            state.epoch, state.batch = state.epoch + 1, 0\n")],
        ["--train-size", "1440"]),
}


class BenchError(RuntimeError):
    pass


def timed_copy(name: str, edits: list[tuple[str, str]], folder: Path) -> Path:
    """The example with the timer and nothing else changed."""
    src = (ROOT / "examples" / name).read_text()
    for old, new in edits:
        if src.count(old) != 1:
            raise BenchError(f"examples/{name}: the timer's anchor {old.strip()!r} is not there once")
        src = src.replace(old, new)
    head, sep, rest = src.partition("\nimport ")  # after the module docstring and __future__
    path = folder / name
    path.write_text(head + "\n" + _TIMER + sep.lstrip("\n") + rest)
    return path


def env_for(mode: str, out: Path, profile: bool) -> dict[str, str]:
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", PYTHONPATH=str(ROOT),
               OMP_NUM_THREADS="1", BENCH_OUT=str(out), PYTHONUNBUFFERED="1")
    for k in ("ELASTIC_RING_STOP_LATENCY_MS", "ELASTIC_RING_STEP_COST", "ELASTIC_RING_HOROVOD_WAIT",
              "ELASTIC_RING_NO_ZYGOTE", "ELASTIC_RING_STEP_COST_LISTS"):  # (a caller's setting of a mode's knob would leak into the others)
        env.pop(k, None)
    if mode == "tool_k1":
        env["ELASTIC_RING_STOP_LATENCY_MS"] = "0"
    elif mode == "tool_spin":
        env["ELASTIC_RING_HOROVOD_WAIT"] = "spin"
    elif mode in ("tool_nozygote", "timed_nozygote"):
        env["ELASTIC_RING_NO_ZYGOTE"] = "1"
    elif mode == "timed_lists":
        env["ELASTIC_RING_STEP_COST_LISTS"] = "1"
    env.setdefault("HOROVOD_CYCLE_TIME", "5")  # the tool's own on CPUs (plain Horovod's default: 1 ms)
    if mode in TIMED:
        env["ELASTIC_RING_STEP_COST"] = "1"  # the library's own time per step (no part timed)
    if mode == "plain_timed":
        env["ELASTIC_RING_STEP_COST_DIR"] = str(out.parent / "plain_stepcost")
    elif profile and mode != "plain":
        env["ELASTIC_RING_STEP_COST"] = "parts"
    return env


def command(form: str, coll: str, mode: str, script: Path, args: list[str], epochs: int, run: Path) -> list[str]:
    steps_form = form == "steps"
    length = ["--steps", str(BLOCK * epochs)] if steps_form else []
    own = args if steps_form else [*args, "--epochs", str(epochs)]
    if mode in ("plain", "plain_timed"):
        if coll == "torch":
            return [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", str(script), *own]
        return [str(BIN / "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, str(script), *own]
    return [sys.executable, "-m", "elastic_ring.cli.main", "train", "--script", str(script), "--gpus", "2",
            "--slots", "2", "--collective", coll, *length, "--run-dir", str(run), "--", *own]


def epoch_times(out: Path) -> list[float]:
    """Per epoch (block) from the second on, the slowest rank's time."""
    by_epoch: dict[int, float] = {}
    for ln in out.read_text().splitlines() if out.exists() else []:
        r = json.loads(ln)
        by_epoch[r["epoch"]] = max(by_epoch.get(r["epoch"], 0.0), r["s"])
    return [by_epoch[e] for e in sorted(by_epoch)[1:]]


def stepcost(run: Path) -> list[dict]:
    return [json.loads(f.read_text()) for f in sorted((run / "stepcost").glob("*.json"))]


LIBRARY_KEYS = ("library_us_per_step", "library_us_per_step_net", "step_us", "share", "target_us",
                "within_target", "aside_us_per_step", "entries_per_step", "timer_bias_us", "steps",
                "median_step_library_us", "p90_step_library_us", "entries", "library_cpu_us_per_step_net",
                "cpu_timer_bias_us")


def library_figures(reports: list[dict]) -> dict:
    """A ``timed`` run's in-process figures: the rank with the most library time per step (net),
    and every rank's."""
    ranks = [{"rank": r.get("rank"), **{k: r["library"].get(k) for k in LIBRARY_KEYS}}
             for r in reports if r.get("library", {}).get("steps")]
    if not ranks:
        raise BenchError("a timed run left no step-cost report with steps")
    worst = max(ranks, key=lambda r: r["library_us_per_step_net"])
    return {**worst, "ranks": ranks}


def one_run(form: str, coll: str, size: str, mode: str, epochs: int, work: Path, profile: bool) -> dict:
    name, edits, extra = CASES[(form, coll)]
    folder = Path(tempfile.mkdtemp(dir=work))
    script = timed_copy(name, edits, folder)
    out, run = folder / "times.jsonl", folder / "run"
    env = env_for(mode, out, profile)
    if form == "steps" and mode in ("plain", "plain_timed"):
        env["ELASTIC_RING_STEPS"] = str(BLOCK * epochs)
    cmd = command(form, coll, mode, script, [*SIZES[size], *extra], epochs, run)
    for attempt in range(TRIES):
        out.unlink(missing_ok=True)
        shutil.rmtree(run, ignore_errors=True)
        t0 = time.perf_counter()
        p = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=900)
        if p.returncode == 0:
            break
        # (plain torchrun's workers sometimes abort at their exit on a loaded machine:
        # "terminate called without an active exception"; the run is made again)
        print(f"{form}/{coll}/{size}/{mode}: exit {p.returncode}, again", file=sys.stderr, flush=True)
    else:
        raise BenchError(f"{form}/{coll}/{size}/{mode}: exit {p.returncode}: {(p.stderr or p.stdout)[-1500:]}")
    times = epoch_times(out)
    if not times:
        raise BenchError(f"{form}/{coll}/{size}/{mode}: no epoch times in {out}")
    res = {"epoch_s": statistics.median(times), "epochs_s": times, "wall_s": time.perf_counter() - t0,
           "attempts": attempt + 1}
    if mode in TOOL_TIMED:
        res["library"] = library_figures(stepcost(run))
    elif mode == "plain_timed":
        plain = folder / "plain_stepcost"
        res["library"] = library_figures([json.loads(f.read_text()) for f in sorted(plain.glob("*.json"))])
    elif profile and mode != "plain":
        res["stepcost"] = stepcost(run)
    return res


def builtin_run(coll: str, mode: str, steps: int, work: Path, profile: bool) -> dict:
    """The built-in trainer (ResNet-20, digits): the median throughput window's seconds per step."""
    run = Path(tempfile.mkdtemp(dir=work)) / "run"
    env = env_for(mode, run.parent / "unused", profile)
    cmd = [sys.executable, "-m", "elastic_ring.cli.main", "train", "--gpus", "2", "--slots", "2", "--device",
           "cpu", "--collective", coll, "--steps", str(steps), "--batch-size", "16", "--set",
           "throughput_window=10", "--run-dir", str(run)]
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise BenchError(f"builtin/{coll}/{mode}: exit {p.returncode}: {(p.stderr or p.stdout)[-1500:]}")
    ev = [json.loads(ln) for ln in (run / "events.jsonl").read_text().splitlines()]
    win = [e["seconds"] / e["steps"] for e in ev if e.get("kind") == "throughput"][1:]
    res = {"step_s": statistics.median(win), "windows_s": win}
    if mode in TOOL_TIMED:
        res["library"] = library_figures(stepcost(run))
    elif profile:
        res["stepcost"] = stepcost(run)
    return res


def latency_run(mode: str, work: Path) -> dict:
    """A live resize of the built-in trainer (2 workers -> 1, from another shell once 60 steps are
    done): the seconds from the request (``elastic-ring resize``: its ``resize_requested`` event's
    time) and from the controller's stop file (the library's part: the bound is 100 ms plus a
    step) to the workers' agreement (``segment_end``'s ``stop_decided_at``), the step time then
    (the median window at 2 workers) and the vote's period and read lag rank 0 last reported."""
    from benchlib import TrainRun

    run = Path(tempfile.mkdtemp(dir=work)) / "run"
    env = env_for(mode, run.parent / "unused", False)
    args = ["--gpus", "2", "--slots", "2", "--device", "cpu", "--steps", "3000", "--batch-size", "16",
            "--set", "throughput_window=10"]
    saved = {k: os.environ.get(k) for k in ("ELASTIC_RING_STOP_LATENCY_MS",)}
    os.environ.pop("ELASTIC_RING_STOP_LATENCY_MS", None)
    if mode == "tool_k1":
        os.environ["ELASTIC_RING_STOP_LATENCY_MS"] = "0"
    try:
        with TrainRun(args, run) as tr:
            tr.wait_step(60)
            prog = json.loads((run / "control" / "progress.json").read_text())
            r = subprocess.run([sys.executable, "-m", "elastic_ring.cli.main", "resize", str(run), "--to", "1"],
                               cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
            if r.returncode != 0:
                raise BenchError(f"resize: {r.stderr.strip()}")
            while not tr.events("resize_overhead"):
                if tr.p.poll() is not None:
                    raise BenchError("the run ended before the live resize landed")
                time.sleep(0.1)
            from elastic_ring import protocol

            stop = protocol.stop_file(run, 0)
            stop_t = stop.stat().st_mtime if stop.exists() else None  # when the controller asked the workers
            req = [e for e in tr.events("resize_requested") if e["source"] == "live"][0]
            end = [e for e in tr.events("segment_end") if e["segment"] == 0][0]
            win = [e["seconds"] / e["steps"] for e in tr.events("throughput") if e["world_size"] == 2][1:]
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v
    step_s = statistics.median(win) if win else None
    lat = end["stop_decided_at"] - req["time"]
    lib = end["stop_decided_at"] - stop_t if stop_t is not None else None
    return {"latency_s": lat, "stop_file_to_agreement_s": lib, "step_s": step_s, "vote_every": prog.get("vote_every"),
            "vote_lag": prog.get("vote_lag"), "stop_step": end["step"],
            "within_100ms_plus_a_step": step_s is not None and lib is not None and lib <= 0.1 + step_s}


def summarise(rounds: list[dict]) -> dict:
    """Per case: the median over rounds of each mode's figure, and the paired ratios to plain (or,
    for the built-in trainer, tool_k1 to tool)."""
    out: dict[str, dict] = {}
    for r in rounds:
        for case, modes in r["cases"].items():
            c = out.setdefault(case, {"modes": {}, "paired": {}})
            key = "step_s" if case.startswith("builtin") else "epoch_s"
            modes = {m: res for m, res in modes.items() if m not in TIMED}  # (in_process())
            for mode, res in modes.items():
                c["modes"].setdefault(mode, []).append(res[key])
            base = "plain" if "plain" in modes else "tool"
            if base not in modes:
                continue
            for mode, res in modes.items():
                if mode != base:
                    c["paired"].setdefault(f"{mode}/{base}", []).append(res[key] / modes[base][key])
    for c in out.values():
        c["median_s"] = {m: statistics.median(v) for m, v in c["modes"].items()}
        c["median_ratio"] = {m: statistics.median(v) for m, v in c["paired"].items()}
    return out


def in_process(rounds: list[dict], mode: str = "timed") -> dict:
    """Per case, the ``timed`` runs' in-process figures (:func:`library_figures`), or another of the
    tool's timed modes' (``timed_nozygote``, ``timed_lists``): per round, and the medians over the rounds (``within_target``:
    every round within the issue's bound)."""
    out: dict[str, dict] = {}
    for r in rounds:
        for case, modes in r["cases"].items():
            if mode in modes:
                c = out.setdefault(case, {"rounds": [], "plain_rounds": [], "added_rounds": []})
                tool = modes[mode]["library"]
                c["rounds"].append(tool)
                plain = modes.get("plain_timed", {}).get("library")
                if plain is not None:
                    c["plain_rounds"].append(plain)
                    c["added_rounds"].append(added(tool, plain))
    for c in out.values():
        rs = c["rounds"]
        for k in ("library_us_per_step", "library_us_per_step_net", "step_us", "share", "target_us",
                  "aside_us_per_step"):
            c[f"median_{k}"] = statistics.median(x[k] for x in rs)
        c["within_target"] = all(x["within_target"] for x in rs)
        cpu = [x["library_cpu_us_per_step_net"] for x in rs if x.get("library_cpu_us_per_step_net") is not None]
        if cpu:  # the training thread's CPU in the entries (the wall figure less its time off the core)
            c["median_library_cpu_us_per_step_net"] = statistics.median(cpu)
            c["library_cpu_rounds"] = cpu
            c["cpu_within_target"] = all(x["library_cpu_us_per_step_net"] <= x["target_us"] for x in rs)
        if c["added_rounds"]:
            c["median_plain_us_per_step_net"] = statistics.median(x["library_us_per_step_net"]
                                                                  for x in c["plain_rounds"])
            c["median_added_us_per_step"] = statistics.median(x["added_us_per_step"] for x in c["added_rounds"])
            c["median_added_share"] = statistics.median(x["added_share"] for x in c["added_rounds"])
            c["added_within_target"] = all(x["within_target"] for x in c["added_rounds"])
    return out


def added(tool: dict, plain: dict) -> dict:
    """What the tool adds to the script's time in the library's entry points, in one round: per
    rank its net figure less the plain run's of the same rank; the rank where that is largest,
    judged against the tool's target (1% of its step or 100 us)."""
    mine = {r["rank"]: r for r in plain["ranks"]}
    best = None
    for r in tool["ranks"]:
        p = mine.get(r["rank"])
        if p is None:
            continue
        a = r["library_us_per_step_net"] - p["library_us_per_step_net"]
        if best is None or a > best["added_us_per_step"]:
            best = {"rank": r["rank"], "added_us_per_step": round(a, 2), "tool_us_per_step_net": r["library_us_per_step_net"],
                    "plain_us_per_step_net": p["library_us_per_step_net"], "step_us": r["step_us"],
                    "added_share": round(a / r["step_us"], 5) if r["step_us"] else None,
                    "target_us": r["target_us"], "within_target": a <= r["target_us"]}
    if best is None:
        raise BenchError("the timed runs' ranks and the plain timed runs' have none in common")
    return best


def main() -> int:
    exit_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="one round, small steps only, 3 epochs")
    ap.add_argument("--epochs", type=int, default=6, help="epochs (steps form: blocks of %d steps) a run" % BLOCK)
    ap.add_argument("--modes", default="plain,tool,tool_k1,timed,plain_timed")
    ap.add_argument("--profile", action="store_true", help="ELASTIC_RING_STEP_COST=parts in the tool's runs")
    ap.add_argument("--only", default="", help="comma-separated cases to run, e.g. epochs/torch,builtin/horovod")
    ap.add_argument("--sizes", default="", help="comma-separated step sizes of the scripts' cases (default: "
                    "small,large; --quick: small)")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    rounds_n, epochs = (1, 3) if a.quick else (a.rounds, a.epochs)
    sizes = ["small"] if a.quick else ["small", "large"]
    if a.sizes:
        sizes = [x for x in a.sizes.split(",") if x]
        if not set(sizes) <= set(SIZES):
            ap.error(f"--sizes: {a.sizes!r}: each of {', '.join(SIZES)}")
    modes = [m for m in a.modes.split(",") if m]
    only = {c for c in a.only.split(",") if c}
    load_start = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="bench-step-cost-"))
    rounds = []
    try:
        for i in range(rounds_n):
            order = modes if i % 2 == 0 else modes[::-1]  # alternating
            rnd: dict = {"load_before": os.getloadavg(), "order": order, "cases": {}}
            for (form, coll) in CASES:
                for size in sizes:
                    case = f"{form}/{coll}/{size}"
                    if only and f"{form}/{coll}" not in only:
                        continue
                    for mode in order:
                        if mode == "plain_timed" and form == "hvd_elastic":
                            continue  # (its plain run is Horovod's own: no entry of ours to time)
                        rnd["cases"].setdefault(case, {})[mode] = one_run(form, coll, size, mode, epochs, work,
                                                                          a.profile)
                        print(f"round {i + 1} {case} {mode}: {rnd['cases'][case][mode]['epoch_s'] * 1e3:.1f} ms "
                              f"an epoch", flush=True)
            for coll in ("horovod", "torch"):
                case = f"builtin/{coll}"
                if only and case not in only:
                    continue
                for mode in [m for m in order if m not in ("plain", "plain_timed")]:
                    rnd["cases"].setdefault(case, {})[mode] = builtin_run(coll, mode, 30 if a.quick else 80,
                                                                          work, a.profile)
                    print(f"round {i + 1} {case} {mode}: {rnd['cases'][case][mode]['step_s'] * 1e3:.2f} ms a step",
                          flush=True)
            if not only or "latency" in only:
                for mode in [m for m in order if m not in ("plain", *TIMED)]:
                    rnd.setdefault("latency", {})[mode] = lat = latency_run(mode, work)
                    lib = lat["stop_file_to_agreement_s"]
                    print(f"round {i + 1} live resize {mode}: {lat['latency_s'] * 1e3:.0f} ms from request to "
                          f"agreement, {lib * 1e3 if lib is not None else float('nan'):.0f} ms from the stop file "
                          f"(K {lat['vote_every']}, L {lat.get('vote_lag')}, steps of {(lat['step_s'] or 0) * 1e3:.1f} ms)", flush=True)
            rnd["load_after"] = os.getloadavg()
            rounds.append(rnd)
    except BenchError as e:
        print(f"bench_step_cost: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    summary = summarise(rounds)
    lats = [r["latency"][m] for r in rounds for m in r.get("latency", {})]
    lat_modes = {m for r in rounds for m in r.get("latency", {})}
    live = {m: {k: statistics.median([r["latency"][m][k] for r in rounds if m in r.get("latency", {})
                                      and r["latency"][m][k] is not None] or [float("nan")])
                for k in ("latency_s", "stop_file_to_agreement_s")} for m in sorted(lat_modes)}
    if live:
        print("live resize, median from the stop file to the agreement:",
              {m: f"{v['stop_file_to_agreement_s'] * 1e3:.0f} ms" for m, v in live.items()},
              "all within 100 ms + a step:", all(x["within_100ms_plus_a_step"] for x in lats))
    for case, c in summary.items():
        print(case, {m: f"{v * 1e3:.2f} ms" for m, v in c["median_s"].items()},
              {m: f"{v:.3f}" for m, v in c["median_ratio"].items()})
    inproc = in_process(rounds)
    extra = {f"in_process_{m[len('timed_'):]}": in_process(rounds, m)
             for m in TOOL_TIMED if m != "timed" and m in modes}
    for case, c in inproc.items():
        print(f"{case} in-process: the library {c['median_library_us_per_step_net']:.1f} us a step "
              f"(raw {c['median_library_us_per_step']:.1f}) of {c['median_step_us']:.0f} us "
              f"({c['median_share'] * 100:.2f}%; target {c['median_target_us']:.0f} us: "
              f"{'within' if c['within_target'] else 'NOT within'})")
        if "median_library_cpu_us_per_step_net" in c:
            print(f"{case} in-process: the training thread's CPU in the library {c['median_library_cpu_us_per_step_net']:.1f} "
                  f"us a step ({'within' if c['cpu_within_target'] else 'NOT within'} in every round)")
        if "median_added_us_per_step" in c:
            print(f"{case} in-process: the same entries without the tool {c['median_plain_us_per_step_net']:.1f} us "
                  f"a step; the tool adds {c['median_added_us_per_step']:.1f} us "
                  f"({c['median_added_share'] * 100:.2f}%; {'within' if c['added_within_target'] else 'NOT within'})")
    write_results(a.out, {"settings": {"rounds": rounds_n, "epochs": epochs, "sizes": sizes, "modes": modes,
                                       "block_steps": BLOCK, "workers": 2, "omp_threads": 1,
                                       "quick": a.quick, "profile": a.profile},
                          "summary": summary, "in_process": inproc, **extra, "live_resize": live,
                          "rounds": rounds},
                  load_start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
