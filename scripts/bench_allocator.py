#!/usr/bin/env python
"""What ``elastic_ring.worker.allocator.keep_freed_memory`` changes in one CPU worker's training
step: page faults and CPU seconds (user, system) per step, counted by ``getrusage``, without and
with it; each in a fresh interpreter (the setting is per process), alternating, medians.

Same model and batch as ``scripts/bench_torch_path.py`` (CIFAR ResNet, synthetic-shaped input,
one intra-op thread, SGD with momentum), without the collective: the step's own allocations.
CPU seconds are the load-robust part (a busy machine inflates wall time, not faults).

    .venv/bin/python scripts/bench_allocator.py --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import json, resource, sys, time
import torch
import torch.nn.functional as F
from elastic_ring.nn import resnet
from elastic_ring.worker.allocator import keep_freed_memory

depth, width, batch, steps, warmup, keep = (int(x) for x in sys.argv[1:7])
torch.set_num_threads(1)
torch.manual_seed(0)
set_ = keep_freed_memory({}) if keep else False
model = resnet(depth, width, 10)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))

def step():
    opt.zero_grad(); F.cross_entropy(model(x), y).backward(); opt.step()

for _ in range(warmup):
    step()
r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
for _ in range(steps):
    step()
r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
print(json.dumps({"set": set_, "faults_per_step": (r1.ru_minflt - r0.ru_minflt) / steps,
                  "user_ms_per_step": 1e3 * (r1.ru_utime - r0.ru_utime) / steps,
                  "sys_ms_per_step": 1e3 * (r1.ru_stime - r0.ru_stime) / steps,
                  "wall_ms_per_step": 1e3 * (t1 - t0) / steps}))
"""


def run(a, keep: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"):
        env.pop(k, None)
    p = subprocess.run([sys.executable, "-c", _CHILD, str(a.depth), str(a.width), str(a.batch_size),
                        str(a.steps), str(a.warmup), str(int(keep))], env=env, capture_output=True, text=True,
                       timeout=1800)
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-2000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3, help="alternating rounds (>= 1)")
    ap.add_argument("--steps", type=int, default=30, help="steps measured per run")
    ap.add_argument("--warmup", type=int, default=5, help="steps before")
    ap.add_argument("--depth", type=int, default=20)
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_allocator.json")
    a = ap.parse_args(argv)
    if a.repeats < 1 or a.steps < 1 or a.warmup < 1:
        print("bench_allocator: need --repeats, --steps and --warmup >= 1", file=sys.stderr)
        return 2
    runs: dict[str, list[dict]] = {"glibc_default": [], "keep_freed_memory": []}
    loads = []
    load0 = os.getloadavg()
    for i in range(a.repeats):
        for keep in ((False, True) if i % 2 == 0 else (True, False)):
            r = run(a, keep)
            runs["keep_freed_memory" if keep else "glibc_default"].append(r)
            loads.append(os.getloadavg()[0])
            print(f"round {i + 1}/{a.repeats} {'keep' if keep else 'default'}: {r}", file=sys.stderr, flush=True)
    med = {side: {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "set"}
           for side, rs in runs.items()}
    config = {k: (v.name if isinstance(v, Path) else v) for k, v in vars(a).items()}
    result = {"config": config, "cpu_count": os.cpu_count(), "time": time.time(), "loadavg_before": load0,
              "loadavg_1min_after_each_run": loads, "runs": runs, "medians": med}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2))
    for side, m in med.items():
        print(f"{side}: {m['faults_per_step']:.0f} faults/step, user {m['user_ms_per_step']:.1f} ms, "
              f"sys {m['sys_ms_per_step']:.1f} ms, wall {m['wall_ms_per_step']:.1f} ms per step")
    print(f"written {a.out.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
