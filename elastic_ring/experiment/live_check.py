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

from elastic_ring.cluster.scheduler import EXPLORE_WINDOWS
from elastic_ring.experiment.replay import replay
from elastic_ring.protocol import LaunchInfo

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
# steps an explorer trains at each size live: the first step (before any window), the warm-up
# window, then the measured windows
WINDOW = LaunchInfo.__dataclass_fields__["throughput_window"].default
EXPLORE_STEPS = 1 + (1 + EXPLORE_WINDOWS) * WINDOW


def _events(path: Path) -> list[dict]:
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def rates(ev: list[dict]) -> dict[int, float]:
    """Steps/s per world size: the steps of each segment from its first step to its last
    throughput window over the seconds they took, summed per size (work over time)."""
    steps: dict[int, float] = {}
    secs: dict[int, float] = {}
    first: dict = {}
    last: dict = {}
    for e in ev:
        seg = e.get("segment")
        if e.get("kind") == "first_step":
            first[seg] = e
        elif e.get("kind") == "throughput" and seg in first:
            last[seg] = e
    for seg, f in first.items():
        if seg in last and last[seg]["step"] > f["step"]:
            w = int(f["world_size"])
            steps[w] = steps.get(w, 0.0) + last[seg]["step"] - f["step"]
            secs[w] = secs.get(w, 0.0) + last[seg]["time"] - f["time"]
    return {w: steps[w] / secs[w] for w in steps if secs[w] > 0}


def _first_step(ev: list[dict]) -> float:
    return min(e["time"] for e in ev if e.get("kind") == "first_step")


def _last_step(ev: list[dict]) -> float:
    return max(e["time"] for e in ev if e.get("kind") in ("throughput", "finished"))


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


def launch_extra(pair_s: float, alone_s: float, cores: int) -> float:
    """The processes a launch keeps busy besides its worker, from a 1-worker start alone
    (``alone_s``) and two side by side (``pair_s`` each) on ``cores`` cores, if launches share the
    cores (:func:`elastic_ring.experiment.replay.shared_launch_ends`: two launches of 1 + h processes each
    run at max(C, 1 + h) / max(C, 2 + 2h), so h = C r / 2 - 1 with r = pair / alone, h <= C - 1)."""
    r = pair_s / alone_s if alone_s > 0 else 1.0
    return min(max(0.0, cores * r / 2 - 1), cores - 1.0)


def launch_costs(resizes: list[tuple[int, float]], starts: list[tuple[int, float]]) -> dict:
    """The simulator's launch costs from the calibration: a resize to W workers loses
    a + b (W - 1) seconds (least squares on the measured resizes, b >= 0: launching W worker
    processes takes longer with W), a first start at W workers s + b (W - 1)."""
    xs = [w - 1.0 for w, _ in resizes]
    ys = [c for _, c in resizes]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    b = max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var) if var > 0 else 0.0
    a = max(0.0, my - b * mx)
    s = max(0.0, statistics.mean(c - b * (w - 1) for w, c in starts))
    return {"resize_overhead_s": a, "overhead_per_worker_s": b, "start_overhead_s": s}


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


def _resizes(db: sqlite3.Connection) -> tuple[dict[int, float], dict[str, int]]:
    """Each job's first start time and the resizes: requests, exploration steps, preemptions."""
    started: dict[int, float] = {}
    n = {"resize_requested": 0, "explore_step": 0, "preempted": 0}
    for jid, kind, t, data in db.execute("SELECT job_id, kind, time, data FROM events ORDER BY id"):
        data = json.loads(data) if data else {}
        if kind == "started":
            started.setdefault(jid, t)
        elif kind == "resize_requested":
            n["resize_requested"] += 1
        elif kind == "explore_step" and data.get("frm", 0) > 0:
            n["explore_step"] += 1
        elif kind == "stop" and data.get("why") == "preempt":
            n["preempted"] += 1
    return started, n


# the scheduler's events kept per job in a results file (job by job against the replay's changes)
SCHED_KINDS = ("started", "resumed", "resize_requested", "resized", "stop", "grow_vetoed", "explore_step",
               "succeeded", "paused", "queued")


def sched_events(db: sqlite3.Connection, first: float) -> dict[str, list]:
    """Each job's (by name) scheduler events: [seconds from the first submission, kind, data]."""
    names = dict(db.execute("SELECT id, name FROM jobs"))
    out: dict[str, list] = {}
    for jid, kind, t, data in db.execute("SELECT job_id, kind, time, data FROM events ORDER BY id"):
        if kind in SCHED_KINDS and jid in names:
            d = {k: v for k, v in (json.loads(data) if data else {}).items() if k != "pid"}
            out.setdefault(names[jid], []).append([round(t - first, 2), kind, d])
    return out


def _outcome(d: Path, jobs: list[dict]) -> dict:
    jobs.sort(key=lambda j: j["submitted"])
    first = jobs[0]["submitted"]
    db = sqlite3.connect(str(d / "cluster.db"))
    started, n = _resizes(db)
    events = sched_events(db, first)
    db.close()
    out = []
    for j in jobs:
        ev = _events(d / "jobs" / str(j["id"]) / "events.jsonl")
        out.append({"name": j["name"], "steps": j["total"], "arrival_s": j["submitted"] - first,
                    "started_s": started[j["id"]] - first, "finished_s": j["finished"] - first,
                    "jct_s": j["finished"] - j["submitted"], "rates_steps_per_s": rates(ev),
                    "start_overhead_s": (_first_step(ev) - started[j["id"]]) + (j["finished"] - _last_step(ev)),
                    "resize_lost_s": [e["total_lost_s"] for e in ev if e.get("kind") == "resize_overhead"],
                    "resize_relaunch_s": [e["relaunch_to_first_step_s"] for e in ev
                                          if e.get("kind") == "resize_overhead"],
                    "events": events.get(j["name"], [])})
    return {"jobs": out, "resizes": sum(n.values()), "resize_kinds": n,
            "avg_jct_s": statistics.mean(j["jct_s"] for j in out),
            "makespan_s": max(j["finished_s"] for j in out)}


def side_by_side(jobs: list[dict], cal: dict[int, float]) -> list[dict]:
    """Each job's work-over-time steps/s at each size against the calibration's, with the
    time-averaged number of jobs running beside it (started -> finished of every other job)."""
    out = []
    for j in jobs:
        life = j["finished_s"] - j["started_s"]
        beside = sum(max(0.0, min(j["finished_s"], o["finished_s"]) - max(j["started_s"], o["started_s"]))
                     for o in jobs if o is not j) / life if life > 0 else 0.0
        for w, r in sorted(j["rates_steps_per_s"].items(), key=lambda x: int(x[0])):
            c = cal.get(int(w))
            out.append({"job": j["name"], "workers": int(w), "steps_per_s": r, "calibrated_steps_per_s": c,
                        "ratio": r / c if c else None, "jobs_beside": beside})
    return out


def simulate_run(run: dict, policy: str, slots: int, cal: dict, cores: int | None = None) -> dict:
    """The live run's arrivals replayed with the calibration's speeds and overheads; the planner
    sees linear speed-up, as the live scheduler does for jobs without a profile. The launch model:
    with a calibration that measured starts side by side (``launch_extra_processes``), launches
    share the node's cores (``shared_cores``: :func:`~elastic_ring.experiment.replay.shared_launch_ends`);
    otherwise the engine's per-worker cost (``per_worker``); the other one is reported beside
    (sharing ``cores`` cores with no extra process when the calibration has no pair). Beside it too,
    a diagnostic replay (``launch_from_run``) with the same speeds but the start and relaunch times
    the jobs had in the live run (their means): what is left of the error when the launch costs
    are right."""
    trace = [(j["arrival_s"], j["steps"]) for j in run["jobs"]]
    table = {int(w): r for w, r in cal["rates_steps_per_s"].items()}
    plan = {w: float(w) for w in range(1, slots + 1)}
    sim_lost: list[float] = []
    changes: list[tuple] = []
    err = lambda s, l: (s - l) / l  # noqa: E731
    h = cal.get("launch_extra_processes")
    share = {"cores": cal.get("cores", cores), "launch_extra": h or 0.0} if h is not None or cores else None
    kw = dict(plan=plan, overhead_per_worker_s=cal["overhead_per_worker_s"], explore_steps=EXPLORE_STEPS,
              window_steps=WINDOW)
    # the -rc gate as live: the scheduler's default cost, then each job's (simulated) resizes
    sim = replay(trace, policy, slots, table, cal["start_overhead_s"], cal["resize_overhead_s"], lost=sim_lost,
                 changes=changes, **kw, **(share if h is not None else {}))
    other = None  # the other launch model: per worker beside sharing, or sharing (h = 0) beside per worker
    if h is not None or share:
        other = replay(trace, policy, slots, table, cal["start_overhead_s"], cal["resize_overhead_s"], **kw,
                       **(share if h is None else {}))
    models = {"shared_cores" if h is not None else "per_worker": sim}
    if other is not None:
        models["per_worker" if h is not None else "shared_cores"] = other
    # the relaunch part of each resize (its wait for a launch in flight is the simulator's own)
    lost = [x for j in run["jobs"] for x in j.get("resize_relaunch_s", [])]
    start_run = statistics.mean(j["start_overhead_s"] for j in run["jobs"])
    resize_run = statistics.mean(lost) if lost else cal["resize_overhead_s"]
    diag = replay(trace, policy, slots, table, start_run, resize_run, plan=plan, explore_steps=EXPLORE_STEPS,
                  window_steps=WINDOW)
    names = [j["name"] for j in run["jobs"]]
    return {"avg_jct_s": sim.avg_jct_s, "makespan_s": sim.makespan_s, "resizes": sim.resizes,
            "launch_model": "shared_cores" if h is not None else "per_worker",
            "resize_lost_s": sim_lost,
            # each start, resize and stop: [asked at s, job, from, to workers, trains from s]
            "changes": [[round(t, 2), names[i], a, b, round(u, 2)] for t, i, a, b, u in changes],
            "jct_s": list(sim.jct_s), "avg_jct_err": err(sim.avg_jct_s, run["avg_jct_s"]),
            "makespan_err": err(sim.makespan_s, run["makespan_s"]),
            "launch_from_run": {"start_overhead_s": start_run, "resize_overhead_s": resize_run,
                                "avg_jct_s": diag.avg_jct_s, "avg_jct_err": err(diag.avg_jct_s, run["avg_jct_s"]),
                                "makespan_s": diag.makespan_s, "resizes": diag.resizes},
            **{k: {**(share if k == "shared_cores" else {}), "avg_jct_s": r.avg_jct_s, "resizes": r.resizes,
                   "avg_jct_err": err(r.avg_jct_s, run["avg_jct_s"])} for k, r in models.items()}}


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


def resim(f: Path, work: str | None = None, per_job: bool = False) -> None:
    """The simulator's part of a results file again (the live run and calibration as recorded).
    ``work``: the run's kept cluster folders (``--work``): its scheduler events are added to the
    live part. ``per_job``: print each job's JCT and changes, live and simulated."""
    res = json.loads(f.read_text())
    if work:
        db = sqlite3.connect(str(Path(work) / res["policy"] / "cluster.db"))
        first = min(t for (t,) in db.execute("SELECT submitted FROM jobs"))
        events = sched_events(db, first)
        db.close()
        for j in res["live"]["jobs"]:
            j["events"] = events.get(j["name"], [])
    sim = simulate_run(res["live"], res["policy"], res["slots"], res["calibration"], res.get("cores"))
    for j, s in zip(res["live"]["jobs"], sim["jct_s"]):
        j["sim_jct_s"] = s
    res["sim"] = sim
    f.write_text(json.dumps(res, indent=1))
    print(f"{res['policy']}: live avg JCT {res['live']['avg_jct_s']:.1f} s, simulator {sim['avg_jct_s']:.1f} s "
          f"({100 * sim['avg_jct_err']:+.1f}%); resizes {res['live']['resizes']} / {sim['resizes']}; with the run's "
          f"launch times {sim['launch_from_run']['avg_jct_s']:.1f} s ({100 * sim['launch_from_run']['avg_jct_err']:+.1f}%); {f}")
    if per_job:
        for j in res["live"]["jobs"]:
            live = [f"{e[1]} {e[2].get('frm', '')}->{e[2].get('to', e[2].get('workers', ''))}@{e[0]:.1f}"
                    for e in j.get("events", []) if e[1] in ("started", "resumed", "resize_requested", "stop",
                                                             "grow_vetoed")]
            simc = [f"{a}->{b}@{t:.1f}" for t, n, a, b, _ in sim["changes"] if n == j["name"]]
            print(f"  {j['name']}: JCT {j['jct_s']:.1f} / {j['sim_jct_s']:.1f} s; resizes (resize_overhead) "
                  f"{len(j['resize_lost_s'])}; live: {', '.join(live) or '-'}; sim: {', '.join(simc)}")


def launch_table(res: dict, cores: int = 2) -> list[dict]:
    """Each launch of a live run (with its scheduler events): a first start (its start + shutdown
    time), a resize's relaunch (from the old workers gone to the first step at the new size) or a
    resume (not timed), with W and what overlapped it: the worker processes of other launches in
    flight (time-averaged over the launch) and how many launches."""
    out = []
    for j in res["live"]["jobs"]:
        relaunch = list(j.get("resize_relaunch_s", []))
        for t, kind, d in j.get("events", []):
            x = {"job": j["name"], "t": t, "w": d.get("workers"), "slots": d.get("slots")}
            if kind == "started":
                out.append({**x, "kind": "start", "s": j["start_overhead_s"]})
            elif kind == "resized" and relaunch:
                out.append({**x, "kind": "resize", "s": relaunch.pop(0)})
            elif kind == "resumed":
                out.append({**x, "kind": "resume", "s": None})
    timed = [x["s"] for x in out if x["kind"] == "start"]
    for x in out:  # a resume's length is not in the events: the run's median first start
        x["span"] = x["s"] if x["s"] is not None else (statistics.median(timed) if timed else 0.0)
    for x in out:
        a, b = x["t"], x["t"] + x["span"]
        ov = [(o, max(0.0, min(b, o["t"] + o["span"]) - max(a, o["t"]))) for o in out if o is not x]
        x["other_workers"] = sum(o["w"] * v for o, v in ov) / (b - a) if b > a else 0.0
        x["other_launches"] = sum(v for _, v in ov) / (b - a) if b > a else 0.0
        if x["slots"] is not None and all(o["slots"] is not None for o, _ in ov):
            # the cluster pins slot i to core i mod the cores: the other launches' workers on this
            # launch's cores, and on the others
            mine = {s % cores for s in x["slots"]}
            same = sum(sum(1 for s in o["slots"] if s % cores in mine) * v for o, v in ov)
            x["same_core_workers"] = same / (b - a) if b > a else 0.0
            x["other_core_workers"] = x["other_workers"] - x["same_core_workers"]
    return out


def core_fit(rows: list[dict]) -> tuple:
    """Least squares of the launches' seconds on (start, resize, W - 1, other launching workers on
    the same cores, on the other cores), and on every core alike: coefficients, residual SDs, n."""
    import numpy as np

    x = np.array([[x["kind"] == "start", x["kind"] == "resize", x["w"] - 1, x["same_core_workers"],
                   x["other_core_workers"]] for x in rows], float)
    y = np.array([x["s"] for x in rows])
    c = np.linalg.lstsq(x, y, rcond=None)[0]
    x2 = np.c_[x[:, :3], x[:, 3] + x[:, 4]]
    c2 = np.linalg.lstsq(x2, y, rcond=None)[0]
    sd = lambda a, k: float(np.sqrt(np.mean((y - a @ k) ** 2)))  # noqa: E731
    return ([*c.tolist(), float(c2[3]), sd(x2, c2)], sd(x, c), len(y))


def launches(files: list[Path]) -> None:
    """The launches of the runs with scheduler events, by kind, W and alone / overlapped, against
    each run's calibration samples (the launch-cost analysis)."""
    groups: dict[tuple, list] = {}
    fits: dict[str, tuple] = {}
    pooled: list[dict] = []
    for f in files:
        res = json.loads(f.read_text())
        rows = [x for x in launch_table(res, res.get("cores") or 2) if x["s"] is not None]
        if not rows:
            continue
        if all("same_core_workers" in x for x in rows):
            fits[f.name] = core_fit(rows)
            pooled += rows
        cal = res["calibration"]
        alone1 = [x["s"] for x in rows if x["kind"] == "start" and x["w"] == 1 and x["other_workers"] < 0.2]
        print(f"{f.name}: calibration starts {cal['measured_start_s']} (samples "
              f"{cal.get('measured_start_samples_s', '-')}); the run's 1-worker starts alone: "
              f"{sorted(round(v, 1) for v in alone1)}")
        for x in rows:
            alone = x["other_workers"] < 0.2
            groups.setdefault((x["kind"], x["w"], alone), []).append((x["s"], x["other_workers"]))
    if len(fits) > 1:
        fits["all of them"] = core_fit(pooled)
    if fits:
        print("least squares, s = start + resize + b (W - 1) + per other launching worker on the launch's cores, "
              "+ per one on the other cores:")
        for name, (c, res_sd, n) in fits.items():
            print(f"  {name}: start {c[0]:.2f}, resize {c[1]:.2f}, b {c[2]:.2f}, same core {c[3]:.2f}, other core "
                  f"{c[4]:.2f} (residual {res_sd:.2f} s, {n} launches); every core alike: {c[5]:.2f} a worker "
                  f"(residual {c[6]:.2f} s)")
    print("| launch | W | overlapped | n | median s | min-max s | other launching workers (mean) |")
    print("|---|---|---|---|---|---|---|")
    for (k, w, alone), v in sorted(groups.items()):
        ss = [s for s, _ in v]
        print(f"| {k} | {w} | {'no' if alone else 'yes'} | {len(v)} | {statistics.median(ss):.1f} | "
              f"{min(ss):.1f}-{max(ss):.1f} | {statistics.mean(o for _, o in v):.2f} |")


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


def summary(files: list[Path], out: Path) -> dict:
    rows = []
    for f in files:
        r = json.loads(f.read_text())
        sbs = [x["ratio"] for x in r["side_by_side"] if x["ratio"] is not None and x["jobs_beside"] >= 1]
        rows.append({"policy": r["policy"], "file": f.name, "load_start": r["machine_load_1min"]["start"],
                     "load_mean": r["machine_load_1min"]["mean"], "jobs": len(r["live"]["jobs"]),
                     "live_avg_jct_s": r["live"]["avg_jct_s"], "sim_avg_jct_s": r["sim"]["avg_jct_s"],
                     "avg_jct_err": r["sim"]["avg_jct_err"], "live_makespan_s": r["live"]["makespan_s"],
                     "sim_makespan_s": r["sim"]["makespan_s"], "makespan_err": r["sim"]["makespan_err"],
                     "live_resizes": r["live"]["resizes"], "sim_resizes": r["sim"]["resizes"],
                     "diag_avg_jct_err": r["sim"].get("launch_from_run", {}).get("avg_jct_err"),
                     "launch_model": r["sim"].get("launch_model", "per_worker"),
                     "per_worker_avg_jct_err": r["sim"].get("per_worker", r["sim"])["avg_jct_err"],
                     "shared_cores_avg_jct_err": r["sim"].get("shared_cores", {}).get("avg_jct_err"),
                     "launch_extra_processes": r["calibration"].get("launch_extra_processes"),
                     "calibration_repeats": r["calibration"].get("repeats", 1),
                     "calibration_start_s": r["calibration"]["measured_start_s"],
                     "live_start_s_mean": statistics.mean(j["start_overhead_s"] for j in r["live"]["jobs"]),
                     "live_resize_lost_s_mean": statistics.mean(lost) if (lost := [
                         x for j in r["live"]["jobs"] for x in j["resize_lost_s"]]) else None,
                     "side_by_side_ratio_median": statistics.median(sbs) if sbs else None,
                     "side_by_side_ratio_min": min(sbs) if sbs else None,
                     # resizes per job and the seconds they lost (the run's resize events:
                     # total_lost_s, a wait for a launch in flight included; the simulator: each
                     # resize's launch at its new size)
                     "live_resizes_per_job": r["live"]["resizes"] / len(r["live"]["jobs"]),
                     "live_resize_lost_s_total": sum(x for j in r["live"]["jobs"] for x in j["resize_lost_s"]),
                     "sim_resizes_per_job": r["sim"]["resizes"] / len(r["live"]["jobs"]),
                     "sim_resize_lost_s_total": (sum(r["sim"]["resize_lost_s"]) if "resize_lost_s" in r["sim"]
                                                 else None)})
    res = {"runs": rows, "max_abs_avg_jct_err": max(abs(r["avg_jct_err"]) for r in rows) if rows else None}
    out.write_text(json.dumps(res, indent=1))
    print("| policy | load (start / mean) | live avg JCT s | sim avg JCT s | error | live makespan s | sim makespan s "
          "| error | resizes live / sim | launch s live: start, resize | error with the run's launch times "
          "| steps/s beside others / calibrated (median, min) | calibration: starts per size, start s at 1 / S "
          "| launch model (error above) | error, per-worker cost | error, launches sharing the cores (h) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        sb = (f"{r['side_by_side_ratio_median']:.2f}, {r['side_by_side_ratio_min']:.2f}"
              if r["side_by_side_ratio_median"] is not None else "-")
        print(f"| {r['file'][len('live12_'):-len('.json')]} | {r['load_start']:.1f} / {r['load_mean']:.1f} | {r['live_avg_jct_s']:.1f} | "
              f"{r['sim_avg_jct_s']:.1f} | {100 * r['avg_jct_err']:+.1f}% | {r['live_makespan_s']:.1f} | "
              f"{r['sim_makespan_s']:.1f} | {100 * r['makespan_err']:+.1f}% | {r['live_resizes']} / "
              f"{r['sim_resizes']} | {r['live_start_s_mean']:.1f}, "
              f"{'-' if r['live_resize_lost_s_mean'] is None else format(r['live_resize_lost_s_mean'], '.1f')} | "
              f"{'-' if r['diag_avg_jct_err'] is None else format(100 * r['diag_avg_jct_err'], '+.1f') + '%'} | {sb} | "
              f"{r['calibration_repeats']}, {' / '.join(format(v, '.1f') for v in r['calibration_start_s'].values())} | "
              f"{r['launch_model'].replace('_', ' ')} | {100 * r['per_worker_avg_jct_err']:+.1f}% | "
              f"{'-' if r['shared_cores_avg_jct_err'] is None else format(100 * r['shared_cores_avg_jct_err'], '+.1f') + '%'}"
              f" ({r['launch_extra_processes'] or 0:.2f}) |")
    print("\n| run | resizes/job live / sim | seconds lost to resizes live / sim | avg JCT s live / sim |")
    print("|---|---|---|---|")
    for r in rows:
        sl = "-" if r["sim_resize_lost_s_total"] is None else f"{r['sim_resize_lost_s_total']:.1f}"
        print(f"| {r['file'][len('live12_'):-len('.json')]} | {r['live_resizes_per_job']:.2f} / "
              f"{r['sim_resizes_per_job']:.2f} | {r['live_resize_lost_s_total']:.1f} / {sl} | "
              f"{r['live_avg_jct_s']:.1f} / {r['sim_avg_jct_s']:.1f} |")
    return res


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
