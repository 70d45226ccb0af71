"""Recovery logic without Horovod: checkpoint keep/fallback/write failures, the background writer,
who failed first, the run lock and stale workers, and the summary after redone steps."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from elastic_ring import protocol
from elastic_ring.ckpt import BackgroundWriter, CheckpointStore, snapshot
from elastic_ring.ckpt.store import newest_valid
from elastic_ring.controller.lock import RunLock, is_locked, stop_stale_workers
from elastic_ring.controller.summary import summarize
from elastic_ring.errors import CheckpointError, CheckpointWriteError, UserError


def _state(step: int) -> dict:
    return {"step": step, "w": torch.full((3,), float(step))}


def test_store_keeps_the_last_k_newest_first(tmp_path):
    store = CheckpointStore(tmp_path, keep=3)
    for s in (5, 10, 15, 20):
        store.save(_state(s))
    assert [p.name for p in store.candidates()] == ["ckpt-00000020.pt", "ckpt-00000015.pt", "ckpt-00000010.pt"]
    assert sorted(p.name for p in tmp_path.glob("ckpt-*.pt")) == [
        "ckpt-00000010.pt", "ckpt-00000015.pt", "ckpt-00000020.pt"]
    assert store.load_latest()["step"] == 20


def test_corrupt_newest_falls_back_with_one_line_naming_both(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(_state(5))
    p10, _, _ = store.save(_state(10))
    raw = bytearray(p10.read_bytes())
    raw[-5] ^= 0xFF
    p10.write_bytes(bytes(raw))
    warnings: list[str] = []
    st = store.load_latest(warn=warnings.append)
    assert st["step"] == 5 and torch.equal(st["w"], torch.full((3,), 5.0))
    (w,) = warnings
    assert "\n" not in w and "ckpt-00000010.pt" in w and "ckpt-00000005.pt" in w and "SHA-256" in w
    assert newest_valid(tmp_path)[1] == 5  # the controller's torch-free view agrees


def test_all_checkpoints_corrupt_is_a_user_error(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    for s in (5, 10):
        p, _, _ = store.save(_state(s))
        p.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="no older checkpoint loads"):
        store.load_latest()
    assert newest_valid(tmp_path) is None


def test_corrupt_index_falls_back_to_the_files(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(_state(5))
    store.save(_state(10))
    (tmp_path / "latest.json").write_text("{not json")
    assert store.load_latest()["step"] == 10


@pytest.fixture
def unwritable(tmp_path):
    """(folder, make_it_unwritable): a read-only remount of a small tmpfs as root (root ignores
    file permissions; CI runs as root), a chmod 500 otherwise."""
    import subprocess

    d = tmp_path / "ckpt"
    d.mkdir()
    if os.geteuid() != 0:
        yield d, lambda: d.chmod(0o500)
        d.chmod(0o700)
        return
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(d)],
                      capture_output=True).returncode != 0:
        pytest.skip("root without the right to mount: no way to make a folder unwritable")
    try:
        yield d, lambda: subprocess.run(["mount", "-o", "remount,ro", str(d)], check=True)
    finally:
        subprocess.run(["umount", str(d)], capture_output=True)


def test_failed_write_names_the_path_removes_the_temp_and_keeps_the_previous(unwritable):
    d, make_unwritable = unwritable
    store = CheckpointStore(d)
    store.save(_state(5))
    make_unwritable()
    with pytest.raises(CheckpointWriteError, match=str(d / "ckpt-00000010.pt")):
        store.save(_state(10))
    assert not list(d.glob(".ckpt-*"))
    assert store.load_latest()["step"] == 5


def test_failed_write_on_a_full_disk(tmp_path, monkeypatch):
    """ENOSPC in the middle of the write: named path, temp file removed, previous checkpoint valid."""
    import errno

    store = CheckpointStore(tmp_path)
    store.save(_state(5))
    real_fsync = os.fsync

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(CheckpointWriteError, match=r"ckpt-00000010\.pt: No space left on device"):
        store.save(_state(10))
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert not list(tmp_path.glob(".ckpt-*"))
    assert store.load_latest()["step"] == 5 and newest_valid(tmp_path)[1] == 5


def test_a_snapshot_into_an_earlier_one_reuses_its_tensors_where_they_fit():
    """The survivors' copy each step: the oldest copy's tensors are overwritten with the new values
    (same shape, dtype and strides at the same place), anything else is a new tensor; the result
    equals a fresh snapshot and does not follow the source's later changes."""
    a, b = torch.arange(6.0).reshape(2, 3), torch.ones(4)
    state = {"model": {"w": a, "b": b}, "opt": [{"m": a * 2}], "rng": (3, tuple(range(625)), None), "n": 1}
    old = snapshot(state)
    a += 10
    b2 = torch.zeros(5)  # another shape at the same place: not reused
    state["model"]["b"] = b2
    new = snapshot(state, into=old)
    fresh = snapshot(state)
    assert new["model"]["w"] is old["model"]["w"] and new["opt"][0]["m"] is old["opt"][0]["m"]
    assert new["model"]["b"] is not old["model"]["b"] and new["model"]["b"] is not b2
    for x, y in ((new["model"]["w"], fresh["model"]["w"]), (new["model"]["b"], fresh["model"]["b"]),
                 (new["opt"][0]["m"], fresh["opt"][0]["m"])):
        assert torch.equal(x, y)
    assert new["rng"] == state["rng"] and new["n"] == 1
    a += 1
    assert torch.equal(new["model"]["w"], fresh["model"]["w"])  # a copy, not the source
    assert new["model"]["w"] is not a


def test_background_writer_writes_a_snapshot_and_reraises_errors(tmp_path):
    store = CheckpointStore(tmp_path)
    w = BackgroundWriter(store)
    t = torch.zeros(4)
    snap = snapshot({"step": 3, "t": t, "nested": [t, {"x": t}]})
    t += 1  # training goes on: the snapshot must not change
    done = []
    w.submit(snap, lambda p, n, s: done.append(p.name))
    w.wait()
    assert done == ["ckpt-00000003.pt"]
    assert torch.equal(store.load_latest()["t"], torch.zeros(4))
    w.submit({"step": 4, "bad": lambda: 0})  # not picklable: fails in the thread
    with pytest.raises(Exception):
        w.wait()
    assert store.load_latest()["step"] == 3


def test_first_failure_prefers_own_errors_then_the_silent_dead_rank():
    peer = {"rank": 0, "type": "HorovodInternalError", "message": "x", "peer_loss": True, "time": 1}
    own = {"rank": 2, "type": "ValueError", "message": "ValueError: boom", "peer_loss": False, "time": 2}
    assert protocol.first_failure([peer, own], [1]).rank == 2
    assert protocol.first_failure([peer], [1]).rank == 1
    lost = protocol.first_failure([peer], [])  # only a victim reported: no rank is blamed
    assert lost.rank is None and lost.type == "PeerLost" and "rank(s) 0 only lost a peer" in lost.message
    assert protocol.first_failure([], []) is None


def test_a_connection_reset_by_peer_is_a_peer_loss_whatever_its_type():
    """Under Horovod Elastic the survivor's error may not be a HorovodInternalError."""
    reset = {"rank": 0, "type": "RuntimeError", "time": 1,
             "message": "RuntimeError: Gloo error: Read error [127.0.0.1]:4242: Connection reset by peer"}
    assert protocol.is_peer_loss(reset["type"], reset["message"])
    assert not protocol.is_peer_loss("ValueError", "ValueError: boom")
    assert protocol.first_failure([reset], [1]).rank == 1
    assert protocol.first_failure([reset], []).rank is None
    own = {"rank": 1, "type": "ValueError", "message": "ValueError: boom", "time": 2}
    assert protocol.first_failure([reset, own], []).rank == 1  # later, but its own error


def test_launch_info_reaches_the_worker_library_whole_and_its_launch_stays_out_of_the_environment(
        tmp_path, monkeypatch):
    """The worker entry hands the library the LaunchInfo of its arguments (a ``seam.Start``) and
    ``run.json``'s ``worker`` entry; the environment its processes inherit has the run's settings."""
    from elastic_ring import seam
    from elastic_ring.worker import run, session

    info = protocol.LaunchInfo(run_dir=tmp_path, segment=3, stop_at=40, total_steps=90, owner="ab",
                               go_file=tmp_path / "go", checkpoint_every=5, checkpoint_every_s=2.5)
    protocol.write_json_atomic(tmp_path / "run.json", {"worker": {"total_steps": 90, "checkpoint_every": 5,
                                                                  "checkpoint_every_s": 2.5, "init_timeout_s": 30}})
    start = seam.Start(3, 40, "ab", tmp_path / "go")
    a, rest = run._parse(["--run-dir", str(tmp_path), *start.args(), "--", "script.py"])
    assert a.start == start and rest == ["script.py"]
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if not k.startswith("ELASTIC_RING_")})
    monkeypatch.setattr(session, "_PROCESS", session._Process())
    assert session.launch() is None  # not started by elastic-ring: init() makes a plain job
    got, init_timeout_s = run._launch_info(a)
    assert got == info and session.launch() is got and init_timeout_s == 30.0
    assert os.environ["ELASTIC_RING_RUN_DIR"] == str(tmp_path) and os.environ["ELASTIC_RING_CHECKPOINT_EVERY"] == "5"
    assert not {protocol.envvars.PREFIX + f.upper() for f in protocol.START_FIELDS} & set(os.environ)


def test_lock_is_exclusive_across_processes_and_dies_with_its_holder(tmp_path):
    code = ("import sys, time; from elastic_ring.controller.lock import RunLock; "
            f"RunLock({str(tmp_path)!r}).acquire(); print('held', flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        assert is_locked(tmp_path)
        with pytest.raises(UserError, match=f"in use by another elastic-ring controller \\(pid {p.pid}\\)"):
            RunLock(tmp_path).acquire()
        p.kill()  # kill -9: the lock goes with it
        p.wait()
        assert not is_locked(tmp_path)
        RunLock(tmp_path).acquire()
        RunLock(tmp_path).release()
    finally:
        p.kill()


def test_stop_stale_workers_kills_recorded_local_workers_only(tmp_path):
    import psutil

    victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        rec = {"rank": 0, "pid": victim.pid, "host": __import__("socket").gethostname(), "owner": "old",
               "segment": 0, "created": psutil.Process(victim.pid).create_time()}
        protocol.write_json_atomic(protocol.pid_dir(tmp_path) / "seg000-rank0.json", rec)
        # a record whose pid was reused by another process is left alone
        protocol.write_json_atomic(protocol.pid_dir(tmp_path) / "seg000-rank1.json",
                                   {**rec, "rank": 1, "pid": bystander.pid, "created": 1.0})
        assert stop_stale_workers(tmp_path) == [victim.pid]
        victim.wait(timeout=10)
        time.sleep(0.2)
        assert bystander.poll() is None
    finally:
        victim.kill()
        bystander.kill()


def test_stop_stale_workers_kills_a_survivor_known_only_by_its_re_form_record(tmp_path):
    import psutil

    survivor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    joiner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        host = __import__("socket").gethostname()
        rec = {"rank": 0, "host": host, "owner": "old", "segment": 0}
        # the joiner's start record overwrote the survivor's; the survivor wrote one after its re-form
        protocol.write_json_atomic(protocol.pid_dir(tmp_path) / "seg000-rank1.json",
                                   {**rec, "rank": 1, "pid": joiner.pid,
                                    "created": psutil.Process(joiner.pid).create_time()})
        protocol.write_json_atomic(protocol.pid_dir(tmp_path) / f"reformed-{survivor.pid}.json",
                                   {**rec, "pid": survivor.pid, "created": psutil.Process(survivor.pid).create_time()})
        protocol.write_json_atomic(protocol.pid_dir(tmp_path) / f"reformed-{joiner.pid}.json",
                                   {**rec, "rank": 1, "pid": joiner.pid,
                                    "created": psutil.Process(joiner.pid).create_time()})
        assert sorted(stop_stale_workers(tmp_path)) == sorted([survivor.pid, joiner.pid])  # each once
        survivor.wait(timeout=10)
        joiner.wait(timeout=10)
        assert not list(protocol.pid_dir(tmp_path).glob("*.json"))
    finally:
        survivor.kill()
        joiner.kill()


def test_summary_counts_each_step_once_after_a_restart():
    ev = [
        {"kind": "launch", "start_step": 1, "world_size": 2, "time": 0},
        {"kind": "throughput", "world_size": 2, "step": 10, "steps": 9, "images_per_s": 10.0, "steps_per_s": 1.0, "loss": 1.0},
        {"kind": "throughput", "world_size": 2, "step": 20, "steps": 10, "images_per_s": 10.0, "steps_per_s": 1.0, "loss": 1.0},
        {"kind": "throughput", "world_size": 2, "step": 30, "steps": 10, "images_per_s": 10.0, "steps_per_s": 1.0, "loss": 1.0},
        # died at ~33; the checkpoint was at 25: steps 26..33 are redone
        {"kind": "launch", "start_step": 26, "world_size": 2, "time": 1},
        {"kind": "throughput", "world_size": 2, "step": 40, "steps": 14, "images_per_s": 10.0, "steps_per_s": 1.0, "loss": 1.0},
    ]
    s = summarize(ev)
    assert s["steps_trained"] == 40 and s["sizes"][0]["steps"] == 40  # 1..25, then 26..40 once
    assert sum(w["steps"] for w in s["sizes"]) == 40


def test_an_event_kind_is_declared_once():
    from dataclasses import dataclass
    from typing import ClassVar

    from elastic_ring.events.api import Event, register

    with pytest.raises(ValueError, match="event kind 'restart' is declared twice"):
        @register
        @dataclass(frozen=True)
        class Another(Event):
            kind: ClassVar[str] = "restart"


def test_the_blame_rule_a_lost_node_then_an_own_error_then_a_silent_death_never_a_peer_loss():
    """One rule for every launcher (the crash records of horovodrun's workers, the members of a
    Ray ring): in the order seen, the strongest cause wins; a worker that only lost a peer never does."""
    peer = protocol.Seen(0, {"type": "HorovodInternalError", "message": "x"})
    own = protocol.Seen(1, {"type": "ValueError", "message": "ValueError: boom"})
    silent, lost = protocol.Seen(2), protocol.Seen(3, None, node_lost=True)
    assert protocol.blame([peer, silent, own, lost]) is lost
    assert protocol.blame([peer, silent, own]) is own
    assert protocol.blame([peer, silent]) is silent
    assert protocol.blame([peer]) is None and protocol.blame([]) is None
