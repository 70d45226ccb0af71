"""One answer to "what state is this run in": `status`, `resize` and `runs` read it from the
controller's state file and its lock (``elastic_ring.controller.status``), and the controller
writes the state a user sees (starting, resizing, restarting) as its state machine moves."""

from __future__ import annotations

import json

import pytest

from elastic_ring.controller.api import Resize, RunState
from elastic_ring.controller.lock import RunLock
from elastic_ring.controller.status import read_status
from elastic_ring.events import EventLog, Finished, Launch, Restart, Throughput
from tests.unit.test_controller_fake import _controller


def _folder(tmp_path, total=60, workers=1):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"workers": workers, "schedule": [], "slots": 2,
                                              "total_steps": total, "script": None}))
    return run


def _status(cli_inproc, run):
    p = cli_inproc("status", str(run))
    assert p.returncode == 0, p.stderr
    return p.stdout.splitlines()[0]


def test_a_folder_left_by_a_ctrl_c_during_start_up_is_stopped_not_running(tmp_path, cli_inproc):
    run = _folder(tmp_path)  # config.yaml and run.json only: no controller ever ran
    line = _status(cli_inproc, run)
    assert line.startswith("state: stopped (aborted before its workers started; continue with: "
                           f"elastic-ring train --resume {run})"), line
    assert "workers: 1" in line and "None" not in line
    assert "not running (state: stopped" in cli_inproc("resize", str(run), "--to", "2").stderr


def test_a_garbage_controller_file_is_never_running_and_resize_says_the_same(tmp_path, cli_inproc):
    run = _folder(tmp_path)
    (run / "controller.json").write_text("{garbage")
    line = _status(cli_inproc, run)
    assert "running" not in line and line.startswith("state: crashed"), line
    p = cli_inproc("resize", str(run), "--to", "2")
    assert p.returncode == 2 and "not running (state: crashed" in p.stderr, p.stderr
    lock = RunLock(run)  # a live controller that has not written its state yet: starting
    lock.acquire()
    try:
        assert _status(cli_inproc, run).startswith("state: starting")
    finally:
        lock.release()


def test_a_live_controller_is_told_from_a_dead_one_by_its_lock(tmp_path, cli_inproc):
    run = _folder(tmp_path)
    (run / "controller.json").write_text(json.dumps({"state": "running", "phase": "running", "world_size": 1,
                                                     "pid": 1}))
    assert read_status(run).phase is RunState.CRASHED
    lock = RunLock(run)
    lock.acquire()
    try:
        assert read_status(run).phase is RunState.RUNNING
    finally:
        lock.release()


def test_a_resize_in_progress_shows_both_sizes(tmp_path, cli_inproc):
    run = _folder(tmp_path)
    (run / "controller.json").write_text(json.dumps({"state": "launching", "phase": "resizing", "world_size": 2,
                                                     "resize_from": 1, "pending_world": 2}))
    lock = RunLock(run)
    lock.acquire()
    try:
        line = _status(cli_inproc, run)
        p = cli_inproc("resize", str(run), "--to", "1")
    finally:
        lock.release()
    assert line.startswith("state: resizing 1 -> 2 "), line
    assert p.returncode == 2 and "resizing 1 -> 2" in p.stderr


def test_a_folder_being_made_is_starting_not_a_non_run_folder(tmp_path, cli_inproc):
    run = tmp_path / "new"
    run.mkdir()
    lock = RunLock(run)  # what `train` takes first, before its config, torch and dataset cache
    lock.acquire()
    try:
        line = _status(cli_inproc, run)
    finally:
        lock.release()
    assert line.startswith("state: starting"), line
    p = cli_inproc("status", str(run))  # the lock released, no run.json: not a run folder
    assert p.returncode == 2 and "not an elastic-ring run folder" in p.stderr


def test_the_controller_writes_starting_resizing_and_running_phases(tmp_path):
    ctl, _ = _controller(tmp_path, (Resize(10, 2),), relaunch="overlap", total=20)
    seen = []
    set_state = ctl._set_state

    def spy(state, **extra):
        set_state(state, **extra)
        d = json.loads((tmp_path / "controller.json").read_text())
        assert "phase" not in d  # one word: the state is what a user sees
        seen.append((d.get("segment"), d["state"], d.get("resize_from"), d.get("pending_world")))
    ctl._set_state = spy
    ctl.run(0, 1, 0)
    phases = [p for _, p, _, _ in seen]
    first_running = phases.index("running")
    assert set(phases[:first_running]) == {"starting"}  # the launch, until the first step
    resizing = [s for s in seen if s[1] == "resizing"]
    assert resizing and all((f, t) == (1, 2) for _, _, f, t in resizing), seen
    # resizing lasts from the decision (at segment 0's end) to the first step at the new size,
    # the launch of segment 1 included
    assert {g for g, _, _, _ in resizing} == {0, 1}, seen
    assert phases[-1] == "finished" and "running" in phases[phases.index("resizing"):]


def test_a_failed_run_shows_the_last_step_reached_and_only_the_restarts_that_happened(tmp_path):
    from elastic_ring.controller.summary import render, summarize

    log = EventLog(tmp_path / "events.jsonl")
    log.write(Launch(segment=0, world_size=2, start_step=1, stop_step=200, command=[], device="cpu"))
    log.write(Throughput(segment=0, world_size=2, step=20, steps=20, seconds=2.0, images_per_s=1.0,
                         steps_per_s=10.0, loss=1.0, lr=0.1, epoch=0))
    log.write(Restart(attempt=1, cause="rank 1: ValueError", rank=1, returncode=1, segment=0, world_size=2,
                      from_step=10, failed_at_step=27, steps_redone=17, new_world_size=2))
    log.write(Launch(segment=1, world_size=2, start_step=11, stop_step=200, command=[], device="cpu"))
    log.write(Throughput(segment=1, world_size=2, step=41, steps=20, seconds=2.0, images_per_s=1.0,
                         steps_per_s=10.0, loss=1.0, lr=0.1, epoch=0))
    log.write(Restart(attempt=2, cause="rank 1: ValueError", rank=1, returncode=1, segment=1, world_size=2,
                      from_step=40, failed_at_step=49, steps_redone=9, new_world_size=0, gave_up=True))
    text = render(summarize([json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]), 200)
    assert "step: 49/200" in text.splitlines()[0], text
    rows = text[text.index("restart from step"):].splitlines()
    assert rows[1].split()[0] == "1" and not any(r.split() and r.split()[0] == "2" for r in rows[2:]), text
    assert "not restarted after step 49 (1 restart(s) before): rank 1: ValueError" in text


def test_wall_time_leaves_out_the_stop_before_a_resume(tmp_path):
    from elastic_ring.controller.summary import render, summarize, write_summary
    from elastic_ring.events import read_events

    log = EventLog(tmp_path / "events.jsonl")
    t0 = 1000.0
    log.write(Launch(segment=0, world_size=1, start_step=1, stop_step=60, command=[], device="cpu",
                     session_start=True, time=t0))
    log.write(Throughput(segment=0, world_size=1, step=30, steps=30, seconds=9.0, images_per_s=1.0,
                         steps_per_s=3.0, loss=1.0, lr=0.1, epoch=0, time=t0 + 10))
    # stopped here (Ctrl-C); resumed 480 s later
    log.write(Launch(segment=1, world_size=1, start_step=31, stop_step=60, command=[], device="cpu",
                     session_start=True, time=t0 + 490))
    write_summary(tmp_path, log, t0 + 498)
    fin = read_events(tmp_path / "events.jsonl", kind="finished")[-1]
    assert fin["wall_s"] == 18.0 and fin["elapsed_s"] == 498.0
    line = render(summarize(read_events(tmp_path / "events.jsonl")), 60).splitlines()[0]
    assert "wall: 18.0 s (elapsed 498.0 s, of which 480.0 s stopped)" in line, line


def test_resize_table_says_what_its_columns_measure():
    from elastic_ring.controller.summary import render

    s = {"state": "finished", "step": 120, "world_size": 2, "sizes": [], "scaling_efficiency": [],
         "resizes": [{"from_workers": 1, "to_workers": 2, "step": 60, "stop_latency_s": 0.2,
                      "checkpoint_s": 0.01, "relaunch_to_first_step_s": 4.13, "total_lost_s": 4.12,
                      "steady_step_s": 0.1}], "restarts": []}
    text = render(s, 120)
    for col in ("stop s:", "relaunch s:", "lost s:"):
        assert col in text


def test_a_resize_that_meets_a_decay_says_both(tmp_path):
    ctl, _ = _controller(tmp_path, (Resize(10, 2),), relaunch="overlap", total=20)
    lines: list[str] = []
    ctl.out = lines.append
    ctl.lr_decays = (10, 15)
    ctl.run(0, 1, 0)
    resize = [ln for ln in lines if ln.startswith("resize 1 -> 2 after step 10")]
    assert len(resize) == 1 and "(Eq. 7: x2)" in resize[0], lines
    assert "decay after step 10 applies from step 11 as well" in resize[0]


def test_finished_event_keeps_old_readers_working(tmp_path):
    log = EventLog(tmp_path / "events.jsonl")
    log.write(Finished(step=1, wall_s=2.0, train_loss=None, test_accuracy=None, test_loss=None))
    from elastic_ring.controller.summary import summarize_run

    assert summarize_run(tmp_path)["wall_s"] == 2.0


def test_a_cluster_job_can_show_what_its_run_is_doing(tmp_path):
    from elastic_ring.controller.status import live_note

    run = _folder(tmp_path)
    assert live_note(None) is None and live_note(tmp_path / "nope") is None
    (run / "controller.json").write_text(json.dumps({"state": "stopping", "phase": "resizing", "world_size": 2,
                                                     "resize_from": 2, "pending_world": 1}))
    lock = RunLock(run)
    lock.acquire()
    try:
        assert live_note(run) == "resizing 2 -> 1"
        (run / "controller.json").write_text(json.dumps({"state": "running", "phase": "running"}))
        assert live_note(run) is None
    finally:
        lock.release()


def test_a_crashed_run_says_where_resume_starts(tmp_path, cli_inproc):
    """No checkpoint yet: --resume starts over from step 1 (not "continue"); with one, from it."""
    run = _folder(tmp_path)
    (run / "controller.json").write_text(json.dumps({"state": "running", "phase": "running", "world_size": 1}))
    (run / "control").mkdir()
    (run / "control" / "progress.json").write_text(json.dumps({"step": 37, "segment": 0, "time": 1.0}))
    line = _status(cli_inproc, run)
    assert line.startswith(f"state: crashed: controller gone while running (last step 37; no checkpoint yet: "
                           f"elastic-ring train --resume {run} starts over from step 1)"), line
    assert "continue" not in line
    p = cli_inproc("resize", str(run), "--to", "2")
    assert p.returncode == 2 and "starts over from step 1" in p.stderr, p.stderr
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "latest.json").write_text(json.dumps({"current": "ckpt-00000030.pt", "step": 30}))
    line = _status(cli_inproc, run)
    assert f"(last step 37; continue from the checkpoint at step 30 with: elastic-ring train --resume {run})" \
        in line, line


def test_an_open_ended_run_shows_its_step_alone(tmp_path, cli_inproc):
    """A script run without --steps: no step limit shown (not 131/4611686018427387904), in `status`,
    `runs` and their JSON; stopped, it still says how to continue."""
    from elastic_ring.protocol import NO_STEP_LIMIT

    run = _folder(tmp_path, total=NO_STEP_LIMIT)
    (run / "controller.json").write_text(json.dumps({"state": "interrupted", "phase": "stopped", "world_size": 2}))
    (run / "control").mkdir()
    (run / "control" / "progress.json").write_text(json.dumps({"step": 131, "segment": 0, "time": 1.0}))
    line = _status(cli_inproc, run)
    assert "step: 131   workers: 2" in line and str(NO_STEP_LIMIT) not in line, line
    assert line.startswith("state: stopped (no checkpoint yet: elastic-ring train --resume"), line
    rows = cli_inproc("runs", str(tmp_path)).stdout
    assert str(NO_STEP_LIMIT) not in rows and " 131 " in rows, rows
    listed = json.loads(cli_inproc("runs", str(tmp_path), "--json").stdout)
    assert listed[0]["step"] == 131 and listed[0]["total_steps"] is None
    assert json.loads(cli_inproc("status", str(run), "--json").stdout)["total_steps"] is None


def test_resize_accounts_for_a_pending_request(tmp_path, cli_inproc):
    """`resize --to 1` while a 1 -> 2 request waits: the request is withdrawn (not "the run already
    has 1 worker"); the same target twice is refused; once the controller took it, the run is
    resizing. Another target replaces a waiting request."""
    from elastic_ring.protocol import REQUEST_FILE

    run = _folder(tmp_path)
    ctl = {"state": "running", "phase": "running", "world_size": 1, "pid": 1}
    (run / "controller.json").write_text(json.dumps(ctl))
    (run / "run.json").write_text(json.dumps({**json.loads((run / "run.json").read_text()), "slots": 3}))
    req = run / "control" / REQUEST_FILE
    lock = RunLock(run)
    lock.acquire()
    try:
        assert cli_inproc("resize", str(run), "--to", "2").returncode == 0
        assert json.loads(req.read_text())["to"] == 2
        p = cli_inproc("resize", str(run), "--to", "2")
        assert p.returncode == 2 and "a resize to 2 workers is already requested" in p.stderr, p.stderr
        p = cli_inproc("resize", str(run), "--to", "3")
        assert p.returncode == 0 and "replaces the pending request for 2" in p.stdout, p.stdout
        assert json.loads(req.read_text())["to"] == 3
        p = cli_inproc("resize", str(run), "--to", "1")
        assert p.returncode == 0 and "already has" not in p.stdout + p.stderr
        assert "pending resize to 3 withdrawn" in p.stdout and not req.exists(), p.stdout
        p = cli_inproc("resize", str(run), "--to", "1")  # nothing pending now: it has 1
        assert p.returncode == 2 and "the run already has 1 worker" in p.stderr
        (run / "controller.json").write_text(json.dumps({**ctl, "live_target": 2}))  # the controller took one
        for to in ("1", "2", "3"):
            p = cli_inproc("resize", str(run), "--to", to)
            assert p.returncode == 2 and "resizing 1 -> 2" in p.stderr and "already has" not in p.stderr, p.stderr
        assert not req.exists()
    finally:
        lock.release()


def test_the_controller_shows_a_live_request_it_took_until_it_is_decided(tmp_path):
    """controller.json names the live resize the controller took (``live_target``, what `resize`
    reads) until the stop for it is decided (``pending_world``: resizing A -> B) or dropped."""
    ctl, _ = _controller(tmp_path, (), relaunch="overlap", total=30)
    read = lambda: json.loads((tmp_path / "controller.json").read_text())  # noqa: E731
    ctl._set_state(RunState.STARTING)
    ctl._set_state(RunState.RUNNING, step=5, world_size=1)
    ctl._set_state(ctl.state, live_target=2)
    assert read()["live_target"] == 2 and read()["state"] != "resizing"
    ctl._set_state(ctl.state, step=6)  # other updates keep it
    assert read()["live_target"] == 2
    ctl._set_state(RunState.RESIZING, step=7, world_size=1, pending_world=2, resize_from=1)
    d = read()
    assert "live_target" not in d and d["state"] == "resizing" and d["pending_world"] == 2


def test_resize_reads_the_status_and_the_pending_request_from_one_controller_state(tmp_path, monkeypatch):
    """A live resize taken and done between `resize`'s read of the status and its read of the
    pending request (the full suite saw it: a second ``--to 2`` accepted at 1 -> 2's end): it reads
    both again, sees 2 workers and nothing pending, and refuses."""
    from elastic_ring.controller import requests, status
    from elastic_ring.errors import UserError
    from elastic_ring.protocol import REQUEST_FILE

    run = _folder(tmp_path)
    ctl = {"state": "running", "phase": "running", "world_size": 1, "pid": 1, "live_target": 2, "time": 1.0}
    (run / "controller.json").write_text(json.dumps(ctl))
    (run / "run.json").write_text(json.dumps({**json.loads((run / "run.json").read_text()), "slots": 3}))
    real, calls = status.read_status, []

    def read_then_resize_ends(rd, *a, **kw):
        st = real(rd, *a, **kw)
        calls.append(st.world_size)
        if len(calls) == 1:  # the controller finishes the resize right after this read
            (run / "controller.json").write_text(json.dumps({**ctl, "world_size": 2, "time": 2.0,
                                                             "live_target": None}))
        return st

    monkeypatch.setattr(status, "read_status", read_then_resize_ends)
    lock = RunLock(run)
    lock.acquire()
    try:
        with pytest.raises(UserError, match="already has 2 workers"):
            requests.request_resize(run, 2)
        assert calls == [1, 2]
        assert not (run / "control" / REQUEST_FILE).exists()
    finally:
        lock.release()
