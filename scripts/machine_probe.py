"""How fast this machine is now: the CPU time of one fixed piece of work, to put beside a timed run.

    python scripts/machine_probe.py                     # 3 repeats of 300 steps, printed
    python scripts/machine_probe.py --label "before X" --out results/ci/machine_probe.json

The work is one training step of the tests' tiny built-in model (ResNet-8, width 4, a batch of 8
CIFAR-shaped 32x32 images, plain SGD with momentum) on one intra-op thread, in this process: the
kind of step the test suite's runs take most of. Each repeat times ``--steps`` steps after 20
unmeasured ones and reports their CPU milliseconds per step (``time.process_time``, this process
only; its wall time beside it). Run alone, the figure moves only with the machine: the same code on
the same data, one thread. A fresh-clone suite run that took longer than another of the same code
is then told apart: slower work, or a slower machine (a VM's cores shared with others, their
clock). ``--out`` appends the repeats, their median, the 1-min load before and after, and the
share of the cores' time that ``/proc/stat`` counted as stolen by the hypervisor meanwhile, to a
JSON list (``benchlib.append_result``)."""

from __future__ import annotations

import argparse
import os
import statistics
import time


def _cpu_ticks() -> list[int] | None:
    """The first line of /proc/stat (user, nice, system, idle, iowait, irq, softirq, steal, ...)."""
    try:
        with open("/proc/stat") as f:
            return [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None


def steal_share(before: list[int] | None, after: list[int] | None) -> float | None:
    """The stolen share of every core's time between two readings of /proc/stat (None: unknown)."""
    if not before or not after or len(before) < 8 or len(after) < 8:
        return None
    d = [b - a for a, b in zip(before[:8], after[:8])]
    total = sum(d)
    return d[7] / total if total > 0 else None


def probe(steps: int, repeats: int) -> list[dict[str, float]]:
    """``repeats`` timings of ``steps`` tiny training steps: CPU and wall milliseconds per step."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # (put back at the end: a caller in the same process keeps its own)
    try:
        return _timed(steps, repeats)
    finally:
        torch.set_num_threads(threads)


def _timed(steps: int, repeats: int) -> list[dict[str, float]]:
    import torch

    from elastic_ring.nn.resnet import resnet

    torch.manual_seed(0)
    model = resnet(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    loss_fn = torch.nn.CrossEntropyLoss()

    def step() -> None:
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    out = []
    for _ in range(repeats):
        for _ in range(20):
            step()
        c0, w0 = time.process_time(), time.perf_counter()
        for _ in range(steps):
            step()
        c1, w1 = time.process_time(), time.perf_counter()
        out.append({"cpu_ms_per_step": round((c1 - c0) / steps * 1e3, 4),
                    "wall_ms_per_step": round((w1 - w0) / steps * 1e3, 4)})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300, help="steps timed in each repeat (default 300)")
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats (default 3)")
    ap.add_argument("--label", default="", help="what the probe was taken beside (written with --out)")
    ap.add_argument("--out", help="append the result to this JSON list file")
    a = ap.parse_args(argv)
    if a.steps < 1 or a.repeats < 1:
        ap.exit(2, f"machine_probe.py: --steps and --repeats must be at least 1, got {a.steps} and {a.repeats}\n")
    load_before, ticks_before = os.getloadavg()[0], _cpu_ticks()
    rounds = probe(a.steps, a.repeats)
    load_after, ticks_after = os.getloadavg()[0], _cpu_ticks()
    med = statistics.median(r["cpu_ms_per_step"] for r in rounds)
    steal = steal_share(ticks_before, ticks_after)
    res = {"label": a.label, "time": time.strftime("%Y-%m-%d %H:%M:%S"), "steps": a.steps, "repeats": rounds,
           "median_cpu_ms_per_step": round(med, 4), "load_before": load_before, "load_after": load_after,
           "steal_share": None if steal is None else round(steal, 5)}
    print(f"tiny step: {med:.3f} ms of CPU (median of {a.repeats}: "
          f"{', '.join('%.3f' % r['cpu_ms_per_step'] for r in rounds)}); load {load_before:.2f} -> {load_after:.2f}"
          + ("" if steal is None else f"; stolen {100 * steal:.2f}% of the cores' time"))
    if a.out:
        from benchlib import append_result  # (here, not at the top: the tests load this file by path)

        append_result(a.out, res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
