"""The heartbeat written off the training thread (:class:`elastic_ring.heartbeat.Beats`): the
training thread only notes its step and phase, a thread writes the newest note; a thread that goes
on writing while the training thread is stuck must not make the worker look alive to the stall
watchdog."""

import gc
import threading
import time

from elastic_ring.controller.watchdog import Watchdog
from elastic_ring.heartbeat import Beat, Beats, read_beats
from tests.conftest import wait_for


class FakeFile:
    """A heartbeat file that records its writes (the opener's product)."""

    def __init__(self, log: list, run_dir, segment: int, rank: int) -> None:
        self.log, self.key, self.closed = log, (segment, rank), False
        log.append(("open", segment, rank))

    def beat(self, step: int, phase: str, t: float) -> None:
        self.log.append((self.key, step, phase, t))

    def close(self) -> None:
        self.closed = True
        self.log.append(("close", *self.key))


def _fake(tmp_path, every_s=60.0):
    log: list = []
    return Beats(tmp_path, every_s=every_s, opener=lambda rd, seg, rank: FakeFile(log, rd, seg, rank)), log


def test_a_mark_writes_nothing_and_a_flush_writes_the_newest_note_once(tmp_path):
    beats, log = _fake(tmp_path)
    beats.mark(0, 1, 3, "step", 10.0)
    beats.mark(0, 1, 4, "sync", 10.5)  # the training thread went on before the writer ran
    assert log == []
    beats.flush()
    assert log == [("open", 0, 1), ((0, 1), 4, "sync", 10.5)]
    beats.flush()  # nothing new: nothing written
    assert len(log) == 2
    beats.mark(0, 1, 4, "step", 11.0)  # a phase change (the same step) is written
    beats.mark(2, 0, 4, "step", 11.0)  # an in-place resize: another segment and rank, another file
    beats.flush()
    assert log[2:] == [("close", 0, 1), ("open", 2, 0), ((2, 0), 4, "step", 11.0)]


def test_write_puts_a_rare_phase_on_disk_at_once_without_the_thread(tmp_path):
    beats, log = _fake(tmp_path)
    assert not beats.running()
    beats.write(1, 0, 7, "checkpoint", 5.0)
    assert log[-1] == ((1, 0), 7, "checkpoint", 5.0)
    assert beats.written == (1, 0, 7, "checkpoint", 5.0)


def test_the_thread_writes_the_training_thread_s_notes_and_stop_writes_the_last(tmp_path):
    beats, log = _fake(tmp_path, every_s=0.01)
    beats.start()
    beats.start()  # idempotent: one thread
    assert sum(t.name == "elastic-ring-beats" and t.is_alive() for t in threading.enumerate()) >= 1
    beats.mark(0, 0, 1, "step", 1.0)
    wait_for(lambda: log and log[-1] == ((0, 0), 1, "step", 1.0), 5, "the thread's write", poll=0.005)
    beats.stop()
    assert not beats.running()
    beats.mark(0, 0, 2, "step", 2.0)  # no thread now: nothing written by itself ...
    time.sleep(0.05)
    assert log[-1] == ((0, 0), 1, "step", 1.0)
    beats.start()  # ... until a next segment starts it again
    wait_for(lambda: log[-1] == ((0, 0), 2, "step", 2.0), 5, "the restarted thread's write", poll=0.005)
    beats.mark(0, 0, 3, "ending", 3.0)
    beats.stop()  # the newest note is on disk when stop() returns
    assert log[-1] == ((0, 0), 3, "ending", 3.0)


def test_a_writer_dropped_without_stop_ends_its_thread(tmp_path):
    beats, _ = _fake(tmp_path, every_s=0.01)
    beats.start()
    thread = beats._thread
    del beats
    gc.collect()
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_concurrent_marks_writes_and_the_thread_leave_the_newest_note_on_disk(tmp_path):
    """The training thread marks on (no lock) and writes rare phases (the lock) while the writer
    thread flushes as fast as it can: the file always ends at the newest note."""
    beats = Beats(tmp_path, every_s=0.0005)
    beats.start()
    for step in range(1, 3001):
        beats.mark(0, 1, step, "step", float(step))
        if step % 500 == 0:
            beats.write(0, 1, step, "checkpoint", float(step))
    beats.mark(0, 1, 3000, "sync", 3001.0)
    beats.stop()
    assert read_beats(tmp_path, 0) == [Beat(1, 3000, "sync")]
    beats.close()


def test_a_stuck_training_thread_stalls_although_the_writer_thread_goes_on(tmp_path):
    """Two ranks' real heartbeat files, read as the controller reads them: rank 1's training thread
    stops noting after step 5 (hung in its data loader) while its writer thread keeps running, rank
    0 waits in step 6's gradient exchange; the watchdog sees no progress after the timeout and
    blames rank 1 by its older heartbeat, at step 5."""
    ranks = [Beats(tmp_path, every_s=0.005) for _ in range(2)]
    for b in ranks:
        b.start()
    wd, now = Watchdog(timeout_s=2.0), 1000.0
    wd.reset(0, 2, now)
    for step in range(1, 6):
        for r, b in enumerate(ranks):
            b.mark(0, r, step, "step", now)
        wait_for(lambda: [x.step for x in read_beats(tmp_path, 0)] == [step, step], 5, f"step {step} on disk",
                 poll=0.005)
        now += 0.1
        wd.observe(read_beats(tmp_path, 0), now)
    ranks[0].mark(0, 0, 5, "sync", now)  # rank 0 done with its part of step 6, waiting for rank 1
    wait_for(lambda: read_beats(tmp_path, 0)[0] == Beat(0, 5, "sync"), 5, "rank 0's sync",
             poll=0.005)
    wd.observe(read_beats(tmp_path, 0), now)
    t_last = now
    for _ in range(30):  # 3 s of the controller's reads while both writer threads run on
        time.sleep(0.01)
        now += 0.1
        wd.observe(read_beats(tmp_path, 0), now)
        assert wd.t_progress == t_last  # the writers' rewrites are no progress
    assert all(b.running() for b in ranks)
    stall = wd.check(now, stopped=dict)
    assert stall is not None and stall.ranks == (1,) and stall.why == "oldest heartbeat" and stall.last_step == 5
    for b in ranks:
        b.close()
