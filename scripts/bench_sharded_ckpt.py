#!/usr/bin/env python
"""The training thread's stall per checkpoint of a sharded model (FSDP2: every rank copies its
shards, DCP writes them in a background thread) against today's full one (the same model
replicated with DDP: rank 0 copies the whole state, a thread writes it), for the same model.

Real ``elastic-ring train --collective torch`` runs at 2 workers (gloo, CPU) of an MLP (16 -> W ->
W -> 4, Adam: weights plus two moments), ``--checkpoint-every K``; the two kinds alternate, one run
each per round. Per run: the median of rank 0's ``stall_s`` over its checkpoint_written events (the
wait for the previous write, plus the copy; for a sharded one also DCP's state dict of its shards),
and the median seconds of the write itself (``seconds``: in the background). Medians over rounds.
The first checkpoint of a sharded run also makes DCP's gloo group (once per process group): it is
left out (``--skip-first``, default 1) for both kinds alike.

    .venv/bin/python scripts/bench_sharded_ckpt.py --rounds 3     # -> results/bench_sharded_ckpt.json

``--copy``: the training thread's copy alone, in process (no controller, no write), at several
model sizes: 2 ranks spawned here (gloo), each holding the MLP sharded (FSDP2) and the same MLP
whole, both with Adam's state. A measurement is one copy after a training step of that model (the
step not timed): ``full``, today's full checkpoint's (rank 0: the model's and the optimizer's state
dicts copied to the CPU, ``elastic_ring.ckpt.snapshot``; rank 1 copies nothing, as in a run);
``sharded``, a sharded checkpoint's (``elastic_ring.worker.sharded.Copier``: its plan and layout,
the shards copied into the previous copy's CPU tensors, handed back before the step as the writer
thread does, not timed); ``sharded_dcp``, the same through DCP's ``get_state_dict`` at every copy
(what it did before the plan). The rest both copy on rank 0 (step, data position, RNG, ...) is the
same and left out. A sharded copy's stall is the slower rank's, copy by copy (the next collective
waits for it); a full one's is rank 0's. The kinds take turns, ``--run`` copies each (their order
turned at every turn): by default 1, interleaved copy by copy, so that each full copy has a
sharded one next to it under the same load; ``--run`` as ``--reps`` gives each kind a block per
round (each copy then follows copies of its own kind: other caches' state; its pairs are farther
apart in time, so another process's load weighs on one kind more than the other). Per
round the median over ``--reps`` copies of each kind; then medians over rounds and of the paired
per-round ratios; also the ratio of each sharded copy to the full one of the same rep (median,
quartiles, the share below 1), and the training thread's CPU time of each copy (``thread_time``:
without the time it waited for a core, though not free of what other processes do to the caches).

    .venv/bin/python scripts/bench_sharded_ckpt.py --copy --rounds 3   # -> results/bench_sharded_ckpt.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from benchlib import exit_on_sigterm, free_port, train_env, write_results  # noqa: E402

WORKER = r'''
import argparse
import torch
import elastic_ring.worker as elastic

p = argparse.ArgumentParser()
p.add_argument("--width", type=int, required=True)
p.add_argument("--sharded", action="store_true")
a = p.parse_args()
job = elastic.init()
torch.manual_seed(0)
w = a.width
model = torch.nn.Sequential(torch.nn.Linear(16, w), torch.nn.ReLU(), torch.nn.Linear(w, w), torch.nn.ReLU(),
                            torch.nn.Linear(w, 4))
if a.sharded:
    from torch.distributed.fsdp import fully_shard
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    net = model
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
else:
    net, opt = job.parallel(model, torch.optim.Adam(model.parameters(), lr=1e-3))
x, y = torch.randn(256, 16), torch.randint(0, 4, (256,))
data = job.sampler(256, batch_size=8, seed=0)
job.register(model=model, optimizer=opt)
job.restore()
for step in job.steps():
    idx = data.next_batch()
    loss = torch.nn.functional.cross_entropy(net(x[idx]), y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
    job.record(loss, samples=len(idx))
'''


def one_run(folder: Path, script: Path, kind: str, width: int, steps: int, every: int, skip: int) -> dict:
    run = folder / f"{kind}-run"
    cmd = [sys.executable, "-m", "elastic_ring.cli.main", "train", "--script", str(script), "--collective", "torch",
           "--gpus", "2", "--slots", "2", "--steps", str(steps), "--checkpoint-every", str(every),
           "--checkpoint-every-s", "0", "--run-dir", str(run), "--", "--width", str(width)]
    if kind == "sharded":
        cmd.append("--sharded")
    p = subprocess.run(cmd, cwd=ROOT, env=train_env(), capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise SystemExit(f"{kind} run failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    ev = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    ck = [e for e in ev if e["kind"] == "checkpoint_written"][skip:]
    if not ck:
        raise SystemExit(f"{kind} run wrote no checkpoint past the first {skip}")
    return {"stall_ms": statistics.median(e["stall_s"] for e in ck) * 1e3,
            "write_ms": statistics.median(e["seconds"] for e in ck) * 1e3,
            "bytes": ck[-1]["bytes"], "checkpoints": len(ck)}


KINDS = ("full", "sharded", "sharded_dcp")


def _copy_rank(rank: int, port: int, widths: list[int], rounds: int, reps: int, run: int, q) -> None:
    """One of the two ranks of ``--copy``: every width's copies timed; rank 0 puts the results on ``q``."""
    import time
    import types

    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from torch.distributed.fsdp import fully_shard

    from elastic_ring.ckpt import snapshot
    from elastic_ring.worker.sharded import Copier, split, state_dicts

    def mlp(w: int) -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(16, w), torch.nn.ReLU(), torch.nn.Linear(w, w), torch.nn.ReLU(),
                                   torch.nn.Linear(w, 4))

    out = {}
    for w in widths:
        sharded = mlp(w)
        for layer in sharded:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer)
        fully_shard(sharded)
        whole = mlp(w)
        st = types.SimpleNamespace(model=sharded, optimizer=torch.optim.Adam(sharded.parameters(), lr=1e-3),
                                   syncing=False)
        whole_opt = torch.optim.Adam(whole.parameters(), lr=1e-3)
        x = torch.randn(8, 16)

        def step(model, opt) -> None:
            opt.zero_grad()
            model(x).pow(2).mean().backward()
            opt.step()

        copier = Copier()
        last: list = [None]

        def copy_sharded() -> None:
            last[0] = copier.copy(st)[0]

        def step_sharded() -> None:
            if last[0] is not None:  # (in a run: the writer thread, once the copy was written: not timed)
                copier.release(last[0])
                last[0] = None
            step(sharded, st.optimizer)

        def copy_dcp() -> None:
            snapshot(split(state_dicts(st.model, st.optimizer), {}))

        def copy_full() -> None:
            if rank == 0:  # (in a run rank 1 copies nothing: it waits in the next collective)
                snapshot({"model": whole.state_dict(), "optimizer": whole_opt.state_dict()})

        fns = {"full": (copy_full, lambda: step(whole, whole_opt)),
               "sharded": (copy_sharded, step_sharded),
               "sharded_dcp": (copy_dcp, lambda: step(sharded, st.optimizer))}
        for _ in range(3):  # Adam's state made, the plan and its layout made, warm (not timed)
            for kind in KINDS:
                fns[kind][1]()
                fns[kind][0]()
        wall: dict[str, list[list[float]]] = {k: [] for k in KINDS}
        cpu: dict[str, list[list[float]]] = {k: [] for k in KINDS}
        for r in range(rounds):
            for k in KINDS:
                wall[k].append([])
                cpu[k].append([])
            for start in range(0, reps, run):  # the kinds in turn, ``run`` copies each, the order turned each time
                n = r * reps + start // run
                for kind in KINDS[n % 3:] + KINDS[:n % 3]:
                    copy, train = fns[kind]
                    for _ in range(start, min(start + run, reps)):
                        train()
                        dist.barrier()
                        c0 = time.thread_time()
                        t0 = time.perf_counter()
                        copy()
                        t1 = time.perf_counter()
                        c1 = time.thread_time()
                        wall[kind][-1].append(t1 - t0)
                        cpu[kind][-1].append(c1 - c0)
        both = [None, None]
        dist.all_gather_object(both, (wall, cpu))
        nbytes = sum(t.numel() * t.element_size() for t in whole.state_dict().values()) + sum(
            t.numel() * t.element_size() for s in whole_opt.state.values() for t in s.values()
            if isinstance(t, torch.Tensor))
        out[w] = {"both": both, "state_bytes": nbytes, "params": sum(p.numel() for p in whole.parameters())}
    if rank == 0:
        q.put(out)
    dist.barrier()
    dist.destroy_process_group()


def _stalls(r0: dict, r1: dict, kind: str) -> list[list[float]]:
    """Per round, each copy's stall of the training (ms): a full one's is rank 0's (rank 1 waits in
    the next collective); a sharded one's the slower rank's, copy by copy (both copy)."""
    if kind == "full":
        return [[t * 1e3 for t in ts] for ts in r0[kind]]
    return [[max(x, y) * 1e3 for x, y in zip(t0, t1)] for t0, t1 in zip(r0[kind], r1[kind])]


def _quartiles(xs: list[float]) -> dict[str, float]:
    q = statistics.quantiles(xs, n=4)
    return {"median": statistics.median(xs), "q1": q[0], "q3": q[2],
            "below_1": sum(x < 1 for x in xs) / len(xs), "n": len(xs)}


def copy_bench(a: argparse.Namespace) -> None:
    """``--copy``: see the module docstring."""
    import torch.multiprocessing as mp

    load_before = os.getloadavg()[0]
    port = free_port()
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    widths = [int(w) for w in a.widths.split(",")]
    mp.start_processes(_copy_rank, args=(port, widths, a.rounds, a.reps, max(1, a.run), q), nprocs=2,
                       start_method="spawn")
    raw = q.get()
    sizes = {}
    for w in widths:
        (w0, c0), (w1, c1) = raw[w]["both"]
        stalls = {k: _stalls(w0, w1, k) for k in KINDS}
        cpus = {k: _stalls(c0, c1, k) for k in KINDS}
        per_round = {k: [statistics.median(ts) for ts in v] for k, v in stalls.items()}
        per_round["sharded_rank0"] = [statistics.median(ts) * 1e3 for ts in w0["sharded"]]  # (its own copy alone)
        med = {k: statistics.median(v) for k, v in per_round.items()}
        ratios = {f"{k}/full": [s / f for s, f in zip(per_round[k], per_round["full"])] for k in KINDS[1:]}
        # each copy against the full one of the same index (with --run 1 the one beside it: the same load)
        pairs = {f"{k}/full": [s / f for sv, fv in zip(stalls[k], stalls["full"]) for s, f in zip(sv, fv)]
                 for k in KINDS[1:]}
        cpu_med = {k: statistics.median(t for ts in v for t in ts) for k, v in cpus.items()}
        sizes[str(w)] = {"params": raw[w]["params"], "state_mb": raw[w]["state_bytes"] / 1e6,
                         "per_round_ms": per_round, "median_ms": med, "paired_ratios": ratios,
                         "median_ratio": {k: statistics.median(v) for k, v in ratios.items()},
                         "copy_by_copy_ratio": {k: _quartiles(v) for k, v in pairs.items()},
                         "cpu_median_ms": cpu_med,
                         "cpu_median_ratio": {f"{k}/full": cpu_med[k] / cpu_med["full"] for k in KINDS[1:]}}
        cbc = sizes[str(w)]["copy_by_copy_ratio"]["sharded/full"]
        print(f"width {w:5d} ({raw[w]['state_bytes'] / 1e6:6.1f} MB of state): full {med['full']:.3f} ms, "
              f"sharded {med['sharded']:.3f} ms, sharded via get_state_dict {med['sharded_dcp']:.3f} ms; "
              f"sharded/full {sizes[str(w)]['median_ratio']['sharded/full']:.2f} "
              f"(rounds {', '.join(f'{x:.2f}' for x in ratios['sharded/full'])}; copy by copy {cbc['median']:.2f}, "
              f"quartiles {cbc['q1']:.2f}-{cbc['q3']:.2f}, {cbc['below_1']:.0%} below 1; CPU time "
              f"{cpu_med['sharded']:.3f} vs {cpu_med['full']:.3f} ms)", flush=True)
    write_results(a.out, {"what": "training-thread copy per checkpoint, in process, 2 ranks (gloo): sharded "
                                  "(FSDP2, Copier's plan and layout) and sharded via get_state_dict (every rank, "
                                  "the slower one's) vs full (rank 0 alone, the whole state); MLP 16 -> W -> W -> 4 "
                                  "with Adam; the kinds in turn, --run copies each",
                          "mode": "copy", "rounds": a.rounds, "reps": a.reps, "run": a.run, "widths": sizes}, load_before)


def main() -> None:
    exit_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--width", type=int, default=1024, help="hidden width (1024: 1.07M parameters, 12.9 MB of state)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--every", type=int, default=6, help="--checkpoint-every (steps)")
    ap.add_argument("--skip-first", type=int, default=1, help="checkpoints left out at the start of each run")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_sharded_ckpt.json")
    ap.add_argument("--copy", action="store_true", help="the training thread's copy alone, in process (see above)")
    ap.add_argument("--widths", default="64,256,1024,2048", help="--copy: the MLP's hidden widths")
    ap.add_argument("--reps", type=int, default=40, help="--copy: copies per kind per round")
    ap.add_argument("--run", type=int, default=1, help="--copy: copies of one kind in a row before the next kind's "
                                                       "(1: interleaved copy by copy; --reps: a block per kind)")
    a = ap.parse_args()
    if a.copy:
        copy_bench(a)
        return
    load_before = os.getloadavg()[0]
    rows: dict[str, list[dict]] = {"full": [], "sharded": []}
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "mlp.py"
        script.write_text(WORKER)
        for r in range(a.rounds):
            order = ("full", "sharded") if r % 2 == 0 else ("sharded", "full")  # alternating
            for kind in order:
                res = one_run(Path(tmp) / f"r{r}", script, kind, a.width, a.steps, a.every, a.skip_first)
                rows[kind].append(res)
                print(f"round {r + 1} {kind:8s} stall {res['stall_ms']:.2f} ms  write {res['write_ms']:.1f} ms  "
                      f"{res['bytes'] / 1e6:.1f} MB  ({res['checkpoints']} checkpoints)", flush=True)
    med = {k: {m: statistics.median(x[m] for x in v) for m in ("stall_ms", "write_ms", "bytes")}
           for k, v in rows.items()}
    ratio = med["sharded"]["stall_ms"] / med["full"]["stall_ms"]
    print(f"median stall: sharded {med['sharded']['stall_ms']:.2f} ms, full {med['full']['stall_ms']:.2f} ms "
          f"(sharded/full {ratio:.2f}); write {med['sharded']['write_ms']:.1f} ms vs {med['full']['write_ms']:.1f} ms")
    write_results(a.out, {"what": "training-thread stall per checkpoint, 2 workers, sharded (FSDP2 + DCP) vs full "
                                  "(DDP, rank 0)", "width": a.width, "steps": a.steps, "every": a.every,
                          "skip_first": a.skip_first, "rounds": rows, "median": med,
                          "stall_ratio_sharded_over_full": ratio}, load_before)


if __name__ == "__main__":
    main()
