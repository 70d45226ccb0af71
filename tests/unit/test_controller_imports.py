"""The controller of a ``--script`` run (every job of ``elastic-ring cluster``) starts without
torch: importing it costs ~3 s of CPU on two cores, at each start, and only the built-in model's
dataset cache needs it (imported there, when that run is prepared)."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

CONTROLLER = ["elastic_ring.cli.main", "elastic_ring.cli.train", "elastic_ring.controller.runs",
              "elastic_ring.controller.rundir", "elastic_ring.controller.controller",
              "elastic_ring.controller.backends"]


def test_the_controller_modules_do_not_import_torch():
    code = "".join(f"import {m}\n" for m in ["sys", *CONTROLLER])
    code += "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch')[:3])"
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]", p.stdout
