"""elastic_ring.worker.notice: a worker's first SIGTERM is a notice (a ``preempt_notice`` event) under
host discovery, the second ends it; elsewhere nothing is installed (a SIGTERM ends the worker)."""

from __future__ import annotations

import json
import os
import signal

from elastic_ring import protocol
from elastic_ring.events import read_events
from elastic_ring.worker import notice


def test_the_first_sigterm_is_a_notice_under_discovery_only(tmp_path, monkeypatch):
    monkeypatch.setenv("HOROVOD_RANK", "1")
    monkeypatch.setenv("HOROVOD_HOSTNAME", "127.0.0.1")
    (tmp_path / "run.json").write_text(json.dumps({"workers": 2}))
    old = signal.getsignal(signal.SIGTERM)
    try:
        assert not notice.install(tmp_path, 3)  # no host discovery: a SIGTERM ends the worker as before
        assert signal.getsignal(signal.SIGTERM) is old
        (tmp_path / "run.json").write_text(json.dumps({"workers": 2, "host_discovery": {"script": "d.sh"}}))
        assert notice.install(tmp_path, 3)
        os.kill(os.getpid(), signal.SIGTERM)  # handled between two bytecodes, in this (the main) thread
        (ev,) = read_events(tmp_path / protocol.WORKER_EVENTS, kind="preempt_notice")
        assert (ev["rank"], ev["segment"], ev["pid"], ev["host"]) == (1, 3, os.getpid(), "127.0.0.1")
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # a second one ends the worker
    finally:
        signal.signal(signal.SIGTERM, old)
