"""`elastic-ring simulate`: files written, bad input is one line on stderr and exit status 2.

In-process through the console script's entry point (``elastic_ring.cli.main.main``, the same
error path); one test runs the installed console script as a real process, end to end.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from elastic_ring.sched.api import DEFAULT_RESIZE_OVERHEAD_S
from tests.conftest import ROOT, run_inproc, tool


run_main = run_inproc


def test_simulate_small_run_writes_table_json_and_plot(tmp_path, capsys):
    out = tmp_path / "sim"
    r = run_main(capsys, "simulate", "--gpus", "16", "--contention", "low,extreme", "--seeds", "2", "--jobs", "12",
                 "--workload", "resnet50-imagenet", "--plan-workload", "resnet110-cifar10", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "precompute-oracle" in r.stdout and "held-out" in r.stdout
    d = json.loads((out / "table3.json").read_text())
    assert set(d["summary"]) == {"low", "extreme"}
    assert len(d["runs"]) == 2 * 2 * 5
    assert all(run["completed"] == 12 for run in d["runs"])
    assert d["meta"]["resize_overhead_s"] == DEFAULT_RESIZE_OVERHEAD_S  # no --resize-overhead: the measured default
    assert (out / "jct.png").stat().st_size > 1000
    assert "| eight |" in (out / "table3.md").read_text()


def test_simulate_runs_the_anchor_policies(tmp_path, capsys):
    out = tmp_path / "sim"
    r = run_main(capsys, "simulate", "--gpus", "16", "--jobs", "8", "--seeds", "1", "--strategies",
                 "eight,las,pollux,hesrpt,pollux-rc", "--out", str(out))
    assert r.returncode == 0, r.stderr
    runs = json.loads((out / "table3.json").read_text())["runs"]
    assert [x["strategy"] for x in runs] == ["eight", "las", "pollux", "hesrpt", "pollux-rc"]
    assert all(x["completed"] == 8 for x in runs)


def test_simulate_tunes_on_tune_seeds_and_reports_eval_seeds(tmp_path, capsys):
    """srtf's exponent is chosen on the tuning seeds and workload; the table holds the others only."""
    out = tmp_path / "sim"
    r = run_main(capsys, "simulate", "--gpus", "16", "--jobs", "10", "--strategies", "eight,srtf",
                 "--tune-seeds", "0-1", "--eval-seeds", "7,9", "--srtf-powers", "0,2",
                 "--eval-workload", "resnet50-imagenet", "--out", str(out))
    assert r.returncode == 0, r.stderr
    d = json.loads((out / "table3.json").read_text())
    split = d["meta"]["seed_split"]
    assert split["tune_seeds"] == [0, 1] and split["eval_seeds"] == [7, 9]
    assert split["tune_workloads"] == ["resnet110-cifar10"] and split["eval_workloads"] == ["resnet50-imagenet"]
    assert {run["seed"] for run in d["runs"]} == {7, 9}  # nothing reported on a tuning seed
    assert {t["seed"] for t in split["tuning_runs"]} == {0, 1}
    chosen = split["tuned"]["moderate"]
    best = max(chosen["candidates"].items(), key=lambda kv: kv[1])
    assert f"{chosen['power']:g}" == best[0]
    assert "tuning seeds (constants chosen on these only): [0, 1]" in (out / "table3.md").read_text()


@pytest.mark.parametrize("args, needle", [
    (["--tune-seeds", "0-4", "--eval-seeds", "4-6"], "overlap on [4]"),
    (["--tune-seeds", "a-b"], "'a-b' is not a seed"),
    (["--srtf-powers", "x"], "--srtf-powers"),
    (["--strategies", "eight,fastest"], "unknown fastest"),
    (["--contention", "medium"], "'medium' is not one of"),
    (["--gpus", "0"], "--gpus must be >= 1"),
    (["--workload", "nope.json"], "unknown workload"),
    (["--seeds", "x"], "'x' is not a valid integer"),
    (["--min-hours", "5", "--max-hours", "1"], "--min-hours 5 is above --max-hours 1"),
    (["--min-hours", "0"], "--min-hours must be > 0"),
    (["--resize-overhead", "-1"], "--resize-overhead must be >= 0 seconds"),
])
def test_simulate_bad_input_is_one_line_exit_2(tmp_path, capsys, args, needle):
    r = run_main(capsys, "simulate", "--out", str(tmp_path / "out"), *args)
    assert r.returncode == 2, (args, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "error" in lines[0] and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert not (tmp_path / "out").exists()  # nothing written


def test_console_script_bad_input_is_one_line_exit_2_end_to_end(tmp_path):
    r = subprocess.run([tool("elastic-ring"), "simulate", "--strategies", "eight,fastest", "--out", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("elastic-ring: error: --strategies: unknown fastest; choose from eight,")
    assert r.stdout == ""


def test_simulate_errors_and_help_use_the_flags_words(tmp_path, capsys):
    """Errors name the flag, not SimConfig's field; --help shows the default's value and every
    built-in workload the error would list."""
    from elastic_ring.sim.workload import builtin_workloads

    r = run_main(capsys, "simulate", "--min-hours", "5", "--max-hours", "1", "--out", str(tmp_path / "o"))
    assert "hours_at_8" not in r.stderr
    r = run_main(capsys, "simulate", "--help")
    assert r.returncode == 0
    text = " ".join(r.stdout.split())
    assert "elastic_ring." not in text and "DEFAULT_" not in text  # no Python names
    assert f"[default: {DEFAULT_RESIZE_OVERHEAD_S:g}," in text
    assert len(builtin_workloads()) >= 4
    squeezed = "".join(r.stdout.split())  # help wraps lines, at hyphens too
    for name in builtin_workloads():
        assert name in squeezed, name
    bad = run_main(capsys, "simulate", "--workload", "nope", "--out", str(tmp_path / "o"))
    assert all(name in bad.stderr for name in builtin_workloads())
