"""elastic_ring.hosts.manager: discovery, exclusions and bounds together, over a fake discovery
and a fake clock (the controller's questions between two steps)."""

from __future__ import annotations

from elastic_ring.hosts.api import HostSet, WorkerBounds
from elastic_ring.hosts.discovery import Discovered, FixedHosts, HostPoller
from elastic_ring.hosts.exclusion import CooldownRange, Exclusions
from elastic_ring.hosts.manager import HostManager


class _Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _manager(hosts, lo=1, hi=None, min_wait_s=None):
    clock = _Clock()
    disc = FixedHosts(HostSet(hosts))
    m = HostManager(HostPoller(disc, interval_s=5, clock=clock), WorkerBounds(lo, hi),
                    Exclusions(CooldownRange(10, 40), clock=clock), min_wait_s=min_wait_s)
    return m, disc, clock


def test_grow_shrink_and_the_hosts_of_a_size():
    m, disc, clock = _manager([("a", 2)], lo=1, hi=3)
    first = m.update()
    assert first.diff.added == (("a", 2),) and first.view.target == 2
    assert m.update() is None  # nothing due, nothing changed
    disc.set(HostSet([("a", 2), ("b", 2)]))
    assert m.update() is None  # not polled before the interval
    clock.t = 5
    grown = m.update()
    assert grown.diff.added == (("b", 2),) and grown.view.target == 3  # capped by the maximum
    assert grown.view.hosts_for(3).arg() == "a:2,b:1" and grown.view.line() == "hosts: a:2,b:2 (4 slots)"
    assert m.view(asked=1).target == 1 and m.view(asked=9).target == 3
    clock.t = 10
    disc.set(HostSet([("b", 2)]))
    shrunk = m.update()
    assert shrunk.diff.removed == (("a", 2),) and shrunk.view.target == 2 and list(shrunk.view.usable) == ["b"]


def test_a_failed_host_is_left_out_then_grown_back_onto():
    m, disc, clock = _manager([("a", 1), ("b", 1)], lo=1)
    m.update()
    m.failed("b")
    out = m.update()
    assert out.diff.removed == (("b", 1),) and out.view.target == 1 and out.notes == ("host b excluded after a failure",)
    assert out.view.line() == "hosts: a:1 (1 slot); excluded: b" and out.view.excluded[0].until == 10
    assert out.view.line(until=lambda t: f"t={t:g}") == "hosts: a:1 (1 slot); excluded: b until t=10"
    waiting = HostManager(m.poller, WorkerBounds(2), m.exclusions).view()  # below a minimum of 2 without b
    assert waiting.line(until=lambda t: f"t={t:g}") == "waiting for hosts (have 1, need 2); excluded: b until t=10"
    clock.t = 9
    assert m.update() is None
    clock.t = 10
    back = m.update()
    assert back.diff.added == (("b", 1),) and back.view.target == 2 and back.notes == ("host b back from its cooldown",)
    clock.t = 11
    m.failed("b")  # a second failure: 20 s
    m.update()
    assert m.view().excluded[0].until == 31


def test_waiting_below_the_minimum_then_giving_up():
    m, disc, clock = _manager([("a", 1)], lo=2, min_wait_s=30)
    v = m.update().view
    assert v.target is None and v.line() == "waiting for hosts (have 1, need 2)"
    clock.t = 20
    assert m.gave_up() is None and m.waited_s() == 20
    disc.set(HostSet([("a", 1), ("b", 1)]))
    ok = m.update()
    assert ok.view.target == 2 and m.waited_s() == 0  # enough again: the wait is over
    disc.set(HostSet([("a", 1)]))
    clock.t = 25
    m.update()
    clock.t = 54
    assert m.gave_up() is None
    clock.t = 55
    assert m.gave_up() == "gave up waiting for hosts after 30 s (have 1, need 2)"


def test_a_failing_discovery_keeps_the_hosts_and_hands_out_its_note():
    clock = _Clock()

    class Flaky:
        answers = [Discovered(HostSet([("a", 2)])), Discovered(None, "script exited with status 1")]

        def find(self):
            return self.answers.pop(0)

    m = HostManager(HostPoller(Flaky(), interval_s=1, clock=clock), WorkerBounds(1, None))
    assert m.update().view.target == 2
    clock.t = 1
    assert m.update() is None  # the hosts are kept: no change
    assert m.notes() == ["host discovery failed: script exited with status 1; keeping the last hosts (a:2, from 1 s ago)"]
    assert m.notes() == [] and m.view().target == 2


def test_first_slots():
    hs = HostSet([("a", 2), ("b", 2), ("c", 4)])
    assert hs.first(1).arg() == "a:1" and hs.first(3).arg() == "a:2,b:1" and hs.first(99) == hs
    assert hs.first(0) == HostSet()


def test_a_drained_host_stays_out_until_discovery_drops_it_and_lists_it_again():
    m, disc, clock = _manager([("a", 1), ("b", 1)], lo=1)
    m.update()
    m.drain("b")
    out = m.update()
    assert out.diff.removed == (("b", 1),) and out.view.target == 1 and m.drained == ("b",)
    assert out.view.line() == "hosts: a:1 (1 slot); drained: b"
    assert out.view.line(draining=("b",)) == "hosts: a:1 (1 slot); draining: b"  # `status` while it lands
    clock.t = 5
    assert m.update() is None and m.view().target == 1  # still listed: still out
    disc.set(HostSet([("a", 1)]))
    clock.t = 10
    assert m.update() is None  # dropped by discovery: nothing usable changed
    disc.set(HostSet([("a", 1), ("b", 1)]))
    clock.t = 15
    back = m.update()
    assert back.diff.added == (("b", 1),) and back.view.target == 2 and m.drained == ()
    assert back.notes == ("host b listed again after its drain",)
    m.drain("a")
    m.undrain("a")  # withdrawn (its notice's segment failed instead): nothing changes
    assert m.update() is None and m.view().target == 2
