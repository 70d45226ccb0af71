"""The library's in-process time per step (``bench_step_cost.py --modes timed``) of this checkout
against another checkout's (an older commit: ``git worktree add /tmp/old <commit>``), alternating.

Each round runs ``scripts/bench_step_cost.py --rounds 1 --modes timed`` once in each checkout, the
order swapped every round, with the cases and sizes given; each run's controller imports its own
checkout's package and hands it to its workers (``PYTHONPATH``), so each side measures its own
code. Written to ``--out``: the machine's load before and after, every round's in-process figures
per side, and per case and side the median over the rounds of the net library time a step
(``library_us_per_step_net``) and of the median step's (``median_step_library_us``, the steadier
figure: a vote's step and an epoch's end are a few dear steps), with the new side's over the old's.

    git worktree add /tmp/old HEAD
    .venv/bin/python scripts/bench_step_cost_ab.py --old /tmp/old --only epochs/horovod,epochs/torch \\
        --rounds 5 --out results/bench_step_cost_ab.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path("scripts") / "bench_step_cost.py"


def run_side(tree: Path, only: str, sizes: str, out: Path) -> dict:
    """One round of the timed mode in ``tree`` (its own package: cwd and PYTHONPATH there)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree)
    cmd = [sys.executable, str(tree / BENCH), "--rounds", "1", "--modes", "timed", "--out", str(out)]
    if only:
        cmd += ["--only", only]
    if sizes:
        cmd += ["--sizes", sizes]
    p = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise SystemExit(f"bench_step_cost_ab: {tree}: exit {p.returncode}: {(p.stderr or p.stdout)[-1500:]}")
    return json.loads(out.read_text())["in_process"]


def summary(rounds: list[dict]) -> dict:
    out: dict[str, dict] = {}
    for case in rounds[0]["new"]:
        c = out[case] = {}
        for side in ("old", "new"):
            net = [r[side][case]["median_library_us_per_step_net"] for r in rounds]
            med = [statistics.median(x["median_step_library_us"] for x in r[side][case]["rounds"]) for r in rounds]
            c[side] = {"library_us_per_step_net": net, "median_library_us_per_step_net": statistics.median(net),
                       "median_step_library_us": med, "median_median_step_library_us": statistics.median(med)}
        for k in ("median_library_us_per_step_net", "median_median_step_library_us"):
            c[f"new_over_old_{k[len('median_'):]}"] = round(c["new"][k] / c["old"][k], 3) if c["old"][k] else None
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", type=Path, required=True, help="the other checkout (the older commit)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--only", default="epochs/horovod,epochs/torch", help="bench_step_cost.py's --only")
    ap.add_argument("--sizes", default="", help="bench_step_cost.py's --sizes")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    old = a.old.resolve()
    if not (old / BENCH).is_file():
        ap.error(f"--old {a.old}: no {BENCH} there (a checkout of this project?)")
    if a.rounds < 1:
        ap.error("--rounds: at least 1")
    trees = {"old": old, "new": ROOT}
    load_before = os.getloadavg()[0]
    rounds = []
    with tempfile.TemporaryDirectory(prefix="bench-ab-") as work:
        for i in range(a.rounds):
            order = ["old", "new"] if i % 2 == 0 else ["new", "old"]
            r: dict = {"order": order, "load_before": list(os.getloadavg())}
            for side in order:
                r[side] = run_side(trees[side], a.only, a.sizes, Path(work) / f"{side}{i}.json")
                print(f"round {i + 1} {side}: " + ", ".join(
                    f"{case} {c['median_library_us_per_step_net']:.1f} us" for case, c in r[side].items()), flush=True)
            rounds.append(r)
    res = {"settings": {"rounds": a.rounds, "only": a.only, "sizes": a.sizes, "old": str(a.old)},
           "commits": {side: subprocess.run(["git", "-C", str(t), "rev-parse", "--short", "HEAD"], capture_output=True,
                                            text=True).stdout.strip() for side, t in trees.items()},
           "machine": {"cpus": os.cpu_count(), "load_before": load_before, "load_after": os.getloadavg()[0]},
           "summary": summary(rounds), "rounds": rounds, "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=1))
    for case, c in res["summary"].items():
        print(case, {s: f"{c[s]['median_library_us_per_step_net']:.1f} us ({c[s]['median_median_step_library_us']:.1f} "
                        f"the median step)" for s in ("old", "new")})
    print(f"wrote {a.out} (load {load_before:.1f} -> {res['machine']['load_after']:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
