"""Table 3 as code (elastic_ring.experiment.cluster_sim): the settings parsed from their flag text,
and one small run through :func:`run_table3` without the command."""

from __future__ import annotations

import json

import pytest

from elastic_ring.errors import ConfigError
from elastic_ring.experiment.cluster_sim import (parse_levels, parse_powers, parse_seeds, parse_strategies,
                                                 run_table3)


def test_settings_from_their_flag_text():
    assert parse_seeds("0-2,9,1", "--eval-seeds") == [0, 1, 2, 9]
    assert parse_levels("low,1.5,1.5") == [("low", 0.5), ("rho=1.5", 1.5)]
    assert parse_strategies("eight,srtf-rc,eight") == ["eight", "srtf-rc"]
    assert parse_powers("1, 2.5") == [1.0, 2.5]
    for bad in (lambda: parse_seeds("3-1", "--tune-seeds"), lambda: parse_levels("calm"),
                lambda: parse_strategies("eight-rc"), lambda: parse_powers("-1")):
        with pytest.raises(ConfigError):
            bad()


def test_run_table3_tunes_on_its_seeds_and_writes_the_table(tmp_path):
    t3 = run_table3(gpus=8, contention="high", strategies="eight,srtf", seeds=2, tune_seeds="7",
                    eval_seeds="0-1", srtf_powers="1,2", n_jobs=10, out_dir=tmp_path, command="test")
    assert t3.levels == [("high", 1.2)] and t3.strategies == ["eight", "srtf"]
    assert t3.tune_seeds == [7] and t3.eval_seeds == [0, 1]
    assert t3.tuned["high"]["power"] in (1.0, 2.0)
    assert {(r["seed"], r["strategy"]) for r in t3.runs} == {(s, k) for s in (0, 1) for k in ("eight", "srtf")}
    assert all(r["completed"] == 10 for r in t3.runs)
    on_disk = json.loads((tmp_path / "table3.json").read_text())
    assert on_disk["summary"] == json.loads(json.dumps(t3.summary)) and on_disk["meta"]["command"] == "test"
    assert (tmp_path / "table3.md").read_text().startswith("# Table 3 (simulated): 8 GPUs, 10 jobs/run, 2 seeds")
    assert (tmp_path / "jct.png").stat().st_size > 0
    with pytest.raises(ConfigError, match="--tune-seeds and --eval-seeds overlap"):
        run_table3(gpus=8, seeds=2, tune_seeds="0", eval_seeds="0-1", n_jobs=10, out_dir=tmp_path)
