"""The simulator's side of the live check (:mod:`elastic_ring.experiment.live_check`) and its
results files: a live run's arrivals replayed with the calibration's speeds and launch costs
(:func:`simulate_run`), each job's speed beside others against the calibration's
(:func:`side_by_side`), a results file's simulated part again (:func:`resim`: ``--resim``) and the
table of every results file (:func:`summary`: ``--summary``).
"""

from __future__ import annotations

import json
import sqlite3
import statistics
from pathlib import Path

from elastic_ring.cluster.scheduler import EXPLORE_WINDOWS
from elastic_ring.experiment.live_records import sched_events
from elastic_ring.experiment.replay import replay
from elastic_ring.protocol import LaunchInfo


# steps an explorer trains at each size live: the first step (before any window), the warm-up
# window, then the measured windows
WINDOW = LaunchInfo.__dataclass_fields__["throughput_window"].default
EXPLORE_STEPS = 1 + (1 + EXPLORE_WINDOWS) * WINDOW


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
