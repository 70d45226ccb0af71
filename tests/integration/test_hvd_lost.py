"""The check behind :class:`elastic_ring.hvd_patches.HorovodCollectiveLost` on a real Horovod (2 ranks,
horovodrun, gloo): while the ring trains, Horovod's loop is not read as down; once rank 1 has exited
without a word and rank 0's collective failed (Horovod's background loop shut down on the lost peer),
it is; after ``hvd.shutdown()`` it is not (Horovod no longer counts as initialized)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import tool

pytestmark = pytest.mark.integration

SCRIPT = r'''
import os, time, torch
import horovod.torch as hvd
from elastic_ring.hvd_patches import _horovod_lost
hvd.init()
lost = _horovod_lost()
r = hvd.rank()
print(f"rank {r} training: lost={lost()}", flush=True)
for i in range(3):
    hvd.allreduce(torch.ones(4), name=f"a{i}")
if r == 1:
    os._exit(0)  # no word to anyone: a peer lost
time.sleep(0.5)
try:
    hvd.allreduce(torch.ones(4), name="after")
except Exception as e:
    print(f"rank 0 raised {type(e).__name__}", flush=True)
t0 = time.time()
while not lost() and time.time() - t0 < 10:
    time.sleep(0.01)
print(f"rank 0 after the loss: lost={lost()}", flush=True)
hvd.shutdown()
print(f"rank 0 after shutdown: lost={lost()}", flush=True)
'''


def test_horovods_loop_reads_down_only_after_a_peers_loss_and_until_its_shutdown(tmp_path):
    script = tmp_path / "lost.py"
    script.write_text(SCRIPT)
    p = subprocess.run([tool("horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, str(script)],
                       capture_output=True, text=True, timeout=120)
    out = p.stdout
    assert "rank 0 training: lost=False" in out and "rank 1 training: lost=False" in out, (out, p.stderr[-2000:])
    assert "rank 0 raised HorovodInternalError" in out, (out, p.stderr[-2000:])
    assert "rank 0 after the loss: lost=True" in out, (out, p.stderr[-2000:])
    assert "rank 0 after shutdown: lost=False" in out, (out, p.stderr[-2000:])
