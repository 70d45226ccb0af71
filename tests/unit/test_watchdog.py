"""The stall watchdog's rule, driven with fake heartbeats, clocks and process states."""

import os
import signal
import subprocess
import sys
import time

from elastic_ring.controller import watchdog as wd
from elastic_ring.controller.watchdog import Watchdog
from elastic_ring.heartbeat import Beat, Heartbeat, parse_beat, read_beats


def test_default_timeout_is_ten_median_steps_with_a_floor():
    assert wd.default_timeout([]) == 30.0
    assert wd.default_timeout([0.1, 0.2, 9.0]) == 30.0  # 10 x 0.2 s < the floor
    assert wd.default_timeout([4.0, 5.0, 6.0, 100.0]) == 55.0  # median 5.5 s, not the mean


def test_allowance_is_longer_before_the_first_step_and_in_slow_phases():
    assert wd.allowed_idle_s(10.0, started=True, phases=["step", "step"]) == 10.0
    assert wd.allowed_idle_s(10.0, started=False, phases=[]) == wd.STARTUP_S
    assert wd.allowed_idle_s(10.0, started=True, phases=["step", "checkpoint"]) == wd.SLOW_PHASE_S
    assert wd.allowed_idle_s(100.0, started=True, phases=["eval"]) == 300.0


def test_heartbeat_file_is_rewritten_in_place_and_read_back(tmp_path):
    hb = Heartbeat(tmp_path, segment=2, rank=1)
    hb.beat(123456, "step", 1.5)
    hb.beat(7, "eval", 2.5)  # shorter: the fixed width leaves nothing of the longer record
    hb.close()
    assert read_beats(tmp_path, 2) == [Beat(1, 7, "eval")]
    assert read_beats(tmp_path, 3) == []
    assert parse_beat(0, b"garbage") is None


def _dog(timeout=4.0):
    d = Watchdog(timeout_s=timeout)
    d.reset(segment=0, world=2, now=0.0)
    return d


def test_no_stall_while_any_rank_makes_steps():
    d = _dog()
    for t in range(1, 30):
        d.observe([Beat(0, t, "step"), Beat(1, t, "step")], now=float(t))
        assert d.check(float(t) + 0.5, stopped=dict) is None


def test_stall_after_the_timeout_blames_the_rank_with_the_oldest_step():
    d = _dog()
    d.observe([Beat(0, 10, "step"), Beat(1, 9, "step")], now=1.0)
    assert d.check(4.9, stopped=dict) is None
    s = d.check(5.1, stopped=dict)
    assert s is not None and s.ranks == (1,) and s.last_step == 10 and s.why == "oldest heartbeat"
    assert "rank 1" in s.message and "after step 10" in s.message


def test_equal_steps_blame_no_one_rather_than_the_healthy_rank():
    d = _dog()
    d.observe([Beat(0, 10, "step"), Beat(1, 10, "step")], now=1.0)
    s = d.check(6.0, stopped=dict)
    assert s is not None and s.ranks == () and s.rank is None and "no rank stands out" in s.message


def test_a_rank_hung_while_running_is_named_by_its_older_heartbeat():
    """Rank 1 sleeps for ever in its data loader in step 11 (state S, not stopped): rank 0 did its
    forward and backward pass and waits at the optimizer's step (phase sync). Both last finished
    step 10; rank 1's heartbeat is the older one. It is named after the timeout, not rank 0."""
    d = _dog(timeout=4.0)
    d.observe([Beat(0, 10, "step"), Beat(1, 10, "step")], now=1.0)
    d.observe([Beat(0, 10, "sync"), Beat(1, 10, "step")], now=1.1)
    states = {0: "S", 1: "S"}
    stopped = lambda: {r: s for r, s in states.items() if s in ("T", "Z")}  # noqa: E731
    assert d.check(5.0, stopped=stopped) is None  # within the timeout: no grace for a sleeper
    s = d.check(5.2, stopped=stopped)
    assert s is not None and s.ranks == (1,) and s.why == "oldest heartbeat" and s.last_step == 10
    # the other way round: rank 0 hung in its checkpoint write, rank 1 waits for it
    assert wd.blame([Beat(0, 20, "checkpoint"), Beat(1, 20, "sync")], 2, {}, {}, [])[0] == (0,)
    # every rank waiting in the exchange (a hang inside the collective itself): no one stands out
    assert wd.blame([Beat(0, 20, "sync"), Beat(1, 20, "sync")], 2, {}, {}, [])[0] == ()
    assert wd.beat_order(None) < wd.beat_order(Beat(0, 0, "step")) < wd.beat_order(Beat(0, 0, "sync"))


def test_a_stopped_process_is_found_after_the_grace_even_with_a_long_timeout():
    d = _dog(timeout=120.0)
    d.observe([Beat(0, 50, "step"), Beat(1, 50, "step")], now=10.0)
    assert d.check(14.0, stopped=lambda: {1: "T"}) is None  # within the 5 s grace
    s = d.check(15.5, stopped=lambda: {1: "T"})
    assert s is not None and s.ranks == (1,) and s.allowed_s == wd.STOPPED_GRACE_S
    assert d.check(15.5, stopped=dict) is None  # nothing stopped: the 120 s timeout holds


def test_stopped_process_beats_other_evidence():
    ranks, why = wd.blame([Beat(0, 3, "step"), Beat(1, 9, "step")], 2, {1: "T"}, {0: "h0"}, [0])
    assert ranks == (1,) and "stopped" in why
    ranks, why = wd.blame([Beat(0, 3, "step"), Beat(1, 9, "step")], 2, {}, {1: "h1"}, [0])
    assert ranks == (1,) and why == "its host does not answer (h1)"
    ranks, why = wd.blame([Beat(0, 3, "step"), Beat(1, 9, "step")], 2, {}, {}, [1])
    assert ranks == (1,) and "missing" in why
    assert wd.blame([Beat(0, 3, "step")], 2, {}, {}, [])[0] == (1,)  # rank 1 never beat


def test_slow_phases_and_start_up_get_their_allowance():
    d = _dog(timeout=4.0)
    assert d.check(100.0, stopped=dict) is None  # no step yet: start-up allowance
    assert d.check(wd.STARTUP_S + 1, stopped=dict) is not None
    d = _dog(timeout=4.0)
    d.observe([Beat(0, 10, "checkpoint"), Beat(1, 10, "step")], now=1.0)
    assert d.check(60.0, stopped=dict) is None
    assert d.check(1.0 + wd.SLOW_PHASE_S + 0.1, stopped=dict) is not None


def test_a_phase_change_counts_as_progress():
    d = _dog(timeout=4.0)
    d.observe([Beat(0, 10, "step"), Beat(1, 10, "step")], now=1.0)
    d.observe([Beat(0, 10, "eval"), Beat(1, 10, "step")], now=4.0)
    assert d.t_progress == 4.0


def test_default_timeout_follows_the_measured_step_time():
    d = Watchdog()
    d.reset(0, 2, 0.0)
    d.observe([Beat(0, 1, "step"), Beat(1, 1, "step")], now=0.0)
    for _ in range(5):
        d.add_step_time(5.0)
    assert d.timeout() == 50.0
    assert d.check(45.0, stopped=dict) is None
    assert d.check(51.0, stopped=dict) is not None


def test_the_callables_are_asked_only_when_needed():
    d = _dog()
    d.observe([Beat(0, 1, "step"), Beat(1, 1, "step")], now=0.0)

    def boom():
        raise AssertionError("asked too early")

    assert d.check(1.0, stopped=boom, dead_hosts=boom, missing=boom) is None


def test_missing_ranks_from_horovods_stall_inspector():
    log = ("[1,0]<stderr>:[2026-01-01 00:00:00.0: W stall_inspector.cc:107] One or more tensors "
           "were submitted to be reduced, gathered or broadcasted by subset of ranks and are "
           "waiting for remainder of ranks for more than 5 seconds. This may indicate ...\n"
           "Missing ranks:\n1: [allreduce.noname.1, allreduce.noname.2]\n3: [allreduce.x]\n")
    assert wd.missing_ranks(log) == [1, 3]
    prefixed = "".join(f"[0]<stderr>:{ln}\n" for ln in log.splitlines())
    assert wd.missing_ranks(prefixed + "[0]<stderr>:step 5\n") == [1, 3]
    assert wd.missing_ranks("nothing here") == []


def test_a_survivor_re_formed_in_place_is_found_stopped_by_its_re_form_record(tmp_path):
    from elastic_ring import protocol

    pids = protocol.pid_dir(tmp_path)
    # the survivor started as rank 1 of segment 0, re-formed in place as rank 0 of segment 2; a joiner is rank 1
    protocol.write_json_atomic(pids / "seg000-rank1.json", {"rank": 1, "pid": 21, "host": "me", "segment": 0})
    protocol.write_json_atomic(pids / "reformed-21.json", {"rank": 0, "pid": 21, "host": "me", "segment": 2})
    protocol.write_json_atomic(pids / "seg002-rank1.json", {"rank": 1, "pid": 22, "host": "me", "segment": 2})
    states = {21: "T", 22: "S"}
    assert wd.stopped_ranks(protocol.read_pid_records(tmp_path), 2, {"me"}, state=states.get) == {}  # (before)
    assert wd.stopped_ranks(protocol.read_pid_records(tmp_path, reformed=True), 2, {"me"}, state=states.get) == {0: "T"}
    assert wd.ranks_on_dead_hosts(protocol.read_pid_records(tmp_path, reformed=True), 2, set(), {"me"}) == {
        0: "me", 1: "me"}


def test_stopped_ranks_reads_the_state_of_local_workers_only():
    recs = [{"rank": 0, "pid": 10, "host": "me", "segment": 1},
            {"rank": 1, "pid": 11, "host": "me", "segment": 1},
            {"rank": 2, "pid": 12, "host": "other", "segment": 1},
            {"rank": 0, "pid": 13, "host": "me", "segment": 0}]
    states = {10: "S", 11: "T", 12: "T", 13: None}
    assert wd.stopped_ranks(recs, 1, {"me"}, state=states.get) == {1: "T"}
    assert wd.ranks_on_dead_hosts(recs, 1, {"me"}, {"me", "other"}) == {2: "other"}
    # the host list names hosts by address: the record's launch_host (horovodrun's HOROVOD_HOSTNAME)
    recs[2] = {**recs[2], "host": "node-b", "launch_host": "10.0.0.2"}
    assert wd.ranks_on_dead_hosts(recs, 1, {"me"}, {"me", "10.0.0.2"}) == {2: "10.0.0.2"}


def test_proc_state_of_a_real_stopped_process():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert wd.proc_state(p.pid) in ("S", "R", "D")  # D: reading its files, on a loaded machine
        os.kill(p.pid, signal.SIGSTOP)
        for _ in range(500):  # the stop lands when the scheduler next runs it (seconds, under load)
            if wd.proc_state(p.pid) == "T":
                break
            time.sleep(0.02)
        assert wd.proc_state(p.pid) == "T"
    finally:
        p.kill()
        p.wait()
    assert wd.proc_state(p.pid) is None


def test_zero_timeout_turns_the_watchdog_off():
    d = Watchdog(timeout_s=0)
    d.reset(0, 2, 0.0)
    d.observe([Beat(0, 5, "step"), Beat(1, 5, "step")], now=0.0)
    assert d.check(1e6, stopped=lambda: {1: "T"}) is None


def test_a_resume_keeps_the_runs_stall_timeout_unless_given_again(tmp_path):
    """`--stall-timeout` is kept in run.json: a `--resume` (as the cluster's stop and resume runs
    it, without the start's options) watches with the same timeout; one given at the resume wins
    and is kept for the next."""
    from elastic_ring.controller.lock import RunLock
    from elastic_ring.controller.runs import RunRequest, prepare

    script = tmp_path / "s.py"
    script.write_text("pass\n")
    rd = tmp_path / "run"
    run = prepare(RunRequest(script=str(script), steps=10, device="cpu", slots=2, stall_timeout=7.5,
                             run_dir=str(rd)), echo=lambda s: None)
    assert run.stall_timeout == 7.5
    RunLock(rd).release()
    again = prepare(RunRequest(resume_dir=str(rd), device="cpu", slots=2), echo=lambda s: None)
    assert again.stall_timeout == 7.5
    RunLock(rd).release()
    third = prepare(RunRequest(resume_dir=str(rd), device="cpu", slots=2, stall_timeout=0), echo=lambda s: None)
    RunLock(rd).release()
    assert third.stall_timeout == 0
    assert prepare(RunRequest(resume_dir=str(rd), device="cpu", slots=2), echo=lambda s: None).stall_timeout == 0


def test_a_host_found_silent_while_the_job_runs_stalls_it_after_the_grace():
    """The host monitor's newest round says host b is silent: once the job made no step for the
    grace, the ranks on b are blamed, whatever the (long) timeout; while steps go on, nothing."""
    d = _dog(timeout=120.0)
    d.observe([Beat(0, 50, "sync"), Beat(1, 50, "step")], now=10.0)
    lost = lambda: {1: "b"}  # noqa: E731
    assert d.check(14.0, stopped=dict, lost=lost) is None  # within the grace
    s = d.check(15.5, stopped=dict, lost=lost)
    assert s is not None and s.ranks == (1,) and s.hosts == ("b",) and s.allowed_s == wd.STOPPED_GRACE_S
    assert "its host does not answer (b)" in s.message
    assert d.check(15.5, stopped=dict, lost=dict) is None  # every host answers: the timeout holds
    d.observe([Beat(0, 51, "step"), Beat(1, 51, "step")], now=15.6)  # it steps: not stalled
    assert d.check(16.0, stopped=dict, lost=lost) is None


def test_host_monitor_rounds_and_thread():
    import threading

    answers = [{"a", "b"}, {"a"}, RuntimeError("ssh missing"), {"a", "b"}]
    calls = []

    def probe(hosts):
        calls.append(list(hosts))
        a = answers[min(len(calls), len(answers)) - 1]
        if isinstance(a, Exception):
            raise a
        return [h for h in hosts if h[0] in a]

    m = wd.HostMonitor([("a", 1), ("b", 2)], probe, every_s=0.01)
    assert m.silent() == frozenset() and m.poll_once() == frozenset()
    assert m.poll_once() == {"b"} and m.silent() == {"b"}
    assert m.poll_once() == {"b"} and m.rounds == 2  # a failed round changes nothing
    assert m.poll_once() == frozenset()
    assert calls[0] == [("a", 1), ("b", 2)]
    before = set(threading.enumerate())
    m.start()
    assert len(set(threading.enumerate()) - before) == 1  # the monitor's thread
    t0 = time.time()
    while m.rounds < 8 and time.time() - t0 < 5:
        time.sleep(0.01)
    m.stop()
    # the monitor's thread is gone (compared as a set: an earlier test's background thread, such as
    # a heartbeat writer ending with its owner, may end meanwhile in this same process)
    assert m.rounds >= 8 and not set(threading.enumerate()) - before
