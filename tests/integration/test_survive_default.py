"""The default of ``--survive`` (neither it nor ``--no-survive`` given), with real horovodrun
(``--relaunch inplace``, two CPU workers): the workers time their per-step state copy against the
step in the first steps, the controller decides for all, and a kill -9 of a rank after its word
costs what the word says. A tiny model whose copy is cheap: on, and the survivor goes on from memory
(0 steps redone); the same run with the measured ratio forced dear (``ELASTIC_RING_SURVIVE_COST``,
a test's knob): off, and the kill is a restart from the checkpoint that says why."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from elastic_ring import protocol
from elastic_ring.events import read_events
from tests.conftest import BIN, ROOT

pytestmark = pytest.mark.integration

STEPS, KILL = 20, 12  # rank 1 is killed at the start of step KILL, once the controller has said

SCRIPT = """
import os, signal, sys, time, torch, horovod.torch as hvd
import elastic_ring.worker as elastic
out = sys.argv[1]
job = elastic.init()
torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01 * job.size, momentum=0.9),
                               named_parameters=model.named_parameters())
data = job.sampler(64, batch_size=4, seed=0)
x, y = torch.randn(64, 8), torch.randint(0, 2, (64,))
job.register(model=model, optimizer=opt)
job.restore()
word = os.path.join(str(job.run_dir), "control", "survive.json")
killed = os.path.join(out, "killed")
for step in job.steps():
    if step == %d:  # both have measured (their copies of steps 3..9 timed): wait for the controller's word
        t0 = time.time()
        while not os.path.exists(word) and time.time() - t0 < 60:
            time.sleep(0.02)
        if job.rank == 1 and not os.path.exists(killed):  # once
            open(killed, "w").write(str(step))
            os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.35)  # a step of a real model's order: the copy of this one (0.4-1.2 ms measured alone, a median of
    # 4.4 ms once in a full suite run, 2.9 percent of a 0.15 s step) stays under 2 percent of it
    idx = data.next_batch()
    loss = torch.nn.functional.cross_entropy(model(x[idx]), y[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
    job.record(loss, samples=len(idx))
""" % KILL


def _train(tmp_path, name: str, env: dict[str, str]) -> subprocess.Popen:
    script, out = tmp_path / "script.py", tmp_path / name
    script.write_text(SCRIPT)
    out.mkdir()
    args = ["--relaunch", "inplace", "--gpus", "2", "--slots", "2", "--steps", str(STEPS), "--checkpoint-every", "5",
            "--script", str(script), "--run-dir", str(out / "r"), "--", str(out)]
    full = {k: v for k, v in os.environ.items() if k != "ELASTIC_RING_SURVIVE_COST"}
    full.update(PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", PYTHONUNBUFFERED="1", **env)
    return subprocess.Popen([sys.executable, "-m", "elastic_ring.cli.main", "train", *args], cwd=ROOT, env=full,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait(procs: dict[str, subprocess.Popen], tmp_path) -> dict[str, str]:
    try:
        errs = {k: p.communicate(timeout=240)[1] for k, p in procs.items()}
    finally:
        for k, p in procs.items():
            if p.poll() is None:
                p.kill()
            for rec in protocol.read_pid_records(tmp_path / k / "r"):  # a worker left behind by a failed test
                if protocol.pid_alive(rec["pid"]):
                    os.kill(rec["pid"], 9)
    for k, p in procs.items():
        assert p.returncode == 0, (k, errs[k][-3000:])
    return errs


def test_the_default_keeps_survivors_where_the_copy_is_cheap_and_not_where_it_is_dear(tmp_path):
    errs = _wait({"cheap": _train(tmp_path, "cheap", {}),
                  "dear": _train(tmp_path, "dear", {"ELASTIC_RING_SURVIVE_COST": "0.071"})}, tmp_path)
    for name, on in (("cheap", True), ("dear", False)):
        run = tmp_path / name / "r"
        first, word = read_events(run / "events.jsonl", kind="survive_choice")
        assert (first["on"], first["forced"]) == (None, False), first  # measuring, then the word for all
        assert word["on"] is on and word["forced"] is False and word["ratio"] is not None, word
        assert (tmp_path / name / "killed").read_text() == str(KILL)  # rank 1 was killed after the word
        (r,) = read_events(run / "events.jsonl", kind="restart")
        lines = [ln for ln in errs[name].splitlines() if ln.startswith("survive: ")]
        assert len(lines) == 1, errs[name][-3000:]  # one line says which and why
        assert protocol.read_json(run / protocol.CONTROLLER_FILE)["survive"] == lines[0]  # in `status`
        if on:
            assert word["ratio"] <= 0.02 and lines[0].startswith("survive: on (state copy ") and "<= 2.0%" in lines[0]
            # the survivor went on from the step both held in memory: nothing redone
            assert (r["path"], r["rank"], r["steps_redone"], r["gave_up"]) == ("memory", 1, 0, False), r
        else:
            assert word["ratio"] == pytest.approx(0.071)
            assert lines[0] == "survive: off (state copy 7.1% of a step > 2.0%; --survive forces it)", lines
            assert (r["path"], r["memory_refused"], r["gave_up"]) == ("disk", lines[0], False), r
