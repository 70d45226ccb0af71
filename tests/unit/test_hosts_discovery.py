"""elastic_ring.hosts.discovery: a discovery script really run (tiny shell scripts, milliseconds),
and the poller over a fake discovery and a fake clock."""

from __future__ import annotations

import os
import time

import pytest

from elastic_ring.errors import UserError
from elastic_ring.hosts.api import HostSet
from elastic_ring.hosts.discovery import Discovered, FixedHosts, HostPoller, ScriptDiscovery, check_script


def _script(tmp_path, body, name="discover.sh"):
    p = tmp_path / name
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(0o755)
    return str(p)


def test_script_output_is_parsed(tmp_path):
    got = ScriptDiscovery(_script(tmp_path, "echo localhost:2\necho 127.0.0.1\n"), default_slots=3).find()
    assert got.error is None and got.hosts.pairs() == [("localhost", 2), ("127.0.0.1", 3)]


def test_script_reads_a_file_the_test_rewrites(tmp_path):
    hosts = tmp_path / "hosts.txt"
    d = ScriptDiscovery(_script(tmp_path, f"cat {hosts}\n"))
    hosts.write_text("a:1\n")
    assert d.find().hosts == HostSet([("a", 1)])
    hosts.write_text("a:1\nb:2\n")
    assert d.find().hosts == HostSet([("a", 1), ("b", 2)])


@pytest.mark.parametrize("body, needle", [
    ("echo 'no ssh to node3' >&2\nexit 3\n", "discover.sh exited with status 3: no ssh to node3"),
    ("exit 1\n", "discover.sh exited with status 1"),
    ("kill -9 $$\n", "was killed by signal 9"),
    ("echo 'Traceback (most recent call last):'\n", "discovery script discover.sh line 1"),
    ("echo node1:lots\n", "'node1:lots' is not HOST:SLOTS"),
    ("printf '\\377\\376'\n", "not text"),
])
def test_a_failing_script_is_one_line(tmp_path, body, needle):
    got = ScriptDiscovery(_script(tmp_path, body)).find()
    assert got.hosts is None and needle in got.error and "\n" not in got.error, got.error


def test_a_hung_script_is_killed_with_its_children(tmp_path):
    pidfile = tmp_path / "child.pid"
    d = ScriptDiscovery(_script(tmp_path, f"sleep 30 &\necho $! > {pidfile}\nwait\n"), timeout_s=0.5)
    t0 = time.monotonic()
    got = d.find()
    assert time.monotonic() - t0 < 5
    assert got.hosts is None and got.error == "discovery script discover.sh did not answer within 0.5 s"
    child = int(pidfile.read_text())
    for _ in range(50):  # killed: a zombie until init reaps it, then gone
        try:
            with open(f"/proc/{child}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
        except (FileNotFoundError, ProcessLookupError):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the script's child {child} outlived the timeout")


def test_a_script_that_cannot_start(tmp_path):
    p = tmp_path / "noexec.sh"
    p.write_text("#!/no/such/interpreter\n")
    p.chmod(0o755)
    got = ScriptDiscovery(str(p)).find()
    assert got.hosts is None and got.error.startswith("discovery script noexec.sh cannot run")


def test_check_script(tmp_path):
    ok = _script(tmp_path, "echo a\n")
    assert check_script(ok) == ok
    plain = tmp_path / "plain.sh"
    plain.write_text("echo a\n")
    for path, needle in ((str(tmp_path / "nope"), "does not exist"), (str(tmp_path), "is not a file"),
                         (str(plain), "is not executable \\(chmod \\+x")):
        with pytest.raises(UserError, match=needle):
            check_script(path)


class _Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


class _Answers:
    """A discovery that gives the answers it is told, one per call."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.calls = 0

    def find(self):
        self.calls += 1
        a = self.answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return Discovered(a) if isinstance(a, HostSet) else Discovered(None, a)


def test_poller_interval_changes_and_last_good_answer():
    a1 = HostSet([("a", 1)])
    a1b2 = HostSet([("b", 2), ("a", 1)])
    clock = _Clock()
    disc = _Answers(a1, a1, "script exited with status 1", "script exited with status 1",
                    "script did not answer within 10 s", a1b2, HostSet([("b", 2)]))
    p = HostPoller(disc, interval_s=5, clock=clock)
    first = p.poll_if_due()
    assert first.hosts == a1 and first.diff.added == (("a", 1),) and first.note is None and first.ok
    assert p.poll_if_due() is None and disc.calls == 1  # not due yet
    clock.t += 5
    assert p.poll_if_due().diff is None  # the same answer: no change
    clock.t += 5
    failed = p.poll_if_due()
    assert not failed.ok and failed.hosts == a1 and failed.diff is None and failed.age_s == 5
    assert failed.note == "host discovery failed: script exited with status 1; keeping the last hosts (a:1, from 5 s ago)"
    clock.t += 5
    again = p.poll()
    assert again.note is None and again.hosts == a1 and again.age_s == 10  # said once per streak
    clock.t += 5
    assert "did not answer within 10 s" in p.poll().note  # another reason: said again
    clock.t += 5
    back = p.poll()
    assert back.ok and back.note == "host discovery answers again" and back.diff.added == (("b", 2),)
    assert list(back.hosts) == ["a", "b"]  # a known host keeps its place (its ranks)
    clock.t += 5
    shrunk = p.poll()
    assert shrunk.diff.removed == (("a", 1),) and shrunk.hosts.pairs() == [("b", 2)]


def test_poller_failing_from_the_start():
    p = HostPoller(_Answers("nope", HostSet()), interval_s=1, clock=_Clock())
    r = p.poll()
    assert r.hosts is None and r.note == "host discovery failed: nope; no hosts known yet"
    r = p.poll()
    assert r.hosts == HostSet() and r.diff is not None and not r.diff and r.note == "host discovery answers again"


def test_poller_over_fixed_hosts_and_bad_interval():
    fixed = FixedHosts(HostSet([("a", 2)]))
    clock = _Clock()
    p = HostPoller(fixed, interval_s=2, clock=clock)
    assert p.poll().hosts.total == 2
    fixed.set(HostSet([("a", 2), ("b", 2)]))
    clock.t += 2
    assert p.poll().diff.slots_delta == 2
    with pytest.raises(UserError, match="--discovery-interval must be > 0 s"):
        HostPoller(fixed, interval_s=0)


def test_poller_turns_a_discovery_that_raises_into_one_line():
    p = HostPoller(_Answers(HostSet([("a", 1)]), OSError("no route\nto host")), interval_s=1, clock=_Clock())
    p.poll()
    r = p.poll()
    assert not r.ok and r.hosts == HostSet([("a", 1)])
    assert r.note.startswith("host discovery failed: host discovery raised OSError: no route;") and "\n" not in r.note
