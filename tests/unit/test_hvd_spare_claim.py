"""The warm joiner (``hvdrun.Spare``) is taken by one slot only: Horovod Elastic's driver starts
the slots of a grow by two from threads of their own at once, and both used to find the one spare
ready; the second then joined with no process and the ring never formed (a hang). And a joiner's
first start takes the spare still pending (its thread had not yet seen the ring train since the
last join) instead of starting cold."""

from __future__ import annotations

import os
import sys
import threading
import time

from elastic_ring.controller.hvdrun import Spare
from elastic_ring.protocol import waiting_file


class FakeProc:
    pid = 4242

    def poll(self):
        return None


def _spare(tmp_path) -> Spare:
    s = Spare.__new__(Spare)  # (its command line parsed by __init__ is not what this tests)
    s.go = tmp_path / "spare-hvd.json"
    s.proc = FakeProc()
    s._lock, s._launches = threading.Lock(), 0
    waiting_file(s.go).write_text('{"pid": 4242}')
    return s


def test_two_slots_asking_at_once_one_takes_the_spare_the_other_starts_cold(tmp_path):
    spare = _spare(tmp_path)
    real_ready = spare.ready

    def slow_ready(events):  # both threads inside the check at once, as the driver's are
        ok = real_ready(events)
        time.sleep(0.05)
        return ok

    spare.ready = slow_ready
    got, go = [], threading.Barrier(2)

    def slot():
        go.wait()
        got.append(spare.claim([]))

    threads = [threading.Thread(target=slot) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert sorted(x is None for x in got) == [False, True]  # one took it, the other goes cold
    assert spare.proc is None and spare.claim([]) is None  # taken: nobody else gets it


def test_a_spare_not_ready_is_not_taken(tmp_path):
    spare = _spare(tmp_path)
    waiting_file(spare.go).unlink()
    spare.proc = None
    assert spare.claim([]) is None


# The next spare after a join is pending until its thread sees the ring train again (the progress
# file, polled every SPARE_POLL_S). A grow one step after the join (a shrink and a grow in a row)
# used to come first: its worker started cold, not as the spare (fresh-clone CI: the last grow of
# test_inplace_survive's rejected-joiner test went cold, so its deliberate abort never came).

SPARE = """
import os, sys, time
open(sys.argv[2], "a").write(f"{os.getpid()}\\n")  # one line per spare process started
open(sys.argv[1], "w").write('{"pid": %d}' % os.getpid())  # at its go, as the real one
time.sleep(30)
"""


def _pending(tmp_path, monkeypatch, poll_s: float):
    """A Spare whose process is a real stand-in (it writes its waiting file at once), pending:
    its thread (polling every ``poll_s``) has not seen the ring train since the last join."""
    from elastic_ring.controller import hvdrun

    monkeypatch.setattr(hvdrun, "SPARE_POLL_S", poll_s)
    s = Spare.__new__(Spare)
    s.run_dir, s.go, s.env = tmp_path, tmp_path / "control" / "spare-hvd.json", dict(os.environ)
    s.go.parent.mkdir()
    started = tmp_path / "started"
    s.argv = [sys.executable, "-c", SPARE, str(waiting_file(s.go)), str(started)]
    s.proc, s._pending, s._lock, s._launches = None, None, threading.Lock(), 0
    s.t0 = time.time() + 3600  # (no training after it)
    shutdown = threading.Event()
    s.start_when_training(shutdown)
    return s, shutdown, started


def test_a_joiners_first_start_takes_the_pending_spare_before_its_thread_saw_the_ring_train(tmp_path, monkeypatch):
    spare, shutdown, started = _pending(tmp_path, monkeypatch, poll_s=60.0)
    try:
        p = spare.claim([], start_pending=True)  # the grow's worker: the spare, started now
        assert p is not None and p.poll() is None and started.read_text().split() == [str(p.pid)]
        assert spare.proc is None and spare.claim([], start_pending=True) is None  # one spare, taken
    finally:
        shutdown.set()
        if p is not None:
            p.kill()


def test_the_thread_starts_no_second_spare_once_a_joiner_started_it(tmp_path, monkeypatch):
    spare, shutdown, started = _pending(tmp_path, monkeypatch, poll_s=0.02)
    p = None
    try:
        p = spare.claim([], start_pending=True)
        spare.t0 = time.time() - 1
        (tmp_path / "control" / "progress.json").write_text("{}")  # the ring trains: the thread sees it
        time.sleep(0.5)  # (its poll, many times over)
        assert spare.proc is None and len(started.read_text().split()) == 1
    finally:
        shutdown.set()
        if p is not None:
            p.kill()


def test_a_start_again_takes_no_pending_spare(tmp_path, monkeypatch):
    """keep_joining's next start after a joiner died before its ring formed (the ring has not
    trained since): cold, unless a spare was started already (its thread's, as before)."""
    spare, shutdown, started = _pending(tmp_path, monkeypatch, poll_s=60.0)
    try:
        assert spare.claim([]) is None and spare._pending is not None and not started.exists()
    finally:
        shutdown.set()


def _worker_fn(tmp_path, monkeypatch, exits: list[int]):
    """The warm_joiner patch's worker function over fakes: its spare's claims are recorded (none
    is taken), each cold start exits with the next of ``exits``."""
    from elastic_ring import hvd_patches
    from elastic_ring.controller import hvdrun

    claims, colds = [], []

    def claim(self, events, start_pending=False):
        claims.append(start_pending)
        return None

    def make(exec_command, run_command, env, event):
        def cold(slot_info, events):
            colds.append(slot_info.rank)
            return exits[len(colds) - 1], time.time()
        return cold

    monkeypatch.setattr(Spare, "claim", claim)
    monkeypatch.setattr(hvdrun, "_SPARES", [])
    monkeypatch.setattr(hvdrun, "SPARE_POLL_S", 60.0)  # (its thread starts no process here)
    (tmp_path / "control").mkdir()
    event = threading.Event()
    create = hvd_patches._warm_joiner(make)(None, f"python -m w --run-dir {tmp_path} --segment 0 -- s.py", {}, event)
    return create, event, claims, colds


def _slot(rank: int):
    from horovod.runner.common.util.hosts import SlotInfo

    return SlotInfo(hostname=f"slot{rank}.elastic-ring.invalid", rank=rank, local_rank=0, cross_rank=rank,
                    size=2, local_size=1, cross_size=2)


def test_only_a_joiners_first_start_starts_a_pending_spare(tmp_path, monkeypatch):
    create, event, claims, colds = _worker_fn(tmp_path, monkeypatch, [0, -6, 0])
    try:
        assert create(_slot(1), [])[0] == 0 and claims == [False]  # the first ring's worker: cold, as before
        (tmp_path / "control" / "progress.json").write_text("{}")  # the ring trains
        claims.clear()
        # a grow's joiner (rejected once before its ring formed): its first start may start the
        # pending spare; keep_joining's start again takes one only when one was started
        assert create(_slot(1), [])[0] == 0 and claims == [True, False] and colds == [1, 1, 1]
    finally:
        event.set()


def test_a_slot_on_another_machine_never_takes_the_local_spare(tmp_path, monkeypatch):
    """In place over hosts, the warm spare is a process on the driver's machine: a grow's slot on
    another host gets the cold worker the driver starts there, never asking for the spare."""
    from horovod.runner.common.util.hosts import SlotInfo

    create, event, claims, colds = _worker_fn(tmp_path, monkeypatch, [0, 0, 0])
    try:
        (tmp_path / "control" / "progress.json").write_text("{}")  # the ring trains: a joiner
        other = SlotInfo(hostname="node-b.example.invalid", rank=1, local_rank=0, cross_rank=1,
                         size=2, local_size=1, cross_size=2)
        assert create(other, [])[0] == 0  # the cold worker's exit status
        assert claims == [] and colds == [1]
        here = SlotInfo(hostname="127.0.0.1", rank=1, local_rank=0, cross_rank=1,
                        size=2, local_size=1, cross_size=2)
        create(here, [])
        assert claims == [True]  # this machine's slot asks for the spare (none here: cold)
    finally:
        event.set()


def test_a_second_spare_started_at_once_leaves_the_first_ones_go_in_place(tmp_path, monkeypatch):
    """Two slots of one grow: the first takes the spare and is handed its go; the second starts the
    next spare at once. That start must not remove (nor share) the first's go file, or the first
    joiner never reads its rank and both read the second's (a hang of the grown ring)."""
    spare, shutdown, started = _pending(tmp_path, monkeypatch, poll_s=60.0)
    # (a stand-in that writes the waiting file of the go file it is given, as the real one)
    spare.argv = [sys.executable, "-c", "import os, sys, time; open(sys.argv[2] + '.waiting', 'w')"
                  ".write('{\"pid\": %d}' % os.getpid()); time.sleep(30)", "--go-file", str(spare.go)]
    p1 = p2 = None
    try:
        p1 = spare.claim([], start_pending=True)
        first_go = p1.go_file
        first_go.write_text('{"stop_at": 0, "env": {"HOROVOD_RANK": "2"}}')  # (join's go, not read yet)
        spare.start_when_training(shutdown)  # join: the next spare is pending
        p2 = spare.claim([], start_pending=True)  # the second slot starts it now
        assert p2 is not None and p2.go_file != first_go
        assert first_go.read_text() == '{"stop_at": 0, "env": {"HOROVOD_RANK": "2"}}'
    finally:
        shutdown.set()
        for p in (p1, p2):
            if p is not None:
                p.kill()
