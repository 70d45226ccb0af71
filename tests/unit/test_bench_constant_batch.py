"""scripts/bench_constant_batch.py: the resize's parts compared round by round (the runs themselves
are the benchmark's, not the tests')."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_constant_batch as bcb  # noqa: E402


def test_paired_differences_are_per_round_medians_and_counts():
    cb = [{"total_lost_s": 0.70, "first_step_s": 0.080}, {"total_lost_s": 0.60, "first_step_s": 0.090},
          {"total_lost_s": 0.90, "first_step_s": 0.070}]
    lin = [{"total_lost_s": 0.65, "first_step_s": 0.075}, {"total_lost_s": 0.62, "first_step_s": 0.080},
           {"total_lost_s": 0.50, "first_step_s": 0.071}]
    d = bcb.paired_differences(cb, lin)
    assert d["total_lost_s"]["median_s"] == pytest.approx(0.05)  # of +0.05, -0.02, +0.40 (not 0.70 - 0.62)
    assert (d["total_lost_s"]["rounds_larger"], d["total_lost_s"]["rounds"]) == (2, 3)
    assert d["first_step_s"]["median_s"] == pytest.approx(0.005)
    assert d["first_step_s"]["rounds_larger"] == 2


def test_a_part_missing_from_a_round_is_compared_over_the_others():
    d = bcb.paired_differences([{"a": 1.0, "b": 2.0}, {"a": 3.0}], [{"a": 0.5, "b": 2.5}, {"a": 4.0}])
    assert d["a"] == {"median_s": pytest.approx(-0.25), "rounds_larger": 1, "rounds": 2}
    assert d["b"] == {"median_s": pytest.approx(-0.5), "rounds_larger": 0, "rounds": 1}


def test_the_first_steps_own_time_is_read_from_its_phases(tmp_path, monkeypatch):
    """``first_step_s``: the new size's first step less its start-up phases (the restore done ->
    the step done), beside the resize_overhead event's parts."""
    events = [{"kind": "first_step", "world_size": 1, "since_launch_s": 3.0, "phases": {"launcher": 2.9}},
              {"kind": "first_step", "world_size": 2, "since_launch_s": 0.70,
               "phases": {"launcher": 0.40, "build": 0.10, "hvd_init": 0.05, "restore_broadcast": 0.07}},
              {"kind": "resize_overhead", "total_lost_s": 0.6, "stop_latency_s": 0.15, "checkpoint_s": 0.01,
               "relaunch_to_first_step_s": 0.7, "steady_step_s": 0.07}]
    monkeypatch.setattr(bcb, "train", lambda run, args: json.loads(json.dumps(events)))
    out = bcb.resize_case(tmp_path, "constant-batch", 60)
    assert out["first_step_s"] == pytest.approx(0.08)
    assert out["total_lost_s"] == 0.6 and out["steady_step_s"] == 0.07
