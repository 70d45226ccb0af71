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
