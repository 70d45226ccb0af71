"""Bad input to `elastic-ring train/resize/status`: one line, exit status 2, nothing lost.

These fail before any worker starts, so they run in this process through the console script's
entry point (``elastic_ring.cli.main.main``: the same one-line error path and exit status);
``test_cli_simulate.py`` runs the installed console script as a real process.
"""

from __future__ import annotations

import json
import urllib.request

import pytest
import torch
import yaml

from elastic_ring.ckpt import CheckpointStore
from elastic_ring.config.api import config_to_dict, load_config
from tests.conftest import ROOT


@pytest.fixture
def run_cli(cli_inproc):
    return cli_inproc


def _assert_one_line_error(p, *needles):
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = [line for line in p.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, p.stderr
    assert "Traceback" not in p.stderr
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.mark.parametrize("args,needles", [
    (["--resize-at", "5", "--to", "0"], ["cannot resize to 0"]),
    (["--keep", "0"], ["--keep must be >= 1"]),
    (["--max-restarts", "-1"], ["--max-restarts must be >= 0"]),
    (["--stall-timeout", "-1"], ["--stall-timeout must be >= 0"]),
    (["--checkpoint-every", "-1"], ["--checkpoint-every", "must be >= 0"]),
    (["stray"], ["unexpected argument 'stray'"]),
    (["--gpus", "3", "--slots", "2"], ["more than the 2 slot"]),
    (["--workers", "3", "--slots", "2"], ["--workers 3 is more than the 2 slot"]),
    (["--hosts", "garbage"], ["--hosts expects HOST:SLOTS", "'garbage' (no :SLOTS"]),
    (["--hosts", "localhost:1,garbage"], ["'garbage' (no :SLOTS"]),
    (["--gpus", "1", "--resize-at", "5", "--to", "3", "--slots", "2"], ["only 2 slot"]),
    (["--resize-at", "500", "--to", "2", "--steps", "100", "--slots", "2"], ["not before the last step"]),
    (["--schedule", "50:2,40:1", "--steps", "100", "--slots", "2"], ["increasing"]),
    (["--gpus", "2", "--resize-at", "10", "--to", "2", "--slots", "2"], ["already has 2"]),
    (["--resize-at", "10"], ["--resize-at and --to go together"]),
    (["--schedule", "10-2"], ["--schedule expects"]),
    (["--config", "/nonexistent/x.yaml"], ["cannot read config"]),
    (["--set", "bogus_key=1"], ["unknown key 'bogus_key'"]),
    (["--depth", "21"], ["depth: must be 6n+2"]),
    (["--bogus-flag"], ["No such option"]),
    (["--device", "cuda"], ["no NVIDIA GPU"]),
    (["--lr-scaling", "constant-batch", "--batch-size", "8", "--global-batch", "16", "--schedule", "5:3",
      "--steps", "10", "--slots", "4"], ["global batch 16 is 2 micro-batch(es) of 8", "valid worker counts: 1-2"]),
    (["--lr-scaling", "constant-batch", "--gpus", "1", "--batch-size", "8", "--resize-at", "5", "--to", "2",
      "--steps", "10", "--slots", "2"], ["global batch 8 is 1 micro-batch(es)", "valid worker counts: 1-1"]),
    (["--lr-scaling", "constant-batch", "--batch-size", "8", "--global-batch", "20"], ["not a multiple of batch_size 8"]),
    (["--global-batch", "64"], ["needs lr_scaling constant-batch"]),
    (["--script", str(ROOT / "examples" / "mlp_constant_batch.py"), "--lr-scaling", "constant-batch"],
     ["needs --global-batch N"]),
    (["--script", str(ROOT / "examples" / "mlp_constant_batch.py"), "--global-batch", "64"],
     ["goes with --lr-scaling constant-batch"]),
])
def test_train_bad_input(run_cli, tmp_path, args, needles):
    run = tmp_path / "run"
    p = run_cli("train", *args, "--run-dir", str(run))
    _assert_one_line_error(p, *needles)
    assert not run.exists()  # nothing started, nothing written


@pytest.mark.parametrize("via_env", [False, True])
def test_backend_ray_where_nothing_listens_is_one_line_at_once(run_cli, tmp_path, monkeypatch, via_env):
    """``--backend ray --ray-address HOST:PORT`` (or ``$RAY_ADDRESS``) where nothing listens: one
    line and exit 2 within seconds, before the run folder is made (not minutes of Ray's retries)."""
    import socket
    import time

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    address = f"127.0.0.1:{port}"
    if via_env:
        monkeypatch.setenv("RAY_ADDRESS", address)
    run = tmp_path / "run"
    t0 = time.time()
    p = run_cli("train", "--backend", "ray", *([] if via_env else ["--ray-address", address]),
                "--run-dir", str(run))
    _assert_one_line_error(p, f"cannot connect to Ray at {address}")
    assert time.time() - t0 < 30
    assert not run.exists()


def test_full_disk_while_the_run_folder_is_created_is_one_line(run_cli, tmp_path, monkeypatch):
    """A fake full disk under the dataset cache: the path and the OS's reason, exit 2."""
    import errno
    import os

    import elastic_ring.data as data

    def full(name, cache_dir, *a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(cache_dir / "digits-train.pt"))

    monkeypatch.setattr(data, "materialize", full)  # the controller imports it when it needs it
    monkeypatch.setenv("ELASTIC_RING_CACHE", str(tmp_path / "machine"))  # no machine copy to take
    run = tmp_path / "run"
    p = run_cli("train", "--run-dir", str(run), "--slots", "2")
    _assert_one_line_error(p, str(run / "cache" / "digits-train.pt"), "No space left on device")


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 64 KiB tmpfs (root only; skipped where mounting is not allowed)."""
    import os
    import subprocess

    mnt = tmp_path / "full"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield mnt
    from elastic_ring.controller import lock

    for key in [k for k in lock._HELD if k.startswith(str(mnt))]:  # the in-process CLI's lock
        os.close(lock._HELD.pop(key))
    subprocess.run(["umount", str(mnt)], capture_output=True)


def test_a_really_full_disk_at_run_folder_creation_is_one_line(run_cli, tiny_tmpfs):
    run = tiny_tmpfs / "run"
    p = run_cli("train", "--run-dir", str(run), "--slots", "2")
    _assert_one_line_error(p, "cannot write the run folder", str(run), "No space left on device")


def test_unreadable_yaml_config(run_cli, tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("depth: [20\n")
    p = run_cli("train", "--config", str(cfg), "--run-dir", str(tmp_path / "r"))
    _assert_one_line_error(p, "not valid YAML")


def test_missing_and_corrupt_cifar10(run_cli, tmp_path, monkeypatch):
    """A missing set is said at once (where to put the files; no download, which would hang on a
    machine without network and leave an empty data/ in the working folder); a corrupt one too."""
    import time

    def no_network(*a, **k):
        raise AssertionError("CIFAR-10 must not be downloaded")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    monkeypatch.chdir(tmp_path)
    t0 = time.time()
    p = run_cli("train", "--dataset", "cifar10", "--run-dir", str(tmp_path / "r"))  # --data-dir: data
    _assert_one_line_error(p, "CIFAR-10 not found in data", "cifar-10-python.tar.gz", "cifar-10-batches-py/",
                           "nothing is downloaded")
    assert time.time() - t0 < 60  # torchvision's first import, on a loaded machine; no network wait
    assert not (tmp_path / "data").exists() and not (tmp_path / "r").exists()
    data = tmp_path / "mine"
    data.mkdir()
    (data / "cifar-10-python.tar.gz").write_bytes(b"not an archive")
    p = run_cli("train", "--dataset", "cifar10", "--data-dir", str(data), "--run-dir", str(tmp_path / "r"))
    _assert_one_line_error(p, str(data / "cifar-10-python.tar.gz"), "corrupt")
    (data / "cifar-10-python.tar.gz").unlink()
    (data / "cifar-10-batches-py").mkdir()
    (data / "cifar-10-batches-py" / "data_batch_1").write_bytes(b"not a pickle")
    p = run_cli("train", "--dataset", "cifar10", "--data-dir", str(data), "--run-dir", str(tmp_path / "r"))
    _assert_one_line_error(p, "corrupt")


def _fake_run(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    cfg = load_config(ROOT / "configs" / "cpu_small.yaml", {"total_steps": 50})
    (run / "config.yaml").write_text(yaml.safe_dump(config_to_dict(cfg)))
    (run / "run.json").write_text(json.dumps({"workers": 1, "schedule": [], "slots": 2}))
    store = CheckpointStore(run / "checkpoints")
    store.save({"step": 10, "world_size": 1, "x": torch.zeros(3)})
    store.save({"step": 20, "world_size": 1, "x": torch.ones(3)})
    return run, store


def test_resume_with_corrupt_checkpoint_loses_nothing(run_cli, tmp_path):
    run, store = _fake_run(tmp_path)
    for path in store.candidates():  # every kept checkpoint corrupt: no fallback left
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x55
        path.write_bytes(bytes(data))
    before = sorted((p.name, p.stat().st_size) for p in (run / "checkpoints").iterdir())
    p = run_cli("train", "--resume", str(run), "--slots", "2")
    _assert_one_line_error(p, "corrupt", "SHA-256", "no older checkpoint loads")
    after = sorted((p.name, p.stat().st_size) for p in (run / "checkpoints").iterdir())
    assert before == after  # the corrupt file and the previous one are both still there


@pytest.mark.parametrize("text,needle", [("{bad", "not valid JSON (line 1, column 2)"),
                                          ("[1, 2]", "a JSON list, not an object")])
def test_resume_with_a_damaged_run_json_is_one_line(run_cli, tmp_path, text, needle):
    run, _ = _fake_run(tmp_path)
    (run / "run.json").write_text(text)
    p = run_cli("train", "--resume", str(run), "--slots", "2")
    _assert_one_line_error(p, str(run / "run.json"), "damaged", needle)
    assert (run / "run.json").read_text() == text


def test_a_resize_past_the_given_steps_names_the_steps_only(run_cli, tmp_path):
    """With --steps given, the error is the limit; it does not suggest --steps/--config (that hint
    is for the CPU default config's steps, when --device auto found no GPU)."""
    p = run_cli("train", "--resize-at", "200", "--to", "2", "--steps", "100", "--slots", "2",
                "--run-dir", str(tmp_path / "r"))
    _assert_one_line_error(p, "resize at step 200 is not before the last step (100)")
    assert "--steps/--config" not in p.stderr
    p = run_cli("train", "--resize-at", "200", "--to", "2", "--set", "total_steps=100", "--slots", "2",
                "--run-dir", str(tmp_path / "r"))
    _assert_one_line_error(p, "resize at step 200 is not before the last step (100)")
    assert "--steps/--config" not in p.stderr


def test_resize_and_status_of_a_run_that_is_not_running(run_cli, tmp_path):
    run, _ = _fake_run(tmp_path)
    p = run_cli("resize", str(run), "--to", "2")
    _assert_one_line_error(p, "not running")
    p = run_cli("resize", str(tmp_path / "nope"), "--to", "2")
    _assert_one_line_error(p, "not an elastic-ring run folder")
    p = run_cli("status", str(tmp_path / "nope"))
    _assert_one_line_error(p, "not an elastic-ring run folder")
    s = run_cli("status", str(run))
    assert s.returncode == 0 and "state:" in s.stdout


def test_help_is_complete(run_cli):
    p = run_cli("train", "--help")
    assert p.returncode == 0
    assert "--workers, --gpus N" in p.stdout  # one option, two names
    for flag in ("--gpus", "--resize-at", "--to", "--schedule", "--device", "--slots", "--hosts",
                 "--hostfile", "--resume", "--relaunch", "--config", "--set"):
        assert flag in p.stdout
    top = run_cli("--help")
    for cmd in ("train", "resize", "status"):
        assert cmd in top.stdout


def test_resize_of_a_finished_run_uses_status_words(run_cli, tmp_path):
    run, _ = _fake_run(tmp_path)
    (run / "controller.json").write_text(json.dumps({"state": "succeeded", "world_size": 1}))
    p = run_cli("resize", str(run), "--to", "2")
    _assert_one_line_error(p, "not running (state: finished)")


def test_resize_counts_one_worker_in_the_singular(run_cli, tmp_path):
    from elastic_ring.controller.lock import RunLock

    run, _ = _fake_run(tmp_path)
    (run / "controller.json").write_text(json.dumps({"state": "running", "world_size": 1}))
    lock = RunLock(run)
    lock.acquire()
    try:
        same = run_cli("resize", str(run), "--to", "1")
        grow = run_cli("resize", str(run), "--to", "2")
    finally:
        lock.release()
    _assert_one_line_error(same, "the run already has 1 worker")
    assert "1 workers" not in same.stderr
    assert grow.returncode == 0, grow.stderr
    assert grow.stdout.strip().endswith("(currently 1 worker)"), grow.stdout


def test_status_of_a_running_run_shows_the_newest_step_and_no_final_loss(run_cli, tmp_path):
    from elastic_ring.controller.lock import RunLock
    from elastic_ring.events import EventLog, Throughput

    run, _ = _fake_run(tmp_path)
    EventLog(run / "events.jsonl").write(Throughput(segment=0, world_size=1, step=20, steps=20, seconds=2.0,
                                                    images_per_s=320.0, steps_per_s=10.0, loss=1.25,
                                                    lr=0.1, epoch=0))
    (run / "controller.json").write_text(json.dumps({"state": "running", "world_size": 1}))
    (run / "control").mkdir()
    (run / "control" / "progress.json").write_text(json.dumps({"step": 37, "segment": 0, "time": 1.0}))
    lock = RunLock(run)
    lock.acquire()
    try:
        s = run_cli("status", str(run))
    finally:
        lock.release()
    assert s.returncode == 0, s.stderr
    assert "state: running   step: 37/50" in s.stdout  # not the window's step 20
    assert "train loss: 1.2500 (window ending at step 20)" in s.stdout
    assert "final train loss" not in s.stdout


def test_resume_without_a_checkpoint_says_it_starts_again(run_cli, tmp_path):
    """After a double Ctrl-C before any checkpoint: one line before anything starts."""
    import shutil

    run, _ = _fake_run(tmp_path)
    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").mkdir()
    p = run_cli("train", "--resume", str(run), "--slots", "2", "--gpus", "3")  # stops at the check
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert lines[0] == (f"elastic-ring: no checkpoint in {run / 'checkpoints'}: the run starts "
                        f"again at step 1"), p.stderr
    assert p.returncode == 2 and "cannot resume with 3 workers" in lines[1]


def test_resume_of_a_folder_a_live_controller_holds_is_refused_and_touches_nothing(run_cli, tmp_path):
    """A second controller (--resume) on a live run: the lock refuses it before it stops the
    live run's workers or reads its checkpoints."""
    import socket
    import subprocess
    import sys

    import psutil

    from elastic_ring import protocol

    run, _ = _fake_run(tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; "
                               "from elastic_ring.controller.lock import try_lock; "
                               f"fd = try_lock(__import__('pathlib').Path({str(run / '.lock')!r})); "
                               "print('locked' if fd else 'no', flush=True); time.sleep(60)"],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert holder.stdout.readline().strip() == "locked"
        protocol.write_json_atomic(protocol.pid_dir(run) / "seg000-rank0.json",
                                   {"rank": 0, "pid": worker.pid, "host": socket.gethostname(), "segment": 0,
                                    "created": psutil.Process(worker.pid).create_time()})
        p = run_cli("train", "--resume", str(run), "--slots", "2")
        _assert_one_line_error(p, f"run folder {run} is in use by another elastic-ring controller "
                                  f"(pid {holder.pid})")
        assert worker.poll() is None  # the live run's worker was left alone
        assert (protocol.pid_dir(run) / "seg000-rank0.json").exists()
    finally:
        for proc in (holder, worker):
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("vote_every,line", [(12, "a live resize lands within 13 steps (a stop vote every 12 steps)"),
                                             (1, None), (None, None)])
def test_status_of_a_running_run_says_when_a_live_resize_lands(run_cli, tmp_path, vote_every, line):
    """Rank 0's progress file carries the stop vote's period; above 1 `status` says how many steps a
    live resize may take to land (and --json gives the period)."""
    from elastic_ring.controller.lock import RunLock

    run, _ = _fake_run(tmp_path)
    (run / "controller.json").write_text(json.dumps({"state": "running", "world_size": 2}))
    (run / "control").mkdir()
    prog = {"step": 37, "segment": 0, "time": 1.0}
    if vote_every is not None:
        prog["vote_every"] = vote_every
    (run / "control" / "progress.json").write_text(json.dumps(prog))
    lock = RunLock(run)
    lock.acquire()
    try:
        s = run_cli("status", str(run))
        j = run_cli("status", str(run), "--json")
    finally:
        lock.release()
    assert s.returncode == 0 and j.returncode == 0, s.stderr + j.stderr
    assert "state: running   step: 37/50" in s.stdout
    if line:
        assert s.stdout.rstrip().endswith(line)
    else:
        assert "live resize lands" not in s.stdout
    assert json.loads(j.stdout)["vote_every"] == vote_every


@pytest.mark.parametrize("env,args,needles", [
    ("abc", [], ["ELASTIC_RING_STOP_LATENCY_MS='abc'", "milliseconds >= 0"]),
    ("-5", [], ["ELASTIC_RING_STOP_LATENCY_MS='-5'"]),
    (None, ["--set", "stop_latency_ms=-1"], ["stop_latency_ms"]),
])
def test_train_bad_stop_latency(run_cli, tmp_path, monkeypatch, env, args, needles):
    if env is not None:
        monkeypatch.setenv("ELASTIC_RING_STOP_LATENCY_MS", env)
    run = tmp_path / "run"
    p = run_cli("train", "--steps", "4", *args, "--run-dir", str(run))
    _assert_one_line_error(p, *needles)
    assert not (run / "run.json").exists()  # nothing started
