"""A host that does not answer (the watchdog's host monitor, `--host-probe`) is not grown onto until
it answers again, unless the job runs on it (then a hang there is the watchdog's), and the probe
command's answers and its one-line errors (docs/hosts.md, "A host that stops answering")."""

from __future__ import annotations

import pytest

from elastic_ring.controller.backends.horovodrun import command_probe
from elastic_ring.errors import UserError
from elastic_ring.hosts.api import HostSet, WorkerBounds
from elastic_ring.hosts.discovery import FixedHosts, HostPoller
from elastic_ring.hosts.manager import HostManager


def _manager() -> HostManager:
    return HostManager(HostPoller(FixedHosts(HostSet([("a", 1), ("b", 1)])), interval_s=0.001), WorkerBounds(1, None))


def test_a_silent_host_off_the_job_is_not_usable_until_it_answers_again():
    m, silent = _manager(), set()
    m.silent = lambda: silent
    assert m.update().view.usable.arg() == "a:1,b:1"
    m.in_use = ("a",)
    silent.add("b")
    ch = m.update()
    assert ch.diff.line() == "-b:1" and ch.view.target == 1
    assert ch.notes == ("host b does not answer (--host-probe, or ssh): not grown onto until it does",)
    assert m.update() is None  # (no change while it stays silent)
    silent.clear()
    ch = m.update()
    assert ch.diff.line() == "+b:1" and ch.notes == ("host b answers again",)


def test_a_silent_host_the_job_runs_on_stays_usable():
    m = _manager()
    m.silent = lambda: {"b"}
    m.in_use = ("a", "b")
    assert m.update().view.usable.arg() == "a:1,b:1"  # a hang there is the watchdog's (a stall), not a shrink


def test_the_probe_command_asks_every_host_and_its_errors_are_one_line(tmp_path):
    script = tmp_path / "probe.sh"
    script.write_text('#!/bin/sh\n[ "$1" != b ]\n')
    script.chmod(0o755)
    assert command_probe(str(script))([("localhost", 1), ("b", 2), ("c", 1)]) == [("localhost", 1), ("c", 1)]
    assert command_probe("sleep 3", timeout_s=0.2)([("a", 1)]) == []  # (too slow: silent)
    for cmd, words in [("", "empty command"), ("'", "not a command line"),
                       ("no-such-cmd-xyz", "'no-such-cmd-xyz' is not an executable")]:
        with pytest.raises(UserError, match=words):
            command_probe(cmd)
