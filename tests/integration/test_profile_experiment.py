"""`elastic-ring profile`, `experiment resize` and `report` end to end with real horovodrun (gloo, CPU).

A tiny ResNet-8/4 on 40 synthetic samples: the time is mostly horovodrun start-ups (~2.5 s each);
the whole file takes about two minutes on two cores.
"""

from __future__ import annotations

import json

import pytest

from elastic_ring.events import read_events
from elastic_ring.perfmodel import FitError, load_profile
from tests.conftest import run_cli

pytestmark = pytest.mark.integration

TINY = ["--set", "depth=8", "--set", "width=4", "--set", "batch_size=8", "--set", "dataset=synthetic",
        "--set", "synthetic_size=40", "--set", "synthetic_side=16", "--set", "throughput_window=3", "--device", "cpu"]


def test_profile_refused_then_accepted_fit_and_report(tmp_path):
    out = tmp_path / "prof"
    p = run_cli("profile", "--gpus", "1,2", "--steps", "13", *TINY, "--out", str(out), timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    prof = json.loads((out / "profile.json").read_text())
    assert [pt["workers"] for pt in prof["points"]] == [1, 2]
    for pt in prof["points"]:  # 13 steps: windows end at 4, 7, 10, 13; the first is warm-up
        assert pt["warmup_windows_dropped"] == 1 and [w["step"] for w in pt["windows"]] == [7, 10, 13]
        ws = pt["windows"]  # work over time: the windows' work over the seconds they took, no median
        secs = sum(w["seconds"] for w in ws)
        assert pt["steps_per_s"] == pytest.approx(sum(w["steps"] for w in ws) / secs)
        assert pt["images_per_s"] == pytest.approx(sum(w["images_per_s"] * w["seconds"] for w in ws) / secs)
    assert prof["fit"]["status"] == "refused" and prof["speed_model"] is None
    assert "Eq. 5 fit refused" in p.stdout and "needs measurements at >= 4" in p.stdout
    assert "efficiency vs prev" in p.stdout
    with pytest.raises(FitError):
        load_profile(out / "profile.json")

    # two more counts (non-power-of-two included); the finished 1- and 2-worker runs are reused
    p = run_cli("profile", "--gpus", "1,2,3,4", "--steps", "13", *TINY, "--out", str(out), timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stderr.count("reusing the finished run") == 2
    prof = json.loads((out / "profile.json").read_text())
    assert [pt["workers"] for pt in prof["points"]] == [1, 2, 3, 4]
    assert prof["fit"]["status"] == "ok" and len(prof["residuals"]) == 4
    model, _ = load_profile(out / "profile.json")
    assert model.predict(3) > 0
    assert "t0 =" in p.stdout and "residual" in p.stdout
    assert "(3->4)" in (out / "table1.md").read_text()

    p = run_cli("report", str(out), timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    png = out / "throughput.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Table 1" in (out / "report.md").read_text()


def test_experiment_resize_tiny_one_repeat_and_report(tmp_path):
    design = tmp_path / "design.yaml"
    design.write_text(
        "config: configs/cpu_small.yaml\n"
        "overrides: {depth: 8, width: 4, batch_size: 8, dataset: synthetic, synthetic_size: 40,\n"
        "            synthetic_side: 16, throughput_window: 2, total_steps: 10}\n"
        "w_init: 1\nw_new: 2\nresize_steps: [4]\nrepeats: 1\nslots: 2\ndevice: cpu\n"
        f"out: {tmp_path / 'exp'}\n")
    p = run_cli("experiment", "resize", "--config", str(design), timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    out = tmp_path / "exp"
    res = json.loads((out / "table2.json").read_text())
    rows = {r["key"]: r for r in res["rows"]}
    assert list(rows) == ["base-w1", "base-w2", "resize-4"]
    # epochs from samples: 10 steps x 8 x w over 40 samples; resized: 4 steps at 1, 6 at 2
    assert rows["base-w1"]["epochs"]["mean"] == pytest.approx(2.0)
    assert rows["base-w2"]["epochs"]["mean"] == pytest.approx(4.0)
    assert rows["resize-4"]["epochs"]["mean"] == pytest.approx((4 * 8 + 6 * 16) / 40)
    for r in rows.values():
        assert r["steps"]["mean"] == 10 and r["test_accuracy"]["mean"] is not None
        assert r["test_loss"]["mean"] > 0 and r["wall_s"]["mean"] > 0
    # wall time comes from the events, time saved against the w_init baseline
    run = res["runs"]["resize-4"][0]
    fin = read_events(f"{run['run_dir']}/events.jsonl", kind="finished")[-1]
    assert run["wall_s"] == fin["wall_s"]
    assert rows["resize-4"]["time_saved_s"]["mean"] == pytest.approx(
        res["runs"]["base-w1"][0]["wall_s"] - run["wall_s"])
    assert rows["resize-4"]["overhead_s"]["mean"] > 0
    assert "(reference)" in p.stdout and "1 -> 2 at step 4" in (out / "table2.md").read_text()

    p = run_cli("report", str(out), timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    for name in ("loss_vs_time.png", "accuracy_vs_time.png", "loss_fit.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG", name
    md = (out / "report.md").read_text()
    assert "Table 2" in md and "Eq. 1" in md and "loss_vs_time.png" in md
