#!/usr/bin/env python
"""The resize cost of one Horovod Elastic script under elastic-ring (in place) and under Horovod
Elastic itself: the same file, unchanged, grown 1 -> 2 and shrunk 2 -> 1, alternating rounds.

The script is ``examples/hvd_elastic_mlp.py`` (``--log-samples``: every rank's step records, with the
time each step ended). Each round runs both harnesses, in an order reversed every other round:

* ``elastic-ring``: ``elastic-ring train --script ... --relaunch inplace --schedule S:2,2S:1
  --steps 2S+A`` (``--after`` A);
* ``horovod-elastic``: ``horovodrun -np 1 --min-np 1 --max-np 2 --host-discovery-script D
  --network-interface lo python SCRIPT``; ``D`` reports one more slot once rank 0 has done step S,
  and one fewer once it has done S steps at 2 workers; the run is ended A steps after the shrink.

Time lost per resize, the same for both, from rank 0's step records: the first step at the new size
ends ``gap`` seconds after the last step at the old size; the time lost is ``gap`` minus the median
step time at the new size (its next steps). For elastic-ring the controller's own ``total_lost_s``
is kept beside it. Medians over the rounds, and elastic-ring / Horovod Elastic per resize. Both
sides run Horovod with its default cycle time (1 ms): until in-place rings dropped the controller's
5 ms, elastic-ring's side waited up to 5 ms per negotiation round of a reset (the pause's broadcast,
the shutdown, the first step) where Horovod Elastic's waited 1 ms, so results from before that
change are not comparable.

    .venv/bin/python scripts/bench_hvd_elastic.py --repeats 3
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
from benchlib import BIN, ROOT, write_results  # noqa: E402

SCRIPT = ROOT / "examples" / "hvd_elastic_mlp.py"


class BenchError(RuntimeError):
    pass


def _rows(folder: Path) -> list[dict]:
    out = []
    for f in sorted(folder.glob("samples-*.jsonl")):
        for ln in f.read_text().splitlines():
            try:
                out.append(json.loads(ln))
            except json.JSONDecodeError:  # a line being written
                pass
    return out


def _rank0(folder: Path) -> list[dict]:
    return sorted((r for r in _rows(folder) if r["rank"] == 0), key=lambda r: r["t"])


def losses(rows: list[dict], follow: int = 10) -> list[dict]:
    """Each change of world size in rank 0's step records: (from, to, time lost)."""
    out = []
    for i in range(1, len(rows)):
        if rows[i]["size"] != rows[i - 1]["size"]:
            after = [rows[j]["t"] - rows[j - 1]["t"] for j in range(i + 1, min(len(rows), i + 1 + follow))
                     if rows[j]["size"] == rows[i]["size"]]
            steady = statistics.median(after) if after else 0.0
            out.append({"from": rows[i - 1]["size"], "to": rows[i]["size"],
                        "lost_s": rows[i]["t"] - rows[i - 1]["t"] - steady})
    return out


def _script_args(a, log: Path) -> list[str]:
    return ["--epochs", str(a.epochs), "--train-size", str(a.train_size), "--log-samples", str(log)]


def _env() -> dict[str, str]:
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", PYTHONUNBUFFERED="1")
    # Horovod's default cycle time on both sides: elastic-ring's in-place workers drop a
    # HOROVOD_CYCLE_TIME (elastic_ring.worker.ring), so Horovod Elastic's must not get one either
    env.pop("HOROVOD_CYCLE_TIME", None)
    return env


def ours(a, tmp: Path) -> dict:
    s, run, log = a.resize_steps, tmp / f"ours-{time.time_ns()}", tmp / f"ours-log-{time.time_ns()}"
    cmd = [str(BIN / "elastic-ring"), "train", "--script", str(SCRIPT), "--gpus", "1", "--slots", "2",
           "--schedule", f"{s}:2,{2 * s}:1", "--steps", str(2 * s + a.after), "--relaunch", "inplace",
           "--run-dir", str(run),
           "--", *_script_args(a, log)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise BenchError(f"elastic-ring train exited with {p.returncode}: {p.stderr[-2000:]}")
    ev = [json.loads(ln) for ln in (run / "events.jsonl").read_text().splitlines()]
    ov = [{"from": e["from_workers"], "to": e["to_workers"], "lost_s": e["total_lost_s"]}
          for e in ev if e["kind"] == "resize_overhead"]
    res = {"wall_s": wall, "resizes": losses(_rank0(log)), "controller_resizes": ov}
    shutil.rmtree(run, ignore_errors=True)
    shutil.rmtree(log, ignore_errors=True)
    return res


def horovod_elastic(a, tmp: Path) -> dict:
    s, d = a.resize_steps, tmp / f"hvd-{time.time_ns()}"
    d.mkdir()
    hosts, disc, log = d / "hosts", d / "discover.sh", d / "log"
    hosts.write_text("localhost:1\n")
    disc.write_text(f"#!/bin/sh\ncat '{hosts}'\n")
    disc.chmod(0o755)
    cmd = [str(BIN / "horovodrun"), "-np", "1", "--min-np", "1", "--max-np", "2", "--host-discovery-script",
           str(disc), "--network-interface", "lo", "--gloo", sys.executable, "-u", str(SCRIPT),
           *_script_args(a, log)]
    t0 = time.perf_counter()
    with open(d / "out.txt", "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            after = a.after
            for until, hosts_text in ((lambda r: len(r) >= s, "localhost:2\n"),
                                      (lambda r: sum(x["size"] == 2 for x in r) >= s, "localhost:1\n"),
                                      (lambda r: len(r) > after and r[-1]["size"] == 1
                                       and all(x["size"] == 1 for x in r[-after:])
                                       and any(x["size"] == 2 for x in r), None)):
                while not until(_rank0(log)):
                    if proc.poll() is not None:
                        raise BenchError(f"horovodrun exited with {proc.returncode}: "
                                         f"{(d / 'out.txt').read_text()[-2000:]}")
                    if time.perf_counter() - t0 > 1800:
                        raise BenchError("horovod elastic: timed out")
                    time.sleep(0.05)
                if hosts_text:
                    hosts.write_text(hosts_text)
        finally:
            if proc.poll() is None:  # enough steps after the shrink: the rest of its epochs is not timed
                os.killpg(proc.pid, 9)
                proc.wait()
    res = {"wall_s": None, "resizes": losses(_rank0(log))}
    shutil.rmtree(d, ignore_errors=True)
    return res


HARNESSES = {"elastic-ring": ours, "horovod-elastic": horovod_elastic}


def summarise(rounds: list[dict]) -> dict:
    out: dict = {}
    for h in HARNESSES:
        for kind in ("grow", "shrink"):
            v = [r[h]["resizes"][0 if kind == "grow" else 1]["lost_s"] for r in rounds
                 if len(r[h]["resizes"]) == 2]
            out.setdefault(h, {})[f"{kind}_lost_s_median"] = statistics.median(v) if v else None
    for kind in ("grow", "shrink"):
        a, b = out["elastic-ring"][f"{kind}_lost_s_median"], out["horovod-elastic"][f"{kind}_lost_s_median"]
        out[f"{kind}_ratio_ours_over_horovod"] = a / b if a is not None and b else None
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--resize-steps", type=int, default=60, help="grow after step S, shrink after 2S")
    p.add_argument("--after", type=int, default=20, help="steps timed after the shrink")
    p.add_argument("--epochs", type=int, default=40, help="more than the run needs: it is cut after the shrink")
    p.add_argument("--train-size", type=int, default=384)
    p.add_argument("--out", type=Path, default=ROOT / "results" / "bench_hvd_elastic.json")
    a = p.parse_args(argv)
    load_before = os.getloadavg()[0]
    rounds = []
    with tempfile.TemporaryDirectory(prefix="bhe") as t:
        for i in range(a.repeats):
            order = list(HARNESSES) if i % 2 == 0 else list(HARNESSES)[::-1]
            r = {}
            for h in order:
                r[h] = HARNESSES[h](a, Path(t))
                print(f"round {i + 1} {h}: " + ", ".join(f"{x['from']}->{x['to']} {x['lost_s']:.2f} s lost"
                                                         for x in r[h]["resizes"]), flush=True)
            rounds.append(r)
    out = {"script": str(SCRIPT.relative_to(ROOT)), "resize_steps": a.resize_steps, "epochs": a.epochs,
           "train_size": a.train_size, "rounds": rounds, "summary": summarise(rounds)}
    print(json.dumps(out["summary"], indent=2))
    write_results(a.out, out, load_before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
