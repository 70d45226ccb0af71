"""Launch costs in the live check (:mod:`elastic_ring.experiment.live_check`): the simulator's
launch and resize costs fitted from the calibration (:func:`launch_costs`, :func:`launch_extra`),
and the analysis of a live run's launches against what overlapped them (:func:`launch_table`,
:func:`core_fit`, :func:`launches`: ``--launches``).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path


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
