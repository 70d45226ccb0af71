"""The simulator checked against the live scheduler on this machine (``scripts/cluster_check_sim.py``).

One policy per call (a few minutes each):

1. Calibrate, before the live run: one paced job (examples/paced.py: each step lasts
   --step-s / W seconds at W workers, set by a sleep, so the machine's load matters little) alone
   under `train`, started at 1 worker and resized 1 -> 2 -> ... -> S, then a second run started
   at S workers and shrunk to 1: its steps/s at each size (work over time: the steps of each
   segment over the seconds they took), the launch + shutdown time at 1 and at S workers (the
   start overhead) and the time each resize lost (`resize_overhead` events). `--calibration FILE`
   reuses an earlier run's calibration instead.
2. Live: `elastic-ring cluster up --slots S --policy P` (no profile: the scheduler plans with
   linear speed-up, as for any job without one) and a trace of 12 paced jobs of different lengths
   submitted at staggered times; JCT = finished - submitted, makespan = last finish - first
   submission, resizes = the scheduler's resize requests, exploration steps and preemptions.
3. Replay the same arrivals in the simulator (`elastic_ring.experiment.replay`) with the CALIBRATION's
   speeds and overheads (never the speeds the jobs had in the live run) and the live planner's
   view (linear speed-up); compare average JCT, makespan and resizes.
4. Each job's own steps/s at each size in the live run (work over time) against the calibration's
   at that size, with the number of jobs that ran beside it (jobs side by side must run at their
   calibrated speed).

`--example mlp --slots 2` (the same, unpaced): examples/mlp_digits.py jobs, real compute; the
calibration's speeds then come from one run per size pinned to its slots' cores, as the cluster
runs a job on W slots. Any policy `cluster up` accepts (the -rc ones too).

Writes results/cluster/live12_<policy>.json; `--summary` reads every live12_<policy>.json and
writes results/cluster/live12_summary.json and prints the table, then resizes per job and the
seconds lost to them, live and simulated.

    .venv/bin/python scripts/cluster_check_sim.py --policy precompute     # ~4-6 min on 2 cores
    .venv/bin/python scripts/cluster_check_sim.py --summary

This module runs the check (calibration, live run; :func:`check`); a run's event lines and database
are read back by :mod:`.live_records`, the launch costs are fitted and analysed in
:mod:`.live_launches`, and the replay, ``--resim`` and ``--summary`` are :mod:`.live_results`.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from elastic_ring.experiment.live_launches import launch_costs, launch_extra
from elastic_ring.experiment.live_records import _events, _first_step, _last_step, _outcome, rates
from elastic_ring.experiment.live_results import side_by_side, simulate_run


ROOT = Path(__file__).resolve().parents[2]  # the repository: examples/, results/

CLI = [sys.executable, "-m", "elastic_ring.cli.main"]
PACED = str(ROOT / "examples" / "paced.py")
SCRIPT = PACED  # the jobs' script (--example mlp: examples/mlp_digits.py)
RESULTS = ROOT / "results" / "cluster"
POLICIES = ("eight", "precompute", "srtf", "optimus", "exploratory")
# (arrival offset s, steps): 12 jobs of different lengths, staggered so that the queue builds up,
# empties and refills (jobs arrive while others run: shrinks at arrivals, grows at completions)
TRACE = [(0, 160), (5, 40), (10, 100), (25, 60), (30, 200), (45, 40),
         (70, 120), (75, 80), (80, 40), (110, 140), (120, 60), (125, 100)]
CAL_SEGMENT = 40  # steps at each size in the calibration
REPEAT_SEGMENT = 25  # steps at each size in the calibration's repeated resize runs (> one throughput window)
START_STEPS = 5  # steps of a calibration run that only measures a start
# --example mlp: two long unpaced jobs side by side
TRACE_MLP = [(0, 8000), (3, 8000), (6, 4000)]
EXAMPLES = ("paced", "mlp")


class LoadSampler(threading.Thread):
    """The machine's 1-min load average every 2 s while the check runs."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[float] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            self.samples.append(os.getloadavg()[0])
            self.halt.wait(2.0)

    def summary(self) -> dict:
        s = self.samples or [os.getloadavg()[0]]
        return {"start": round(s[0], 2), "mean": round(statistics.mean(s), 2), "min": round(min(s), 2),
                "max": round(max(s), 2), "cores": os.cpu_count()}


def _train(rd: Path, script_args: list[str], steps: int, start: int, slots: int, schedule: str,
           cores: list[int] | None = None) -> tuple[list, float]:
    """One `train` run; ``cores``: its CPU affinity (what the cluster gives a job on that many slots)."""
    t0 = time.time()
    sched = ["--schedule", schedule] if schedule else []
    r = subprocess.run([*CLI, "train", "--script", SCRIPT, "--steps", str(steps), "--gpus", str(start),
                        "--slots", str(slots), "--device", "cpu", *sched, "--run-dir", str(rd),
                        "--", *script_args], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None)
    t1 = time.time()
    if r.returncode != 0:
        raise SystemExit(f"calibration run failed: {r.stderr[-2000:]}")
    ev = _events(rd / "events.jsonl")
    return ev, (_first_step(ev) - t0) + (t1 - _last_step(ev))


def _train_pair(work: Path, tag: str, script_args: list[str], steps: int, slots: int) -> list[float]:
    """Two 1-worker `train` runs started at the same moment (two jobs launching side by side, as
    live at an arrival): each one's start cost (launch + shutdown, as :func:`_train`)."""
    t0 = time.time()
    runs = []
    for k in (0, 1):
        rd = work / f"cal-pair{tag}-{k}"
        rd.mkdir(parents=True, exist_ok=True)
        err = open(rd.parent / f"cal-pair{tag}-{k}.err", "wb")
        runs.append((rd, err, subprocess.Popen(
            [*CLI, "train", "--script", SCRIPT, "--steps", str(steps), "--gpus", "1", "--slots", str(slots),
             "--device", "cpu", "--run-dir", str(rd), "--", *script_args], cwd=ROOT, stdout=subprocess.DEVNULL,
            stderr=err)))
    ends: dict[int, float] = {}
    while len(ends) < 2:
        for k, (_, _, p) in enumerate(runs):
            if k not in ends and p.poll() is not None:
                ends[k] = time.time()
        if time.time() - t0 > 600:
            raise SystemExit("calibration pair did not end in 600 s")
        time.sleep(0.05)
    out = []
    for k, (rd, err, p) in enumerate(runs):
        err.close()
        if p.returncode != 0:
            raise SystemExit(f"calibration pair run failed: see {err.name}")
        ev = _events(rd / "events.jsonl")
        out.append((_first_step(ev) - t0) + (ends[k] - _last_step(ev)))
    return out


def pinned_rates(work: Path, slots: int, script_args: list[str], steps: int) -> dict[int, float]:
    """Steps/s of one job alone at each size W, W workers on W slots pinned to the first W cores
    the cluster would give it (slot i: the i-th core of this process's affinity), so that each
    worker has the threads it has in the cluster (cpu_threads: the affinity's cores / workers)."""
    mine = sorted(os.sched_getaffinity(0))
    out = {}
    for w in range(1, slots + 1):
        ev, _ = _train(work / f"cal-pinned-{w}", script_args, steps, w, w, "", [mine[i % len(mine)] for i in range(w)])
        out.update({k: v for k, v in rates(ev).items() if k == w})
    return out


def _resize_pair(work: Path, tag: str, slots: int, script_args: list[str], seg: int) -> tuple[list, float, list, float]:
    """The two resize runs: started at 1, grown 1 -> 2 -> ... -> S; started at S, shrunk to 1, grown
    back to S and shrunk to 2 (``seg`` steps a size). Their events and start costs."""
    up_sched = ",".join(f"{seg * i}:{i + 1}" for i in range(1, slots))
    ev_up, start_1 = _train(work / f"cal-up{tag}", script_args, seg * slots, 1, slots, up_sched)
    down, prev = [], slots
    for i, w in enumerate((1, slots, 2), 1):  # S -> 1 -> S -> 2 (no step to the size it is at)
        if w != prev:
            down.append(f"{i * seg}:{w}")
            prev = w
    ev_down, start_s = _train(work / f"cal-down{tag}", script_args, 4 * seg, slots, slots, ",".join(down))
    return ev_up, start_1, ev_down, start_s


def calibrate(work: Path, slots: int, script_args: list[str], pinned: bool = False, repeats: int = 1) -> dict:
    """One paced job alone (:func:`_resize_pair`): its steps/s at each size, its start costs at 1
    and S workers and the seconds each resize lost. ``repeats`` > 1: the pair again
    (``REPEAT_SEGMENT`` steps a size), then starts alone at 1 and at S workers of
    ``START_STEPS`` steps until each size has ``repeats`` starts; a start costs the MEDIAN of its
    size's samples (one launch alone on 2 shared cores varies by up to 2x from one to the next),
    the resize line is fitted on every resize. ``pinned`` (unpaced jobs, whose speed depends on the
    cores they get): the speeds come from one run per size on its own slots' cores
    (:func:`pinned_rates`) instead; the resize runs still give the launch and resize costs."""
    seg = CAL_SEGMENT
    ev_up, start_1, ev_down, start_s = _resize_pair(work, "", slots, script_args, seg)
    up, down = rates(ev_up), rates(ev_down)
    table = {w: statistics.mean([r[w] for r in (up, down) if w in r]) for w in sorted(set(up) | set(down))}
    samples = {1: [start_1], slots: [start_s]}
    evs = [(0, e) for e in ev_up + ev_down]
    if repeats > 1:
        ev_up2, s1, ev_down2, ss = _resize_pair(work, "-2", slots, script_args, REPEAT_SEGMENT)
        samples[1].append(s1)
        samples[slots].append(ss)
        evs += [(1, e) for e in ev_up2 + ev_down2]
    for i in range(2, repeats):
        for w in (1, slots):
            samples[w].append(_train(work / f"cal-start{w}-{i}", script_args, START_STEPS, w, slots, "")[1])
    pairs = [x for i in range(repeats if repeats > 1 else 0)
             for x in _train_pair(work, str(i), script_args, START_STEPS, slots)]
    lost = [{"from": e["from_workers"], "to": e["to_workers"], "lost_s": e["total_lost_s"], "repeat": r}
            for r, e in evs if e.get("kind") == "resize_overhead"]
    starts = {w: statistics.median(v) for w, v in samples.items()}
    costs = launch_costs([(x["to"], x["lost_s"]) for x in lost], list(starts.items()))
    extra = {}
    if pinned:
        extra = {"rates_unpinned_runs": table, "rates_from": "one run per size on its slots' cores"}
        table = pinned_rates(work, slots, script_args, 2 * seg)
    if repeats > 1:
        extra["repeats"] = repeats
        extra["measured_start_samples_s"] = {str(w): v for w, v in samples.items()}
        cores = len(os.sched_getaffinity(0))
        extra.update(pair_start_samples_s=pairs, cores=cores,
                     launch_extra_processes=launch_extra(statistics.median(pairs), starts[1], cores))
    return {"segment_steps": seg, "rates_steps_per_s": table, **extra, "rates_grow_run": up, "rates_shrink_run": down,
            "measured_start_s": {str(w): v for w, v in starts.items()}, "measured_resizes": lost, **costs}


def _cli(*args: str) -> str:
    r = subprocess.run([*CLI, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(args[:2])} failed: {r.stderr.strip()[-500:]}")
    return r.stdout


def _submit_and_wait(d: Path, trace: list, script_args: list[str], timeout: float) -> list[dict]:
    t0 = time.time()
    for i, (at, steps) in enumerate(trace):
        while time.time() - t0 < at:
            time.sleep(0.05)
        _cli("submit", SCRIPT, "--name", f"j{i}", "--steps", str(steps), "--dir", str(d), "--", *script_args)
    while True:  # read the database directly: a `jobs` process a second would load the cores
        db = sqlite3.connect(str(d / "cluster.db"))
        states = [s for (s,) in db.execute("SELECT state FROM jobs")]
        db.close()
        if len(states) == len(trace) and all(s in ("succeeded", "failed", "cancelled") for s in states):
            return json.loads(_cli("jobs", "--dir", str(d), "--json"))
        if time.time() - t0 > timeout:
            raise SystemExit(f"jobs not done after {timeout:.0f} s")
        time.sleep(1.0)


def live(work: Path, policy: str, slots: int, trace: list, script_args: list[str], timeout: float) -> dict:
    """One `cluster up` under ``policy`` with ``trace`` submitted live; the jobs' outcome."""
    d = work / policy
    log = open(work / f"{policy}.log", "wb")
    sched = subprocess.Popen([*CLI, "cluster", "up", "--dir", str(d), "--slots", str(slots), "--policy", policy,
                              "--quiet", "--poll", "0.3"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        t_wait = time.time()
        while not (d / "cluster.db").exists():
            if time.time() - t_wait > 60 or sched.poll() is not None:
                raise SystemExit(f"cluster up did not start (see {work / (policy + '.log')})")
            time.sleep(0.3)
        jobs = _submit_and_wait(d, trace, script_args, timeout)
    finally:
        if sched.poll() is None:
            subprocess.run([*CLI, "cluster", "down", "--dir", str(d), "--timeout", "60"], cwd=ROOT,
                           capture_output=True, timeout=120)
            try:
                sched.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(sched.pid, 9)
        log.close()
    bad = [j["name"] for j in jobs if j["state"] != "succeeded"]
    if bad:
        raise SystemExit(f"{policy}: jobs {bad} did not succeed (see {d})")
    return _outcome(d, jobs)


def check(policy: str, slots: int, step_s: float, cal_file: str | None, out: Path, timeout: float,
          keep: str | None, repeats: int = 1) -> dict:
    work = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="cluster-check-"))
    work.mkdir(parents=True, exist_ok=True)
    load = LoadSampler()
    load.start()
    t_all = time.time()
    args = ["--step-s", str(step_s)] if SCRIPT == PACED else ["--hidden", "32"]
    if cal_file:
        cal = json.loads(Path(cal_file).read_text())["calibration"]
        cf = Path(cal_file).resolve()
        cal["reused_from"] = str(cf.relative_to(ROOT)) if cf.is_relative_to(ROOT) else cf.name
    else:
        cal = calibrate(work, slots, args, pinned=SCRIPT != PACED, repeats=repeats)
    print(f"calibration: steps/s {cal['rates_steps_per_s']}, start {cal['start_overhead_s']:.1f} s, resize "
          f"{cal['resize_overhead_s']:.1f} s, + {cal['overhead_per_worker_s']:.2f} s per worker beyond 1", flush=True)
    run = live(work, policy, slots, TRACE, args, timeout)
    sim = simulate_run(run, policy, slots, cal, os.cpu_count())
    for j, s in zip(run["jobs"], sim["jct_s"]):
        j["sim_jct_s"] = s
    load.halt.set()
    res = {"policy": policy, "slots": slots, "cores": os.cpu_count(), "script": str(Path(SCRIPT).relative_to(ROOT)),
           "script_args": args, "trace": TRACE, "machine_load_1min": load.summary(), "calibration": cal,
           "live": run, "sim": sim,
           "side_by_side": side_by_side(run["jobs"], {int(w): r for w, r in cal["rates_steps_per_s"].items()}),
           "wall_s": time.time() - t_all}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    print(f"{policy}: live avg JCT {run['avg_jct_s']:.1f} s, simulator {sim['avg_jct_s']:.1f} s "
          f"({100 * sim['avg_jct_err']:+.1f}%); makespan {run['makespan_s']:.1f} / {sim['makespan_s']:.1f} s; "
          f"resizes {run['resizes']} / {sim['resizes']}; load {res['machine_load_1min']}; {out}", flush=True)
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    return res


def calibrate_only(slots: int, step_s: float, out: Path, keep: str | None, repeats: int = 1) -> None:
    work = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="cluster-cal-"))
    work.mkdir(parents=True, exist_ok=True)
    load = LoadSampler()
    load.start()
    cal = calibrate(work, slots, ["--step-s", str(step_s)], repeats=repeats)
    load.halt.set()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"slots": slots, "script": "examples/paced.py", "script_args": ["--step-s", str(step_s)],
                               "machine_load_1min": load.summary(), "calibration": cal}, indent=1))
    print(json.dumps(cal, indent=1))
    if not keep:
        shutil.rmtree(work, ignore_errors=True)


def use_example(example: str, jobs: int | None = None) -> None:
    """The jobs of the check: ``paced`` (examples/paced.py, the default) or ``mlp``
    (examples/mlp_digits.py, real compute, the calibration's segments 1000 steps); ``jobs``: only
    the first N jobs of the trace."""
    global SCRIPT, CAL_SEGMENT
    if example == "mlp":
        SCRIPT, CAL_SEGMENT = str(ROOT / "examples" / "mlp_digits.py"), 1000
        TRACE[:] = TRACE_MLP
    if jobs is not None:
        del TRACE[jobs:]
