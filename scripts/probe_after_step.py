#!/usr/bin/env python
"""The first microseconds after a step: what small operations cost right after a training step,
against the same operations a moment later, and the library's calls there before and after
issue 50's changes (one process, ``OMP_NUM_THREADS=1``, no tool).

A step here is one forward and backward pass of a 4096 x 4096 linear layer on 32 samples (the
``large`` MLP step of ``scripts/bench_step_cost.py``, about 64 MB of weights and gradients). After
each step the probe times, with ``perf_counter_ns``, one kind of operation twice in a row:

* ``python``: ``sum(range(50))``; ``torch_empty``: ``torch.empty(0)``; ``torch_slice``: a 32-index
  slice of a tensor (each the first code after the step, then the same again);
* ``next_batch_take``: a batch's indices as ``Sampler.next_batch`` took them before (a slice of
  the epoch's permutation and a ``torch.cat``), against ``next_batch_prepared``, today's
  ``Sampler.next_batch`` (the next 64 steps' batches prepared at once, a step's own taken by a
  list's ``pop()``);
* ``vote_new_tensor``: a Horovod stop vote as it was started before (a tensor made from the
  values, ``hvd.allreduce_async``) against ``vote_in_place``, today's (the values written into
  one kept tensor, ``hvd.allreduce_async_``), each read 10 ms later (Horovod in one process).

The kinds alternate over ``--rounds`` rounds of ``--steps`` steps; per kind the median of the
first call after the step and of the second, and per pair (before/after) the ratio of medians.
Results: ``results/probe_after_step.json``.

    .venv/bin/python scripts/probe_after_step.py --rounds 3 --steps 60
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import types
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import ROOT, write_results  # noqa: E402

OUT = ROOT / "results" / "probe_after_step.json"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60, help="steps per kind and round")
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    if a.rounds < 1 or a.steps < 2:
        ap.error("--rounds at least 1, --steps at least 2")
    load = os.getloadavg()[0]
    sys.path.insert(0, str(ROOT))
    import torch

    torch.set_num_threads(1)
    import horovod.torch as hvd

    from elastic_ring.data.stream import SampleStream
    from elastic_ring.worker.sampler import Sampler

    hvd.init()
    x = torch.randn(32, 4096)
    w = torch.randn(4096, 4096, requires_grad=True)

    def step() -> None:
        (x @ w).relu().sum().backward()
        w.grad = None

    stream = SampleStream(60000, 0)
    sampler = Sampler(types.SimpleNamespace(rank=0, size=2), 60000, 32, 0)
    perm = stream.permutation(0)
    cursor = [0]
    values = [0.0, 0.0, 9.0, 3.0, 0.0, 0.5]
    kept = [torch.zeros(len(values)) for _ in range(2)]  # (the two calls of a step: both in flight)
    kept_np = [t.numpy() for t in kept]
    which = [0]

    def take() -> None:
        cursor[0] = (cursor[0] + 64) % 50000
        stream.take(cursor[0], 32)

    def vote_new():
        which[0] ^= 1
        return hvd.allreduce_async(torch.tensor(values, dtype=torch.float32), op=hvd.Sum,
                                   name=f"probe_a{which[0]}")

    def vote_kept():
        which[0] ^= 1
        kept_np[which[0]][:] = values
        return hvd.allreduce_async_(kept[which[0]], op=hvd.Sum, name=f"probe_b{which[0]}")

    kinds = {
        "python": lambda: sum(range(50)),
        "torch_empty": lambda: torch.empty(0),
        "torch_slice": lambda: perm[100:132],
        "next_batch_take": take,
        "next_batch_prepared": sampler.next_batch,
        "vote_new_tensor": vote_new,
        "vote_in_place": vote_kept,
    }
    times: dict[str, dict[str, list[float]]] = {k: {"first": [], "second": []} for k in kinds}
    clock = time.perf_counter_ns
    for r in range(a.rounds):
        order = list(kinds) if r % 2 == 0 else list(kinds)[::-1]  # alternating
        for name in order:
            f = kinds[name]
            for _ in range(a.steps):
                step()
                t0 = clock()
                h1 = f()
                t1 = clock()
                h2 = f()
                t2 = clock()
                if name.startswith("vote"):  # (each read after the collective is done)
                    time.sleep(0.01)
                    hvd.synchronize(h1)
                    hvd.synchronize(h2)
                times[name]["first"].append((t1 - t0) / 1e3)
                times[name]["second"].append((t2 - t1) / 1e3)
        print(f"round {r + 1}: " + ", ".join(f"{k} {statistics.median(v['first'][-a.steps:]):.1f} us"
                                             for k, v in times.items()), flush=True)
    out = {k: {"first_median_us": round(statistics.median(v["first"]), 2),
               "second_median_us": round(statistics.median(v["second"]), 2),
               "first_over_second": round(statistics.median(v["first"]) / statistics.median(v["second"]), 2)}
           for k, v in times.items()}
    pairs = {"next_batch": ("next_batch_prepared", "next_batch_take"), "vote": ("vote_in_place", "vote_new_tensor")}
    ratios = {k: round(out[new]["first_median_us"] / out[old]["first_median_us"], 3) for k, (new, old) in pairs.items()}
    for k, v in out.items():
        print(f"{k}: first after the step {v['first_median_us']:.1f} us, again {v['second_median_us']:.1f} us")
    print("after / before, the first call after the step:", ratios)
    write_results(a.out, {"settings": {"rounds": a.rounds, "steps": a.steps, "omp_threads": 1,
                                       "step": "32 x 4096 @ 4096 x 4096, forward and backward"},
                          "kinds": out, "after_over_before": ratios}, load)
    return 0


if __name__ == "__main__":
    sys.exit(main())
