"""`elastic-ring experiment resize --rules linear,constant-batch`: no resize, Eq. 7 and constant-batch
under the same resize, real training runs (horovodrun, gloo) of a tiny model, one seed."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.integration


def test_experiment_resize_compares_the_rules(tmp_path):
    design = tmp_path / "design.yaml"
    design.write_text(
        "config: configs/cpu_small.yaml\n"
        "overrides: {depth: 8, width: 4, batch_size: 8, dataset: synthetic, synthetic_size: 40,\n"
        "            synthetic_side: 16, throughput_window: 2, total_steps: 8, eval_every: 4}\n"
        "w_init: 1\nw_new: 2\nresize_steps: [4]\nrepeats: 1\nslots: 2\ndevice: cpu\n"
        f"out: {tmp_path / 'exp'}\n")
    p = run_cli("experiment", "resize", "--config", str(design), "--rules", "linear,constant-batch", timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    out = tmp_path / "exp"
    res = json.loads((out / "table2.json").read_text())
    rows = {r["key"]: r for r in res["rows"]}
    assert list(rows) == ["base-w1", "base-w2", "resize-4", "constant-batch-base-w1", "constant-batch-resize-4"]
    # Eq. 7: the resized run trains more samples after the resize; constant-batch: 16 per step throughout
    assert rows["resize-4"]["epochs"]["mean"] == pytest.approx((4 * 8 + 4 * 16) / 40)
    for k in ("constant-batch-base-w1", "constant-batch-resize-4"):
        assert rows[k]["epochs"]["mean"] == pytest.approx(8 * 16 / 40) and rows[k]["rule"] == "constant-batch"
        run = res["runs"][k][0]
        cfg = (tmp_path / run["run_dir"] / "config.yaml").read_text()
        assert "lr_scaling: constant-batch" in cfg and "global_batch: 16" in cfg
    assert "lr_scaling: linear" in (tmp_path / res["runs"]["resize-4"][0]["run_dir"] / "config.yaml").read_text()
    # the resize does not change a constant-batch run's training: its last loss is the unresized one's
    # (float reduction order only: tests/integration/test_constant_batch.py's 1e-5), unlike Eq. 7's
    loss = {k: res["runs"][k][0]["train_loss"] for k in rows}
    assert loss["constant-batch-resize-4"] == pytest.approx(loss["constant-batch-base-w1"], rel=1e-5)
    assert loss["resize-4"] != pytest.approx(loss["base-w1"], rel=1e-5)
    # every row: its final accuracy's spread and the time to the reference's accuracy (or not reached)
    target = res["accuracy_target"]
    assert target == pytest.approx(rows["base-w1"]["test_accuracy"]["mean"] - 0.005)
    for r in rows.values():
        assert r["test_accuracy_range"]["n"] == 1 and r["accuracy_target"] == target
        assert len(res["runs"][r["key"]][0]["accuracy_curve"]) == 2  # evaluations at steps 4 and 8
    assert rows["base-w1"]["time_to_accuracy_s"]["reached"] == 1
    assert (out / "table2_rules.png").read_bytes()[:4] == b"\x89PNG"
    assert "Rules compared" in (out / "table2.md").read_text()
    assert "time to target s" in p.stdout and "constant-batch" in p.stdout
