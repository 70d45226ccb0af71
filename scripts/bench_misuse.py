"""Time to fail of each script mistake of issue 20, this checkout against a revision before it
(default: the last commit of main before the change), side by side in one run.

Each mistake is a small script run by a real `elastic-ring train --script S --steps 40 --gpus 1`
(horovodrun, gloo); the figure is the wall time until `elastic-ring` exits, its exit status and
its last error line. "silent" means it exited 0: the mistake was not reported at all.

    .venv/bin/python scripts/bench_misuse.py [--baseline REV] [--rounds 1] [--only NAME,...]
    -> results/bench_misuse.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import write_results

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "d18db4e"

HEAD = """
import argparse, torch, horovod.torch as hvd
import elastic_ring.worker as elastic
"""
BODY = """
model = torch.nn.Linear(4, 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
{register}
job.restore()
for step in job.steps():
    {in_step}
    loss = model(torch.ones(8, 4)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    job.record(loss, samples=8)
"""


def script(init: str = "job = elastic.init()", register: str = "job.register(model=model, optimizer=opt)",
           in_step: str = "pass", pre: str = "") -> str:
    return HEAD + pre + init + "\n" + BODY.format(register=register, in_step=in_step)


MISTAKES: dict[str, tuple[str, list[str]]] = {
    "syntax_error": (HEAD + "job = elastic.init(\nx = = 1\n", []),
    "unpicklable_extra": (script(register="job.register(model=model, optimizer=opt, fn=lambda x: x)"), []),
    "hvd_init_first": (script(init="hvd.init()\njob = elastic.init()"), []),
    "no_optimizer_registered": (script(register="job.register(model=model)"), []),
    "raise_before_first_step": (script(pre="raise KeyError('label')\n"), []),
    "bad_script_argument": (script(pre="p = argparse.ArgumentParser(); p.add_argument('--lr', type=float)"
                                      "; p.parse_args()\n"), ["--", "--lr", "fast"]),
    "raise_at_step_5": (script(in_step="if step == 5: raise RuntimeError('bad batch')"), []),
}


def run(tree: Path, folder: Path, name: str) -> dict:
    text, extra = MISTAKES[name]
    s = folder / f"{name}.py"
    s.write_text(text)
    cmd = [sys.executable, "-m", "elastic_ring.cli.main", "train", "--script", str(s), "--steps", "40",
           "--gpus", "1", "--slots", "2", "--run-dir", str(folder / "run"), *extra]
    env = dict(os.environ, PYTHONPATH=str(tree),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=900)
    secs = time.perf_counter() - t0
    err = [ln for ln in p.stderr.splitlines() if ln.startswith("elastic-ring: error:")]
    launches = sum(1 for ln in (folder / "run" / "events.jsonl").read_text().splitlines()
                   if '"kind":"launch"' in ln.replace(" ", "")) if (folder / "run" / "events.jsonl").exists() else 0
    return {"seconds": round(secs, 2), "returncode": p.returncode, "launches": launches,
            "error": err[-1] if err else None, "silent": p.returncode == 0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default=BASELINE)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--only", default="")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_misuse.json")
    a = ap.parse_args()
    names = [n for n in MISTAKES if not a.only or n in a.only.split(",")]
    load0 = os.getloadavg()[0]
    res: dict[str, dict[str, list[dict]]] = {n: {"before": [], "after": []} for n in names}
    with tempfile.TemporaryDirectory() as d:
        base = Path(d) / "baseline"
        subprocess.run(["git", "worktree", "add", "--detach", str(base), a.baseline], cwd=ROOT,
                       check=True, capture_output=True)
        try:
            k = 0
            for i in range(a.rounds):
                for n in names:
                    order = [("before", base), ("after", ROOT)]
                    if k % 2:
                        order.reverse()
                    k += 1
                    for arm, tree in order:
                        folder = Path(d) / f"{arm}-{n}-{i}"
                        folder.mkdir()
                        r = run(tree, folder, n)
                        res[n][arm].append(r)
                        print(f"{n:<26} {arm:<6} {r['seconds']:7.1f} s  rc {r['returncode']}  "
                              f"launches {r['launches']}  {r['error'] or '(silent: exit 0)'}", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, capture_output=True)
    table = []
    print(f"\n{'mistake':<26} {'before s':>9} {'after s':>8}  before -> after")
    for n in names:
        b, af = res[n]["before"], res[n]["after"]
        row = {"mistake": n, "before_s": statistics.median(x["seconds"] for x in b),
               "after_s": statistics.median(x["seconds"] for x in af),
               "before_silent": b[-1]["silent"], "before_launches": b[-1]["launches"],
               "after_launches": af[-1]["launches"], "before_error": b[-1]["error"],
               "after_error": af[-1]["error"]}
        table.append(row)
        bw = "silent" if row["before_silent"] else f"{row['before_launches']} launch(es)"
        print(f"{n:<26} {row['before_s']:>9.1f} {row['after_s']:>8.1f}  {bw} -> {row['after_launches']} launch(es)")
    write_results(a.out, {"baseline": a.baseline, "steps": 40, "rounds": a.rounds, "table": table,
                          "runs": res}, load0)


if __name__ == "__main__":
    main()
