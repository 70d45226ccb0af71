"""A run survives faults, with real horovodrun (gloo, CPU workers): kill -9 of a rank, of the
controller, a corrupt checkpoint, restarts exhausted. Exactness is checked the strongest way: the
final weights and momentum buffers equal, bit for bit, those of a run that never failed.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from elastic_ring import protocol
from elastic_ring.ckpt import CheckpointStore
from elastic_ring.events import read_events
from tests.conftest import BIN, ROOT, run_cli, shared_dir
from tests.integration.test_tensorboard import curves_show_each_step_once

pytestmark = pytest.mark.integration

TINY = ["--dataset", "synthetic", "--set", "synthetic_size=48", "--depth", "8", "--set", "width=4",
        "--batch-size", "8", "--set", "throughput_window=10", "--set", "trace_samples=true",
        "--set", "augment=true", "--slots", "2"]
# long enough that a kill at step <= 60 (of 2 workers) lands well before the end, on a quiet machine
# as on a loaded one; every kill point is after several checkpoints
STEPS = 120


def _start(args: list[str]) -> subprocess.Popen:
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "elastic_ring.cli.main", "train", *args], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_step(run: Path, step: int, timeout: float = 120, segment: int = 0) -> int:
    """Wait until rank 0 of ``segment`` has started ``step`` (its sample trace, written every step)."""
    path = run / "trace" / f"seg{segment:03d}-rank0.jsonl"
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            lines = path.read_text().splitlines()
            last = json.loads(lines[-1])["step"] if lines else 0
        except (OSError, ValueError):
            last = 0
        if last >= step:
            return last
        time.sleep(0.01)
    raise AssertionError(f"step {step} of segment {segment} not reached in {timeout} s")


def _wait_window_past_checkpoint(run: Path, timeout: float = 120) -> None:
    """Until ``events.jsonl`` holds a throughput window 4 to 15 steps past the last checkpoint (the
    next checkpoint, 30 steps on, is not written before the kill that follows; where the events
    lag behind the steps, a later checkpoint and a window past it)."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        ck = (protocol.read_json(run / "checkpoints" / "latest.json") or {}).get("step", 0)
        steps = [e["step"] for e in read_events(run / "events.jsonl", kind="throughput")]
        # (ck + 4: the first window of a launch leaves out its first step, so it ends at ck + 4)
        if ck and any(ck + 4 <= s <= ck + 15 for s in steps):
            return
        time.sleep(0.01)
    raise AssertionError(f"no throughput window past a checkpoint in {timeout} s")


def _pid_of(run: Path, segment: int, rank: int) -> int:
    rec = protocol.read_json(protocol.pid_dir(run) / f"seg{segment:03d}-rank{rank}.json")
    assert rec, f"no pid record for segment {segment} rank {rank}"
    return int(rec["pid"])


def _final(run: Path) -> dict:
    return CheckpointStore(run / "checkpoints").load_latest()


def _assert_same_weights(a: dict, b: dict) -> None:
    assert a["step"] == b["step"] and a["cursor"] == b["cursor"]
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    ma = [s["momentum_buffer"] for s in a["optimizer"]["state"].values()]
    mb = [s["momentum_buffer"] for s in b["optimizer"]["state"].values()]
    assert ma and len(ma) == len(mb) and all(torch.equal(x, y) for x, y in zip(ma, mb))


def _steps_once(run: Path) -> list[int]:
    """Steps of the run, the last attempt of each (a redone step replaces the failed attempt)."""
    last: dict[int, tuple[int, int]] = {}
    for f in sorted((run / "trace").glob("*.jsonl")):
        seg = int(f.name[3:6])
        for line in f.read_text().splitlines():
            r = json.loads(line)
            if r["rank"] == 0 and seg >= last.get(r["step"], (-1, 0))[0]:
                last[r["step"]] = (seg, r["world"])
    return sorted(last)


def _straight(folder: Path) -> None:
    p = run_cli("train", "--gpus", "2", "--steps", str(STEPS), *TINY, "--run-dir", str(folder / "run"),
                timeout=400)
    assert p.returncode == 0, p.stderr


@pytest.fixture(scope="module")
def straight_2w(tmp_path_factory) -> dict:
    """An uninterrupted 2-worker run: the reference for the kill tests (run once per session, also
    when pytest-xdist spreads these tests over several worker processes)."""
    return _final(shared_dir(tmp_path_factory, "recovery-straight-2w", _straight) / "run")


def test_kill_9_of_one_rank_restarts_by_itself_exactly(tmp_path, straight_2w):
    run = tmp_path / "killed"
    proc = _start(["--gpus", "2", "--steps", str(STEPS), *TINY, "--checkpoint-every", "5",
                   "--run-dir", str(run)])
    try:
        at = random.Random(7).randint(20, 60)
        _wait_step(run, at)
        os.kill(_pid_of(run, 0, 1), signal.SIGKILL)  # rank 1, mid-run
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    (r,) = read_events(run / "events.jsonl", kind="restart")
    assert r["rank"] == 1, r  # really the first: rank 0 only lost its peer
    assert "rank 1" in r["cause"] and not r["gave_up"]
    # steps lost: those rank 0 had started after the checkpoint it resumed from (trace of segment 0)
    started = max(json.loads(x)["step"] for x in (run / "trace" / "seg000-rank0.jsonl").read_text().splitlines())
    print(f"killed at step {at}: last started {started}, resumed from {r['from_step']}")
    assert r["from_step"] % 5 == 0 and started - r["from_step"] <= 5 + 1, (at, started, r)
    assert r["steps_redone"] <= started - r["from_step"] and r["new_world_size"] == 2
    (rec,) = read_events(run / "events.jsonl", kind="recovered")
    assert rec["step"] == r["from_step"] + 1 and rec["time_lost_s"] > 0
    assert _steps_once(run) == list(range(1, STEPS + 1))
    s = json.loads((run / "summary.json").read_text())
    assert s["steps_trained"] == STEPS  # every step once, the redone ones too
    assert "restart" in out and "from step" in out  # the table lists it
    _assert_same_weights(_final(run), straight_2w)
    curves_show_each_step_once(run)  # the steps redone are in events.jsonl twice, in TensorBoard once


def test_death_between_two_resizes_resumes_at_the_right_size_with_the_rest_of_the_schedule(tmp_path):
    # 2 workers to step 30, 1 to step 100, 2 to step 130; the kill lands in the middle segment
    sched = ["--gpus", "2", "--schedule", "30:1,100:2", "--steps", "130", *TINY, "--checkpoint-every", "5"]
    straight = tmp_path / "straight"
    run = tmp_path / "killed"
    with ThreadPoolExecutor(1) as beside:  # the uninterrupted reference runs beside the killed run
        ref = beside.submit(run_cli, "train", *sched, "--run-dir", str(straight), timeout=400)
        proc = _start([*sched, "--run-dir", str(run)])
        try:
            _wait_step(run, 50, segment=1)  # after the resize 2 -> 1, 50 steps before the resize 1 -> 2
            os.kill(_pid_of(run, 1, 0), signal.SIGKILL)
            out, err = proc.communicate(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()
        p = ref.result()
    assert p.returncode == 0, p.stderr
    assert proc.returncode == 0, err
    (r,) = read_events(run / "events.jsonl", kind="restart")
    assert r["new_world_size"] == 1 and 30 <= r["from_step"] < 100
    launches = [(e["world_size"], e["start_step"], e["stop_step"]) for e in read_events(run / "events.jsonl", kind="launch")]
    assert launches == [(2, 1, 30), (1, 31, 100), (1, r["from_step"] + 1, 100), (2, 101, 130)]
    _assert_same_weights(_final(run), _final(straight))


def test_kill_9_of_the_controller_leaves_no_orphan_and_resume_is_exact(tmp_path, straight_2w):
    run = tmp_path / "ctl"
    # checkpoints every 30 steps, a throughput window every 3: the kill lands once a window past the
    # last checkpoint is in events.jsonl, so the resumed run trains and reports it again
    proc = _start(["--gpus", "2", "--steps", str(STEPS), *TINY, "--checkpoint-every", "30",
                   "--set", "throughput_window=3", "--run-dir", str(run)])
    try:
        _wait_step(run, 30)
        _wait_window_past_checkpoint(run)
        workers = [_pid_of(run, 0, r) for r in (0, 1)]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        t0 = time.time()  # the workers notice within seconds and stop by themselves
        while any(protocol.pid_alive(p) for p in workers) and time.time() - t0 < 20:
            time.sleep(0.1)
        assert not any(protocol.pid_alive(p) for p in workers), "orphaned workers still run"
    finally:
        if proc.poll() is None:
            proc.kill()
    st = run_cli("status", str(run))
    assert st.returncode == 0 and st.stdout.startswith("state: crashed: controller gone while running (last step"), \
        st.stdout
    ck = json.loads((run / "checkpoints" / "latest.json").read_text())["step"]  # where --resume goes on
    assert f"continue from the checkpoint at step {ck} with: elastic-ring train --resume {run})" in st.stdout, \
        st.stdout
    res = run_cli("train", "--resume", str(run), "--slots", "2", timeout=400)
    assert res.returncode == 0, res.stderr
    assert read_events(run / "events.jsonl", kind="launch")[-1]["world_size"] == 2  # no --gpus needed
    _assert_same_weights(_final(run), straight_2w)
    windows = [e["step"] for e in read_events(run / "events.jsonl", kind="throughput")]
    assert len(windows) > len(set(windows)), "no window trained twice: the check below would check nothing"
    curves_show_each_step_once(run)  # in events.jsonl twice, in TensorBoard once


def test_corrupt_latest_checkpoint_resumes_from_the_previous_one(tmp_path):
    run = tmp_path / "c"
    p = run_cli("train", "--gpus", "1", "--steps", "40", *TINY, "--checkpoint-every", "5", "--keep", "3",
                "--run-dir", str(run), timeout=300)
    assert p.returncode == 0, p.stderr
    final = _final(run)
    store = CheckpointStore(run / "checkpoints")
    assert [c.name for c in store.candidates()] == ["ckpt-00000040.pt", "ckpt-00000035.pt", "ckpt-00000030.pt"]
    latest = store.candidates()[0]
    latest.write_bytes(latest.read_bytes()[:-100])  # truncated, as by a full disk
    r = run_cli("train", "--resume", str(run), "--slots", "2", timeout=300)
    assert r.returncode == 0, r.stderr
    warn = [ln for ln in r.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warn) == 1 and "ckpt-00000040.pt" in warn[0] and "ckpt-00000035.pt" in warn[0]
    assert read_events(run / "events.jsonl", kind="launch")[-1]["start_step"] == 36
    _assert_same_weights(_final(run), final)


FLAKY = """
import os, torch, horovod.torch as hvd
import elastic_ring.worker as elastic
job = elastic.init()
model = torch.nn.Linear(2, 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
job.register(model=model, optimizer=opt)
job.restore()
for step in job.steps():
    if step == 3:
        raise RuntimeError(f"flaky hardware in process {os.getpid()}")
    loss = model(torch.ones(4, 2)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    job.record(loss, samples=4)
"""


def test_restarts_exhausted_exit_1_with_one_line(tmp_path):
    script = tmp_path / "flaky.py"
    script.write_text(FLAKY)
    run = tmp_path / "x"
    p = run_cli("train", "--script", str(script), "--steps", "10", "--max-restarts", "1", "--slots", "2",
                "--run-dir", str(run), timeout=300)
    assert p.returncode == 1, p.stderr
    err = [ln for ln in p.stderr.splitlines() if ln.startswith("elastic-ring: error:")]
    assert len(err) == 1 and "Traceback" not in p.stderr
    assert "worker rank 0 failed: RuntimeError: flaky hardware" in err[0]
    assert "(1 restart(s) tried)" in err[0] and "no checkpoint was written" in err[0]
    assert len(read_events(run / "events.jsonl", kind="restart")) == 2


def test_a_stopped_rank_is_found_by_the_stall_watchdog_and_the_run_ends_exactly(tmp_path, straight_2w):
    """SIGSTOP of rank 1 (a hung worker: no crash, horovodrun goes on waiting): the watchdog kills
    the job within seconds, blames rank 1 (not rank 0, which only waits for it), restarts from the
    last checkpoint, and the weights end equal to the uninterrupted run's."""
    run = tmp_path / "stopped"
    proc = _start(["--gpus", "2", "--steps", str(STEPS), *TINY, "--checkpoint-every", "5",
                   "--stall-timeout", "3", "--run-dir", str(run)])
    victim = 0
    try:
        _wait_step(run, random.Random(11).randint(20, 60))
        victim = _pid_of(run, 0, 1)
        os.kill(victim, signal.SIGSTOP)
        t_stop = time.time()
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
        if victim and protocol.pid_alive(victim):
            os.kill(victim, signal.SIGKILL)
    assert proc.returncode == 0, err
    (st,) = read_events(run / "events.jsonl", kind="stalled")
    assert st["ranks"] == [1] and "stopped" in st["why"], st
    assert st["time"] - t_stop < 10, st  # the timeout is 3 s; Gloo alone took 42 s
    (r,) = read_events(run / "events.jsonl", kind="restart")
    assert r["rank"] == 1 and "stall" in r["cause"] and not r["gave_up"], r
    assert r["from_step"] % 5 == 0 and r["new_world_size"] == 2
    assert _steps_once(run) == list(range(1, STEPS + 1))
    _assert_same_weights(_final(run), straight_2w)


HUNG = """
import time, torch, horovod.torch as hvd
import elastic_ring.worker as elastic
job = elastic.init()
torch.manual_seed(0)
model = torch.nn.Linear(2, 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters())
job.register(model=model, optimizer=opt)
job.restore()
for step in job.steps():
    if step == 9 and job.rank == 1 and job.segment == 0:
        time.sleep(3600)  # a data loader that never returns: the process sleeps (state S), not stopped
    loss = model(torch.ones(4, 2)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    job.record(loss, samples=4)
"""


def test_a_rank_hung_while_running_is_named_by_its_heartbeat(tmp_path):
    """Rank 1 sleeps for ever inside step 9 (not stopped: no /proc evidence): after the stall
    timeout the watchdog names rank 1, whose heartbeat is older than rank 0's (which waits in its
    optimizer step), restarts from the checkpoint and the run ends by itself."""
    script = tmp_path / "hung.py"
    script.write_text(HUNG)
    run = tmp_path / "hung"
    p = run_cli("train", "--script", str(script), "--steps", "14", "--gpus", "2", "--slots", "2",
                "--checkpoint-every", "4", "--stall-timeout", "2", "--run-dir", str(run), timeout=300)
    assert p.returncode == 0, p.stderr
    (st,) = read_events(run / "events.jsonl", kind="stalled")
    assert st["ranks"] == [1] and st["why"] == "oldest heartbeat" and st["last_step"] == 8, st
    (r,) = read_events(run / "events.jsonl", kind="restart")
    assert r["rank"] == 1 and r["from_step"] == 8 and not r["gave_up"], r
    assert read_events(run / "events.jsonl", kind="finished")[0]["step"] == 14
