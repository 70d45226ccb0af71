"""The workers' process records read back by one reader (``protocol.read_pid_records``): every
record, or with ``newest`` each process's records of its newest segment, which the in-place
backend's map of ranks to processes and its survivors' hosts are built from."""

from __future__ import annotations

import os
import time

from elastic_ring import protocol
from elastic_ring.controller.backends.elastic import _current_pids, _current_records


def _write(tmp_path, name: str, **rec) -> None:
    protocol.write_json_atomic(protocol.pid_dir(tmp_path) / name, rec)


def _ring(tmp_path):
    """A survivor (pid 21) started as rank 1 of segment 0 and re-formed in place as rank 0 of
    segment 2, then as rank 0 of segment 3 (written before the controller runs it); a joiner
    (pid 22) started for segment 2 as rank 1 after the survivor's start record; a warm spare's
    placeholder (pid 23, segment -1); a record that does not parse."""
    _write(tmp_path, "seg000-rank1.json", rank=1, pid=21, segment=0, launch_host="127.0.0.1")
    _write(tmp_path, "seg000-rank0.json", rank=0, pid=20, segment=0, launch_host="localhost")
    _write(tmp_path, "reformed-21.json", rank=0, pid=21, segment=2, launch_host="127.0.0.1")
    later = time.time() + 5  # (written after the survivor's: the mtime says so, whatever the clock's grain)
    _write(tmp_path, "seg002-rank1.json", rank=1, pid=22, segment=2, launch_host="localhost")
    os.utime(protocol.pid_dir(tmp_path) / "seg002-rank1.json", (later, later))
    _write(tmp_path, "seg-01-rank1.json", rank=1, pid=23, segment=-1)
    (protocol.pid_dir(tmp_path) / "seg003-rank9.json").write_text("{not json")


def test_every_record_or_the_newest_segments_of_each_process(tmp_path):
    _ring(tmp_path)
    assert sorted(r["pid"] for r in protocol.read_pid_records(tmp_path)) == [20, 21, 22, 23]  # (start records)
    assert sorted(r["pid"] for r in protocol.read_pid_records(tmp_path, reformed=True)) == [20, 21, 21, 22, 23]
    newest = protocol.read_pid_records(tmp_path, reformed=True, newest=True)
    assert sorted((r["pid"], r["segment"], r["rank"]) for r in newest) == [
        (20, 0, 0), (21, 2, 0), (22, 2, 1), (23, -1, 1)]
    assert all(r["written"] > 0 for r in newest)
    # the survivor re-formed for segment 3, which the controller does not run yet: up to segment 2
    # its record is the one it started with (its re-form's file is its newest only)
    _write(tmp_path, "reformed-21.json", rank=0, pid=21, segment=3, launch_host="127.0.0.1")
    upto2 = protocol.read_pid_records(tmp_path, reformed=True, newest=True, upto=2)
    assert sorted((r["pid"], r["segment"], r["rank"]) for r in upto2) == [(20, 0, 0), (21, 0, 1), (22, 2, 1),
                                                                          (23, -1, 1)]


def test_the_in_place_backends_map_of_ranks_reads_the_newest_records(tmp_path):
    """Rank 0 of segment 2 is the survivor (its re-form's record), rank 1 the joiner; pid 20, gone
    since segment 0, still names rank 0 there, but the survivor's record is newer; the spare
    holds no rank."""
    _ring(tmp_path)
    old = time.time() - 60
    os.utime(protocol.pid_dir(tmp_path) / "seg000-rank0.json", (old, old))
    assert _current_pids(tmp_path, 2) == {0: 21, 1: 22}
    assert _current_records(tmp_path, 2)[0]["launch_host"] == "127.0.0.1"
    assert _current_pids(tmp_path, 0) == {0: 20, 1: 21}  # (segment 0's ring: the later records not yet)
