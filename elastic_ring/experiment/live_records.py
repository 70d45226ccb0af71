"""What a run of the live check (:mod:`elastic_ring.experiment.live_check`) left behind, read back:
a run folder's event lines as dicts (:func:`rates`: steps/s per size, work over time; the first and
last step's times) and the cluster's database (:func:`sched_events`: each job's scheduler events;
the jobs' outcome: JCTs, start costs, resizes).
"""

from __future__ import annotations

import json
import sqlite3
import statistics
from pathlib import Path


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
