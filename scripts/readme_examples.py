#!/usr/bin/env python
"""Run the README's two worked examples and keep their real output, so each printed figure traces
to a file:

  * ``demo``: what ``make demo`` runs (``elastic-ring train --gpus 1 --resize-at 60 --to 2
    --slots 2``), its whole output;
  * ``live``: ``examples/mlp_digits.py`` for 3000 steps at 1 worker, resized live from a second
    process to 2 workers at about step 600 and back to 1 at about step 1800 (``elastic-ring resize``).

Each run writes ``results/readme/<name>.txt`` (the commands, their output, the machine's load
before and after) and ``<name>-summary.json`` (the run's ``summary.json``).

    .venv/bin/python scripts/readme_examples.py [demo] [live]
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
OUT = ROOT / "results" / "readme"
RUN_NAMES = {"demo": "demo", "live": "mlp"}
sys.path.insert(0, str(ROOT))

from benchlib import TrainRun, exit_on_sigterm, train_env  # noqa: E402


def _cli(*args: str) -> list[str]:
    return [str(BIN / "elastic-ring"), *args]


def demo(run: Path) -> tuple[list[str], str]:
    cmd = _cli("train", "--gpus", "1", "--resize-at", "60", "--to", "2", "--slots", "2", "--run-dir", str(run))
    p = subprocess.run(cmd, cwd=ROOT, env=train_env(), capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"demo failed:\n{p.stderr[-2000:]}")
    return [" ".join(cmd[1:])], p.stderr + p.stdout


def live(run: Path) -> tuple[list[str], str]:
    asked = []
    with TrainRun(["--script", "examples/mlp_digits.py", "--steps", "3000", "--gpus", "1", "--slots", "2"], run,
                  keep_output=True, cli=_cli()) as tr:
        for at, to in ((600, 2), (1800, 1)):
            tr.wait_step(at, poll_s=0.05)
            r = subprocess.run(_cli("resize", str(run), "--to", str(to)), cwd=ROOT, env=train_env(),
                               capture_output=True, text=True)
            asked.append(f"# at step {tr.step()}: elastic-ring resize runs/{run.name} --to {to}\n{r.stdout}{r.stderr}")
        out = tr.finish("the live example")
    return [" ".join(tr.cmd[1:]), *asked], out


def main() -> None:
    exit_on_sigterm()
    names = sys.argv[1:] or ["demo", "live"]
    OUT.mkdir(parents=True, exist_ok=True)
    for name in names:
        load0 = os.getloadavg()[0]
        with tempfile.TemporaryDirectory() as d:
            run = Path(d) / RUN_NAMES[name]  # the README's run folder: runs/<it>
            t0 = time.time()
            cmds, out = {"demo": demo, "live": live}[name](run)
            wall = time.time() - t0
            shutil.copy(run / "summary.json", OUT / f"{name}-summary.json")
        head = "".join(f"$ elastic-ring {c}\n" if not c.startswith("#") else c for c in cmds)
        text = (head + "\n" + out).replace(str(run), f"runs/{run.name}").replace(str(ROOT), "<repo>")
        (OUT / f"{name}.txt").write_text(
            f"# {time.strftime('%Y-%m-%d %H:%M:%S')}  wall {wall:.1f} s  load {load0:.1f} -> "
            f"{os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)\n" + text)
        print(f"wrote results/readme/{name}.txt ({wall:.1f} s)")


if __name__ == "__main__":
    main()
