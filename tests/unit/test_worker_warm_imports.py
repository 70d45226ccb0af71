"""A worker does the imports of its first optimizer step (``torch._dynamo``, pulled in lazily by
``torch.optim``) while it waits: for its go (pre-launched) or in ``hvd.init()``'s rendezvous.
Each check runs in a fresh interpreter: this one may have imported the module already."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

_FAKE_HVD = """
import sys, time, types
hvd = types.ModuleType("horovod.torch")
state = {"init": False, "seen": None}
def init():
    time.sleep(0.3)  # the rendezvous: C code, no GIL held
    state["init"] = True
hvd.init = init
hvd.is_initialized = lambda: state["init"]
sys.modules["horovod"] = types.ModuleType("horovod")
sys.modules["horovod.torch"] = hvd
"""


def _run(code: str) -> str:
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def test_hvd_init_returns_with_the_first_steps_imports_done():
    out = _run(_FAKE_HVD + """
import torch
from elastic_ring.worker.api import Job
assert "torch._dynamo" not in sys.modules
job = Job.__new__(Job)
job._hvd_init()
print("torch._dynamo" in sys.modules, hvd.is_initialized())
""")
    assert out == "True True"


def test_a_prelaunched_worker_imports_while_it_waits_for_its_go(tmp_path):
    go = tmp_path / "go-1"
    go.write_text('{"stop_at": 7}')
    out = _run(f"""
import sys, torch
from elastic_ring.worker.api import Job
assert "torch._dynamo" not in sys.modules
job = Job.__new__(Job)
job.ring_by_controller = False
rec = job._wait_for_go(__import__("pathlib").Path({str(go)!r}))
print("torch._dynamo" in sys.modules, job.stop_at)
""")
    assert out == "True 7"
