"""What the benchmark scripts share: the bare start of N workers (the yardstick of every relaunch
and restart figure) and the results file with the machine's load around the measurement."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def bare_start(n: int) -> float:
    """Wall time of ``horovodrun -np N -H localhost:N --gloo python launch/bare_start.py``:
    horovodrun + ``import torch, horovod.torch`` + ``hvd.init()`` + one barrier."""
    cmd = [str(BIN / "horovodrun"), "-np", str(n), "-H", f"localhost:{n}", "--gloo",
           sys.executable, str(ROOT / "launch" / "bare_start.py")]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
    return time.perf_counter() - t0


def write_results(path: Path, out: dict[str, Any], load_before: float) -> None:
    """Write ``out`` with the machine's CPU count and load before/after, and say so."""
    load_after = os.getloadavg()[0]
    out = {**out, "machine": {"cpus": os.cpu_count(), "load_before": load_before, "load_after": load_after},
           "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} "
          f"(load {load_before:.1f} -> {load_after:.1f})")
