"""The controller's parts beside its loop, each alone: the resize and restart meter, the event
relay, the process table, the restart rule's reason, live requests, the plan's queries."""

from __future__ import annotations

import json

import pytest

from elastic_ring.controller.api import Plan, Resize
from elastic_ring.controller.meter import Meter, PendingResize, Restarting
from elastic_ring.controller.relay import Relay
from elastic_ring.controller.requests import take_request
from elastic_ring.controller.restart_rule import give_up_reason
from elastic_ring.controller.segment import Processes, Segment
from elastic_ring.events.api import EventLog, as_event, read_events
from elastic_ring.protocol import REQUEST_FILE, WORKER_EVENTS
from elastic_ring.worker.lr import RULES


def _first(**kw):
    return as_event({"kind": "first_step", **kw})


def _meter(tmp_path) -> Meter:
    return Meter(EventLog(tmp_path / "events.jsonl"), RULES["linear"])


def _kinds(tmp_path) -> list[str]:
    return [e["kind"] for e in read_events(tmp_path / "events.jsonl")]


@pytest.mark.parametrize("exit_first", [True, False])
def test_a_resize_is_measured_once_its_exit_and_a_steady_step_are_known(tmp_path, exit_first):
    m = _meter(tmp_path)
    m.pending = PendingResize(1, 2, step=10, t_request=100.0, lr_last=0.1, checkpoint_s=0.5, segment=0)
    m.relaunched(1, t_launch=101.0)
    m.first_step(1, _first(time=104.0, world_size=2, step=11, lr=0.2), t_launch=101.0, prelaunched=False)
    window = as_event({"kind": "throughput", "seconds": 2.0, "steps": 4, "steps_per_s": 2.0})
    if exit_first:
        m.exited(0, 102.0)
        assert m.pending is not None  # no steady step yet
        m.throughput(window, running=True)
    else:
        m.throughput(window, running=True)
        assert m.pending is not None  # the old workers have not exited yet
        m.exited(0, 102.0)
    assert m.pending is None and m.startup_s == [3.0] and m.last_speed == 2.0
    (ov,) = read_events(tmp_path / "events.jsonl", kind="resize_overhead")
    assert ov["stop_latency_s"] == 2.0 and ov["relaunch_to_first_step_s"] == 3.0
    assert ov["total_lost_s"] == pytest.approx(104.0 - 100.0 - 0.5) and ov["checkpoint_s"] == 0.5
    (rel,) = read_events(tmp_path / "events.jsonl", kind="relaunched")
    assert rel["lr_new"] == pytest.approx(0.2)  # Eq. 7, linear
    assert _kinds(tmp_path) == ["relaunched", "first_step_after_resize", "resize_overhead"]


def test_a_resize_without_a_full_window_is_flushed_with_no_steady_step(tmp_path):
    m = _meter(tmp_path)
    m.flush()  # nothing pending: nothing written
    m.pending = PendingResize(2, 1, step=10, t_request=100.0, lr_last=0.2, t_exit=100.5, segment=0)
    m.first_step(1, _first(time=103.0, world_size=1, step=11, lr=0.1), t_launch=101.0, prelaunched=True)
    m.flush()
    (ov,) = read_events(tmp_path / "events.jsonl", kind="resize_overhead")
    assert ov["steady_step_s"] == 0.0 and ov["total_lost_s"] == 3.0 and m.startup_s == []  # pre-launched


def test_a_restart_is_measured_to_its_first_step(tmp_path):
    m = _meter(tmp_path)
    m.last_speed = 4.0  # 0.25 s a step
    m.restarting = Restarting(attempt=1, t_detect=50.0, t_last_progress=49.0, steps_redone=8, from_step=10)
    m.first_step(2, _first(time=60.0, world_size=1, step=11, lr=0.1), t_launch=52.0, prelaunched=False)
    (r,) = read_events(tmp_path / "events.jsonl", kind="recovered")
    assert r["detect_to_first_step_s"] == 10.0 and r["time_lost_s"] == pytest.approx(11.0 + 8 * 0.25)
    assert m.restarting is None


def test_when_to_prelaunch(tmp_path):
    m = _meter(tmp_path)
    seg = Segment(0, 1, stop_at=100, start_step=0)
    assert m.seconds_left(seg, now=0.0) is None  # no speed known yet
    assert m.prelaunch_lead_s(10.0) == 21.0
    m.startup_s = [2.0, 4.0, 30.0]
    assert m.prelaunch_lead_s(10.0) == 9.0  # twice the median start-up, plus one second
    m.last_speed = 10.0  # an earlier segment's
    assert m.seconds_left(seg, now=0.0) == 10.0  # not yet stepping: the whole segment
    seg.last_step, seg.last_step_t, seg.steps_per_s = 50, 100.0, 5.0
    assert m.seconds_left(seg, now=102.0) == pytest.approx((100 - 60) / 5.0)


def test_the_relay_copies_whole_lines_and_holds_a_later_segment(tmp_path):
    """Lines are relayed whole and in order; once segment 0 has ended, segment 1's events wait (the
    hold is asked of each event after the ones before it were handled: the end and the next
    segment's first event may come in one read)."""
    wev = tmp_path / WORKER_EVENTS
    wev.parent.mkdir(parents=True, exist_ok=True)
    wev.write_text('{"kind": "old", "segment": 0}\n')  # before this controller: not relayed
    relay, seen = Relay(tmp_path, EventLog(tmp_path / "events.jsonl")), []
    watched = {"segment": 0, "ended": False}

    def on_event(ev):
        seen.append(ev["kind"])
        watched["ended"] |= ev["kind"] == "segment_end"

    def hold(ev):
        return watched["ended"] and ev["segment"] > watched["segment"]

    with wev.open("a") as f:
        f.write('{"kind": "a", "segment": 0}\nnot json\n{"kind": "segment_end", "segment": 0}\n'
                '{"kind": "b", "segment": 1}\n{"kind": "c", "seg')
    relay.poll(on_event, hold)
    assert seen == ["a", "segment_end"]  # "b" is past the ended segment 0: held
    watched.update(segment=1, ended=False)
    relay.poll(on_event, hold)
    assert seen == ["a", "segment_end", "b"]  # the torn last line waits
    with wev.open("a") as f:
        f.write('ment": 1}\n')
    relay.poll(on_event)
    assert seen == ["a", "segment_end", "b", "c"] and _kinds(tmp_path) == seen


def test_the_relay_feeds_the_tensorboard_curves_at_most_once_a_second_and_in_full_at_close(tmp_path):
    """Each feed flushes the curves and rewrites the sink's offset: not at every poll (10 a second)."""
    from elastic_ring.controller import relay as relay_mod

    class Sink:
        def __init__(self) -> None:
            self.syncs, self.closed = [], False

        def sync(self) -> int:
            self.syncs.append(now[0])
            return 0

        def close(self) -> None:
            self.closed = True

    now = [10.0]
    relay = Relay(tmp_path, EventLog(tmp_path / "events.jsonl"), clock=lambda: now[0])
    relay._tb = sink = Sink()
    for t in (10.0, 10.1, 10.5, 10.99, 11.0, 11.3, 12.5):
        now[0] = t
        relay.poll(lambda ev: None)
    assert sink.syncs == [10.0, 11.0, 12.5]
    assert relay_mod.TB_EVERY_S == 1.0
    relay.close()
    assert sink.closed  # (the sink's close feeds whatever is left)


class _Handle:
    def __init__(self, rc_after: int | None, rc: int = 0) -> None:
        self.pid, self.polls, self.rc_after, self.rc, self.killed = 1, 0, rc_after, rc, False

    def poll(self):
        self.polls += 1
        if self.killed:
            return -9
        return self.rc if self.rc_after is not None and self.polls > self.rc_after else None

    def kill(self):
        self.killed = True


def test_processes_reap_the_stopped_segments(tmp_path):
    procs = Processes(backend=None, run_dir=tmp_path, owner="o", clock=lambda: 7.0,
                      events=EventLog(tmp_path / "events.jsonl"))
    done, hung = Segment(0, 1, 10, handle=_Handle(1, rc=1)), Segment(1, 2, 20, handle=_Handle(None))
    procs.draining += [done, hung]
    exits = []
    procs.reap(lambda seg, t: exits.append((seg.index, t)))
    assert exits == [] and len(procs.draining) == 2  # no wait: one look
    procs.reap(lambda seg, t: exits.append((seg.index, t)), wait=True, timeout=0.0, poll_s=0.0)
    assert exits == [(0, 7.0), (1, 7.0)] and hung.handle.killed and not procs.draining
    evs = read_events(tmp_path / "events.jsonl")
    assert [(e["kind"], e.get("segment")) for e in evs] == [
        ("workers_exited", 0), ("error", 0), ("workers_exited", 1), ("error", 1)]
    assert "exited with status 1 after their checkpoint" in evs[1]["message"]


def test_give_up_reason_first_that_applies():
    f = {"from_step": 10, "type": "ValueError", "message": "boom", "step": None}
    assert give_up_reason(None, f, attempt=1, repeated=False, max_restarts=3, new_world=2) is None
    assert give_up_reason({"kind": "syntax"}, f, 1, True, 3, 0).startswith("a syntax error")
    assert give_up_reason(None, f, 2, True, 3, 0) == ("the same error before the first step after step 10 "
                                                      "twice: not retrying")
    assert "at step 12 twice" in give_up_reason(None, {**f, "step": 12}, 2, True, 3, 2)
    assert give_up_reason(None, f, 9, False, 3, 0) == "no slot answers"
    assert give_up_reason(None, f, 4, False, 3, 2) == "3 restart(s) tried"


def test_a_live_request_is_taken_once(tmp_path):
    path = tmp_path / "control" / REQUEST_FILE
    path.parent.mkdir()
    seen: set[str] = set()
    assert take_request(tmp_path, seen) is None  # none
    path.write_text('{"to": 2, "ti')  # being written
    assert take_request(tmp_path, seen) is None and path.exists()
    path.write_text(json.dumps({"to": 2, "time": 5.0, "id": "x"}))
    assert take_request(tmp_path, seen) == (2, 5.0) and not path.exists() and seen == {"x"}
    path.write_text(json.dumps({"to": 3, "id": "x"}))  # the same request again
    assert take_request(tmp_path, seen) is None


def test_plan_next_stop_and_resize_at():
    p = Plan.from_spec(1, (Resize(10, 2), Resize(20, 2), Resize(30, 1)))  # 20:2 is a no-op
    assert [p.next_stop(s, 40) for s in (0, 9, 10, 29, 30)] == [10, 10, 30, 30, 40]
    assert p.resize_at(10) == Resize(10, 2) and p.resize_at(20) is None and p.resize_at(11) is None


def test_a_restart_does_not_replay_what_the_hosts_did_as_stops():
    """The hosts' changes are history, not a schedule: a restart from a checkpoint before them runs
    on without stopping there (the hosts as they are now size it), where a scheduled or live
    resize ahead still stops it. Replayed, a grow onto a host still in its cooldown was capped to
    the ring's own size and left in-place workers paused for good."""
    p = Plan.from_spec(2, (Resize(300, 3),))
    p.add(28, 1, "hosts")  # a host dropped from discovery
    p.add(50, 2, "hosts")  # and back
    p.add(0, 1, "lost_host")  # a stall, restarted from step 0 on the one host left
    assert p.world_after(0) == 1 and p.world_after(60) == 2  # what the run was at, as before
    assert p.resizes_after(0) == p.resizes_after(29) == (Resize(300, 3),)
    assert p.next_stop(0, 400) == 300 and p.resize_at(50) is None and p.resize_at(28) is None
    p.add(100, 2, "live")  # a live grow ahead is replayed
    assert p.resizes_after(0) == (Resize(100, 2), Resize(300, 3))


def test_the_loops_sleep_wakes_at_a_new_live_request_and_not_at_one_left_unread(tmp_path):
    """``Controller._nap``: a request written during the sleep ends it within a few of its 10 ms
    looks (a live resize waits no 0.1 s poll); with no request, or one left unread from before
    the sleep (no change), it sleeps its whole period (no busy loop)."""
    import threading
    import time
    from types import SimpleNamespace

    from elastic_ring.controller.controller import Controller
    from elastic_ring.protocol import REQUEST_FILE, write_json_atomic

    (tmp_path / "control").mkdir()
    me = SimpleNamespace(spec=SimpleNamespace(run_dir=tmp_path))
    req = tmp_path / "control" / REQUEST_FILE

    t0 = time.monotonic()
    Controller._nap(me, 0.3)
    assert time.monotonic() - t0 >= 0.29  # nothing asked: the whole period

    threading.Timer(0.1, lambda: write_json_atomic(req, {"to": 2, "time": time.time()})).start()
    t0 = time.monotonic()
    Controller._nap(me, 5.0)
    assert 0.09 <= time.monotonic() - t0 < 2.0  # woken by the request, not at the period's end

    t0 = time.monotonic()
    Controller._nap(me, 0.3)  # the same request, unread: no change
    assert time.monotonic() - t0 >= 0.29

    threading.Timer(0.1, lambda: write_json_atomic(req, {"to": 1, "time": time.time()})).start()
    t0 = time.monotonic()
    Controller._nap(me, 5.0)  # a newer request over it wakes it again
    assert time.monotonic() - t0 < 2.0
