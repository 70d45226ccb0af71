"""Pure logic of Table 1 (profile) and Table 2 (resize experiment): no processes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from elastic_ring.errors import ConfigError, UserError
from elastic_ring.experiment.resize import (ResizeDesign, load_design, mean_sd, render_table2,
                                         run_metrics, table2_rows)
from elastic_ring.perfmodel import SpeedModel, load_profile
from elastic_ring.profile.api import (build_profile, measure_point, parse_worker_counts,
                                      render_fit, render_table1, steady_windows, table1_rows)
from tests.conftest import ROOT


def thr(step, sps, w=1, seg=0, steps=10, b=32):
    return {"kind": "throughput", "segment": seg, "world_size": w, "step": step, "steps": steps,
            "seconds": steps / sps, "steps_per_s": sps, "images_per_s": sps * b * w, "loss": 1.0}


# ---------------------------------------------------------------------------- warm-up exclusion
def test_steady_windows_drop_warmup_per_segment_and_short_tail():
    ev = [thr(11, 1.0), thr(21, 5.0), thr(31, 5.0), thr(35, 9.0, steps=4),   # segment 0
          thr(45, 1.0, seg=1), thr(55, 6.0, seg=1)]                            # segment 1
    kept, dropped = steady_windows(ev, warmup_windows=1, window=10)
    assert dropped == 2
    assert [e["step"] for e in kept] == [21, 31, 55]  # warm-up and the 4-step tail gone
    kept, dropped = steady_windows(ev, warmup_windows=0, window=None)
    assert len(kept) == 6 and dropped == 0


def test_measure_point_is_work_over_time_with_the_spread_beside_it_and_excludes_warmup():
    ev = [thr(11, 0.5, w=2)] + [thr(11 + 10 * i, s, w=2) for i, s in enumerate([2.0, 4.0, 3.0, 5.0], 1)]
    p = measure_point(2, ev, warmup_windows=1, window=10)
    # 40 steps in 10/2 + 10/4 + 10/3 + 10/5 s (the 0.5 steps/s warm-up window dropped)
    rate = 40 / (10 / 2 + 10 / 4 + 10 / 3 + 10 / 5)
    assert p.steps_per_s == pytest.approx(rate) and rate < 3.5  # below the windows' median, 3.5
    assert p.images_per_s == pytest.approx(rate * 32 * 2)
    assert p.steps_per_s_median == pytest.approx(3.5) and p.rate == "work_over_time"
    assert p.steps_per_s_spread == pytest.approx(np.quantile([2, 3, 4, 5], .75) - np.quantile([2, 3, 4, 5], .25))
    assert (p.steps_per_s_min, p.steps_per_s_max) == (2.0, 5.0)
    assert len(p.windows) == 4 and p.warmup_windows_dropped == 1


def test_measure_point_two_jobs_side_by_side_case_of_issue_22():
    # the issue's case: short fast windows and long slow ones; 1,500 steps in 31 s is ~48 steps/s,
    # while the median of the windows' rates says 170
    ev = [thr(10, 100.0, steps=10)]  # warm-up
    step = 10
    for sps, steps in [(170.0, 100), (180.0, 100), (175.0, 100), (10.0, 150), (165.0, 100), (12.0, 150)] * 2:
        step += steps
        ev.append(thr(step, sps, steps=steps))
    p = measure_point(1, ev, warmup_windows=1)
    steps = sum(e["steps"] for e in ev[1:])
    secs = sum(e["seconds"] for e in ev[1:])
    assert p.steps_per_s == pytest.approx(steps / secs)
    assert p.steps_per_s < 0.5 * p.steps_per_s_median
    assert p.steps_per_s_min <= p.steps_per_s <= p.steps_per_s_max


def test_profile_from_windows_without_seconds_uses_steps_over_rate():
    ev = [thr(11, 1.0), {"kind": "throughput", "world_size": 1, "step": 21, "steps": 10, "steps_per_s": 4.0,
                         "images_per_s": 128.0}, thr(31, 2.0)]
    p = measure_point(1, ev, warmup_windows=1)
    assert p.steps_per_s == pytest.approx(20 / (10 / 4 + 10 / 2))
    assert p.windows[0]["seconds"] == pytest.approx(2.5)


def test_measure_point_too_short_is_a_user_error():
    with pytest.raises(UserError, match="--steps"):
        measure_point(1, [thr(11, 1.0)], warmup_windows=1)


def test_parse_worker_counts():
    assert parse_worker_counts("4, 1,3,2") == [1, 2, 3, 4]
    for bad in ("", "1,x", "0,1", "1,1"):
        with pytest.raises(UserError):
            parse_worker_counts(bad)


# ---------------------------------------------------------------------------- Table 1 math
def _pt(w, ips, b=32):
    return {"workers": w, "images_per_s": ips, "steps_per_s": ips / (b * w), "steps_per_s_spread": 0.0,
            "windows": [{}] * 5}


def test_table1_speedup_and_both_efficiencies_non_power_of_two():
    rows = table1_rows([_pt(3, 240.0), _pt(1, 100.0), _pt(2, 180.0), _pt(4, 300.0)])
    assert [r["workers"] for r in rows] == [1, 2, 3, 4]
    assert [r["speedup"] for r in rows] == pytest.approx([1.0, 1.8, 2.4, 3.0])
    assert [r["efficiency_vs_ref"] for r in rows] == pytest.approx([1.0, 0.9, 0.8, 0.75])
    assert rows[0]["efficiency_vs_prev"] is None
    # 2 -> 3: 240 / (180 * 3/2) ; 3 -> 4: 300 / (240 * 4/3)
    assert rows[2]["efficiency_vs_prev"] == pytest.approx(240 / 270)
    assert rows[3]["efficiency_vs_prev"] == pytest.approx(300 / 320)
    txt = render_table1(rows)
    assert "88.9% (2->3)" in txt and "93.8% (3->4)" in txt and "3.00x" in txt
    md = render_table1(rows, markdown=True)
    assert md.splitlines()[1].startswith("|---:")


def test_table1_reference_is_smallest_count_when_no_single_worker():
    rows = table1_rows([_pt(4, 400.0), _pt(8, 756.0)])  # the paper's 94.5% from 4 to 8
    assert rows[1]["speedup"] == pytest.approx(1.89)
    assert rows[1]["efficiency_vs_ref"] == pytest.approx(0.945)
    assert rows[1]["efficiency_vs_prev"] == pytest.approx(0.945)
    assert "speedup vs 4" in render_table1(rows)


# ---------------------------------------------------------------------------- profile.json + Eq. 5
def _points_from(model: SpeedModel, ws):
    from elastic_ring.profile.api import ProfilePoint

    out = []
    for w in ws:
        f = float(model.predict(w))
        out.append(ProfilePoint(w, f, f * model.m * w, 0.0, f, f, [], 1))
    return out


def test_profile_fit_refused_below_four_counts_but_profile_written(tmp_path):
    true = SpeedModel(0.01, 0.02, 1e-8, 0.05, 32, 1e5)
    prof = build_profile(_points_from(true, [1, 2]), 32, 100_000, {"source": "test"})
    assert prof["fit"]["status"] == "refused"
    assert "needs measurements at >= 4 distinct worker counts" in prof["fit"]["message"]
    assert prof["speed_model"] is None and prof["residuals"] is None
    assert len(prof["points"]) == 2 and len(prof["table1"]) == 2
    assert render_fit(prof).startswith("Eq. 5 fit refused")
    json.dumps(prof)  # serialisable as is


def test_profile_fit_accepted_recovers_predictions_and_round_trips(tmp_path):
    true = SpeedModel(0.01, 0.02, 1e-7, 0.05, 32, 1e5)
    ws = [1, 2, 3, 4, 6]
    prof = build_profile(_points_from(true, ws), 32, 100_000, {"source": "test"})
    assert prof["fit"]["status"] == "ok"
    assert np.max(np.abs(prof["residuals"])) < 1e-6
    assert len(prof["residuals"]) == len(ws)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(prof))
    m, d = load_profile(path)  # the simulator's reader
    assert m.predict(5) == pytest.approx(true.predict(5), rel=1e-6)
    assert "residual" in render_fit(prof)


# ---------------------------------------------------------------------------- Table 2
def _run_events(segments, wall, acc=0.9, loss=0.3, overheads=()):
    """segments: [(world, start_step, end_step)] -> a run's events."""
    ev = []
    for i, (w, a, b) in enumerate(segments):
        ev.append({"kind": "launch", "segment": i, "world_size": w, "start_step": a, "stop_step": b})
        ev.append(thr(b, 2.0, w=w, seg=i) | {"loss": loss + 0.1})
        ev.append({"kind": "segment_end", "segment": i, "world_size": w, "step": b})
    for o in overheads:
        ev.append({"kind": "resize_overhead", "from_workers": 1, "to_workers": 2, "step": 60,
                   "stop_latency_s": 0.5, "checkpoint_s": 0.05, "relaunch_to_first_step_s": o - 0.5,
                   "total_lost_s": o})
    ev.append({"kind": "evaluation", "step": segments[-1][2], "test_accuracy": acc, "test_loss": loss})
    ev.append({"kind": "finished", "wall_s": wall})
    return ev


def test_run_metrics_epochs_from_samples_consumed():
    # 60 steps at 1 worker, 140 at 2, batch 32, 1437 training samples
    m = run_metrics(_run_events([(1, 1, 60), (2, 61, 200)], 100.0, overheads=[8.0]), 32, 1437)
    assert m["steps"] == 200
    assert m["samples"] == 60 * 32 + 140 * 64
    assert m["epochs"] == pytest.approx((60 * 32 + 140 * 64) / 1437)
    assert m["wall_s"] == 100.0 and m["overhead_s"] == 8.0
    assert m["test_accuracy"] == 0.9 and m["train_loss"] == pytest.approx(0.4)


def test_table2_rows_time_saved_paired_by_repeat_with_mean_and_sd():
    d = ResizeDesign(config="x.yaml", w_init=1, w_new=2, resize_steps=(60, 120), repeats=2)
    rows = d.rows()
    assert [r["key"] for r in rows] == ["base-w1", "base-w2", "resize-60", "resize-120"]
    mk = lambda wall, segs, ov=(): run_metrics(_run_events(segs, wall, overheads=ov), 32, 1437)  # noqa: E731
    runs = {
        "base-w1": [mk(100.0, [(1, 1, 200)]), mk(110.0, [(1, 1, 200)])],
        "base-w2": [mk(80.0, [(2, 1, 200)]), mk(84.0, [(2, 1, 200)])],
        "resize-60": [mk(90.0, [(1, 1, 60), (2, 61, 200)], [8.0]),
                      mk(96.0, [(1, 1, 60), (2, 61, 200)], [10.0])],
        "resize-120": [mk(95.0, [(1, 1, 120), (2, 121, 200)], [9.0]), None],
    }
    t = {r["key"]: r for r in table2_rows(rows, runs, "base-w1")}
    assert t["base-w1"]["reference"] and t["base-w1"]["time_saved_s"]["mean"] == 0.0
    assert t["base-w2"]["time_saved_s"]["mean"] == pytest.approx(23.0)  # (20 + 26) / 2
    assert t["base-w2"]["time_saved_s"]["sd"] == pytest.approx(np.std([20, 26], ddof=1))
    assert t["resize-60"]["time_saved_s"]["mean"] == pytest.approx(12.0)  # (10 + 14) / 2
    assert t["resize-60"]["time_saved_frac"]["mean"] == pytest.approx((0.1 + 14 / 110) / 2)
    assert t["resize-60"]["overhead_s"]["mean"] == pytest.approx(9.0)
    assert t["resize-60"]["wall_s"] == {"mean": 93.0, "sd": pytest.approx(np.std([90, 96], ddof=1)), "n": 2}
    assert t["resize-120"]["repeats"] == 1 and t["resize-120"]["time_saved_s"] == {"mean": 5.0, "sd": None, "n": 1}
    assert t["base-w1"]["overhead_s"]["mean"] is None
    assert t["resize-60"]["epochs"]["mean"] == pytest.approx((60 * 32 + 140 * 64) / 1437)
    txt = render_table2(list(t.values()))
    assert "(reference)" in txt and "12.0 ± 2.8" in txt and "90.00%" in txt
    md = render_table2(list(t.values()), markdown=True)
    assert md.splitlines()[1].startswith("|:---")


def test_mean_sd():
    assert mean_sd([]) == {"mean": None, "sd": None, "n": 0}
    assert mean_sd([None, 2.0]) == {"mean": 2.0, "sd": None, "n": 1}
    assert mean_sd([1.0, 3.0])["sd"] == pytest.approx(2 ** 0.5)


# ---------------------------------------------------------------------------- design file
def test_design_files_shipped_are_valid(tmp_path, monkeypatch):
    from elastic_ring.experiment.resize import PACKAGE, resolve_path

    paper = load_design(PACKAGE / "configs" / "table2.yaml")
    assert (paper.w_init, paper.w_new, paper.resize_steps) == (4, 8, (5000, 10000))
    cpu = load_design(PACKAGE / "configs" / "table2_cpu.yaml")
    # the design's training config is found inside the package, wherever the command runs
    monkeypatch.chdir(tmp_path)
    assert resolve_path(cpu.config, tmp_path) == PACKAGE / "configs" / "cpu_small.yaml"
    assert cpu.w_init < cpu.w_new and len(cpu.resize_steps) >= 2
    assert paper.relaunch == cpu.relaunch == "sequential"  # the paper's stop-checkpoint-restart


@pytest.mark.parametrize("text, msg", [
    ("config: a.yaml\nw_init: 1\nw_new: 2\nresize_steps: [5]\nbogus: 1\n", "unknown key"),
    ("config: a.yaml\nw_init: 1\nresize_steps: [5]\n", "missing required key 'w_new'"),
    ("config: a.yaml\nw_init: 2\nw_new: 2\nresize_steps: [5]\n", "nothing to resize"),
    ("config: a.yaml\nw_init: 1\nw_new: 2\nresize_steps: [10, 5]\n", "increasing"),
    ("config: a.yaml\nw_init: 1\nw_new: 4\nresize_steps: [5]\nslots: 2\n", "slots"),
    ("config: a.yaml\nw_init: 1\nw_new: 2\nresize_steps: [5]\nrepeats: x\n", "repeats: wrong type"),
    ("config: a.yaml\nw_init: 1\nw_new: 2\nresize_steps: [5]\nrelaunch: eager\n", "relaunch: must be one of"),
])
def test_design_errors_are_config_errors(tmp_path, text, msg):
    p = tmp_path / "d.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=msg):
        load_design(p)




@pytest.mark.parametrize("args, needle", [
    (["profile", "--gpus", "1,0", "--device", "cpu"], "worker counts must be >= 1"),
    (["experiment", "resize", "--config", "{design}", "--device", "cpu"], "not before the last step"),
    (["report", "{tmp}"], "holds no profile.json"),
])
def test_cli_profile_experiment_report_user_errors_exit_2(tmp_path, cli_inproc, args, needle):
    d = tmp_path / "d.yaml"
    d.write_text(f"config: {ROOT / 'configs' / 'cpu_small.yaml'}\nw_init: 1\nw_new: 2\nresize_steps: [500]\n")
    r = cli_inproc(*(a.format(design=d, tmp=tmp_path) for a in args))
    code, err = r.returncode, r.stderr
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and needle in lines[0], err
