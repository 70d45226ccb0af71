"""A worker does the imports of its first optimizer step (``torch._dynamo``, pulled in lazily by
``torch.optim``) while it waits: for its go (pre-launched) or in ``hvd.init()``'s rendezvous.
The import itself is replaced by a recorder here (a fresh interpreter would take seconds)."""

from __future__ import annotations

import sys
import threading
import time
import types

from elastic_ring.worker import ring


def _recorder(monkeypatch, seconds: float = 0.0) -> list[tuple[str, float, float]]:
    calls: list[tuple[str, float, float]] = []

    def warm() -> None:
        t0 = time.time()
        time.sleep(seconds)
        calls.append((threading.current_thread().name, t0, time.time()))
    monkeypatch.setattr(ring, "warm_imports", warm)
    monkeypatch.delitem(sys.modules, "torch._dynamo", raising=False)  # as in a fresh worker
    return calls


def test_hvd_init_imports_meanwhile_and_returns_with_it_done(monkeypatch):
    calls = _recorder(monkeypatch, seconds=0.3)
    state = {"init": None}
    hvd = types.ModuleType("horovod.torch")

    def init() -> None:  # the rendezvous: C code, no GIL held
        time.sleep(0.5)
        state["init"] = time.time()
    hvd.init, hvd.is_initialized = init, lambda: state["init"] is not None
    monkeypatch.setitem(sys.modules, "horovod", types.ModuleType("horovod"))
    monkeypatch.setitem(sys.modules, "horovod.torch", hvd)
    r = ring.Ring.__new__(ring.Ring)
    t0 = time.time()
    r.init_horovod()
    took = time.time() - t0
    assert len(calls) == 1 and calls[0][0] == "elastic-ring-warm-imports"
    assert calls[0][1] < state["init"]  # started while init waited, not after it
    assert took < 0.75, took  # the two overlapped (0.5 s and 0.3 s; one after the other: 0.8 s)


def test_a_prelaunched_worker_imports_while_it_waits_for_its_go(tmp_path, monkeypatch):
    calls = _recorder(monkeypatch)
    go = tmp_path / "go-1"
    go.write_text('{"stop_at": 7}')
    r = ring.RelaunchRing.__new__(ring.RelaunchRing)
    rec = r.wait_for_go(go)
    assert len(calls) == 1 and rec.stop_at == 7

