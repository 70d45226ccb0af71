#!/usr/bin/env python
"""Start-up a user waits for, before against after a change: two source trees of elastic-ring
(``--before``, ``--after``: each put first on PYTHONPATH) run the same commands, alternating within
a round (the order reversed every other round), medians over the rounds.

* ``first``: ``train --script examples/mlp_digits.py`` at 1 worker: the controller's launch ->
  rank 0's first step (``first_step.time - launch.time``), with the worker's own phases
  (``restore_broadcast`` is where Horovod's optimizer-state broadcast made torch import
  ``torch._dynamo`` on a fresh start);
* ``prelaunch``: the same script resized 1 -> 2 with ``--relaunch prelaunch``: the resize's
  ``relaunch_to_first_step_s`` and ``total_lost_s`` (the new workers wait for their go meanwhile);
* ``finished``: ``train --resume`` of a finished run: the command's wall time to its one-line
  answer.

The load average before every run is recorded (a shared machine makes the absolute figures move;
compare the medians of alternated runs).

    .venv/bin/python scripts/bench_first_step.py --before ../old-tree --after . --rounds 3 \\
        --out results/bench_first_step.json
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

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "mlp_digits.py"


def _events(rd: Path) -> list[dict]:
    out = []
    for line in (rd / "events.jsonl").read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def _train(tree: Path, args: list[str], timeout: float = 600) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONUNBUFFERED="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    t0 = time.time()
    p = subprocess.run([sys.executable, "-m", "elastic_ring.cli.main", "train", *args], env=env, cwd=tree,
                       capture_output=True, text=True, timeout=timeout)
    return p, time.time() - t0


def run_first(tree: Path, tmp: Path) -> dict:
    rd = tmp / "first"
    p, _ = _train(tree, ["--script", str(SCRIPT), "--steps", "10", "--slots", "2", "--device", "cpu",
                         "--run-dir", str(rd)])
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-2000:])
    ev = _events(rd)
    launch = next(e for e in ev if e["kind"] == "launch")
    first = next(e for e in ev if e["kind"] == "first_step")
    return {"launch_to_first_step_s": first["time"] - launch["time"], "phases": first.get("phases", {})}


def run_prelaunch(tree: Path, tmp: Path) -> dict:
    rd = tmp / "pre"
    p, _ = _train(tree, ["--script", str(SCRIPT), "--steps", "60", "--gpus", "1", "--resize-at", "40", "--to", "2",
                         "--relaunch", "prelaunch", "--slots", "2", "--device", "cpu", "--run-dir", str(rd)])
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-2000:])
    ov = next(e for e in _events(rd) if e["kind"] == "resize_overhead")
    return {"relaunch_to_first_step_s": ov["relaunch_to_first_step_s"], "total_lost_s": ov["total_lost_s"]}


def run_finished(tree: Path, done: Path, tmp: Path) -> dict:
    rd = tmp / "done"
    shutil.copytree(done, rd)
    p, wall = _train(tree, ["--resume", str(rd)])
    if p.returncode != 2 or "already finished" not in p.stderr:
        raise RuntimeError(p.stderr[-2000:])
    return {"wall_s": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--after", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cases", default="first,prelaunch,finished")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_first_step.json")
    a = ap.parse_args()
    trees = {"before": a.before.resolve(), "after": a.after.resolve()}
    cases = a.cases.split(",")
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="er-bench-") as tmp_s:
        tmp = Path(tmp_s)
        done = tmp / "finished-run"
        if "finished" in cases:
            p, _ = _train(trees["after"], ["--script", str(SCRIPT), "--steps", "4", "--slots", "2",
                                           "--device", "cpu", "--run-dir", str(done)])
            if p.returncode != 0:
                raise SystemExit(p.stderr[-2000:])
        for r in range(a.rounds):
            order = ["before", "after"] if r % 2 == 0 else ["after", "before"]
            for case in cases:
                for which in order:
                    work = tmp / f"{which}-{case}-{r}"
                    work.mkdir()
                    load = os.getloadavg()[0]
                    fn = {"first": lambda: run_first(trees[which], work),
                          "prelaunch": lambda: run_prelaunch(trees[which], work),
                          "finished": lambda: run_finished(trees[which], done, work)}[case]
                    res = fn()
                    rows.append({"round": r, "case": case, "tree": which, "load_before": load, **res})
                    print(json.dumps(rows[-1]), flush=True)
                    shutil.rmtree(work, ignore_errors=True)
    keys = {"first": "launch_to_first_step_s", "prelaunch": "relaunch_to_first_step_s", "finished": "wall_s"}
    medians = {}
    for case in cases:
        for which in trees:
            xs = [row[keys[case]] for row in rows if row["case"] == case and row["tree"] == which]
            medians[f"{case}:{which}"] = statistics.median(xs) if xs else None
        if case == "first":
            for which in trees:
                xs = [row["phases"].get("restore_broadcast", 0.0) for row in rows
                      if row["case"] == case and row["tree"] == which]
                medians[f"first:{which}:restore_broadcast"] = statistics.median(xs) if xs else None
        if case == "prelaunch":
            for which in trees:
                xs = [row["total_lost_s"] for row in rows if row["case"] == case and row["tree"] == which]
                medians[f"prelaunch:{which}:total_lost_s"] = statistics.median(xs) if xs else None
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"medians": medians, "rows": rows, "rounds": a.rounds,
                                 "cpus": os.cpu_count()}, indent=2))
    print(json.dumps(medians, indent=2))


if __name__ == "__main__":
    main()
