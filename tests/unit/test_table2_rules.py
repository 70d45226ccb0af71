"""Table 2 with the batch rules compared (``experiment resize --rules``): the rows per rule, each
row's config, the time to the common target accuracy, the rules' table; with fakes (event dicts)."""

from __future__ import annotations

import pytest

from elastic_ring.config.api import load_config
from elastic_ring.errors import ConfigError
from elastic_ring.experiment.resize import (ResizeDesign, load_design, render_rules, rule_config, run_metrics,
                                            table2_rows, time_to_accuracy)
from tests.conftest import ROOT


def _events(segments, wall, curve, t0=1000.0):
    """segments: [(world, start_step, end_step)]; curve: [(seconds after the launch, step, accuracy)]."""
    ev = []
    for i, (w, a, b) in enumerate(segments):
        ev.append({"kind": "launch", "time": t0 + (0 if i == 0 else 5.0 * i), "segment": i, "world_size": w,
                   "start_step": a, "stop_step": b})
        ev.append({"kind": "segment_end", "segment": i, "world_size": w, "step": b})
    for t, step, acc in curve:
        ev.append({"kind": "evaluation", "time": t0 + t, "step": step, "test_accuracy": acc, "test_loss": 1.0,
                   "samples": 10})
    ev.append({"kind": "finished", "wall_s": wall, "step": segments[-1][2], "train_loss": None,
               "test_accuracy": None, "test_loss": None})
    return ev


def test_rows_per_rule_keep_eq7_keys_and_add_constant_batch_ones():
    plain = ResizeDesign(config="x.yaml", w_init=1, w_new=2, resize_steps=(60, 120))
    both = ResizeDesign(config="x.yaml", w_init=1, w_new=2, resize_steps=(60, 120), rules=("linear", "constant-batch"))
    assert [r["key"] for r in plain.rows()] == ["base-w1", "base-w2", "resize-60", "resize-120"]
    rows = both.rows()
    assert [r["key"] for r in rows] == ["base-w1", "base-w2", "resize-60", "resize-120", "constant-batch-base-w1",
                                        "constant-batch-resize-60", "constant-batch-resize-120"]
    assert [r["rule"] for r in rows] == ["linear"] * 4 + ["constant-batch"] * 3
    assert rows[2]["label"] == "1 -> 2 at step 60, Eq. 7" and rows[5]["schedule"] == [(60, 2)]


def test_rules_from_the_command_line_and_bad_ones(tmp_path):
    p = tmp_path / "d.yaml"
    p.write_text("config: a.yaml\nw_init: 1\nw_new: 2\nresize_steps: [5]\n")
    assert load_design(p, ["rules=linear,constant-batch"]).rules == ("linear", "constant-batch")
    assert load_design(p, {"rules": "constant-batch"}).rules == ("constant-batch",)
    with pytest.raises(ConfigError, match="rules"):
        load_design(p, ["rules=linear,eq7"])
    with pytest.raises(ConfigError, match="distinct"):
        load_design(p, ["rules=linear,linear"])


def test_rule_config_sets_the_rule_and_the_global_batch():
    cfg = load_config(ROOT / "configs" / "cpu_small.yaml")
    d = ResizeDesign(config="x.yaml", w_init=1, w_new=4, resize_steps=(5,), rules=("linear", "constant-batch"))
    cb = rule_config(cfg, "constant-batch", d)
    assert (cb.lr_scaling, cb.global_batch) == ("constant-batch", 4 * cfg.batch_size)
    lin = rule_config(cb, "linear", d)
    assert (lin.lr_scaling, lin.global_batch) == ("linear", 0)
    assert rule_config(cfg, None, d) is cfg
    assert rule_config(cfg.replace(lr_scaling="constant-batch", global_batch=8 * cfg.batch_size),
                       "constant-batch", d).global_batch == 8 * cfg.batch_size


def test_time_to_accuracy_is_the_first_evaluation_at_the_target():
    m = run_metrics(_events([(1, 1, 20)], 30.0, [(10.0, 10, 0.5), (20.0, 15, 0.8), (28.0, 20, 0.79)]), 8, 40)
    assert m["accuracy_curve"] == [[10.0, 10, 0.5], [20.0, 15, 0.8], [28.0, 20, 0.79]]
    assert time_to_accuracy(m, 0.8) == 20.0
    assert time_to_accuracy(m, 0.5) == 10.0
    assert time_to_accuracy(m, 0.9) is None


def test_rows_time_every_run_to_the_reference_accuracy_with_the_spread():
    d = ResizeDesign(config="x.yaml", w_init=1, w_new=2, resize_steps=(10,), rules=("linear", "constant-batch"))
    def mk(curve, segs=((1, 1, 20),)):
        return run_metrics(_events(list(segs), curve[-1][0] + 1, curve), 8, 40)

    resized = ((1, 1, 10), (2, 11, 20))
    runs = {
        "base-w1": [mk([(10.0, 10, 0.6), (20.0, 20, 0.905)]), mk([(12.0, 10, 0.6), (24.0, 20, 0.895)])],
        "base-w2": [mk([(8.0, 10, 0.7), (16.0, 20, 0.92)]), mk([(9.0, 10, 0.7), (18.0, 20, 0.91)])],
        "resize-10": [mk([(10.0, 10, 0.6), (19.0, 20, 0.80)], resized),
                      mk([(11.0, 10, 0.6), (21.0, 20, 0.90)], resized)],
        "constant-batch-base-w1": [mk([(15.0, 10, 0.9), (30.0, 20, 0.93)]), mk([(16.0, 10, 0.88), (31.0, 20, 0.93)])],
        "constant-batch-resize-10": [mk([(15.0, 10, 0.9), (22.0, 20, 0.93)], resized), None],
    }
    t = {r["key"]: r for r in table2_rows(d.rows(), runs, "base-w1", accuracy_margin=0.005)}
    target = (0.905 + 0.895) / 2 - 0.005
    assert all(r["accuracy_target"] == pytest.approx(target) for r in t.values())
    assert t["base-w1"]["time_to_accuracy_s"]["mean"] == pytest.approx(22.0)  # 20 and 24
    assert t["base-w1"]["time_to_accuracy_s"]["min"] == 20.0 and t["base-w1"]["time_to_accuracy_s"]["max"] == 24.0
    assert t["resize-10"]["time_to_accuracy_s"]["reached"] == 1  # 0.80 never gets there
    # target 0.895: the first run at 15 s (0.9), the second only at 31 s (0.88 at 16 s is below it)
    assert t["constant-batch-base-w1"]["time_to_accuracy_s"]["mean"] == pytest.approx(23.0)
    assert t["constant-batch-base-w1"]["test_accuracy_range"] == {"min": 0.93, "max": 0.93, "n": 2}
    assert t["constant-batch-resize-10"]["repeats"] == 1 and t["constant-batch-resize-10"]["rule"] == "constant-batch"
    txt = render_rules(list(t.values()))
    assert "constant-batch" in txt and "90.00 ± 0.71% [89.50-90.50]" in txt and "1/2" in txt
    md = render_rules(list(t.values()), markdown=True)
    assert md.splitlines()[0].startswith("|") and "Eq. 7" in md
    # without rules compared: the rows are as before (no rules' fields)
    plain = table2_rows(d.rows(), runs, "base-w1")
    assert "time_to_accuracy_s" not in plain[0]
