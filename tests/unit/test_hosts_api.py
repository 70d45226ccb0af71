"""elastic_ring.hosts.api: the host set (parse, order, diff) and the worker bounds."""

from __future__ import annotations

import pytest

from elastic_ring.errors import UserError
from elastic_ring.hosts.api import HostSet, HostsError, WorkerBounds, parse_workers, resolve_bounds


def test_parse_discovery_output():
    hs = HostSet.parse("# hosts now\nnode1:4\n\nnode2\n10.0.0.3:2  # a comment\nnode1:4\ngone:0\n", default_slots=3)
    assert hs.pairs() == [("node1", 4), ("node2", 3), ("10.0.0.3", 2)]  # bare host: default slots; 0: left out
    assert hs.total == 9 and len(hs) == 3 and hs["node2"] == 3
    assert hs.arg() == "node1:4,node2:3,10.0.0.3:2"
    assert HostSet.parse("") == HostSet() and HostSet.parse("a").pairs() == [("a", 1)]


@pytest.mark.parametrize("text, needle", [
    ("node1:four", "'node1:four' is not HOST:SLOTS"),
    ("Traceback (most recent call last):", "line 1"),
    ("a:1\nb c:2", "line 2: 'b c:2'"),
    ("a:-1", "slots must be 0..4096"),
    ("a:100000", "slots must be 0..4096"),
    ("a:2\na:3", "host a listed again with other slots (2, then 3)"),
    (":3", "':3' is not HOST:SLOTS"),
])
def test_parse_refuses_garbage_with_one_line(text, needle):
    with pytest.raises(HostsError) as e:
        HostSet.parse(text, what="script x")
    assert needle in str(e.value) and "\n" not in str(e.value) and str(e.value).startswith("script x line")


def test_equality_ignores_order_and_order_is_kept_for_ranks():
    a, b = HostSet([("x", 1), ("y", 2)]), HostSet([("y", 2), ("x", 1)])
    assert a == b and hash(a) == hash(b) and list(a) != list(b)
    new = HostSet([("z", 1), ("y", 3), ("x", 1)]).ordered_like(a)
    assert list(new) == ["x", "y", "z"] and new["y"] == 3


def test_diff():
    old = HostSet([("a", 1), ("b", 2), ("c", 4)])
    new = HostSet([("b", 3), ("c", 4), ("d", 2)])
    d = old.diff(new)
    assert d.added == (("d", 2),) and d.removed == (("a", 1),) and d.changed == (("b", 2, 3),)
    assert d.slots_delta == 2 and d.line() == "+d:2 -a:1 b:2->3"
    assert not old.diff(old) and old.diff(old).line() == "no change"
    assert new.without(["b", "nope"]).pairs() == [("c", 4), ("d", 2)]


def test_hostset_refuses_bad_values():
    for pairs in ([("a", 0)], [("a", 1), ("a", 2)], [("bad name", 1)], [("a", True)]):
        with pytest.raises(HostsError):
            HostSet(pairs)
    assert HostSet.from_arg("localhost:1,127.0.0.1:1").pairs() == [("localhost", 1), ("127.0.0.1", 1)]


def test_target_size_follows_free_slots_within_bounds():
    b = WorkerBounds(min=2, max=6)
    assert [b.target(free) for free in (0, 1, 2, 5, 6, 9)] == [None, None, 2, 5, 6, 6]
    assert b.target(9, asked=4) == 4 and b.target(3, asked=4) == 3  # an asked size is bounded by the slots
    assert b.target(9, asked=8) == 6 and b.target(1, asked=4) is None
    unbounded = WorkerBounds(min=1)
    assert unbounded.target(13) == 13 and unbounded.target(0) is None
    assert b.waiting_line(1) == "waiting for hosts (have 1, need 2)"
    b.check_asked(2)
    b.check_asked(6)
    with pytest.raises(UserError, match="to 1 is below --min-workers 2"):
        b.check_asked(1)
    with pytest.raises(UserError, match="to 7 is above --max-workers 6"):
        b.check_asked(7)


def test_parse_workers():
    assert parse_workers("4") == 4 and parse_workers(" 2:8 ") == (2, 8) and parse_workers("3:3") == (3, 3)
    for bad, needle in (("x", "N or MIN:MAX"), ("2:", "N or MIN:MAX"), ("1:2:3", "N or MIN:MAX"),
                        ("0", ">= 1"), ("0:4", ">= 1"), ("5:2", "MIN 5 is above MAX 2")):
        with pytest.raises(UserError, match=needle):
            parse_workers(bad)


def test_resolve_bounds():
    assert resolve_bounds() is None and resolve_bounds(workers="4") is None and resolve_bounds(gpus=2) is None
    assert resolve_bounds(workers="2:8") == WorkerBounds(2, 8)
    assert resolve_bounds(min_workers=2, max_workers=4) == WorkerBounds(2, 4)
    assert resolve_bounds(max_workers=4) == WorkerBounds(1, 4)
    assert resolve_bounds(min_workers=3) == WorkerBounds(3, None)
    assert resolve_bounds(workers="3", min_workers=2, max_workers=4) == WorkerBounds(2, 4, start=3)
    assert resolve_bounds(gpus=4, min_workers=2) == WorkerBounds(2, None, start=4)


@pytest.mark.parametrize("kw, needle", [
    (dict(min_workers=4, max_workers=2), "--max-workers 2 is below --min-workers 4"),
    (dict(min_workers=0), "--min-workers must be >= 1, got 0"),
    (dict(max_workers=0), "--max-workers must be >= 1, got 0"),
    (dict(workers="2:4", min_workers=1), "drop --min-workers/--max-workers"),
    (dict(workers="2:4", gpus=2), "--gpus and --workers are the same option"),
    (dict(workers="6", min_workers=1, max_workers=4), "--workers 6 is outside"),
    (dict(gpus=1, min_workers=2), "--workers 1 is outside"),
    (dict(workers="8:2"), "MIN 8 is above MAX 2"),
])
def test_resolve_bounds_one_line_errors(kw, needle):
    with pytest.raises(UserError) as e:
        resolve_bounds(**kw)
    assert needle in str(e.value) and "\n" not in str(e.value)
