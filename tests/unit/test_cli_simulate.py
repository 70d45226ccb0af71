"""`elastic-ring simulate` as a real subprocess: files written, bad input is one line, exit 2."""

from __future__ import annotations

import json

from tests.conftest import run_cli


def test_simulate_small_run_writes_table_json_and_plot(tmp_path):
    out = tmp_path / "sim"
    r = run_cli("simulate", "--gpus", "16", "--contention", "low,extreme", "--seeds", "2", "--jobs", "12",
                "--workload", "resnet50-imagenet", "--plan-workload", "resnet110-cifar10", "--out", str(out),
                timeout=120)
    assert r.returncode == 0, r.stderr
    assert "precompute-oracle" in r.stdout and "held-out" in r.stdout
    d = json.loads((out / "table3.json").read_text())
    assert set(d["summary"]) == {"low", "extreme"}
    assert len(d["runs"]) == 2 * 2 * 5
    assert all(run["completed"] == 12 for run in d["runs"])
    assert (out / "jct.png").stat().st_size > 1000
    assert "| eight |" in (out / "table3.md").read_text()


def test_simulate_bad_input_is_one_line_exit_2(tmp_path):
    for args in (["--strategies", "eight,fastest"], ["--contention", "medium"], ["--gpus", "0"],
                 ["--workload", str(tmp_path / "nope.json")], ["--seeds", "x"]):
        r = run_cli("simulate", "--out", str(tmp_path), *args, timeout=60)
        assert r.returncode == 2, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "error" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
