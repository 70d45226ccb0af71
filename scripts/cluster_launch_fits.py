"""The launch-cost figures of docs/reports/cluster.md ("Launch costs launch by launch"), derived from the
committed live runs (results/cluster/live12_*.json) and written to one file, so that each figure
has a file behind it. Nothing is measured: it reads the runs and replays them (seconds).

1. The launches of the 12 runs that keep the scheduler's events (the 5 older quiet runs and the 7
   of the calibration-of-3 protocol), by kind, W and alone / overlapped
   (:func:`elastic_ring.experiment.live_launches.launch_table`, as ``--launches`` prints it).
2. Least squares of a launch's seconds over the 5 older runs (no slots recorded): a start and a
   resize intercept, per own worker beyond 1, per other launching worker, and per worker of the
   other jobs that were training (not launching) meanwhile.
3. The same with the other launching workers on the launch's cores and on the other core (the runs
   that record each launch's slots and had overlaps), per run and pooled
   (:func:`elastic_ring.experiment.live_launches.core_fit`).
4. The 18 older runs (no start pairs in their calibration) replayed with the engine's per-worker
   launch cost, with launches sharing the 2 cores at h = 0 and at h = 0.5 (h chosen on these same
   runs: not a prediction), beside the diagnostic replay with the run's own launch times; average
   JCT error against live for each.

    .venv/bin/python scripts/cluster_launch_fits.py      # writes results/cluster/launch_fits.json
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from elastic_ring.experiment.live_check import RESULTS  # noqa: E402
from elastic_ring.experiment.live_launches import core_fit, launch_table  # noqa: E402
from elastic_ring.experiment.live_results import simulate_run  # noqa: E402

OLDER = ["exploratory-quiet", "optimus-quiet", "srtf-quiet2", "srtf-rc-quiet2", "srtf-rc-quiet3"]
PROTOCOL = ["eight-q5", "optimus-q5", "optimus-rc-q5", "precompute-q5", "precompute-rc-q5", "srtf-q4", "srtf-rc-q4"]
OVERLAPPED = [r for r in PROTOCOL if r != "eight-q5"]  # eight runs its jobs one at a time
STORED = ["eight", "exploratory-quiet", "exploratory", "optimus-quiet", "optimus-rc-quiet", "optimus",
          "precompute-quiet", "precompute-quiet2", "precompute-rc-quiet", "precompute-rc-quiet2", "precompute-rc",
          "precompute", "srtf-quiet", "srtf-quiet2", "srtf-rc-quiet", "srtf-rc-quiet2", "srtf-rc-quiet3", "srtf"]
BAR = 0.15  # the live check's bar on average JCT


def _run(name: str) -> dict:
    return json.loads((RESULTS / f"live12_{name}.json").read_text())


def _timed(res: dict) -> list[dict]:
    return [x for x in launch_table(res, res.get("cores") or 2) if x["s"] is not None]


def launch_groups(names: list[str]) -> list[dict]:
    groups: dict[tuple, list] = {}
    for n in names:
        for x in _timed(_run(n)):
            groups.setdefault((x["kind"], x["w"], x["other_workers"] < 0.2), []).append(x)
    return [{"launch": k, "workers": w, "overlapped": not alone, "n": len(v),
             "median_s": statistics.median(x["s"] for x in v), "min_s": min(x["s"] for x in v),
             "max_s": max(x["s"] for x in v),
             "other_launching_workers_mean": statistics.mean(x["other_workers"] for x in v)}
            for (k, w, alone), v in sorted(groups.items())]


def training_workers(res: dict, launches: list[dict], x: dict, samples: int = 50) -> float:
    """The workers of the other jobs that train (started, not launching) during launch ``x``,
    averaged over ``samples`` instants of it."""
    sizes: dict[str, list[tuple[float, int]]] = {}
    for j in res["live"]["jobs"]:
        pts = [(t, d["workers"]) for t, kind, d in j.get("events", [])
               if kind in ("started", "resized", "resumed") and d.get("workers") is not None]
        pts += [(t, 0) for t, kind, _ in j.get("events", []) if kind == "stop"]
        sizes[j["name"]] = sorted(pts + [(j["finished_s"], 0)])

    def size(name: str, t: float) -> int:
        w = 0
        for t0, v in sizes[name]:
            if t0 <= t:
                w = v
        return w

    tot = 0.0
    for t in np.linspace(x["t"], x["t"] + x["span"], samples):
        for name in sizes:
            if name != x["job"] and not any(o["job"] == name and o["t"] <= t < o["t"] + o["span"] for o in launches):
                tot += size(name, float(t))
    return tot / samples


def older_fit(names: list[str]) -> dict:
    rows, ys = [], []
    for n in names:
        res = _run(n)
        table = launch_table(res, 2)
        for x in table:
            if x["s"] is not None:
                rows.append([x["kind"] == "start", x["kind"] == "resize", x["w"] - 1, x["other_workers"],
                             training_workers(res, table, x)])
                ys.append(x["s"])
    a, y = np.array(rows, float), np.array(ys)
    k = np.linalg.lstsq(a, y, rcond=None)[0]
    return {"runs": names, "launches": len(y), "start_s": k[0], "resize_s": k[1], "per_own_worker_beyond_1_s": k[2],
            "per_other_launching_worker_s": k[3], "per_training_worker_s": k[4],
            "residual_s": float(np.sqrt(np.mean((y - a @ k) ** 2)))}


def core_fits(names: list[str]) -> dict:
    def one(rows: list[dict]) -> dict:
        c, res_sd, n = core_fit(rows)
        return {"launches": n, "start_s": c[0], "resize_s": c[1], "per_own_worker_beyond_1_s": c[2],
                "same_core_worker_s": c[3], "other_core_worker_s": c[4], "residual_s": res_sd,
                "every_core_alike_worker_s": c[5], "every_core_alike_residual_s": c[6]}

    per = {n: _timed(_run(n)) for n in names}
    return {"per_run": {n: one(r) for n, r in per.items()}, "pooled": {"runs": names, **one(sum(per.values(), []))}}


def sharing(names: list[str]) -> dict:
    rows = []
    for n in names:
        res = _run(n)
        row = {"run": n, "load_mean": res["machine_load_1min"]["mean"]}
        for key, h in (("per_worker", None), ("shared_h0", 0.0), ("shared_h05", 0.5)):
            cal = copy.deepcopy(res["calibration"])
            if h is not None:
                cal.update(launch_extra_processes=h, cores=2)
            sim = simulate_run(res["live"], res["policy"], res["slots"], cal)
            row[key] = sim["avg_jct_err"]
        row["run_launch_times"] = sim["launch_from_run"]["avg_jct_err"]
        rows.append(row)

    def stats(sel: list[dict]) -> dict:
        return {k: {"mean_abs_err": statistics.mean(abs(r[k]) for r in sel),
                    "mean_err": statistics.mean(r[k] for r in sel), "misses": sum(abs(r[k]) > BAR for r in sel)}
                for k in ("per_worker", "shared_h0", "shared_h05")}

    quiet = [r for r in rows if "quiet" in r["run"] or r["run"] == "eight"]
    return {"runs": rows, "quiet_and_eight": {"n": len(quiet), **stats(quiet)}, "all": {"n": len(rows), **stats(rows)}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(RESULTS / "launch_fits.json"))
    a = p.parse_args()
    out = {"launches": {"runs": OLDER + PROTOCOL, "table": launch_groups(OLDER + PROTOCOL)},
           "older_fit": older_fit(OLDER), "core_fits": core_fits(OVERLAPPED), "sharing": sharing(STORED)}
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
