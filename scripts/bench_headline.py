#!/usr/bin/env python
"""The headline figures, measured again in one command: ``make bench`` (or this script).

Four parts, each an existing benchmark run for ONE round at a time, the parts alternating round
after round (``steady``, ``resize``, ``recovery``, ``relaunch``, then the same again), the machine's
load average (1 min) read before and after every part of every round:

* ``steady``: per-step speed at 2 CPU workers against plain Horovod and a hand-written DDP script
  under torchrun (``scripts/bench_peers.py --part steady``: the harnesses alternate inside a round);
  ratios of images/s, ours over theirs (above 1: ours faster);
* ``resize``: time lost per grow 1 -> 2 and shrink 2 -> 1 for the relaunch modes ``overlap``,
  ``prelaunch``, ``inplace`` against Horovod Elastic's own script and torchrun stopped and
  restarted (``scripts/bench_peers.py --part resize``), and each harness's whole-run wall time;
* ``recovery``: a kill -9 of rank 0 of a 2-worker in-place run, with ``--survive`` (from memory)
  and without (restart from the checkpoint, ``--checkpoint-every 10``)
  (``scripts/bench_failure_resize.py --side inplace --kill-rank 0``): kill to next step, steps
  redone, time lost;
* ``relaunch``: a relaunching resize's relaunch s (new workers started -> first step) and lost s,
  with the fork server against fresh processes (``scripts/bench_zygote.py --relaunch overlap``).

Each part's round files are kept under ``results/headline/`` and the whole is summarised in
``results/bench_headline.json``: per figure the values of every round, the median and the range.
The wording of every claim follows from the numbers (:func:`claims`): "quiet" only when every load
read was at most 1.5 on 2 cores (else the loads are stated), "faster"/"less" only when every round
of one side is beyond every round of the other (else "overlapping rounds"). The report
``docs/reports/headline.md`` is generated from that file (:func:`render`), and a unit test checks
that the committed report is the rendering of the committed file.

    .venv/bin/python scripts/bench_headline.py [--rounds 3] [--parts steady,resize,recovery,relaunch]
    .venv/bin/python scripts/bench_headline.py --render   # only rewrite the report from the file
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "results" / "bench_headline.json"
REPORT = ROOT / "docs" / "reports" / "headline.md"
ROUNDS_DIR = ROOT / "results" / "headline"
QUIET_LOAD = 1.5  # per 2 cores: above it, no "quiet"
PARTS = ("steady", "resize", "recovery", "relaunch")
RESIZE_HARNESSES = ("ours:overlap", "ours:prelaunch", "ours:inplace", "horovod-elastic", "torchrun-relaunch")


def part_command(part: str, out: Path, quick: bool) -> list[str]:
    py, s = sys.executable, str(ROOT / "scripts")
    if part == "steady":
        return [py, f"{s}/bench_peers.py", "--part", "steady", "--repeats", "1", "--workers", "2",
                "--steps", "80" if quick else "200", "--warmup", "20", "--out", str(out)]
    if part == "resize":
        return [py, f"{s}/bench_peers.py", "--part", "resize", "--repeats", "1", "--resize-steps", "15",
                "--relaunch", "overlap", "prelaunch", "inplace", "--peers", "horovod-elastic", "torchrun-relaunch",
                "--no-resize-repeats", "0", "--out", str(out)]
    if part == "recovery":
        return [py, f"{s}/bench_failure_resize.py", "--side", "inplace", "--kill-rank", "0", "--rounds", "1",
                "--copy-rounds", "1", "--out", str(out)]
    if part == "relaunch":
        return [py, f"{s}/bench_zygote.py", "--rounds", "1", "--relaunch", "overlap", "--out", str(out)]
    raise ValueError(part)


def figures_of(part: str, d: dict[str, Any]) -> dict[str, float]:
    """The headline figures of one round's results file of ``part``."""
    f: dict[str, float] = {}
    if part == "steady":
        for row in d["steady"]["rows"]:
            w = row["workers"]
            for peer in ("horovod", "ddp"):
                f[f"w{w}.ours_over_{peer}"] = statistics.median(row[f"ours_over_{peer}"])
            f[f"w{w}.ours_images_per_s"] = row["ours_median"]
    elif part == "resize":
        for row in d["resize"]["rows"]:
            h = row["harness"]
            for k in ("grow_lost_median_s", "shrink_lost_median_s", "wall_median_s"):
                if row.get(k) is not None:
                    f[f"{h}.{k.replace('_median', '')}"] = row[k]
    elif part == "recovery":
        m = d["inplace"]["medians"]
        for side in ("survive", "restart"):
            for k in ("kill_to_next_step_s", "steps_redone", "time_lost_s"):
                f[f"{side}.{k}"] = m[side][k]
        f["copy_of_step_pct"] = d["copy_cost"]["copy_of_step_pct"]
    elif part == "relaunch":
        for side in ("zygote", "fresh"):
            runs = d["runs"][side]
            f[f"{side}.relaunch_s"] = statistics.median(x for r in runs for x in r["relaunch_s"])
            f[f"{side}.lost_s"] = statistics.median(x for r in runs for x in r["lost_s"])
    return f


def summarise(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per part and figure: every round's value, the median, min and max; the loads read."""
    out: dict[str, Any] = {}
    for part in PARTS:
        rs = [r for r in rounds if r["part"] == part and r.get("figures")]
        if not rs:
            continue
        keys = sorted({k for r in rs for k in r["figures"]})
        figs = {}
        for k in keys:
            vals = [r["figures"][k] for r in rs if k in r["figures"]]
            figs[k] = {"rounds": vals, "median": statistics.median(vals), "min": min(vals), "max": max(vals)}
        loads = [x for r in rs for x in (r["load_before"], r["load_after"])]
        out[part] = {"figures": figs, "rounds": len(rs), "load_min": min(loads), "load_max": max(loads),
                     "files": [r["file"] for r in rs]}
    return out


def _ratio_claim(name: str, fig: dict[str, Any]) -> str:
    lo, hi, med = fig["min"], fig["max"], fig["median"]
    if lo > 1:
        verdict = "faster in every round"
    elif hi < 1:
        verdict = "slower in every round"
    else:
        verdict = "rounds on both sides of 1: no winner"
    return f"ours / {name} per step: {med:.2f}x (rounds {lo:.2f}-{hi:.2f}): {verdict}"


def _less_claim(a: str, fa: dict[str, Any], b: str, fb: dict[str, Any], what: str) -> str:
    if fa["max"] < fb["min"]:
        verdict = f"{a} less in every round"
    elif fb["max"] < fa["min"]:
        verdict = f"{b} less in every round"
    else:
        verdict = "overlapping rounds: no winner"
    return (f"{what}: {a} {fa['median']:.2f} s ({fa['min']:.2f}-{fa['max']:.2f}) against {b} "
            f"{fb['median']:.2f} s ({fb['min']:.2f}-{fb['max']:.2f}): {verdict}")


def claims(summary: dict[str, Any]) -> list[str]:
    """The sentences the numbers allow (see the module docstring)."""
    out: list[str] = []
    for part, s in summary.items():
        quiet = s["load_max"] <= QUIET_LOAD
        out.append(f"{part}: {s['rounds']} round(s), load {s['load_min']:.1f}-{s['load_max']:.1f} on 2 cores"
                   + (" (quiet)" if quiet else " (not quiet: above 1.5)"))
    st = summary.get("steady", {}).get("figures", {})
    for peer, name in (("horovod", "plain Horovod"), ("ddp", "DDP under torchrun")):
        if f"w2.ours_over_{peer}" in st:
            out.append(_ratio_claim(name, st[f"w2.ours_over_{peer}"]))
    rz = summary.get("resize", {}).get("figures", {})
    for kind in ("grow_lost_s", "shrink_lost_s"):
        ours = {h: rz[f"{h}.{kind}"] for h in RESIZE_HARNESSES if h.startswith("ours:") and f"{h}.{kind}" in rz}
        he = rz.get(f"horovod-elastic.{kind}")
        if ours and he:
            best = min(ours, key=lambda h: ours[h]["median"])
            out.append(_less_claim(best.replace("ours:", "ours "), ours[best], "Horovod Elastic", he,
                                   kind.replace("_lost_s", " lost")))
    rc = summary.get("recovery", {}).get("figures", {})
    if "survive.time_lost_s" in rc and "restart.time_lost_s" in rc:
        out.append(_less_claim("--survive", rc["survive.time_lost_s"], "restart", rc["restart.time_lost_s"],
                               "kill -9 of rank 0, time lost"))
    rl = summary.get("relaunch", {}).get("figures", {})
    if "zygote.lost_s" in rl and "fresh.lost_s" in rl:
        out.append(_less_claim("fork server", rl["zygote.lost_s"], "fresh processes", rl["fresh.lost_s"],
                               "relaunching resize, time lost"))
    return out


def _row(key: str, fig: dict[str, Any], digits: int = 2) -> str:
    rounds = ", ".join(f"{v:.{digits}f}" for v in fig["rounds"])
    return f"| `{key}` | {fig['median']:.{digits}f} | {fig['min']:.{digits}f}-{fig['max']:.{digits}f} | {rounds} |"


def render(data: dict[str, Any]) -> str:
    """``docs/reports/headline.md`` from the results file (nothing typed by hand)."""
    lines = ["# Headline figures (generated)", "",
             f"Generated by `scripts/bench_headline.py --render` from `results/bench_headline.json` "
             f"(measured {data['time']} at commit `{data['commit']}`, {data['rounds']} alternating round(s), "
             f"{data['machine']['cpus']} CPU cores). Do not edit by hand: re-run the benchmark "
             "(`make bench`), or `--render` after editing nothing but the file's wording rules.", "",
             "## What the numbers allow", ""]
    lines += [f"- {c}" for c in data["claims"]]
    units = {"steady": "ratio (images/s, ours over theirs) or images/s", "resize": "seconds",
             "recovery": "seconds, steps, % of a step", "relaunch": "seconds"}
    for part, s in data["summary"].items():
        lines += ["", f"## {part}", "", f"{units[part]}; load {s['load_min']:.2f}-{s['load_max']:.2f}; "
                  f"round files: {', '.join('`' + f + '`' for f in s['files'])}", "",
                  "| figure | median | range | rounds |", "|---|---|---|---|"]
        lines += [_row(k, v, 1 if k.endswith("images_per_s") else 2) for k, v in s["figures"].items()]
    return "\n".join(lines) + "\n"


def _commit() -> str:
    r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return r.stdout.strip() or "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of every part (>= 1)")
    ap.add_argument("--parts", default=",".join(PARTS), help="comma-separated subset of " + ",".join(PARTS))
    ap.add_argument("--quick", action="store_true", help="shorter steady runs (a check that it works)")
    ap.add_argument("--render", action="store_true", help="only rewrite docs/reports/headline.md from the file")
    a = ap.parse_args()
    parts = [p for p in a.parts.split(",") if p]
    bad = [p for p in parts if p not in PARTS]
    if bad or a.rounds < 1:
        ap.exit(2, f"bench_headline.py: unknown part(s) {', '.join(bad)}; --rounds >= 1\n" if bad
                else "bench_headline.py: --rounds must be at least 1\n")
    if a.render:
        REPORT.write_text(render(json.loads(OUT.read_text())))
        print(f"wrote {REPORT.relative_to(ROOT)}")
        return 0
    ROUNDS_DIR.mkdir(parents=True, exist_ok=True)
    rounds: list[dict[str, Any]] = []
    t_start = time.time()
    for r in range(1, a.rounds + 1):
        for part in parts:
            out = ROUNDS_DIR / f"{part}-round{r}.json"
            load0 = os.getloadavg()[0]
            t0 = time.time()
            print(f"[{time.time() - t_start:6.0f} s] round {r}/{a.rounds}: {part} (load {load0:.2f})", flush=True)
            p = subprocess.run(part_command(part, out, a.quick), cwd=ROOT, text=True, capture_output=True)
            rec = {"part": part, "round": r, "load_before": load0, "load_after": os.getloadavg()[0],
                   "seconds": time.time() - t0, "file": str(out.relative_to(ROOT)), "returncode": p.returncode}
            if p.returncode != 0:
                rec["error"] = (p.stderr or p.stdout)[-2000:]
                print(f"  {part} failed (exit {p.returncode}): {rec['error'][-400:]}", flush=True)
            else:
                rec["figures"] = figures_of(part, json.loads(out.read_text()))
            rounds.append(rec)
    summary = summarise(rounds)
    data = {"time": time.strftime("%Y-%m-%d %H:%M:%S"), "commit": _commit(), "rounds": a.rounds,
            "machine": {"cpus": os.cpu_count()}, "rounds_run": rounds, "summary": summary,
            "claims": claims(summary)}
    OUT.write_text(json.dumps(data, indent=2))
    REPORT.write_text(render(data))
    print("\n".join(data["claims"]))
    print(f"wrote {OUT.relative_to(ROOT)} and {REPORT.relative_to(ROOT)}")
    return 0 if all(r["returncode"] == 0 for r in rounds) else 1


if __name__ == "__main__":
    sys.exit(main())
