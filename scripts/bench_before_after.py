#!/usr/bin/env python
"""The same runs on two versions of the code, alternating: does a change (a refactor) make the
per-step speed or a resize's cost worse?

``--before REV`` is checked out into a temporary git worktree; ``--after`` is this checkout's
working tree (or ``--after REV``). Both run with this venv, each with its own tree first on
``PYTHONPATH`` and as its working folder. Every round runs every case once per side, the side that
goes first alternating round by round (before/after, then after/before, ...), and the machine's load
(1 min) is read before each run. Cases (``--cases``):

* ``steady``: the built-in job (``configs/cpu_small.yaml``) at 2 workers, no resize; the figure is
  the median images/s of its throughput windows after the first (a rate: images over the window's
  time);
* ``inplace``: 1 -> 2 -> 1 with ``--relaunch inplace``; the figures are each resize's
  ``total_lost_s`` (``resize_overhead`` events: request to the first step at the new size, minus
  one steady step);
* ``relaunch``: the same schedule with the default relaunch (``overlap`` on the CPU).

Per figure: each side's values, medians, the paired ratios after/before round by round and their
median. For images/s above 1 is faster after; for seconds lost above 1 is more lost after. Written
to ``--out`` (default ``results/bench_before_after.json``) and printed as a table.

    .venv/bin/python scripts/bench_before_after.py --before da56294 --rounds 3
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

from benchlib import BIN, ROOT, exit_on_sigterm, write_results

CASES = {
    "steady": ["--gpus", "2", "--steps", "240"],
    "inplace": ["--gpus", "1", "--steps", "150", "--schedule", "50:2,100:1", "--relaunch", "inplace"],
    "relaunch": ["--gpus", "1", "--steps", "150", "--schedule", "50:2,100:1"],
}


def run_case(tree: Path, case: str, work: Path) -> dict[str, float]:
    """One ``elastic-ring train`` of ``case`` with the code in ``tree``: its figures."""
    run = work / f"run-{time.monotonic_ns()}"
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", PYTHONUNBUFFERED="1",
               PYTHONPATH=str(tree))
    cmd = [sys.executable, "-m", "elastic_ring.cli.main", "train", "--config", "configs/cpu_small.yaml",
           "--slots", "2", *CASES[case], "--run-dir", str(run)]
    p = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"{case} failed on {tree}:\n{p.stderr[-2000:]}")
    evs = [json.loads(ln) for ln in (run / "events.jsonl").read_text().splitlines() if ln.strip()]
    shutil.rmtree(run, ignore_errors=True)
    if case == "steady":
        rates = [e["images_per_s"] for e in evs if e["kind"] == "throughput" and e["world_size"] == 2][1:]
        if not rates:
            raise SystemExit(f"steady on {tree}: no throughput window after the first")
        return {"steady images/s": statistics.median(rates)}
    out = {}
    for e in evs:
        if e["kind"] == "resize_overhead":
            out[f"{case} {e['from_workers']}->{e['to_workers']} lost s"] = e["total_lost_s"]
    if len(out) != 2:
        raise SystemExit(f"{case} on {tree}: {len(out)} resize(s) measured, 2 expected")
    return out


def checkout(rev: str, where: Path) -> Path:
    subprocess.run(["git", "worktree", "add", "--detach", str(where), rev], cwd=ROOT, check=True,
                   capture_output=True)
    return where


def summarise(rounds: list[dict]) -> dict[str, dict]:
    figs = sorted({k for r in rounds for k in r["before"]})
    out = {}
    for f in figs:
        b = [r["before"][f] for r in rounds]
        a = [r["after"][f] for r in rounds]
        paired = [x / y if y else float("nan") for x, y in zip(a, b)]
        out[f] = {"before": b, "after": a, "median_before": statistics.median(b),
                  "median_after": statistics.median(a), "paired_after_over_before": paired,
                  "median_ratio": statistics.median(paired)}
    return out


def table(summary: dict[str, dict]) -> str:
    rows = ["| figure | before (median) | after (median) | after/before paired | median ratio |",
            "|---|---:|---:|---|---:|"]
    for f, s in summary.items():
        rows.append(f"| {f} | {s['median_before']:.3f} | {s['median_after']:.3f} | "
                    f"{', '.join(f'{x:.3f}' for x in s['paired_after_over_before'])} | {s['median_ratio']:.3f} |")
    return "\n".join(rows)


def main() -> None:
    exit_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="the git revision to compare against")
    ap.add_argument("--after", default=None, help="a git revision (default: this working tree)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", default="steady,inplace,relaunch", help=f"comma-separated subset of {','.join(CASES)}")
    ap.add_argument("--out", default=str(ROOT / "results" / "bench_before_after.json"))
    a = ap.parse_args()
    cases = [c for c in a.cases.split(",") if c]
    bad = [c for c in cases if c not in CASES]
    if bad or a.rounds < 1:
        ap.error(f"unknown case(s) {bad}" if bad else "--rounds must be >= 1")
    load0 = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="er-ba-"))
    made: list[Path] = []
    try:
        sha = lambda r: subprocess.run(["git", "rev-parse", "--short", r], cwd=ROOT, capture_output=True,  # noqa: E731
                                       text=True, check=True).stdout.strip()
        trees = {"before": checkout(a.before, tmp / "before")}
        made.append(trees["before"])
        if a.after:
            trees["after"] = checkout(a.after, tmp / "after")
            made.append(trees["after"])
        else:
            trees["after"] = ROOT
        revs = {"before": sha(a.before), "after": sha(a.after) if a.after else f"{sha('HEAD')} (working tree)"}
        rounds = []
        for r in range(a.rounds):
            order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
            got: dict = {"order": order, "load": {}, "before": {}, "after": {}}
            for case in cases:
                for side in order:
                    got["load"][f"{case}/{side}"] = os.getloadavg()[0]
                    got[side].update(run_case(trees[side], case, tmp))
                    print(f"round {r + 1} {case} {side}: "
                          + ", ".join(f"{k} {v:.3f}" for k, v in got[side].items() if k.startswith(case)),
                          flush=True)
            rounds.append(got)
        summary = summarise(rounds)
        print(table(summary))
        write_results(Path(a.out), {"revisions": revs, "cases": {c: CASES[c] for c in cases}, "rounds": rounds,
                                    "summary": summary, "table": table(summary)}, load0)
    finally:
        for t in made:
            subprocess.run(["git", "worktree", "remove", "--force", str(t)], cwd=ROOT, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
