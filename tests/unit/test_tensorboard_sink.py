"""TensorBoardSink logic with a fake writer: which scalars, the offset that makes a resume append
without duplicates, partial lines, and that a failing writer never stops the run; and the event
file the default writer makes, read back by TensorBoard's own reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from elastic_ring.telemetry.tensorboard import OFFSET_FILE, TensorBoardSink, logdir_for, scalars_of


class FakeWriter:
    def __init__(self, logdir: Path) -> None:
        self.rows, self.flushes, self.closed = [], 0, False
        FakeWriter.last = self

    def add(self, tag, value, step, wall):
        self.rows.append((tag, value, step, wall))

    def start(self, step, wall):
        self.rows.append(("START", None, step, wall))

    def flush(self):
        self.flushes += 1

    def close(self):
        self.closed = True


def _thr(step: int, loss: float) -> dict:
    return {"kind": "throughput", "time": 100.0 + step, "segment": 0, "world_size": 2, "step": step, "steps": 1,
            "seconds": 0.5, "images_per_s": 32.0, "steps_per_s": 2.0, "loss": loss, "lr": 0.1, "epoch": 0}


def _append(p: Path, *evs: dict, tail: str = "") -> None:
    with p.open("a") as f:
        for e in evs:
            f.write(json.dumps(e) + "\n")
        f.write(tail)


def test_scalars_of_each_kind():
    assert {t for t, *_ in scalars_of(_thr(3, 1.5))} == {"train/loss", "train/lr", "train/images_per_s",
                                                        "train/steps_per_s", "train/world_size"}
    ev = {"kind": "restart", "time": 5.0, "attempt": 1, "failed_at_step": 9, "steps_redone": 2,
          "new_world_size": 1, "cause": "x"}
    assert sorted(scalars_of(ev)) == [("restart/attempt", 1.0, 9, 5.0), ("restart/new_world_size", 1.0, 9, 5.0),
                                      ("restart/steps_redone", 2.0, 9, 5.0)]
    assert list(scalars_of({"kind": "launch", "time": 1.0, "segment": 0})) == []
    assert list(scalars_of({"kind": "throughput", "time": 1.0})) == []  # no step: nothing


def test_resume_appends_only_new_lines_and_waits_for_whole_lines(tmp_path):
    ev = tmp_path / "events.jsonl"
    _append(ev, _thr(1, 2.0), _thr(2, 1.0), tail='{"kind": "throughput", "ti')
    s = TensorBoardSink(ev, tmp_path / "tb", writer_factory=FakeWriter)
    assert s.sync() == 10
    first = FakeWriter.last
    assert [r for r in first.rows if r[0] == "train/loss"] == [("train/loss", 2.0, 1, 101.0),
                                                               ("train/loss", 1.0, 2, 102.0)]
    s.close()
    assert first.closed
    # the partial line is completed, then a new controller (a resume) starts on the same folder
    with ev.open("a") as f:
        f.write('me": 103.0, "step": 3}\n')
    _append(ev, _thr(4, 0.5))
    s2 = TensorBoardSink(ev, tmp_path / "tb", writer_factory=FakeWriter)
    assert s2.sync() == 5
    assert [r[2] for r in FakeWriter.last.rows] == [4] * 5
    assert s2.sync() == 0
    assert json.loads((tmp_path / "tb" / OFFSET_FILE).read_text())["offset"] == ev.stat().st_size


def _redone(ev: Path) -> None:
    """Steps 1-4, rank 1 dies after step 4, a restart from the checkpoint at step 2: steps 3 and 4
    again, with other losses."""
    _append(ev, {"kind": "launch", "time": 100.0, "segment": 0, "start_step": 1, "stop_step": 4},
            *(_thr(s, 10.0 - s) for s in range(1, 5)),
            {"kind": "restart", "time": 105.0, "attempt": 1, "failed_at_step": 4, "from_step": 2,
             "steps_redone": 2, "new_world_size": 2, "cause": "rank 1 exited 137"},
            {"kind": "launch", "time": 106.0, "segment": 1, "start_step": 3, "stop_step": 4},
            *(_thr(s, 20.0 - s) for s in (3, 4)))


def test_a_launch_starts_the_writer_again_at_its_first_step_and_the_restart_follows_it(tmp_path):
    ev = tmp_path / "events.jsonl"
    _redone(ev)
    s = TensorBoardSink(ev, tmp_path / "tb", writer_factory=FakeWriter)
    s.sync()
    rows = [(t, st) for t, _, st, _ in FakeWriter.last.rows if t in ("START", "train/loss", "restart/attempt")]
    assert rows == [("START", 1), ("train/loss", 1), ("train/loss", 2), ("train/loss", 3), ("train/loss", 4),
                    ("restart/attempt", 4),  # as it comes, then again after the START that would drop it
                    ("START", 3), ("restart/attempt", 4), ("train/loss", 3), ("train/loss", 4)]


def test_tensorboard_s_reader_shows_each_step_done_again_once_with_its_last_values(tmp_path):
    """The default writer's START, read by TensorBoard's accumulator: the steps done again show
    their second values, once; the restart's point stays."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    ev = tmp_path / "events.jsonl"
    _redone(ev)
    s = TensorBoardSink(ev, tmp_path / "tb")
    s.close()
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(1, 9.0), (2, 8.0), (3, 17.0), (4, 16.0)]
    assert [(e.step, e.value) for e in acc.Scalars("restart/attempt")] == [(4, 1.0)]


def test_a_failing_writer_stops_the_curves_not_the_run(tmp_path):
    ev = tmp_path / "events.jsonl"
    _append(ev, _thr(1, 2.0))

    def broken(logdir):
        raise OSError("disk full")

    s = TensorBoardSink(ev, tmp_path / "tb", writer_factory=broken)
    assert s.sync() == 0 and "disk full" in s.failed
    s.close()


def test_logdir_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("ELASTIC_RING_TENSORBOARD_DIR", raising=False)
    assert logdir_for(tmp_path) == tmp_path / "tensorboard"
    monkeypatch.setenv("ELASTIC_RING_TENSORBOARD_DIR", str(tmp_path / "x"))
    assert logdir_for(tmp_path) == tmp_path / "x"
    monkeypatch.setenv("ELASTIC_RING_TENSORBOARD", "0")
    assert logdir_for(tmp_path) is None


def test_the_event_file_is_read_by_tensorboard_s_own_loader_with_its_checksums(tmp_path):
    """The default writer's file: TensorBoard's loader (which checks each record's checksums) reads
    the version record and then each scalar, in order, and its accumulator their values; the
    checksum is CRC-32C's (its check value, of b"123456789", is 0xE3069283), masked as
    TensorBoard's own function masks it."""
    import os
    import random

    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as tb_masked

    from elastic_ring.telemetry.tensorboard import EventFileScalars, masked_crc32c

    crc = 0xE3069283  # CRC-32C's check value, masked below as TFRecord masks it
    assert masked_crc32c(b"123456789") == ((((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF)
    rng = random.Random(3)
    for n in (0, 1, 7, 8, 100, 1000):
        data = bytes(rng.randrange(256) for _ in range(n))
        assert masked_crc32c(data) == tb_masked(data), n
    w = EventFileScalars(tmp_path / "tb")
    rows = [("train/loss", 2.5, 1, 100.0), ("train/loss", 1.25, 2, 101.0), ("test/accuracy", 0.5, 2, 102.0)]
    for r in rows:
        w.add(*r)
    w.flush()
    w.close()
    (f,) = os.listdir(tmp_path / "tb")
    assert f.startswith("events.out.tfevents.")
    events = list(EventFileLoader(str(tmp_path / "tb" / f)).Load())
    assert events[0].file_version == "brain.Event:2"
    assert [(e.summary.value[0].tag, e.step, e.wall_time) for e in events[1:]] == [(t, s, w) for t, _, s, w in rows]
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    got = sorted((tag, e.value, e.step, e.wall_time) for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag))
    assert got == sorted(rows)  # (values a float32 holds exactly)


def test_the_controller_s_writer_leaves_tensorboard_s_summary_ops_unimported(tmp_path):
    """The writer needs only TensorBoard's protocol buffers: the ``tensorboard.summary`` package
    (its summary ops and their TensorFlow stand-in, ~0.25 s of CPU in each controller) is not
    imported by a run's curves (a fresh interpreter: what the controller does)."""
    import subprocess
    import sys

    pytest.importorskip("tensorboard")
    code = ("import sys; from pathlib import Path; from elastic_ring.telemetry.tensorboard import EventFileScalars; "
            f"w = EventFileScalars(Path({str(tmp_path)!r})); w.add('a', 1.0, 1, 1.0); w.close(); "
            "print(sorted(m for m in sys.modules if m.startswith(('tensorboard.summary', 'tensorboard.compat.tensorflow_stub'))))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]", r.stdout
