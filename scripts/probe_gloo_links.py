#!/usr/bin/env python3
"""How often a gloo survivor stays blocked after a peer's death, with and without dropping the
links (:mod:`elastic_ring.worker.links`).

Three ranks (gloo, this machine) run ``all_gather_into_tensor`` and ``reduce_scatter_tensor`` in a
loop (an FSDP2 step's collectives); rank 1 is killed (SIGKILL) at a random moment 0.5-1.5 s in.
Each survivor, on its error, either keeps its group as it is (``keep``: how the survive path was
before) or drops its links (``drop``: ``Links.drop()``) and then reports. A survivor that has not
reported within ``--wait`` seconds (the controller's wait, ``survival.WAIT_S``) is counted blocked:
the controller would then restart from the checkpoint on disk instead of going on from memory.
The two modes alternate trial by trial; the machine's load is recorded before and after.

    python scripts/probe_gloo_links.py --trials 60 --out results/probe_gloo_links.json
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from benchlib import free_port, write_results  # noqa: E402


def _rank(rank: int, port: int, mode: str, q: Any) -> None:
    import warnings
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from elastic_ring.worker.links import Links

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    links = Links()
    links.mark()
    links.keep_port(port)
    store = dist.TCPStore("127.0.0.1", port, is_master=rank == 0, world_size=3, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=3, timeout=timedelta(seconds=120))
    q.put(("pid", rank, os.getpid()))
    x, out = torch.ones(200_000), torch.empty(600_000)
    try:
        while True:
            dist.all_gather_into_tensor(out, x)
            dist.reduce_scatter_tensor(x, out)
    except Exception:
        if mode == "drop":
            links.drop()
        q.put(("err", rank, time.time()))
        time.sleep(60)


def _trial(mode: str, wait_s: float) -> dict:
    ctx = mp.get_context("fork")
    q, port = ctx.Queue(), free_port()
    ps = [ctx.Process(target=_rank, args=(r, port, mode, q), daemon=True) for r in range(3)]
    for p in ps:
        p.start()
    try:
        pids = {}
        while len(pids) < 3:
            _, r, pid = q.get(timeout=120)
            pids[r] = pid
        time.sleep(0.5 + random.random())
        t_kill = time.time()
        os.kill(pids[1], signal.SIGKILL)
        said: dict[int, float] = {}
        while len(said) < 2:
            left = wait_s - (time.time() - t_kill)
            if left <= 0:
                break
            try:
                kind, r, t = q.get(timeout=left)
            except Exception:
                break
            if kind == "err":
                said[r] = round(t - t_kill, 4)
        return {"mode": mode, "reported_after_s": {str(r): s for r, s in sorted(said.items())},
                "blocked": [r for r in (0, 2) if r not in said]}
    finally:
        for p in ps:
            p.kill()
        for p in ps:
            p.join(5)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=60, help="trials per mode (default 60)")
    ap.add_argument("--wait", type=float, default=5.0, help="seconds a survivor may take to report (default 5)")
    ap.add_argument("--out", default="results/probe_gloo_links.json", help="where the figures go")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.trials < 1 or a.wait <= 0:
        print("probe_gloo_links: --trials must be at least 1 and --wait above 0", file=sys.stderr)
        return 2
    random.seed(a.seed)
    import torch.distributed  # noqa: F401 (imported once here: each trial's forked ranks start at once)

    from elastic_ring.worker import links  # noqa: F401
    load_before = os.getloadavg()[0]
    trials: list[dict] = []
    t0 = time.time()
    for i in range(a.trials):
        for mode in (("keep", "drop") if i % 2 == 0 else ("drop", "keep")):
            tr = _trial(mode, a.wait)
            trials.append(tr)
            print(f"[{i + 1}/{a.trials}] {mode}: reported {tr['reported_after_s']}, blocked {tr['blocked']}", flush=True)
    summary = {}
    for mode in ("keep", "drop"):
        mine = [t for t in trials if t["mode"] == mode]
        times = sorted(s for t in mine for s in t["reported_after_s"].values())
        summary[mode] = {"trials": len(mine), "blocked_trials": sum(1 for t in mine if t["blocked"]),
                         "median_report_s": times[len(times) // 2] if times else None}
    import torch

    rec = {"what": "3 gloo ranks in an all-gather/reduce-scatter loop, rank 1 killed at random; a survivor "
                   "not reported within wait_s is blocked", "wait_s": a.wait, "torch": torch.__version__,
           "seconds": round(time.time() - t0, 1), "summary": summary, "trials": trials}
    for mode, s in summary.items():
        print(f"{mode}: {s['blocked_trials']} of {s['trials']} trials had a survivor blocked past {a.wait} s "
              f"(median report {s['median_report_s']} s)")
    write_results(Path(a.out), rec, load_before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
