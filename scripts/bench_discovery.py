#!/usr/bin/env python
"""Hosts that come and go (issue 45's targets): the same Horovod Elastic script, unchanged, under
elastic-ring's host discovery and under Horovod Elastic's, driven by the same discovery schedule,
side by side in alternating rounds.

The script is ``examples/hvd_elastic_mlp.py`` (``--log-samples``: every rank's step records with
the samples and the time each step ended). The two hosts are ``localhost`` and ``127.0.0.1`` (one
slot each), as in the tests. Both sides poll the same kind of discovery script (``cat`` of a file
the bench rewrites) every second, Horovod Elastic's own interval:

1. ``localhost:1`` at the start;
2. once rank 0 has done ``--steps-before`` steps, ``127.0.0.1:1`` appears (the **appear** change);
3. once rank 0 has done as many steps at 2 workers, ``127.0.0.1`` is dropped (the **drop** change);
4. the run is ended ``--after`` steps later.

* ``elastic-ring``: ``elastic-ring train --script SCRIPT --host-discovery-script D
  --discovery-interval 1 --min-workers 1 --max-workers 2`` (horovodrun over the hosts);
* ``horovod-elastic``: ``horovodrun -np 1 --min-np 1 --max-np 2 --host-discovery-script D``;
* with ``--inplace``, a third side, ``elastic-ring-inplace``: ``elastic-ring train ... --relaunch
  inplace`` (Horovod Elastic's driver under elastic-ring, the ring re-formed in place over the
  hosts). In place the script's first answer decides whether the ring runs over the hosts it names
  or on this host only (docs/hosts.md), so this side starts on both hosts and takes the same two
  changes in the other order: ``127.0.0.1`` is dropped once rank 0 has done ``--steps-before``
  steps at 2 workers, listed again once it has done as many at 1, and the run is ended ``--after``
  steps at 2 later (``inplace_schedule`` in the results says so);
* ``elastic-ring-inplace-scheduled`` (named in ``--sides``): the same in-place run over the same two
  hosts, the discovery listing both all along, with the same two changes asked by a schedule
  instead (``--schedule D:1,A:2``): the shrink to one worker off ``127.0.0.1`` after step D, the
  grow back onto it after step A, the steps at which the drop side's last run shrank and grew (so
  that each change comes as long after the ring's start as the drop side's: a warm spare, for
  one, is started once the ring trains); before any run of that side, D and A are
  ``--steps-before`` and twice that. The issue's target for a drop is "no more training time than
  a scheduled shrink": this is that shrink, measured the same way beside the drop (its **to first
  step** is from the moment the bench saw rank 0's step D, where the drop's is from the file's
  rewrite); ``ratio_elastic_ring_inplace_over_scheduled`` pairs the two sides' rounds and
  ``scheduled_steps`` says each round's D and A.

Figures per change, from rank 0's step records: **to first step**, from the moment the bench
rewrote the file to the end of the first step at the new size (the target for the appear change:
within one discovery interval plus a warm grow); **lost**, the gap between the last step at the old
size and the first at the new one less one steady step of the new size (as
scripts/bench_hvd_elastic.py); **samples redone**, the samples of an epoch trained more than once
over the whole run (the target for the drop: 0). Medians over rounds with the spread, the paired
ratios elastic-ring / Horovod Elastic, and the machine's load before and after each run.

    .venv/bin/python scripts/bench_discovery.py [--rounds 3] [--inplace] [--sides A,B] [--out F]
    -> results/bench_discovery.json

``--sides`` runs only the sides named (e.g. ``elastic-ring-inplace,horovod-elastic``: the drop in
place paired with Horovod Elastic's, without the slower relaunch side; or
``elastic-ring-inplace,elastic-ring-inplace-scheduled``: the drop beside the scheduled shrink); a
ratio is written for each side run beside ``horovod-elastic``. ``--keep DIR`` keeps each run's
folder (its run directory, logs and step records) under DIR, for a look at where the time went.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_hvd_elastic import _env, _rank0, _rows, losses  # noqa: E402
from benchlib import BIN, ROOT, exit_on_sigterm, spread, write_results  # noqa: E402

SCRIPT = ROOT / "examples" / "hvd_elastic_mlp.py"
INTERVAL = 1.0  # Horovod Elastic's discovery interval (seconds), used by both sides
ONE, TWO = "localhost:1\n", "localhost:1\n127.0.0.1:1\n"
INPLACE = "elastic-ring-inplace"
SCHEDULED = "elastic-ring-inplace-scheduled"  # the same in-place run, its two changes asked by --schedule
IN_PLACE = (INPLACE, SCHEDULED)  # the sides that start on both hosts (drop, then appear)
SIDES = ("elastic-ring", "horovod-elastic", INPLACE, SCHEDULED)
INPLACE_SCHEDULE = ("starts on both hosts; 127.0.0.1 dropped after --steps-before steps at 2, listed again after "
                    "as many at 1, ended --after steps at 2 later")


def script_args(log: Path) -> list[str]:
    return ["--epochs", "200", "--train-size", "384", "--log-samples", str(log)]  # (ended by the bench long before)


def redone(rows: list[dict]) -> int:
    """Samples of an epoch trained more than once, over every rank's records."""
    seen: set[tuple[int, int]] = set()
    n = 0
    for r in rows:
        for i in r["idx"]:
            key = (r["epoch"], i)
            n += key in seen
            seen.add(key)
    return n


def schedule(side: str, a, marks: dict[str, float]) -> tuple:
    """(name, until rank 0's records say so, the hosts then) for each change of ``side``'s run."""
    s = a.steps_before
    if side == SCHEDULED:  # the file stays; the schedule's steps reached (rank 0 records every step)
        d, g = a.scheduled_steps
        return (("drop", lambda r: len(r) >= d, None), ("appear", lambda r: len(r) >= g, None),
                ("end", lambda r: "appear" in marks and sum(x["size"] == 2 and x["t"] > marks["appear"] for x in r)
                 >= a.after, None))
    if side == INPLACE:  # over both hosts from the start: drop, then appear (the module docstring)
        return (("drop", lambda r: sum(x["size"] == 2 for x in r) >= s, ONE),
                ("appear", lambda r: sum(x["size"] == 1 for x in r) >= s, TWO),
                ("end", lambda r: "appear" in marks and sum(x["size"] == 2 and x["t"] > marks["appear"] for x in r)
                 >= a.after, None))
    return (("appear", lambda r: len(r) >= s, TWO),
            ("drop", lambda r: sum(x["size"] == 2 for x in r) >= s, ONE),
            ("end", lambda r: "drop" in marks and sum(x["size"] == 1 and x["t"] > marks["drop"] for x in r)
             >= a.after, None))


def drive(a, side: str, proc: subprocess.Popen, hosts: Path, log: Path, out: Path) -> dict[str, float]:
    """Rewrite the hosts file along ``side``'s schedule; the time of each rewrite."""
    t0, marks = time.time(), {}
    for name, until, text in schedule(side, a, marks):
        while not until(_rank0(log)):
            if proc.poll() is not None:
                raise SystemExit(f"{proc.args[0]} exited with {proc.returncode} before '{name}':\n"
                                 f"{out.read_text()[-3000:]}")
            if time.time() - t0 > 600:
                raise SystemExit(f"timed out before '{name}':\n{out.read_text()[-3000:]}")
            time.sleep(0.02)
        marks[name] = time.time()
        if text:  # in one step: a file rewritten in place can be read empty (no hosts) by the script
            tmp = hosts.with_name(hosts.name + ".tmp")
            tmp.write_text(text)
            os.replace(tmp, hosts)
    return marks


def one(side: str, a, tmp: Path) -> dict:
    d = tmp / f"{side}-{time.time_ns()}"
    d.mkdir()
    hosts, disc, log, out = d / "hosts", d / "discover.sh", d / "log", d / "out.txt"
    hosts.write_text(TWO if side in IN_PLACE else ONE)
    disc.write_text(f"#!/bin/sh\ncat '{hosts}'\n")
    disc.chmod(0o755)
    if side != "horovod-elastic":
        s = a.steps_before
        cmd = [str(BIN / "elastic-ring"), "train", "--script", str(SCRIPT), "--host-discovery-script", str(disc),
               "--discovery-interval", str(INTERVAL), "--min-workers", "1", "--max-workers", "2",
               *(["--relaunch", "inplace"] if side in IN_PLACE else []),
               *(["--schedule", "{}:1,{}:2".format(*a.scheduled_steps)] if side == SCHEDULED else []),
               "--steps", "100000", "--run-dir", str(d / "run"), "--", *script_args(log)]
    else:
        cmd = [str(BIN / "horovodrun"), "-np", "1", "--min-np", "1", "--max-np", "2", "--host-discovery-script",
               str(disc), "--network-interface", "lo", "--gloo", sys.executable, "-u", str(SCRIPT),
               *script_args(log)]
    load = os.getloadavg()[0]
    with open(out, "w") as fh:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            marks = drive(a, side, proc, hosts, log, out)
        finally:
            if proc.poll() is None:  # enough steps after the drop: the rest is not timed
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    rows = _rank0(log)
    went = losses(rows)
    sizes = [(2, 1), (1, 2)] if side in IN_PLACE else [(1, 2), (2, 1)]
    if [(c["from"], c["to"]) for c in went] != sizes:
        raise SystemExit(f"{side}: the sizes went {went}, not {sizes}:\n{out.read_text()[-3000:]}")
    changes = {(c["from"], c["to"]): c for c in went}
    first2 = next(r["t"] for r in rows if r["size"] == 2 and r["t"] > marks["appear"])
    first1 = next(r["t"] for r in rows if r["size"] == 1 and r["t"] > marks["drop"])
    if side == INPLACE:  # the steps it shrank and grew after: the scheduled side's next schedule
        a.scheduled_steps = (sum(r["size"] == 2 for r in rows if r["t"] < first1),
                             sum(r["t"] < first2 for r in rows))
    return {"appear": {"to_first_step_s": first2 - marks["appear"], "lost_s": changes[(1, 2)]["lost_s"]},
            "drop": {"to_first_step_s": first1 - marks["drop"], "lost_s": changes[(2, 1)]["lost_s"]},
            "samples_redone": redone(_rows(log)), "load": [load, os.getloadavg()[0]]}


def main() -> None:
    exit_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps-before", type=int, default=40, help="steps before each change")
    ap.add_argument("--after", type=int, default=20, help="steps timed after the drop")
    ap.add_argument("--inplace", action="store_true",
                    help=f"also the side {INPLACE} (--relaunch inplace over the hosts; its schedule: the docstring)")
    ap.add_argument("--sides", default=None,
                    help=f"only these sides, comma-separated (of {', '.join(SIDES)})")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_discovery.json")
    ap.add_argument("--keep", type=Path, default=None, help="keep each run's folder under this one")
    a = ap.parse_args()
    load0 = os.getloadavg()[0]
    runs: dict[str, list[dict]] = {"elastic-ring": [], "horovod-elastic": [], **({INPLACE: []} if a.inplace else {})}
    if a.sides:
        names = [n.strip() for n in a.sides.split(",") if n.strip()]
        unknown = [n for n in names if n not in SIDES]
        if unknown or not names:
            ap.error(f"--sides: not a side: {', '.join(unknown) or a.sides!r}")
        runs = {n: [] for n in names}
    a.scheduled_steps = (a.steps_before, 2 * a.steps_before)  # (then the drop side's, once it ran)
    scheduled_steps: list[list[int]] = []
    if a.keep is not None:
        a.keep.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bdi") as t:
        for r in range(a.rounds):
            order = list(runs) if r % 2 == 0 else list(runs)[::-1]
            for side in order:
                if side == SCHEDULED:
                    scheduled_steps.append(list(a.scheduled_steps))
                res = one(side, a, a.keep or Path(t))
                runs[side].append(res)
                print(f"round {r + 1} {side}: appear -> first step {res['appear']['to_first_step_s']:.2f} s "
                      f"(lost {res['appear']['lost_s']:.2f} s), drop lost {res['drop']['lost_s']:.2f} s, "
                      f"{res['samples_redone']} samples redone (load {res['load'][0]:.1f})", flush=True)
    summary = {side: {f"{c}_{k}": spread([x[c][k] for x in rs]) for c in ("appear", "drop")
                      for k in ("to_first_step_s", "lost_s")} for side, rs in runs.items()}
    for side, rs in runs.items():
        summary[side]["samples_redone"] = spread([float(x["samples_redone"]) for x in rs])
    def ratios(ours: str, other: str = "horovod-elastic") -> dict:
        return {f"{c}_lost": spread([o[c]["lost_s"] / h[c]["lost_s"] for o, h in
                                     zip(runs[ours], runs[other])]) for c in ("appear", "drop")}

    paired = "horovod-elastic" in runs
    inplace = ({"inplace_schedule": INPLACE_SCHEDULE} if any(s in runs for s in IN_PLACE) else {})
    if INPLACE in runs and paired:
        inplace["ratio_elastic_ring_inplace_over_horovod_elastic"] = ratios(INPLACE)
    if SCHEDULED in runs:
        inplace["scheduled"] = "--schedule D:1,A:2, the steps of the drop side's last run (the same hosts listed all along)"
        inplace["scheduled_steps"] = scheduled_steps
        if INPLACE in runs:  # the drop (and the appear) against the same changes asked by the schedule
            inplace["ratio_elastic_ring_inplace_over_scheduled"] = ratios(INPLACE, SCHEDULED)
    relaunch = ({"ratio_elastic_ring_over_horovod_elastic": ratios("elastic-ring")}
                if "elastic-ring" in runs and paired else {})
    write_results(a.out, {"script": str(SCRIPT.relative_to(ROOT)), "discovery_interval_s": INTERVAL,
                          "steps_before": a.steps_before, "after": a.after, "rounds": a.rounds,
                          "sides": list(runs), "runs": runs, "summary": summary, **relaunch, **inplace}, load0)


if __name__ == "__main__":
    main()
