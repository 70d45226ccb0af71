"""The commands around a run's folder: `runs`, `logs`, a Ctrl-C during `train`'s start-up, and
`train --resume DIR --steps N` (a finished run answers at once; a new total extends it)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from elastic_ring.controller.lock import RunLock
from tests.conftest import ROOT

SCRIPT = str(ROOT / "examples" / "mlp_digits.py")


def _run(parent, name, state=None, total=60, step=None, created=1.0, workers=1):
    rd = parent / name
    (rd / "logs").mkdir(parents=True)
    (rd / "run.json").write_text(json.dumps({"workers": workers, "schedule": [], "slots": 2, "total_steps": total,
                                             "script": "/x/mlp.py", "created": created}))
    if state is not None:
        (rd / "controller.json").write_text(json.dumps({"state": state, "world_size": workers}))
    if step is not None:
        (rd / "control").mkdir()
        (rd / "control" / "progress.json").write_text(json.dumps({"step": step}))
    return rd


def test_runs_lists_each_run_with_its_state_and_last_step(tmp_path, cli_inproc):
    runs = tmp_path / "runs"
    _run(runs, "a", "succeeded", step=60, created=1.0)
    _run(runs, "b", "running", step=12, created=2.0)  # its controller is gone: crashed
    _run(runs / "ps", "c", None, created=3.0)  # never started
    (runs / "notes").mkdir()
    p = cli_inproc("runs", str(runs))
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].split()[:4] == ["run", "folder", "state", "step"]
    rows = [ln.split() for ln in lines[1:]]
    assert [(r[0], r[1], r[2]) for r in rows] == [(str(runs / "a"), "finished", "60/60"),
                                                   (str(runs / "b"), "crashed", "12/60"),
                                                   (str(runs / "ps" / "c"), "stopped", "0/60")], p.stdout
    js = json.loads(cli_inproc("runs", str(runs), "--json").stdout)
    assert [r["phase"] for r in js] == ["finished", "crashed", "stopped"]
    assert cli_inproc("runs", str(tmp_path / "none")).returncode == 2
    assert "no runs in" in cli_inproc("runs", str(runs / "notes")).stdout


def test_runs_shows_a_live_run_as_running(tmp_path, cli_inproc):
    rd = _run(tmp_path, "live", "running", step=7)
    lock = RunLock(rd)
    lock.acquire()
    try:
        p = cli_inproc("runs", str(tmp_path))
    finally:
        lock.release()
    assert p.stdout.splitlines()[1].split()[1:3] == ["running", "7/60"], p.stdout


def test_logs_prints_a_segment_and_finds_the_one_an_inplace_segment_wrote_into(tmp_path, cli_inproc):
    rd = _run(tmp_path, "r", "succeeded")
    (rd / "logs" / "segment-000-w1.log").write_text("seg0 line\n")
    (rd / "logs" / "segment-002-w1.log").write_text("seg2 line\n")
    p = cli_inproc("logs", str(rd))
    assert p.returncode == 0 and p.stdout == "seg2 line\n", (p.stdout, p.stderr)
    assert cli_inproc("logs", str(rd), "--segment", "0").stdout == "seg0 line\n"
    p = cli_inproc("logs", str(rd), "--segment", "1")  # ran in place in segment 0's processes
    assert p.stdout == "seg0 line\n" and "segment 1 has no log of its own" in p.stderr
    assert "seg2" in cli_inproc("logs", str(rd), "--follow").stdout  # the run is over: returns
    listed = cli_inproc("logs", str(rd), "--list").stdout
    assert "segment-000-w1.log" in listed and "segment-002-w1.log" in listed
    p = cli_inproc("logs", str(tmp_path / "nope"))
    assert p.returncode == 2 and "not an elastic-ring run folder" in p.stderr
    empty = _run(tmp_path, "e", None)
    p = cli_inproc("logs", str(empty))
    assert p.returncode == 2 and "no log yet" in p.stderr
    (empty / "logs" / "segment-000-w1.log").write_text("")  # workers that print nothing: not silence
    p = cli_inproc("logs", str(empty))
    assert p.returncode == 0 and p.stdout == "" and "is empty (its workers printed nothing)" in p.stderr
    assert f"elastic-ring status {empty}" in p.stderr and "events.jsonl" in p.stderr


def _finished_script_run(tmp_path, total=10):
    from elastic_ring.ckpt import CheckpointStore

    rd = tmp_path / "done"
    (rd / "checkpoints").mkdir(parents=True)
    (rd / "run.json").write_text(json.dumps({"workers": 1, "schedule": [], "slots": 2, "total_steps": total,
                                             "script": SCRIPT, "script_args": [], "worker": {}}))
    CheckpointStore(rd / "checkpoints").save({"step": total, "world_size": 1})
    return rd


def test_resume_of_a_finished_run_answers_without_torch(tmp_path):
    rd = _finished_script_run(tmp_path)
    code = ("import sys, time; t=time.time(); from elastic_ring.cli.main import main\n"
            "try:\n    main(['train', '--resume', sys.argv[1]])\n"
            "except SystemExit as e:\n    print(e.code, 'torch' in sys.modules, round(time.time()-t, 2))\n")
    p = subprocess.run([sys.executable, "-c", code, str(rd)], capture_output=True, text=True, cwd=ROOT)
    code_, torch_loaded, _ = p.stdout.split()
    assert (code_, torch_loaded) == ("2", "False"), (p.stdout, p.stderr)
    assert f"run {rd} already finished (step 10 of 10); train it further with: " \
           f"elastic-ring train --resume {rd} --steps N" in p.stderr


def test_resume_with_steps_must_go_past_the_checkpoint(tmp_path, cli_inproc):
    rd = _finished_script_run(tmp_path)
    p = cli_inproc("train", "--resume", str(rd), "--steps", "10")
    assert p.returncode == 2 and "--steps 10 is not after the run's checkpoint (step 10)" in p.stderr
    p = cli_inproc("train", "--resume", str(rd), "--steps", "20", "--depth", "20")
    assert p.returncode == 2 and "--steps N is the one that applies" in p.stderr


def test_extended_config_keeps_the_decays_where_they_were():
    from elastic_ring.config.api import load_config
    from elastic_ring.controller.resume import extended_config

    cfg = load_config(ROOT / "configs" / "cpu_small.yaml", {"total_steps": 120})
    assert cfg.decay_steps == (60, 90)
    longer = extended_config(cfg, 200)
    assert longer.total_steps == 200 and longer.decay_steps == (60, 90)
    assert extended_config(cfg, 80).decay_steps == (60,)


def test_ctrl_c_during_start_up_names_the_folder_and_how_to_go_on(tmp_path, cli_inproc, monkeypatch):
    from elastic_ring.controller import controller

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(controller.Controller, "__init__", interrupted)  # after run.json, before the launch
    rd = tmp_path / "r"
    p = cli_inproc("train", "--script", SCRIPT, "--steps", "10", "--slots", "2", "--device", "cpu",
                   "--run-dir", str(rd))
    assert p.returncode == 130
    assert p.stderr.strip().splitlines()[-1] == (
        f"elastic-ring: interrupted during start-up: run folder {rd} kept (no step was run); "
        f"start it with: elastic-ring train --resume {rd}"), p.stderr
    st = cli_inproc("status", str(rd)).stdout.splitlines()[0]
    assert st.startswith("state: stopped (aborted before its workers started; continue with:"), st


def test_ctrl_c_before_the_run_is_recorded_leaves_no_folder(tmp_path, cli_inproc, monkeypatch):
    from elastic_ring.controller import rundir

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(rundir, "create_run_dir", interrupted)
    rd = tmp_path / "r"
    p = cli_inproc("train", "--script", SCRIPT, "--steps", "10", "--slots", "2", "--device", "cpu",
                   "--run-dir", str(rd))
    assert p.returncode == 130 and "interrupted during start-up: nothing was kept" in p.stderr
    assert not rd.exists()


def test_bad_input_found_after_the_folder_is_claimed_leaves_no_folder(tmp_path, cli_inproc):
    rd = tmp_path / "r"
    p = cli_inproc("train", "--script", SCRIPT, "--steps", "10", "--slots", "2", "--device", "cpu",
                   "--gpus", "3", "--run-dir", str(rd))
    assert p.returncode == 2 and "more than the 2 slot(s)" in p.stderr
    assert not rd.exists()
    nested = tmp_path / "runs" / "a"  # folders above the run's, made for it (the default runs/DATE-TIME)
    p = cli_inproc("train", "--script", SCRIPT, "--steps", "10", "--slots", "2", "--device", "cpu",
                   "--gpus", "3", "--run-dir", str(nested))
    assert p.returncode == 2 and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("bound, words", [(None, "unbounded under this policy"), (15.0, "the policy's bound: 15")])
def test_ps_names_what_its_release_gap_is_measured_against(monkeypatch, cli_inproc, tmp_path, bound, words):
    from types import SimpleNamespace

    from elastic_ring.ps import runner

    fin = {"release_bound": bound, "reason": "time_budget", "wall_s": 1.0, "version": 3, "test_accuracy": 0.5,
           "best_accuracy": 0.5, "max_release_gap": 59, "max_staleness": 2}
    monkeypatch.setattr(runner, "run_job", lambda cfg, out: SimpleNamespace(finished=fin, summaries=[]))
    p = cli_inproc("ps", "--sync", "dssp", "--run-dir", str(tmp_path / "ps"))
    assert p.returncode == 0, p.stderr
    assert f"largest push gap at a release: 59 ({words})" in p.stdout and "bound none" not in p.stdout


def test_start_up_says_what_it_is_doing_on_a_terminal_and_leaves_nothing(tmp_path):
    import io

    from elastic_ring.controller.runs import preparing

    class Tty(io.StringIO):
        def isatty(self):
            return True

    out = Tty()
    with preparing(tmp_path / "r", resume=False, stream=out):
        assert out.getvalue() == f"elastic-ring: preparing {tmp_path / 'r'} (config, torch and the dataset cache) ..."
    assert out.getvalue().endswith("\r\033[K")  # erased: an error after it is still one line
    pipe = io.StringIO()
    with pytest.raises(KeyError), preparing(tmp_path, resume=True, stream=pipe):
        raise KeyError
    assert pipe.getvalue() == ""
