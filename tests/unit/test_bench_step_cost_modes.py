"""scripts/bench_step_cost.py's modes, without launching anything: each mode's environment takes
exactly one of the tool's differences away (or none), whatever the caller's environment holds,
and every mode but the plain ones runs the tool's command."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ROOT, load_module

KNOBS = ("ELASTIC_RING_STOP_LATENCY_MS", "ELASTIC_RING_HOROVOD_WAIT", "ELASTIC_RING_NO_ZYGOTE",
         "ELASTIC_RING_STEP_COST_LISTS")


@pytest.fixture(scope="module")
def bsc():
    return load_module(ROOT / "scripts" / "bench_step_cost.py")


@pytest.mark.parametrize("mode, knob, value", [
    ("tool", None, None),
    ("plain", None, None),
    ("tool_k1", "ELASTIC_RING_STOP_LATENCY_MS", "0"),
    ("tool_spin", "ELASTIC_RING_HOROVOD_WAIT", "spin"),
    ("tool_nozygote", "ELASTIC_RING_NO_ZYGOTE", "1"),
    ("timed_nozygote", "ELASTIC_RING_NO_ZYGOTE", "1"),
    ("timed_lists", "ELASTIC_RING_STEP_COST_LISTS", "1"),
])
def test_a_mode_sets_its_one_knob_and_clears_the_callers(bsc, monkeypatch, mode, knob, value):
    for k in KNOBS:  # a caller's setting of any knob must not leak into another mode's runs
        monkeypatch.setenv(k, "leaked")
    env = bsc.env_for(mode, Path("/nonexistent/times.jsonl"), profile=False)
    assert {k: env.get(k) for k in KNOBS} == {k: (value if k == knob else None) for k in KNOBS}
    assert env["OMP_NUM_THREADS"] == "1" and env["HOROVOD_CYCLE_TIME"]


@pytest.mark.parametrize("mode", ["tool", "tool_k1", "tool_spin", "tool_nozygote", "timed_nozygote", "timed_lists"])
def test_every_tool_mode_runs_the_tools_command(bsc, mode, tmp_path):
    cmd = bsc.command("steps", "horovod", mode, tmp_path / "s.py", [], 2, tmp_path / "run")
    assert cmd[1:5] == ["-m", "elastic_ring.cli.main", "train", "--script"]
    plain = bsc.command("steps", "horovod", "plain", tmp_path / "s.py", [], 2, tmp_path / "run")
    assert Path(plain[0]).name == "horovodrun"


def test_bench_tool_cpu_counts_a_thread_s_switches_and_adds_them_up_by_kind():
    """bench_tool_cpu's switch counters: this thread's, read from /proc, grow when it sleeps; a
    run's sums take the training threads' preemptions and the other threads' apart."""
    import time

    btc = load_module(ROOT / "scripts" / "bench_tool_cpu.py")
    import os
    import threading

    name, vol0, _ = btc._switches(os.getpid(), threading.get_native_id())
    for _ in range(5):
        time.sleep(0.002)
    _, vol1, _ = btc._switches(os.getpid(), threading.get_native_id())
    assert name != "?" and vol1 >= vol0 + 5
    assert btc._switches(os.getpid(), 2**31 - 1) == ("?", 0, 0)  # no such thread
    run = {"threads": {"rank_training_thread/a": {"preempted_per_s": 10.0, "wakeups_per_s": 1.0},
                       "rank_training_thread/b": {"preempted_per_s": 5.0, "wakeups_per_s": 1.0},
                       "rank_other_threads/a": {"preempted_per_s": 2.0, "wakeups_per_s": 100.0},
                       "controller/python": {"preempted_per_s": 7.0, "wakeups_per_s": 50.0}}}
    assert [btc._switch_sum(run, w) for w in btc.SWITCHES] == [15.0, 2.0, 100.0]


def test_the_ab_benchmark_takes_medians_per_side_and_refuses_a_folder_that_is_no_checkout(tmp_path):
    """bench_step_cost_ab.py: per case and side the medians over the rounds, the new side's over the
    old's; an --old that is not a checkout of this project is a one-line error, exit 2."""
    import subprocess
    import sys

    ab = load_module(ROOT / "scripts" / "bench_step_cost_ab.py")

    def side(net, steps):
        return {"c": {"median_library_us_per_step_net": net,
                      "rounds": [{"median_step_library_us": s} for s in steps]}}

    rounds = [{"old": side(100.0, [60, 64]), "new": side(80.0, [40, 44])},
              {"old": side(120.0, [70, 90]), "new": side(90.0, [50, 50])},
              {"old": side(110.0, [66, 66]), "new": side(200.0, [48, 52])}]
    s = ab.summary(rounds)["c"]
    assert s["old"]["median_library_us_per_step_net"] == 110.0 and s["new"]["median_library_us_per_step_net"] == 90.0
    assert s["old"]["median_step_library_us"] == [62.0, 80.0, 66.0] and s["new"]["median_median_step_library_us"] == 50.0
    assert s["new_over_old_median_step_library_us"] == round(50.0 / 66.0, 3)
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_step_cost_ab.py"), "--old", str(tmp_path),
                        "--out", str(tmp_path / "o.json")], capture_output=True, text=True)
    assert p.returncode == 2 and "no scripts/bench_step_cost.py there" in p.stderr and "Traceback" not in p.stderr
