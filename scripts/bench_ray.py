#!/usr/bin/env python
"""The Ray backend's warm resizes against our horovodrun paths and Horovod Elastic: one run,
alternating rounds, side by side.

Every harness trains the same model (CIFAR ResNet ``--depth``/``--width``, synthetic data, batch
``--batch-size`` per worker) for 3S steps, grows 1 -> 2 after step S and shrinks 2 -> 1 after step
2S (``--resize-steps`` S):

* ``ray``: ``elastic-ring train --backend ray`` on a two-node Ray cluster started here
  (``ray.cluster_utils.Cluster``: a head and a node of one CPU each, so that the grow joins a warm
  spare actor on the other node);
* ``ours:inplace``, ``ours:overlap`` (``--relaunch``): ``elastic-ring train`` with horovodrun;
* ``horovod-elastic``: Horovod Elastic's own script (``launch/peer_elastic.py``, the harness of
  ``scripts/bench_peers.py``): its discovery script reports one more / one fewer slot.

Time lost per resize: the controller's ``resize_overhead.total_lost_s`` for ours (first step at the
new size - the stop request - one steady step at the new size), the same definition from the step
records for Horovod Elastic. Whole-run wall time: from the command's start to its exit (Ray: the
cluster is up before; connecting to it and starting the actors is counted). The harnesses
alternate within a round (reversed every other round); medians and ratios against Horovod
Elastic. Not measured here: Ray Train's elastic ``TorchTrainer`` (not built: no time).

    .venv/bin/python scripts/bench_ray.py --repeats 3        # ~15 min on a loaded 2-core machine
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_peers import BenchError, _env, _read, _run, _train_cmd, resize_hvd_elastic, resize_ours  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HARNESSES = ("ray", "ours:inplace", "ours:overlap", "horovod-elastic")


def resize_ray(a, address: str, tmp: Path) -> dict:
    s = a.resize_steps
    run = tmp / f"ray-{time.time_ns()}"
    extra = ["--schedule", f"{s}:2,{2 * s}:1", "--backend", "ray", "--ray-address", address]
    t0 = time.perf_counter()
    _run(_train_cmd(a, run, 3 * s, 1, extra), _env(), 1800, "elastic-ring train --backend ray")
    wall = time.perf_counter() - t0
    evs = _read(run / "events.jsonl")
    ov = [e for e in evs if e["kind"] == "resize_overhead"]
    phases = [e.get("phases") for e in evs if e["kind"] == "first_step" and e.get("segment", 0) > 0]
    shutil.rmtree(run, ignore_errors=True)
    return {"wall_s": wall, "phases": phases,
            "resizes": [{"from": e["from_workers"], "to": e["to_workers"], "lost_s": e["total_lost_s"],
                         "redone_steps": 0} for e in ov]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="alternating rounds (>= 1)")
    ap.add_argument("--resize-steps", type=int, default=30, help="S: grow at S, shrink at 2S, 3S steps")
    ap.add_argument("--harnesses", nargs="*", default=list(HARNESSES), choices=HARNESSES)
    ap.add_argument("--depth", type=int, default=20)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=32, help="per worker")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_ray.json")
    a = ap.parse_args(argv)
    a.device = "cpu"
    if a.repeats < 1 or a.resize_steps < 10:
        print("bench_ray: need --repeats >= 1 and --resize-steps >= 10", file=sys.stderr)
        return 2
    load0 = os.getloadavg()
    res: dict[str, dict] = {h: {"grow_lost_s": [], "shrink_lost_s": [], "wall_s": []} for h in a.harnesses}
    loads: list[float] = []
    with tempfile.TemporaryDirectory(prefix="br") as d:
        tmp = Path(d)
        cluster = None
        address = ""
        if "ray" in a.harnesses:
            os.environ["RAY_TMPDIR"] = str(tmp / "r")
            from ray.cluster_utils import Cluster

            mb = 1024 * 1024
            cluster = Cluster(initialize_head=True, head_node_args={
                "num_cpus": 1, "object_store_memory": 80 * mb, "include_dashboard": False})
            cluster.add_node(num_cpus=1, object_store_memory=80 * mb)
            cluster.wait_for_nodes()
            address = cluster.address
        try:
            for i in range(a.repeats):
                order = list(a.harnesses) if i % 2 == 0 else list(reversed(a.harnesses))
                for h in order:
                    try:
                        if h == "ray":
                            r = resize_ray(a, address, tmp)
                        elif h == "horovod-elastic":
                            r = resize_hvd_elastic(a, True, tmp)
                        else:
                            r = resize_ours(a, h.split(":", 1)[1], tmp)
                    except (BenchError, subprocess.TimeoutExpired) as e:
                        res[h].setdefault("errors", []).append(str(e)[-1500:])
                        print(f"round {i + 1} {h}: FAILED: {str(e).splitlines()[0]}", file=sys.stderr)
                        continue
                    res[h]["wall_s"].append(r["wall_s"])
                    if r.get("phases"):
                        res[h].setdefault("phases", []).append(r["phases"])
                    for z in r["resizes"]:
                        res[h]["grow_lost_s" if z["to"] > z["from"] else "shrink_lost_s"].append(z["lost_s"])
                    loads.append(os.getloadavg()[0])
                    print(f"round {i + 1}/{a.repeats} {h}: " + ", ".join(
                        f"{z['from']}->{z['to']} {z['lost_s']:.2f}s" for z in r["resizes"])
                        + f", wall {r['wall_s']:.1f}s (load {loads[-1]:.1f})", flush=True)
        finally:
            if cluster is not None:
                cluster.shutdown()

    def med(v: list[float]) -> float:
        return statistics.median(v) if v else float("nan")

    ref = res.get("horovod-elastic", {})
    rows = []
    s = a.resize_steps
    print(f"\ngrow 1->2 at step {s}, shrink 2->1 at step {2 * s}, {3 * s} steps; median of {a.repeats} "
          f"alternating rounds; ratios against Horovod Elastic")
    print(f"{'harness':>16} {'grow lost s':>11} {'/hvd-el':>7} {'shrink lost s':>13} {'/hvd-el':>7} "
          f"{'run wall s':>10} {'/hvd-el':>7}")
    for h in a.harnesses:
        r = res[h]
        row = {"harness": h, **r, "grow_lost_median_s": med(r["grow_lost_s"]),
               "shrink_lost_median_s": med(r["shrink_lost_s"]), "wall_median_s": med(r["wall_s"])}
        for k in ("grow_lost", "shrink_lost", "wall"):
            base = med(ref.get(f"{k}_s", [])) if ref else float("nan")
            row[f"{k}_vs_hvd_elastic"] = row[f"{k}_median_s" if k != "wall" else "wall_median_s"] / base \
                if base and base == base else float("nan")
        rows.append(row)
        print(f"{h:>16} {row['grow_lost_median_s']:>11.2f} {row['grow_lost_vs_hvd_elastic']:>7.2f} "
              f"{row['shrink_lost_median_s']:>13.2f} {row['shrink_lost_vs_hvd_elastic']:>7.2f} "
              f"{row['wall_median_s']:>10.1f} {row['wall_vs_hvd_elastic']:>7.2f}")
    load1 = os.getloadavg()
    print(f"\nload average before {load0[0]:.1f}, after {load1[0]:.1f} ({os.cpu_count()} cores; "
          f"the machine is shared: other jobs ran meanwhile)")
    out = {"config": {k: (str(v.name) if isinstance(v, Path) else v) for k, v in vars(a).items()},
           "cpu_count": os.cpu_count(), "loadavg_before": load0, "loadavg_after": load1,
           "loadavg_per_run": loads, "time": time.time(), "rows": rows,
           "note": "measured on a shared 2-core machine loaded by other jobs"}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=2))
    print(f"written {a.out.relative_to(ROOT) if a.out.is_relative_to(ROOT) else a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
