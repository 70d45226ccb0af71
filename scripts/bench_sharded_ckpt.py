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

from benchlib import exit_on_sigterm, train_env, write_results  # noqa: E402

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


def main() -> None:
    exit_on_sigterm()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--width", type=int, default=1024, help="hidden width (1024: 1.07M parameters, 12.9 MB of state)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--every", type=int, default=6, help="--checkpoint-every (steps)")
    ap.add_argument("--skip-first", type=int, default=1, help="checkpoints left out at the start of each run")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_sharded_ckpt.json")
    a = ap.parse_args()
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
