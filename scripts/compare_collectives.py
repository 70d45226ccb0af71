#!/usr/bin/env python
"""The built-in ResNet trained on the torch path (``--collective torch``: DistributedDataParallel on
gloo) and on the Horovod path, the same schedule of sizes with resizes (default 1 -> 2 -> 1), on
the CPU's real data set (scikit-learn's digits, offline): does the torch path learn as well?

Per seed, the two runs of the same command (who goes first alternates); from each run's events:
the training loss per throughput window (the loss curve), every evaluation's test accuracy and
loss, the final test accuracy and the wall time; and whether the final weights are bitwise equal
(at one and two workers both paths average the same gradients, so they may be). Written to
``--out`` (JSON), with a Markdown table and a plot of the loss curves and test accuracies beside it.

    .venv/bin/python scripts/compare_collectives.py --seeds 0 1 2 --steps 80 --depth 14
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from benchlib import exit_on_sigterm, train_env, write_results  # noqa: E402

COLLECTIVES = ("horovod", "torch")


def train_args(a, seed: int, collective: str) -> list[str]:
    """One run's ``elastic-ring train`` arguments (the run folder excluded)."""
    args = ["train", "--gpus", str(a.start), "--schedule", a.schedule, "--steps", str(a.steps), "--depth",
            str(a.depth), "--slots", str(a.slots), "--seed", str(seed), "--relaunch", a.relaunch,
            "--set", f"throughput_window={a.window}", "--set", f"eval_every={a.eval_every}"]
    return args + (["--collective", "torch"] if collective == "torch" else [])


def run_one(a, seed: int, collective: str, run: Path) -> dict:
    """Train once; the run's curves and results from its events."""
    cmd = [sys.executable, "-m", "elastic_ring.cli.main", *train_args(a, seed, collective), "--run-dir", str(run)]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=ROOT, env=train_env(), capture_output=True, text=True, timeout=a.timeout)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise SystemExit(f"{collective} seed {seed} failed (exit {p.returncode}):\n{p.stderr[-3000:]}")
    ev = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines() if line.strip()]
    fin = [e for e in ev if e["kind"] == "finished"][-1]
    return {
        "collective": collective, "seed": seed, "start": a.start, "command_wall_s": round(wall, 2),
        "run_wall_s": fin["wall_s"],
        "final_step": fin["step"], "test_accuracy": fin["test_accuracy"], "test_loss": fin["test_loss"],
        "train_loss": fin["train_loss"],
        "sizes": [[e["step"], e["to_workers"]] for e in ev if e["kind"] == "relaunched"],
        "loss_curve": [[e["step"], e["loss"]] for e in ev if e["kind"] == "throughput"],
        "evaluations": [[e["step"], e["test_accuracy"], e["test_loss"]] for e in ev if e["kind"] == "evaluation"],
    }


def weights_equal(a: Path, b: Path) -> bool:
    """The two runs' final checkpoints hold bitwise equal weights."""
    import torch

    from elastic_ring.ckpt import CheckpointStore

    x, y = CheckpointStore(a / "checkpoints").load_latest(), CheckpointStore(b / "checkpoints").load_latest()
    return x["model"].keys() == y["model"].keys() and all(torch.equal(x["model"][k], y["model"][k])
                                                          for k in x["model"])


def table(out: dict) -> str:
    rows = ["| seed | collective | test accuracy | test loss | last window's train loss | run wall s |",
            "|---|---|---|---|---|---|"]
    for r in out["runs"]:
        rows.append(f"| {r['seed']} | {r['collective']} | {r['test_accuracy']:.4f} | {r['test_loss']:.4f} | "
                    f"{r['train_loss']:.4f} | {r['run_wall_s']:.1f} |")
    s = out["summary"]
    evals = ["| seed | step | workers | Horovod accuracy / loss | torch accuracy / loss |", "|---|---|---|---|---|"]
    for seed in sorted({r["seed"] for r in out["runs"]}):
        by = {r["collective"]: r for r in out["runs"] if r["seed"] == seed}
        for (step, ah, lh), (_, at, lt) in zip(by["horovod"]["evaluations"], by["torch"]["evaluations"]):
            evals.append(f"| {seed} | {step} | {_workers(by['horovod'], step)} | {ah:.4f} / {lh:.4f} | "
                         f"{at:.4f} / {lt:.4f} |")
    lines = [f"`{out['command']}`", "", *rows, "", "Every evaluation:", "", *evals, "",
             f"Median test accuracy: Horovod {s['horovod_median_accuracy']:.4f}, torch "
             f"{s['torch_median_accuracy']:.4f} (torch - Horovod per seed: "
             f"{', '.join(f'{d:+.4f}' for d in s['accuracy_diff_per_seed'])}); final weights bitwise equal "
             f"in {s['seeds_weights_equal']} of {len(s['accuracy_diff_per_seed'])} seeds.", "",
             "At more than one worker an evaluation may differ: each rank tests its share of the test set with "
             "its own BatchNorm statistics, which DDP sets to rank 0's at every forward and Horovod leaves as "
             "the rank's own; a checkpoint holds rank 0's, so the paths agree again at one worker.", ""]
    return "\n".join(lines)


def _workers(run: dict, step: int) -> int:
    """The world size that did ``step`` (its evaluation runs at that size)."""
    n = run["start"]
    for at, to in run["sizes"]:
        if step > at:
            n = to
    return n


def plot(out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    style = {"horovod": ("#1f77b4", "-"), "torch": ("#d62728", "--")}
    for r in out["runs"]:
        color, ls = style[r["collective"]]
        label = f"{r['collective']} seed {r['seed']}"
        st, loss = zip(*r["loss_curve"])
        ax1.plot(st, loss, color=color, ls=ls, label=label, alpha=0.8)
        if r["evaluations"]:
            es, acc, _ = zip(*r["evaluations"])
            ax2.plot(es, acc, color=color, ls=ls, marker="o", label=label, alpha=0.8)
    for step, _ in out["runs"][0]["sizes"]:
        for ax in (ax1, ax2):
            ax.axvline(step, color="grey", lw=0.8, ls=":")
    ax1.set(xlabel="step", ylabel="training loss (throughput window)", yscale="log",
            title="loss (dotted: resizes)")
    ax2.set(xlabel="step", ylabel="test accuracy", title="test accuracy")
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    exit_on_sigterm()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--steps", type=int, default=80)
    p.add_argument("--depth", type=int, default=14)
    p.add_argument("--start", type=int, default=1, help="workers at the start")
    p.add_argument("--schedule", default="27:2,54:1", help="the resizes, STEP:N[,STEP:N...]")
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--relaunch", default="overlap")
    p.add_argument("--window", type=int, default=5, help="throughput window (steps): the loss curve's points")
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--timeout", type=float, default=1200)
    p.add_argument("--out", type=Path, default=ROOT / "results" / "compare_collectives.json")
    p.add_argument("--report-only", action="store_true", help="rewrite the table and plot from --out")
    a = p.parse_args()
    if a.report_only:
        out = json.loads(a.out.read_text())
        report(out, a.out)
        return
    load0 = os.getloadavg()[0]
    runs = []
    diffs, equal = [], 0
    with tempfile.TemporaryDirectory(prefix="cmpcoll") as tmp:
        for i, seed in enumerate(a.seeds):
            order = COLLECTIVES if i % 2 == 0 else tuple(reversed(COLLECTIVES))
            got = {}
            for c in order:
                got[c] = run_one(a, seed, c, Path(tmp) / f"{c}-{seed}")
                print(f"seed {seed} {c}: test accuracy {got[c]['test_accuracy']:.4f} "
                      f"(load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
            same = weights_equal(Path(tmp) / f"horovod-{seed}", Path(tmp) / f"torch-{seed}")
            equal += same
            for c in COLLECTIVES:
                runs.append({**got[c], "weights_equal_other": same})
            diffs.append(got["torch"]["test_accuracy"] - got["horovod"]["test_accuracy"])
    acc = {c: [r["test_accuracy"] for r in runs if r["collective"] == c] for c in COLLECTIVES}
    out = {
        "command": "elastic-ring " + " ".join(train_args(a, a.seeds[0], "horovod")) + " [--collective torch]",
        "settings": {k: (os.path.relpath(v, ROOT) if isinstance(v, Path) else v) for k, v in vars(a).items()},
        "summary": {"horovod_median_accuracy": statistics.median(acc["horovod"]),
                    "torch_median_accuracy": statistics.median(acc["torch"]),
                    "accuracy_diff_per_seed": diffs, "seeds_weights_equal": equal},
        "runs": runs,
    }
    write_results(a.out, out, load0)
    report(json.loads(a.out.read_text()), a.out)


def report(out: dict, path: Path) -> None:
    """The Markdown table and the plot beside the results file."""
    text = table(out)
    path.with_suffix(".md").write_text(text)
    plot(out, path.with_suffix(".png"))
    print(text)


if __name__ == "__main__":
    main()
