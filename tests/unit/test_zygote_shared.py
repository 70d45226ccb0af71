"""A fork server shared by the runs of one parent process (``ELASTIC_RING_ZYGOTE_SHARED``): a
controller hands it to its workers when it answers, and starts its own when it does not."""

from __future__ import annotations

import socket
import uuid

import pytest

from elastic_ring import env as envvars
from elastic_ring.worker import zygote


@pytest.fixture
def own(monkeypatch):
    """zygote.start replaced: records each start instead of starting a process."""
    started: list[bool] = []
    monkeypatch.setattr(zygote, "start", lambda timeout=60.0, compile_=False: (started.append(compile_) or None, "own"))
    monkeypatch.setattr(zygote, "_RUNNING", [])
    monkeypatch.setattr(zygote, "_REFUSED", [])
    monkeypatch.delenv(envvars.NO_ZYGOTE, raising=False)
    return started


def _listening(name: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(zygote._address(name))
    s.listen(4)
    return s


def test_a_shared_zygote_that_answers_is_used_and_none_is_started(monkeypatch, own):
    name = f"shared-test-{uuid.uuid4().hex[:8]}"
    srv = _listening(name)
    try:
        monkeypatch.setenv(envvars.ZYGOTE_SHARED, name)
        assert zygote.ensure(compile_=True) == name
        assert own == []
        conn, _ = srv.accept()  # the probe connected, and closed at once
        assert conn.recv(1) == b""
        conn.close()
    finally:
        srv.close()


def test_a_shared_zygote_that_does_not_answer_leaves_the_controller_to_start_its_own(monkeypatch, own):
    monkeypatch.setenv(envvars.ZYGOTE_SHARED, f"gone-{uuid.uuid4().hex[:8]}")
    assert zygote.ensure(compile_=True) is None  # (the stand-in start above "fails")
    assert own == [True]


def test_no_zygote_wins_over_a_shared_one(monkeypatch, own):
    name = f"shared-test-{uuid.uuid4().hex[:8]}"
    srv = _listening(name)
    try:
        monkeypatch.setenv(envvars.ZYGOTE_SHARED, name)
        monkeypatch.setenv(envvars.NO_ZYGOTE, "1")
        assert zygote.ensure() is None and own == []
    finally:
        srv.close()


def test_the_answers_probe():
    name = f"shared-test-{uuid.uuid4().hex[:8]}"
    assert not zygote.answers(name)
    srv = _listening(name)
    try:
        assert zygote.answers(name)
    finally:
        srv.close()
    assert not zygote.answers(name)


def test_a_backends_store_is_forked_by_the_zygote_its_workers_fork_from(monkeypatch):
    """serve_store_for: a launcher with a fork server (CPU runs) has the store forked by the zygote,
    started if need be; one without (GPU runs) uses a zygote only where one already runs."""
    from elastic_ring.controller.backends.torch_ring import serve_store_for

    calls: list[tuple] = []
    monkeypatch.setattr(zygote, "ensure", lambda timeout=60.0, compile_=False: calls.append(("ensure", compile_)) or "own")
    monkeypatch.setattr(zygote, "running", lambda: calls.append(("running",)) or "theirs")
    monkeypatch.setattr(zygote, "serve_forked", lambda name, module, argv, timeout=30.0: (
        calls.append(("fork", name, module, argv[0])) or (object(), "4242")))

    class CpuLauncher:
        fork_server = True

    assert serve_store_for(CpuLauncher())("127.0.0.1")[1] == 4242
    assert calls == [("ensure", True), ("fork", "own", "elastic_ring.controller.backends.store_server", "127.0.0.1")]
    calls.clear()
    assert serve_store_for(object())("10.0.0.1")[1] == 4242
    assert calls == [("running",), ("fork", "theirs", "elastic_ring.controller.backends.store_server", "10.0.0.1")]
