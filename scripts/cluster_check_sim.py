"""The simulator checked against the live scheduler on this machine (issue 11).

1. Calibrate: one MLP job (examples/mlp_digits.py) alone under `train`, at 1 worker then resized
   to 2: its steps/s at each size (median of the steady throughput windows), its launch +
   shutdown time (the start overhead) and the time lost in the resize. These become the job
   profile (profile.json, Eq. 5 with t3 = step time at 1 and t1 the extra per worker) that the
   live `precompute` plans with, and the simulator's true speed and overheads.
2. Live: `elastic-ring cluster up --slots S` under `eight`, then under `precompute`; a trace of
   jobs of different lengths submitted at staggered times; JCT = finished - submitted.
3. Replay each live run in the simulator (`elastic_ring.sim.replay`) with the measured arrivals,
   the calibration's speed table and overheads; also a second replay with each job's own speeds
   and overheads as measured in the live run (isolates the scheduling model from speed noise).
4. Per-job and average JCT error, the machine's load; results/cluster/sim_vs_live.json.

    .venv/bin/python scripts/cluster_check_sim.py            # ~6-10 min on 2 loaded cores
"""

from __future__ import annotations

import argparse
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from elastic_ring.perfmodel.speed import load_profile  # noqa: E402
from elastic_ring.sim.replay import replay  # noqa: E402

CLI = [sys.executable, "-m", "elastic_ring.cli.main"]
MLP = str(ROOT / "examples" / "mlp_digits.py")
SCRIPT_ARGS = ["--hidden", "32"]
# (arrival offset s, steps): six jobs of different lengths, staggered
TRACE = [(0, 1500), (6, 600), (12, 1000), (18, 400), (24, 1200), (30, 800)]


def _events(path: Path) -> list[dict]:
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def _rates(ev: list[dict]) -> dict[int, float]:
    """Steps/s per world size as the job ran: steps trained / seconds from each segment's first
    step to its last throughput window (a time average: the speed on this loaded machine swings
    by 10x between windows, so a median of windows overstates it)."""
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
        if seg in last:
            w = int(f["world_size"])
            steps[w] = steps.get(w, 0.0) + last[seg]["step"] - f["step"]
            secs[w] = secs.get(w, 0.0) + last[seg]["time"] - f["time"]
    return {w: steps[w] / secs[w] for w in steps if secs[w] > 0 and steps[w] > 0}


def _first_step(ev: list[dict]) -> float:
    return min(e["time"] for e in ev if e.get("kind") == "first_step")


def _last_step(ev: list[dict]) -> float:
    return max(e["time"] for e in ev if e.get("kind") in ("throughput", "finished"))


class LoadSampler(threading.Thread):
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
        return {"mean": round(statistics.mean(s), 1), "min": round(min(s), 1), "max": round(max(s), 1),
                "cores": os.cpu_count()}


def calibrate(work: Path, slots: int, steps: int) -> dict:
    rd = work / "calibration"
    t0 = time.time()
    r = subprocess.run([*CLI, "train", "--script", MLP, "--steps", str(steps), "--gpus", "1", "--slots", str(slots),
                        "--device", "cpu", "--schedule", f"{steps // 2}:{slots}", "--run-dir", str(rd), "--",
                        *SCRIPT_ARGS], cwd=ROOT, capture_output=True, text=True, timeout=600)
    t1 = time.time()
    if r.returncode != 0:
        raise SystemExit(f"calibration run failed: {r.stderr[-2000:]}")
    ev = _events(rd / "events.jsonl")
    rates = _rates(ev)
    start = (_first_step(ev) - t0) + (t1 - _last_step(ev))
    lost = [e["total_lost_s"] for e in ev if e.get("kind") == "resize_overhead"]
    st1 = 1.0 / rates[1]
    stn = 1.0 / rates.get(slots, rates[1])
    profile = {"source": "MEASURED by scripts/cluster_check_sim.py (calibration run of examples/mlp_digits.py)",
               "batch_per_worker": 32, "n_params": 64 * 32 + 32 + 32 * 10 + 10,
               "points": [{"workers": w, "steps_per_s": v} for w, v in sorted(rates.items())],
               # Eq. 5 with t0 = t2 = 0: step time t3 at 1 worker, + t1 per extra worker (>= 0)
               "speed_model": {"t0": 0.0, "t1": max(stn - st1, 0.0) / max(slots - 1, 1), "t2": 0.0, "t3": st1,
                               "m": 32.0, "n": 64 * 32 + 32 + 32 * 10 + 10}}
    (work / "profile.json").write_text(json.dumps(profile, indent=1))
    return {"steps": steps, "rates_steps_per_s": rates, "start_overhead_s": start,
            "resize_overhead_s": statistics.mean(lost) if lost else 0.0, "wall_s": t1 - t0}


def _cli(*args: str) -> str:
    r = subprocess.run([*CLI, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(args[:2])} failed: {r.stderr.strip()[-500:]}")
    return r.stdout


def live(work: Path, policy: str, slots: int, profile: Path, timeout: float) -> dict:
    d = work / policy
    log = open(work / f"{policy}.log", "wb")
    sched = subprocess.Popen([*CLI, "cluster", "up", "--dir", str(d), "--slots", str(slots), "--policy", policy,
                              "--profile", str(profile), "--quiet", "--poll", "0.3"], cwd=ROOT, stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
    try:
        t_wait = time.time()
        while not (d / "cluster.db").exists():
            if time.time() - t_wait > 60 or sched.poll() is not None:
                raise SystemExit(f"cluster up did not start (see {work / (policy + '.log')})")
            time.sleep(0.3)
        t0 = time.time()
        for i, (at, steps) in enumerate(TRACE):
            while time.time() - t0 < at:
                time.sleep(0.1)
            _cli("submit", MLP, "--name", f"j{i}", "--steps", str(steps), "--dir", str(d), "--", *SCRIPT_ARGS)
        while True:  # read the database directly: a `jobs` process a second would load the cores
            db = sqlite3.connect(str(d / "cluster.db"))
            states = [s for (s,) in db.execute("SELECT state FROM jobs")]
            db.close()
            if len(states) == len(TRACE) and all(s in ("succeeded", "failed", "cancelled") for s in states):
                jobs = json.loads(_cli("jobs", "--dir", str(d), "--json"))
                break
            if time.time() - t0 > timeout:
                raise SystemExit(f"{policy}: jobs not done after {timeout:.0f} s")
            time.sleep(1.0)
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
        raise SystemExit(f"{policy}: jobs {bad} did not succeed")
    db = sqlite3.connect(str(d / "cluster.db"))
    started = {}
    resizes = 0
    for jid, kind, t in db.execute("SELECT job_id, kind, time FROM events ORDER BY id"):
        if kind == "started":
            started.setdefault(jid, t)
        resizes += kind == "resize_requested"
    db.close()
    jobs.sort(key=lambda j: j["submitted"])
    first = jobs[0]["submitted"]
    out = []
    for j in jobs:
        ev = _events(d / "jobs" / str(j["id"]) / "events.jsonl")
        lost = [e["total_lost_s"] for e in ev if e.get("kind") == "resize_overhead"]
        out.append({"name": j["name"], "steps": j["total"], "arrival_s": j["submitted"] - first,
                    "jct_s": j["finished"] - j["submitted"], "rates_steps_per_s": _rates(ev),
                    "start_overhead_s": (_first_step(ev) - started[j["id"]]) + (j["finished"] - _last_step(ev)),
                    "resize_lost_s": lost})
    return {"jobs": out, "resizes": resizes, "wall_s": time.time() - t0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--slots", type=int, default=2, help="CPU worker slots of the live cluster (default 2 = cores)")
    p.add_argument("--calibration-steps", type=int, default=1200)
    p.add_argument("--out", default=str(ROOT / "results" / "cluster" / "sim_vs_live.json"))
    p.add_argument("--work", default=None, help="keep the cluster folders here (default: a temporary folder)")
    p.add_argument("--timeout", type=float, default=600, help="per live run, seconds")
    a = p.parse_args()
    if a.slots < 2:
        p.error("--slots must be >= 2")
    if a.calibration_steps < 100:
        p.error("--calibration-steps must be >= 100")
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="cluster-check-"))
    work.mkdir(parents=True, exist_ok=True)
    load = LoadSampler()
    load.start()
    t_all = time.time()
    cal = calibrate(work, a.slots, a.calibration_steps)
    print(f"calibration: steps/s {cal['rates_steps_per_s']}, start overhead {cal['start_overhead_s']:.1f} s, "
          f"resize overhead {cal['resize_overhead_s']:.1f} s", flush=True)
    model, _ = load_profile(work / "profile.json")
    table = {w: float(model.predict(w)) for w in range(1, a.slots + 1)}
    results = {}
    for policy in ("eight", "precompute"):
        run = live(work, policy, a.slots, work / "profile.json", a.timeout)
        trace = [(j["arrival_s"], j["steps"]) for j in run["jobs"]]
        sim_cal = replay(trace, policy, a.slots, table, cal["start_overhead_s"], cal["resize_overhead_s"], plan=table)
        own = [{w: r for w, r in j["rates_steps_per_s"].items()} or table for j in run["jobs"]]
        own = [{**table, **{int(w): r for w, r in o.items()}} for o in own]
        lost = [x for j in run["jobs"] for x in j["resize_lost_s"]]
        sim_own = replay(trace, policy, a.slots, own, statistics.mean(j["start_overhead_s"] for j in run["jobs"]),
                         statistics.mean(lost) if lost else cal["resize_overhead_s"], plan=table)
        live_avg = statistics.mean(j["jct_s"] for j in run["jobs"])
        for j, s1, s2 in zip(run["jobs"], sim_cal.jct_s, sim_own.jct_s):
            j["sim_jct_s"], j["sim_err"] = s1, (s1 - j["jct_s"]) / j["jct_s"]
            j["sim_run_jct_s"], j["sim_run_err"] = s2, (s2 - j["jct_s"]) / j["jct_s"]
        results[policy] = {**run, "live_avg_jct_s": live_avg, "sim_avg_jct_s": sim_cal.avg_jct_s,
                           "avg_err": (sim_cal.avg_jct_s - live_avg) / live_avg, "sim_resizes": sim_cal.resizes,
                           "sim_run_avg_jct_s": sim_own.avg_jct_s,
                           "avg_err_run": (sim_own.avg_jct_s - live_avg) / live_avg}
        print(f"{policy}: live avg JCT {live_avg:.1f} s, simulator {sim_cal.avg_jct_s:.1f} s "
              f"({100 * results[policy]['avg_err']:+.1f}%)", flush=True)
    load.halt.set()
    out = {"machine_load_1min": load.summary(), "slots": a.slots, "trace": TRACE, "script_args": SCRIPT_ARGS,
           "calibration": cal, "policies": results, "wall_s": time.time() - t_all}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"\nload (1-min average) mean {out['machine_load_1min']['mean']} on {os.cpu_count()} cores; "
          f"{out['wall_s']:.0f} s in all; {a.out}\n")
    print("| policy | job | steps | arrival s | live JCT s | sim JCT s | error | sim (run speeds) s | error |")
    print("|---|---|---|---|---|---|---|---|---|")
    for policy, r in results.items():
        for j in r["jobs"]:
            print(f"| {policy} | {j['name']} | {j['steps']} | {j['arrival_s']:.1f} | {j['jct_s']:.1f} | "
                  f"{j['sim_jct_s']:.1f} | {100 * j['sim_err']:+.0f}% | {j['sim_run_jct_s']:.1f} | "
                  f"{100 * j['sim_run_err']:+.0f}% |")
        print(f"| {policy} | **average** | | | {r['live_avg_jct_s']:.1f} | {r['sim_avg_jct_s']:.1f} | "
              f"**{100 * r['avg_err']:+.1f}%** | {r['sim_run_avg_jct_s']:.1f} | {100 * r['avg_err_run']:+.1f}% |")
    if not a.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
