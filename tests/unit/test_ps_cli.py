"""`elastic-ring ps`: bad input is one line on stderr and exit status 2, before anything starts.

The cases run in this process through the console script's entry point (the same one-line error
path and exit status as a process of its own); the first also as a real process."""

from __future__ import annotations

import pytest

from tests.conftest import run_cli, run_inproc

BAD = [
    (["--sync", "foo"], "sync: must be one of"),
    (["--sync", "dssp", "--staleness", "3"], "lo:hi"),
    (["--sync", "dssp", "--staleness", "15:3"], "lo <= hi"),
    (["--sync", "dssp-exact", "--staleness", "a:b"], "lo:hi"),
    (["--sync", "dssp", "--staleness", "1:2:3"], "lo:hi"),
    (["--sync", "ssp", "--staleness", "3:15"], "one threshold"),
    (["--sync", "ssp", "--staleness", "-1"], ">= 0"),
    (["--sync", "bsp", "--staleness", "3"], "does not apply"),
    (["--sync", "asp", "--workers", "3", "--slowdown", "1.0,1.8"], "2 factor(s) for 3 worker(s)"),
    (["--sync", "asp", "--workers", "0"], "workers: must be >= 1, got 0"),
    (["--sync", "asp", "--slowdown", "0.5,1"], ">= 1.0"),
    (["--sync", "asp", "--slowdown", "1,x"], "slowdown[1]: wrong type, expected a number, got 'x'"),
    (["--sync", "asp", "--depth", "9"], "6n+2"),
    (["--sync", "asp", "--set", "nonsense=1"], "unknown key 'nonsense'"),
    (["--sync", "asp", "--time-budget", "0"], "no stop condition"),
    (["--workers", "two"], "not a valid integer"),
    (["--sync", "asp", "--stop-accuracy", "0.9", "--set", "eval_deferred=true"], "stop_accuracy needs"),
]


@pytest.mark.parametrize("args,needle", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_is_one_line_exit_2(args, needle, tmp_path, capsys):
    run_dir = tmp_path / "run"
    if args == BAD[0][0]:
        r = run_cli("ps", *args, "--run-dir", str(run_dir), timeout=60)
    else:
        r = run_inproc(capsys, "ps", *args, "--run-dir", str(run_dir))
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "error" in lines[0] and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr
    assert not run_dir.exists()  # nothing started


def test_experiment_bad_design(tmp_path):
    r = run_cli("ps", "experiment", "--config", str(tmp_path / "missing.yaml"), timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "cannot read" in r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("seeds: [0]\ntargets: [0.9]\nparadigms:\n  - {name: X, sync: dssp, staleness: '9:1'}\n")
    r = run_cli("ps", "experiment", "--config", str(bad), timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "lo <= hi" in r.stderr


def test_help_is_complete():
    r = run_cli("ps", "--help", timeout=60)
    assert r.returncode == 0
    for opt in ("--sync", "--staleness", "--workers", "--slowdown", "--noise", "--time-budget", "dssp-exact",
                "experiment", "--run-dir"):
        assert opt in r.stdout, opt
    r = run_cli("ps", "experiment", "--help", timeout=60)
    assert r.returncode == 0 and "--config" in r.stdout and "table1.md" in r.stdout and "--parallel" in r.stdout


def test_design_file_loads():
    from elastic_ring.experiment.ps_design import load_design

    d = load_design("configs/dssp_table1.yaml")
    names = list(d.paradigms)
    assert len(names) == 7 and len(d.hets) == 3
    syncs = {d.cell(d.hets[0], p).cfg.sync for p in d.paradigms}
    assert syncs == {"bsp", "asp", "ssp", "dssp", "dssp-exact"}


def test_an_existing_run_folder_is_refused_and_left_as_it_was(tmp_path):
    """A second job into a used folder would append to its events.jsonl and overwrite its
    ps_config.json: refused like `train --run-dir` (one line, exit 2, nothing touched)."""
    run_dir = tmp_path / "old"
    run_dir.mkdir()
    (run_dir / "events.jsonl").write_text('{"kind": "ps_finished"}\n')
    (run_dir / "ps_config.json").write_text("{}")
    r = run_cli("ps", "--sync", "asp", "--workers", "2", "--run-dir", str(run_dir), timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "already exists" in lines[0] and str(run_dir) in lines[0], r.stderr
    assert (run_dir / "events.jsonl").read_text() == '{"kind": "ps_finished"}\n'
    assert (run_dir / "ps_config.json").read_text() == "{}"
    assert sorted(p.name for p in run_dir.iterdir()) == ["events.jsonl", "ps_config.json"]
