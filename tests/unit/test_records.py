"""Records read back typed: event lines through the event registry, the cluster store's job rows
and history, the scheduler's policy capabilities; older files still read, and what is written
keeps its format."""

from __future__ import annotations

import json
import sqlite3

import pytest

from elastic_ring import protocol
from elastic_ring.cluster.api import JobEvent, JobRequest, JobRow, JobState
from elastic_ring.cluster.store import Store
from elastic_ring.controller.summary import summarize
from elastic_ring.events.api import EventLog, Launch, Throughput, UnknownEvent, as_event, read_events
from elastic_ring.sched.api import CostAwarePolicy, ExploringPolicy
from elastic_ring.sched.policies import Exploratory
from elastic_ring.sched.registry import make_policy


def _launch(**kw) -> Launch:
    base = dict(segment=0, world_size=2, start_step=1, stop_step=10, command=["horovodrun"], device="cpu", time=5.0)
    return Launch(**{**base, **kw})


def test_a_written_event_reads_back_as_its_record_and_its_line_is_unchanged(tmp_path):
    log = EventLog(tmp_path / "events.jsonl")
    ev = _launch()
    log.write(ev)
    line = json.loads((tmp_path / "events.jsonl").read_text())
    assert list(line) == ["kind", "time", "segment", "world_size", "start_step", "stop_step", "command", "device",
                          "prelaunched_s", "session_start"]  # no key of the reader's own (extra)
    (back,) = read_events(tmp_path / "events.jsonl")
    assert back == ev and isinstance(back, Launch) and back.to_dict() == line
    assert read_events(tmp_path / "events.jsonl", Launch) == read_events(tmp_path / "events.jsonl", "launch") == [ev]


def test_lines_of_an_older_or_newer_version_still_read(tmp_path):
    """A field the record lacks is kept in ``extra``; a declared one the line lacks reads as None (or
    its default); a kind nobody registered keeps its name and fields; a torn last line is skipped."""
    lines = [{"kind": "launch", "time": 1.0, "segment": 0, "world_size": 2, "start_step": 1, "stop_step": 9,
              "command": [], "from_the_future": 7},  # no device, no prelaunched_s / session_start
             {"kind": "not_a_kind_yet", "time": 2.0, "a": [1, 2]}]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"kind": "thr')
    old, new = read_events(tmp_path / "events.jsonl")
    assert isinstance(old, Launch) and old.world_size == 2 and old.device is None and old.session_start is False
    assert old.extra == {"from_the_future": 7} and old.to_dict()["from_the_future"] == 7
    assert isinstance(new, UnknownEvent) and new.kind == "not_a_kind_yet" and new.to_dict() == lines[1]
    assert new != as_event({**lines[1], "a": [3]})  # an unknown kind's fields still count in ==


def test_the_dict_view_answers_what_the_dict_did():
    ev = as_event({"kind": "throughput", "time": 3.0, "segment": 0, "world_size": 1, "step": 4, "steps": 4,
                   "seconds": 2.0, "images_per_s": 64.0, "steps_per_s": 2.0, "loss": 1.5, "lr": 0.1, "epoch": 0,
                   "note": "x"})
    assert isinstance(ev, Throughput) and ev["kind"] == "throughput" and ev["step"] == 4 and ev["note"] == "x"
    assert ev.get("missing", 9) == 9 and "seconds" in ev and "missing" not in ev
    assert dict(ev) == ev.to_dict() and {**ev}["loss"] == 1.5
    with pytest.raises(KeyError):
        ev["missing"]


def test_a_run_folder_of_an_older_version_summarises(tmp_path):
    """Lines without the fields added later (session_start, elapsed_s, telemetry) still summarise."""
    lines = [{"kind": "launch", "time": 0.0, "segment": 0, "world_size": 1, "start_step": 1, "stop_step": 8,
              "command": [], "device": "cpu"}]
    lines += [{"kind": "throughput", "time": float(s), "segment": 0, "world_size": 1, "step": s, "steps": 4,
               "seconds": 2.0, "images_per_s": 64.0, "steps_per_s": 2.0, "loss": 1.0 / s, "lr": 0.1, "epoch": 0}
              for s in (4, 8)]
    lines.append({"kind": "finished", "time": 9.0, "step": 8, "wall_s": 9.0, "train_loss": 0.125,
                  "test_accuracy": None, "test_loss": None})
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    s = summarize(read_events(tmp_path / "events.jsonl"))
    assert s["state"] == "finished" and s["step"] == 8 and s["steps_trained"] == 8
    assert s["elapsed_s"] is None and s["train_loss"] == 0.125 and s["sizes"][0]["windows"] == 2


def _request() -> JobRequest:
    return JobRequest(name="j", kind="script", path="x.py", steps=10)


def test_job_rows_are_frozen_values_and_the_store_keeps_its_format(tmp_path):
    store = Store(tmp_path, create=True)
    jid = store.submit(_request())
    store.update(jid, slots=[0, 1], state=JobState.RUNNING)
    row = store.job(jid)
    assert isinstance(row, JobRow) and row.slots == (0, 1) and row.state is JobState.RUNNING
    with pytest.raises(AttributeError):
        row.step = 3  # type: ignore[misc]
    assert row.replace(step=3).step == 3 and row.step == 0
    raw = store.db.execute("SELECT slots, state, request FROM jobs WHERE id=?", (jid,)).fetchone()
    assert raw["slots"] == "[0, 1]" and raw["state"] == "running"
    assert JobRequest.from_dict(json.loads(raw["request"])) == _request() == row.request
    assert row["slots"] == [0, 1] and row.get("nope") is None and dict(row.items())["name"] == "j"
    (ev,) = store.events(jid)
    assert isinstance(ev, JobEvent) and ev.kind == "submitted" and ev.data == {"name": "j"} and ev["job_id"] == jid


def test_a_store_of_an_older_version_loads(tmp_path):
    """A store written before ``finished`` was the word (``succeeded``), and one with a column this
    version does not know, read as rows."""
    Store(tmp_path, create=True).close()
    db = sqlite3.connect(str(tmp_path / "cluster.db"))
    db.execute("ALTER TABLE jobs ADD COLUMN added_later TEXT")
    db.execute("INSERT INTO jobs(name, request, state, submitted, slots, added_later) VALUES(?, ?, ?, ?, ?, ?)",
               ("old", json.dumps(_request().to_dict()), "succeeded", 1.0, "[]", "x"))
    db.commit()
    db.close()
    (row,) = Store(tmp_path).jobs()
    assert row.name == "old" and row.state is JobState.FINISHED and row.slots == ()


def test_policy_capabilities_are_typed():
    rc, plain, explore = make_policy("srtf-rc", 2.0), make_policy("srtf"), Exploratory(4)
    assert isinstance(rc, CostAwarePolicy) and rc.resize_cost_s == 2.0
    assert not isinstance(plain, CostAwarePolicy) and not isinstance(plain, ExploringPolicy)
    assert isinstance(explore, ExploringPolicy) and explore.explore_gpus == 4


def test_retired_is_one_status():
    """The worker and the Ray group agree with ``protocol.RETIRED`` (until both import it)."""
    from elastic_ring.controller.backends import ray_group
    from elastic_ring.worker import run

    assert run.RETIRED == ray_group.RETIRED == protocol.RETIRED
