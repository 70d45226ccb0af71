"""The simulator checked against the live scheduler on this machine: the command line of
:mod:`elastic_ring.experiment.live_check` (its docstring says what the check does).

    .venv/bin/python scripts/cluster_check_sim.py --policy precompute     # ~4-6 min on 2 cores
    .venv/bin/python scripts/cluster_check_sim.py --summary
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from elastic_ring.experiment.live_check import (POLICIES, RESULTS, TRACE, calibrate_only, check,  # noqa: E402
                                                use_example)
from elastic_ring.experiment.live_launches import launches  # noqa: E402
from elastic_ring.experiment.live_results import resim, summary  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description="The simulator checked against the live scheduler on this machine.")
    p.add_argument("--policy", help=f"the live cluster's policy ({', '.join(POLICIES)}, or one the cluster accepts)")
    p.add_argument("--summary", action="store_true", help="only the table of results/cluster/live12_*.json")
    p.add_argument("--resim", nargs="+", metavar="FILE", default=None,
                   help="replay again the live runs of these results files with the current simulator "
                        "(their own calibration), rewriting their sim part; with one file, each job's changes "
                        "live and simulated; --work DIR: add the scheduler's events from that run's kept folders")
    p.add_argument("--launches", nargs="+", metavar="FILE", default=None,
                   help="the launches of these runs (those with scheduler events): duration against W and "
                        "what overlapped them, and the calibration's start samples")
    p.add_argument("--calibrate", action="store_true",
                   help="only the calibration, to results/cluster/live12_calibration.json (for --calibration)")
    p.add_argument("--slots", type=int, default=4, help="CPU worker slots (paced jobs need little CPU; default 4)")
    p.add_argument("--step-s", type=float, default=0.3, help="a paced step's seconds at 1 worker (default 0.3)")
    p.add_argument("--example", choices=("paced", "mlp"), default="paced",
                   help="mlp: examples/mlp_digits.py jobs (real compute, no pacing: the check that jobs "
                        "side by side run at their calibrated speed; use --slots 2 = the cores)")
    p.add_argument("--jobs", type=int, default=len(TRACE), help="the first N jobs of the trace (development)")
    p.add_argument("--calibration", default=None, help="reuse the calibration of this results file")
    p.add_argument("--out", default=None, help="default results/cluster/live12_<policy>.json")
    p.add_argument("--work", default=None, help="keep the cluster folders here (default: a temporary folder)")
    p.add_argument("--timeout", type=float, default=900, help="live run, seconds")
    p.add_argument("--repeats", type=int, default=3,
                   help="calibration: starts per size and resize runs repeated (medians of the starts; default 3; "
                        "1: one of each, as the runs before 2026-12-01 18:00)")
    a = p.parse_args()
    if a.repeats < 1:
        p.error("need --repeats >= 1")
    if a.summary:
        files = sorted(f for f in RESULTS.glob("live12_*.json")
                       if f.name not in ("live12_summary.json", "live12_calibration.json"))
        summary(files, RESULTS / "live12_summary.json")
        return
    if a.launches:
        launches([Path(f) for f in a.launches])
        return
    if a.resim:
        if a.work and len(a.resim) != 1:
            p.error("--work with --resim: one results file")
        for f in a.resim:
            resim(Path(f), a.work, per_job=len(a.resim) == 1)
        return
    if a.calibrate:
        calibrate_only(a.slots, a.step_s, Path(a.out or RESULTS / "live12_calibration.json"), a.work, a.repeats)
        return
    if not a.policy:
        p.error("give --policy, --calibrate or --summary")
    if a.slots < 2 or a.step_s <= 0 or not 1 <= a.jobs <= len(TRACE):
        p.error(f"need --slots >= 2, --step-s > 0 and 1 <= --jobs <= {len(TRACE)}")
    use_example(a.example, a.jobs)
    check(a.policy, a.slots, a.step_s, a.calibration, Path(a.out or RESULTS / f"live12_{a.policy}.json"),
          a.timeout, a.work, a.repeats)


if __name__ == "__main__":
    main()
