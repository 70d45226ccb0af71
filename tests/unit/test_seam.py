"""The controller's word to its workers (elastic_ring.seam): each record round-trips, the files an
older elastic-ring wrote (no version) still read the same, an unknown version is refused in one line."""

from __future__ import annotations

import json
import os
import pickle

import pytest

from elastic_ring import protocol, seam
from elastic_ring.controller.backends.api import SegmentLaunch
from elastic_ring.seam import Action, ActionKind, Go, SeamError

ENV = {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2"}


def test_a_resize_written_ahead_round_trips_with_every_field(tmp_path):
    go = Go(30, 5.5, {"RANK": "1"}, pid_segment=2)
    act = Action.resize(SegmentLaunch(2, 2, 30, "me"), 5.0, members={"w1": ENV, "w2": ENV}, at_step=10,
                        go_files={str(tmp_path / "go-w2.json"): go}, hosts_written=4.5, rollback_to=9)
    assert (act.kind, act.world, act.segment, act.stop_at) == (ActionKind.RESIZE, 2, 2, 30)
    assert Action.from_json(json.loads(json.dumps(act.to_json()))) == act
    protocol.control_dir(tmp_path).mkdir()
    seam.write_action(tmp_path, 1, act)
    back = seam.read_action(tmp_path, 1)
    assert back == act and back.ahead and back.is_resize and not back.is_exit
    assert back.member_env("w2") == ENV and back.member_env("w9") is None
    assert pickle.loads(pickle.dumps(back)) == back  # rank 0 broadcasts it as a Python object
    exit_ = Action.exit(7.0)
    assert Action.from_json(exit_.to_json()) == exit_ and exit_.is_exit and not exit_.ahead


def test_the_file_keeps_the_keys_an_older_worker_reads(tmp_path):
    """A new controller's file is the old format plus ``version``: ``to``, not ``world``; keys of
    fields not given are absent (an old survivor tells an action written ahead by ``at_step``)."""
    seam.write_resize_action(tmp_path, 0, SegmentLaunch(3, 1, 40, "me"), 2.0, rollback_to=6)
    d = json.loads(seam.action_file(tmp_path, 0).read_text())
    assert d == {"action": "resize", "to": 3, "segment": 1, "stop_at": 40, "time": 2.0, "rollback_to": 6,
                 "version": seam.VERSION}
    seam.write_exit_action(tmp_path, 0, 3.0)
    assert json.loads(seam.action_file(tmp_path, 0).read_text()) == {"action": "exit", "time": 3.0,
                                                                     "version": seam.VERSION}


def test_files_written_before_the_version_read_as_before(tmp_path):
    """The dicts the earlier writer (worker/inplace.py) put in ``control/inplace-<seg>.json``."""
    old_ahead = {"action": "resize", "to": 2, "segment": 4, "stop_at": 20, "time": 1.5, "members": {"w1": ENV},
                 "at_step": 10, "go_files": {"/r/control/spare-w3.json": {"stop_at": 20, "time": 1.5,
                                                                          "env": ENV, "pid_segment": 4}}}
    act = Action.from_json(old_ahead)
    assert (act.world, act.segment, act.stop_at, act.at_step, act.rollback_to) == (2, 4, 20, 10, None)
    assert act.go_files["/r/control/spare-w3.json"] == Go(20, 1.5, ENV, 4)
    again = act.to_json()  # the same keys, each record with its version
    assert act.version == 1 and again.pop("version") == 1 and again.pop("go_files") == {
        p: {**g, "version": 1} for p, g in old_ahead.pop("go_files").items()} and again == old_ahead
    hvd = Action.from_json({"action": "resize", "to": 1, "segment": 2, "stop_at": 9, "time": 0.0,
                            "hosts_written": 100.0, "rollback_to": 7})
    assert hvd.hosts_written == 100.0 and hvd.rollback_to == 7 and not hvd.ahead and hvd.members is None
    assert Action.from_json({"action": "exit", "time": 2.0}) == Action.exit(2.0)
    # a go record without a version: the controller's release of pre-launched workers, hvdrun's spare
    assert Go.from_json({"stop_at": 7, "time": 1.0}) == Go(7, 1.0)
    path = tmp_path / "go-3"
    path.write_text('{"stop_at": 7}')
    assert seam.read_go(path) == Go(7) and seam.read_go(tmp_path / "none") is None


@pytest.mark.parametrize("record, read", [
    ({"action": "resize", "to": 2, "segment": 1, "stop_at": 9, "version": 2}, Action.from_json),
    ({"action": "exit", "version": "1"}, Action.from_json),
    ({"stop_at": 9, "version": 99}, Go.from_json),
])
def test_an_unknown_version_is_refused_in_one_line(record, read):
    with pytest.raises(SeamError) as e:
        read(record)
    msg = str(e.value)
    assert "\n" not in msg and f"version {record['version']!r}" in msg and f"reads version {seam.VERSION}" in msg


def test_a_launch_is_one_record_from_the_controllers_arguments_to_the_worker_entry(tmp_path, capsys):
    """The stop step of a segment's first launch, its segment, owner and go file: one ``seam.Start``,
    written by the controller's backends (``worker_args``) and read back by the worker entry; a warm
    spare's is segment -1 with its go file; an unknown version of it is refused in one line."""
    from types import SimpleNamespace

    from elastic_ring.controller.backends.horovodrun import worker_args
    from elastic_ring.worker import run

    spec = SimpleNamespace(run_dir=tmp_path)
    for go in (None, tmp_path / "control" / "go-2"):
        cmd = worker_args(spec, 2, 40, "me", go)
        own = cmd[cmd.index("elastic_ring.worker.run") + 1:]
        assert own.count("--stop-at") == 1 and own.count("--go-file") == (go is not None)
        a, rest = run._parse([*own, "--", "script.py", "--x"])
        assert a.run_dir == tmp_path and rest == ["script.py", "--x"]
        assert (a.start.segment, a.start.stop_at, a.start.owner, a.start.go_file) == (2, 40, "me", go)
        assert a.start.controller_pid == os.getpid() and a.start.version == seam.VERSION
        assert run._parse(["--run-dir", "r", *a.start.args(), "--", "s"])[0].start == a.start
    spare = seam.Start(-1, 40, "me", tmp_path / "spare-w3.json", 7, "h")
    assert run._parse(["--run-dir", "r", *spare.args(), "--", "s"])[0].start == spare
    newer = seam.Start(2, 40, version=2)
    with pytest.raises(SystemExit) as e:
        run._parse(["--run-dir", "r", *newer.args(), "--", "s"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert e.value.code == 2 and "version 2" in err and f"reads version {seam.VERSION}" in err, err


def test_a_worker_reading_an_unknown_version_or_kind_raises_not_guesses(tmp_path):
    protocol.control_dir(tmp_path).mkdir()
    protocol.write_json_atomic(seam.action_file(tmp_path, 0), {"action": "exit", "version": 2})
    with pytest.raises(SeamError, match="version 2"):
        seam.read_action(tmp_path, 0)
    protocol.write_json_atomic(seam.action_file(tmp_path, 0), {"action": "pause"})
    with pytest.raises(SeamError, match="unknown kind 'pause'"):
        seam.read_action(tmp_path, 0)
    assert seam.read_action(tmp_path, 1) is None  # no word yet


def test_an_action_written_ahead_is_taken_or_withdrawn_once(tmp_path):
    seam.write_resize_action(tmp_path, 2, SegmentLaunch(2, 3, 30, "me"), 1.0, at_step=20)
    assert seam.take_ahead_action(tmp_path, 2) and not seam.withdraw_action_ahead(tmp_path, 2)
    assert seam.taken_action_file(tmp_path, 2).exists() and seam.read_action(tmp_path, 2) is None
    seam.write_resize_action(tmp_path, 5, SegmentLaunch(2, 6, 30, "me"), 1.0, at_step=20)
    assert seam.withdraw_action_ahead(tmp_path, 5) and not seam.take_ahead_action(tmp_path, 5)
    assert seam.withdrawn_action_file(tmp_path, 5).exists()


def test_survivors_agree_on_the_newest_step_they_all_hold_with_equal_copies():
    recs = [{"held": [6, 7], "digests": {"6": "a", "7": "b"}}, {"held": [7, 8], "digests": {"7": "b"}}]
    assert seam.agreement(recs) == (7, None) and seam.agreed_step(recs) == 7
    assert seam.agreement([{"held": [6, 7], "digests": {"7": "b"}}, {"held": [7], "digests": {"7": "c"}}])[0] is None
    assert seam.agreement(recs, silent=1)[1].startswith("1 worker(s) neither said")
    assert seam.survivor_file("/r", "w2").name == "survivor-w2.json"
