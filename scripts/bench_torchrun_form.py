#!/usr/bin/env python
"""A torchrun script's resize under elastic-ring against torchrun's own elastic restart (issue 47's
target), the same unchanged script, side by side in alternating rounds.

The script is tests/integration/scripts/torchrun_contract.py (torchrun's contract only: its own
process group, its own snapshot every ``--every`` steps, a step of at least ``--step-s``). One run
of each side trains ``--steps`` steps and goes through a grow 1 -> 2 and a shrink 2 -> 1:

- **elastic-ring**: ``train --script ... --workers 1 --slots 2``; the grow and the shrink are
  ``elastic-ring resize RUN --to 2`` / ``--to 1`` (every worker is stopped, SIGTERM then SIGKILL
  after ``--stop-grace``, and started again at the new size).
- **torchrun**: two agents on this machine, ``torchrun --nnodes 1:2 --nproc-per-node 1`` with one
  c10d rendezvous (``last_call_timeout`` 1 s, ``--monitor-interval`` 0.1 s: torchrun's fastest
  reaction). The grow is the start of the second agent (the first sees a node waiting and restarts
  its workers into a new round); the shrink is SIGTERM to the second agent (how a node leaves
  under torchrun: its workers stop, the first agent's worker fails in its next allreduce, and that
  agent restarts it into a round of one).

Each change has two figures, from the script's own step records (``t``, the time a step ended).
**To first step**: from the moment the bench triggers it (just before it starts the `resize`
command or the second agent, or sends the SIGTERM) to the end of the first step at the new size.
**Training time lost**: the gap between the last step at the old size and that first step, less
one steady step of the new size (the step that would have run anyway); a side that trains on at
the old size while it reacts is not charged for that time. **Steps redone** are those trained
again because the script went back to its snapshot (over the run's two changes). Both sides pay the script's own restart (its torch
import, ``init_process_group``, loading its snapshot).

Rounds alternate which side goes first; the figures are medians over rounds with the spread, and
the paired ratios (elastic-ring / torchrun) round by round, with the machine's load before and
after each run (scripts/benchlib.py).

    .venv/bin/python scripts/bench_torchrun_form.py [--rounds 3] [--steps 400]
    .venv/bin/python scripts/bench_torchrun_form.py --quick      # one short round: does it work
    -> results/bench_torchrun_form.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import exit_on_sigterm, free_port, spread, train_env, write_results

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "integration" / "scripts" / "torchrun_contract.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")
EVERY, STEP_S = 5, 0.1
GROW_AFTER, SHRINK_AFTER = 12, 12  # steps trained at the old size before each change


def log(out: Path) -> list[dict]:
    try:
        return [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines() if x.endswith("}")]
    except FileNotFoundError:
        return []


def wait(pred, procs: list[subprocess.Popen], timeout: float = 180.0):
    t0 = time.time()
    while time.time() - t0 < timeout:
        got = pred()
        if got:
            return got
        for p in procs:
            if p.poll() not in (None, 0):
                logs = [Path(p.stderr_path).read_text()[-3000:] for p in procs if hasattr(p, "stderr_path")]
                raise SystemExit(f"a process ended with {p.returncode} during the bench: {p.args}\n" + "\n".join(logs))
        time.sleep(0.02)
    raise SystemExit("timed out waiting in the bench")


def steps_at(out: Path, world: int, after: float = 0.0) -> list[dict]:
    return [r for r in log(out) if r["kind"] == "step" and r["world"] == world and r["t"] > after]


def change(out: Path, world: int, t_trigger: float, procs) -> dict:
    """The change to ``world`` triggered at ``t_trigger``: trigger -> the end of the first step at
    ``world``; and the training time lost, the gap between the last step at the old size and that
    first step, less one steady step of the new size (the side that trains on while it reacts is
    not charged for it; what it trains again is counted in steps redone)."""
    first = wait(lambda: (lambda s: s[:3] if len(s) >= 3 else None)(steps_at(out, world, t_trigger)), procs)
    steady = statistics.median(b["t"] - a["t"] for a, b in zip(first, first[1:]))
    last_old = max(r["t"] for r in log(out) if r["kind"] == "step" and r["world"] != world and r["t"] < first[0]["t"])
    return {"to_first_step_s": first[0]["t"] - t_trigger, "lost_s": first[0]["t"] - last_old - steady}


def redone(out: Path, steps: int) -> tuple[int, list[int]]:
    trained = [r["step"] for r in log(out) if r["kind"] == "step"]
    assert sorted(set(trained)) == list(range(1, steps + 1)), "a step was never trained"
    starts = [r for r in log(out) if r["kind"] == "start"]
    return len(trained) - steps, [s["world"] for s in starts]


def script_args(out: Path, steps: int) -> list[str]:
    return ["--out", str(out), "--steps", str(steps), "--every", str(EVERY), "--step-s", str(STEP_S)]


def ours(tmp: Path, steps: int) -> dict:
    run, out = tmp / "run", tmp / "out"
    env = train_env()
    p = subprocess.Popen([sys.executable, "-m", "elastic_ring.cli.main", "train", "--script", str(SCRIPT),
                          "--workers", "1", "--slots", "2", "--device", "cpu", "--stop-grace", "10",
                          "--run-dir", str(run), "--", *script_args(out, steps)],
                         cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait(lambda: len(steps_at(out, 1)) >= GROW_AFTER, [p])
        t = time.time()
        subprocess.run([sys.executable, "-m", "elastic_ring.cli.main", "resize", str(run), "--to", "2"],
                       cwd=ROOT, env=env, check=True, capture_output=True)
        grow = change(out, 2, t, [p])
        wait(lambda: len(steps_at(out, 2)) >= SHRINK_AFTER, [p])
        t = time.time()
        subprocess.run([sys.executable, "-m", "elastic_ring.cli.main", "resize", str(run), "--to", "1"],
                       cwd=ROOT, env=env, check=True, capture_output=True)
        shrink = change(out, 1, t, [p])
        _, err = p.communicate(timeout=300)
        if p.returncode != 0:
            raise SystemExit(f"elastic-ring train failed:\n{err[-3000:]}")
    finally:
        if p.poll() is None:
            p.kill()
    n, worlds = redone(out, steps)
    return {"grow": grow, "shrink": shrink, "steps_redone": n, "worlds": worlds}


def theirs(tmp: Path, steps: int, n: int) -> dict:
    out = tmp / "out"
    cmd = [str(TORCHRUN), "--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", f"bench{n}", "--max-restarts", "3",
           "--monitor-interval", "0.1", "--rdzv-conf", "last_call_timeout=1", str(SCRIPT), *script_args(out, steps)]
    joiner = list(cmd)  # the second agent joins the first's store (on one host both would try to host it)
    joiner[joiner.index("last_call_timeout=1")] = "last_call_timeout=1,is_host=false"
    # (the shared TCPStore of torch 2.14 leaves a joiner of a later round waiting for a key its rank 0
    # does not write again: torchrun's own opt-out of the sharing)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    a = subprocess.Popen(cmd, cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=open(tmp / "a.log", "wb"),
                         start_new_session=True)
    a.stderr_path = tmp / "a.log"
    b = None
    try:
        wait(lambda: len(steps_at(out, 1)) >= GROW_AFTER, [a])
        t = time.time()
        b = subprocess.Popen(joiner, cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=open(tmp / "b.log", "wb"),
                             start_new_session=True)
        b.stderr_path = tmp / "b.log"
        grow = change(out, 2, t, [a, b])
        wait(lambda: len(steps_at(out, 2)) >= SHRINK_AFTER, [a, b])
        t = time.time()
        b.send_signal(signal.SIGTERM)
        shrink = change(out, 1, t, [a])
        a.wait(timeout=300)
        if a.returncode != 0:
            raise SystemExit(f"torchrun failed:\n{(tmp / 'a.log').read_text()[-3000:]}")
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    n_redone, worlds = redone(out, steps)
    return {"grow": grow, "shrink": shrink, "steps_redone": n_redone, "worlds": worlds}


def main() -> None:
    exit_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=400, help="steps of each run (enough for both changes to land)")
    ap.add_argument("--quick", action="store_true", help="one round, to see that it works")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_torchrun_form.json")
    a = ap.parse_args()
    rounds = 1 if a.quick else a.rounds
    load0 = os.getloadavg()[0]
    runs: dict[str, list[dict]] = {"elastic_ring": [], "torchrun": []}
    for r in range(rounds):
        order = ["elastic_ring", "torchrun"] if r % 2 == 0 else ["torchrun", "elastic_ring"]
        for side in order:
            with tempfile.TemporaryDirectory(prefix="btf") as d:
                before = os.getloadavg()[0]
                res = ours(Path(d), a.steps) if side == "elastic_ring" else theirs(Path(d), a.steps, r)
                res["load"] = [before, os.getloadavg()[0]]
                runs[side].append(res)
                print(f"round {r + 1} {side}: grow lost {res['grow']['lost_s']:.2f} s (first step after "
                      f"{res['grow']['to_first_step_s']:.2f} s), shrink lost "
                      f"{res['shrink']['lost_s']:.2f} s, {res['steps_redone']} steps redone, "
                      f"starts at {res['worlds']} (load {before:.1f})", flush=True)
    summary = {}
    for side, rs in runs.items():
        summary[side] = {f"{c}_{k}": spread([x[c][k] for x in rs]) for c in ("grow", "shrink")
                         for k in ("lost_s", "to_first_step_s")}
        summary[side]["steps_redone"] = spread([float(x["steps_redone"]) for x in rs])
    ratios = {c: spread([o[c]["lost_s"] / t[c]["lost_s"] for o, t in zip(runs["elastic_ring"], runs["torchrun"])])
              for c in ("grow", "shrink")}
    write_results(a.out, {"script": str(SCRIPT.relative_to(ROOT)), "steps": a.steps, "snapshot_every": EVERY,
                          "step_s_at_least": STEP_S, "rounds": rounds, "runs": runs, "summary": summary,
                          "ratio_elastic_ring_over_torchrun": ratios}, load0)


if __name__ == "__main__":
    main()
