"""Rank 0's progress file, written off the training thread (worker.progress.ProgressWriter)."""

from __future__ import annotations

import json
import threading
import time

from elastic_ring.worker.progress import ProgressWriter


def test_the_newest_record_is_on_disk_after_flush(tmp_path):
    w = ProgressWriter(tmp_path / "control" / "progress.json")
    for step in range(1, 50):
        w.submit({"step": step, "segment": 0})
    w.flush()
    assert json.loads((tmp_path / "control" / "progress.json").read_text()) == {"step": 49, "segment": 0}


def test_submit_does_not_wait_for_the_file_system(tmp_path, monkeypatch):
    from elastic_ring import protocol

    gate = threading.Event()
    real = protocol.write_json_atomic

    def slow(path, obj):  # a file system that blocks until released
        gate.wait(10)
        real(path, obj)

    monkeypatch.setattr(protocol, "write_json_atomic", slow)
    w = ProgressWriter(tmp_path / "progress.json")
    t0 = time.perf_counter()
    w.submit({"step": 1})
    w.submit({"step": 2})
    assert time.perf_counter() - t0 < 1.0
    assert not (tmp_path / "progress.json").exists()
    gate.set()
    w.flush()
    assert json.loads((tmp_path / "progress.json").read_text()) == {"step": 2}


def test_an_idle_writer_ends_its_thread_and_a_later_record_starts_another(tmp_path):
    w = ProgressWriter(tmp_path / "progress.json", idle_s=0.05)
    w.submit({"step": 1})
    w.flush()
    deadline = time.time() + 5
    while w._thread is not None and time.time() < deadline:
        time.sleep(0.01)
    assert w._thread is None
    w.submit({"step": 2})
    w.flush()
    assert json.loads((tmp_path / "progress.json").read_text()) == {"step": 2}


def test_events_handed_to_the_thread_land_in_order_before_any_written_after_them(tmp_path, monkeypatch):
    """A throughput window's event is made and appended by the writer's thread (off the training
    thread); an event emitted on the training thread after it waits for it, so the log keeps the
    order they were emitted in, and a segment's end (flush) finds them on disk."""
    from elastic_ring.events.api import EventLog, Notice, iter_event_dicts
    from elastic_ring.worker.progress import Progress

    gate = threading.Event()
    log = EventLog(tmp_path / "events.jsonl")
    real = log.write

    def slow(event):  # the writer's thread held until released
        if threading.current_thread() is not threading.main_thread():
            gate.wait(10)
        real(event)

    log.write = slow
    p = Progress.__new__(Progress)  # (only what emit/emit_later use)
    p._events, p._later = log, 0
    p._progress_writer = ProgressWriter(tmp_path / "progress.json")
    made = []
    p.emit_later(lambda: made.append(1) or Notice(message="first"))
    p.emit_later(lambda: Notice(message="second"))
    time.sleep(0.05)
    assert not list(iter_event_dicts(tmp_path / "events.jsonl"))  # nothing yet: the thread holds them
    threading.Timer(0.1, gate.set).start()
    p.emit(Notice(message="third"))  # waits for the two before it
    assert [e["message"] for e in iter_event_dicts(tmp_path / "events.jsonl")] == ["first", "second", "third"]
    assert made == [1] and p._later == 0
    p.emit_later(lambda: Notice(message="fourth"))
    p._progress_writer.flush()
    assert [e["message"] for e in iter_event_dicts(tmp_path / "events.jsonl")][-1] == "fourth"
