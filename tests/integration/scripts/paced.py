"""A tiny script on the worker library whose steps take at least --step-s seconds (a sleep), so
tests of scheduling can rely on a job still running when the next one arrives, on a quiet machine
as on a loaded one.

It is ``examples/paced.py`` with the whole step unshared by the workers: its ``--serial-s`` is this
``--step-s`` and its shared part is 0 (the same model, data and loop, one copy of them)."""

import argparse
import runpy
import sys
from pathlib import Path

p = argparse.ArgumentParser()
p.add_argument("--step-s", type=float, default=0.05)
a = p.parse_args()

example = Path(__file__).resolve().parents[3] / "examples" / "paced.py"
sys.argv = [str(example), "--serial-s", str(a.step_s), "--step-s", "0"]
runpy.run_path(str(example), run_name="__main__")
