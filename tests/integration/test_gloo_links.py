"""A survivor's gloo connections shut down after a peer's loss (``worker.links.Links``): a peer
blocked in a collective on it sees the loss at once, and the store the next group forms over stays
open. Real processes, a real gloo group."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_RANK = r"""
import json, os, sys, time
from datetime import timedelta
import torch, torch.distributed as dist
from elastic_ring import protocol
from elastic_ring.worker.links import Links
rank, port = int(sys.argv[1]), int(sys.argv[2])
links = Links()
links.mark()
links.keep_port(port)
store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
dist.init_process_group("gloo", store=dist.PrefixStore("g", store), rank=rank, world_size=2,
                        timeout=timedelta(seconds=60))
dist.barrier()
if rank == 1:  # blocked on rank 0, which never sends
    t = torch.zeros(4)
    store.set("waiting", "1")
    t0 = time.time()
    try:
        dist.recv(t, src=0)
        out = {"woken": False}
    except Exception as e:
        out = {"woken": True, "after_s": time.time() - t0,
               "peer_loss": protocol.is_peer_loss(type(e).__name__, str(e))}
    store.set("done", "1")
else:
    store.wait(["waiting"])
    time.sleep(1.0)  # rank 1 is in its recv
    n = links.drop()
    store.set("after", "still open")
    out = {"dropped": n, "store": store.get("after").decode(), "again": links.drop()}
    try:  # alive until rank 1 is woken (its exit would close the connections too)
        store.wait(["done"], timedelta(seconds=15))
    except Exception:
        pass
print(json.dumps(out), flush=True)
os._exit(0)
"""


def test_dropped_links_wake_a_peer_blocked_on_this_rank_and_keep_the_store(tmp_path):
    """Rank 1 blocks in a ``recv`` from rank 0 (as a survivor left in a collective by a rank that
    left it at a peer's loss: gloo wakes it only when the connection closes); rank 0 drops its
    links: rank 1's recv fails within seconds, with an error the survive path reads as a peer's
    loss (not at the group's 60 s timeout); rank 0's connection to the store, noted as kept, still
    serves; a second drop finds nothing left to shut."""
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=60), wait_for_workers=False)
    script = tmp_path / "rank.py"
    script.write_text(_RANK)
    t0 = time.time()
    ps = [subprocess.Popen([sys.executable, str(script), str(r), str(store.port)], cwd=ROOT,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    try:
        outs = [p.communicate(timeout=45) for p in ps]
    finally:
        for p in ps:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in ps] == [0, 0], outs
    r0, r1 = (json.loads(o.strip().splitlines()[-1]) for o, _ in outs)
    assert r0["dropped"] >= 1 and r0["store"] == "still open" and r0["again"] == 0, r0
    assert r1["woken"] and r1["peer_loss"] and r1["after_s"] < 10.0, r1  # (not at rank 0's exit, 15 s on)
    assert time.time() - t0 < 45
