"""elastic_ring.hosts.exclusion: failed hosts cool down for a time growing with their failures
(a fake clock)."""

from __future__ import annotations

import pytest

from elastic_ring.errors import UserError
from elastic_ring.hosts.api import HostSet
from elastic_ring.hosts.exclusion import CooldownRange, Exclusions, parse_cooldown_range


class _Clock:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


def test_delay_doubles_within_the_range():
    r = CooldownRange(10, 100)
    assert [r.delay(n) for n in range(0, 7)] == [0, 10, 20, 40, 80, 100, 100]
    assert CooldownRange(5, 5).delay(3) == 5 and CooldownRange(1, 3600).delay(10_000) == 3600


def test_a_failed_host_is_left_out_then_comes_back():
    clock = _Clock()
    ex = Exclusions(CooldownRange(10, 100), clock=clock)
    hosts = HostSet([("a", 2), ("b", 2), ("c", 1)])
    e = ex.failed("b")
    assert (e.host, e.until, e.failures) == ("b", 1010, 1)
    assert ex.is_excluded("b") and not ex.is_excluded("a")
    assert ex.usable(hosts).pairs() == [("a", 2), ("c", 1)] and ex.next_return() == 1010
    clock.t = 1005
    assert ex.failed("b").until == 1010 and ex.failures("b") == 1  # its other worker, same failure
    clock.t = 1010
    assert not ex.is_excluded("b") and ex.usable(hosts) == hosts and ex.excluded() == []
    assert ex.next_return() is None and ex.failures("b") == 1  # back, but remembered
    clock.t = 2000
    assert ex.failed("b").until == 2020  # second failure: twice as long
    clock.t = 2020
    assert ex.failed("b").until == 2060  # third: 40 s
    ex.forgive(["b"])
    assert not ex.is_excluded("b") and ex.failures("b") == 0
    assert ex.failed("b").until == clock.t + 10


def test_excluded_lists_hosts_and_until_when():
    clock = _Clock(0)
    ex = Exclusions(CooldownRange(30, 300), clock=clock)
    ex.failed("a")
    clock.t = 40
    ex.failed("a")  # cooled down at 30: a second failure, 60 s
    clock.t = 50
    ex.failed("b")
    assert [(e.host, e.until, e.failures) for e in ex.excluded()] == [("b", 80, 1), ("a", 100, 2)]
    assert ex.line(fmt=lambda t: f"t={t:g}") == "excluded: b until t=80 (1 failure), a until t=100 (2 failures)"
    clock.t = 100
    assert Exclusions(clock=clock).line() == "excluded: none" and ex.line(fmt=str) == "excluded: none"


def test_cooldown_range_parsing():
    assert parse_cooldown_range("10:100") == CooldownRange(10, 100)
    assert parse_cooldown_range("30") == CooldownRange(30, 30)
    for bad, needle in (("a:b", "LOW:HIGH in seconds"), ("100:10", "0 < LOW <= HIGH"), ("0:5", "0 < LOW <= HIGH")):
        with pytest.raises(UserError, match=needle):
            parse_cooldown_range(bad)
