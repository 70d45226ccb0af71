"""The warm joiner (``hvdrun.Spare``) is taken by one slot only: Horovod Elastic's driver starts
the slots of a grow by two from threads of their own at once, and both used to find the one spare
ready; the second then joined with no process and the ring never formed (a hang)."""

from __future__ import annotations

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
    s._lock = threading.Lock()
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
