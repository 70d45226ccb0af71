"""Eq. 5 speed model and Eq. 1 convergence model: fits recover parameters, stay non-negative."""

from __future__ import annotations

import json

import numpy as np
import pytest

from elastic_ring.perfmodel import (ConvergenceModel, FitError, SpeedModel, fit_convergence, fit_speed,
                                    load_profile, losses_from_events)
from elastic_ring.sched.api import model_rate


def test_speed_predict_matches_eq5_by_hand():
    m = SpeedModel(t0=0.001, t1=0.002, t2=1e-8, t3=0.01, m=100, n=1e6)
    # w=4: 0.001*100 + 0.002*3 + 1e-8*3*1e6/4 + 0.01 = 0.1 + 0.006 + 0.0075 + 0.01 = 0.1235
    assert m.predict(4) == pytest.approx(1 / 0.1235)
    assert m.samples_per_s(4) == pytest.approx(400 / 0.1235)
    np.testing.assert_allclose(m.predict(np.array([1, 4])), [1 / 0.11, 1 / 0.1235])


def test_fit_speed_recovers_predictions_exactly_from_noiseless_points():
    true = SpeedModel(0.0008, 0.0015, 8e-10, 0.0, 128, 1727962)
    w = np.array([1, 2, 4, 8, 3, 6])
    fit = fit_speed(w, true.predict(w), 128, 1727962)
    np.testing.assert_allclose(fit.model.predict(np.arange(1, 17)), true.predict(np.arange(1, 17)), rtol=1e-6)
    assert fit.rmse < 1e-9
    # only t0*m + t3 is identified (collinear columns); that sum is recovered
    assert fit.model.t0 * 128 + fit.model.t3 == pytest.approx(true.t0 * 128, rel=1e-6)
    assert fit.model.t1 == pytest.approx(true.t1, rel=1e-6)


def test_fit_speed_coefficients_non_negative_on_random_data():
    rng = np.random.default_rng(3)
    for _ in range(50):
        w = rng.integers(1, 17, size=8)
        w[:4] = [1, 2, 3, 4]
        f = rng.uniform(0.1, 10, size=8)
        fit = fit_speed(w, f, 32, 1e6)
        assert min(fit.model[:4]) >= 0
        np.testing.assert_allclose(fit.residuals, f - fit.model.predict(w))


def test_fit_speed_refuses_fewer_distinct_worker_counts_than_parameters():
    with pytest.raises(FitError, match="4 distinct worker counts"):
        fit_speed([1, 2, 4, 4, 4], [1.0, 1.9, 3.5, 3.6, 3.4], 128, 1e6)
    with pytest.raises(FitError):
        fit_speed([1, 2, 4, 8], [1.0, 0.0, 3.5, 3.6], 128, 1e6)


def test_a_profile_that_cannot_be_fitted_is_a_one_line_user_error(tmp_path, capsys):
    from elastic_ring.cli.main import main

    pts = [{"workers": w, "steps_per_s": 1.0 / w} for w in (1, 2)]
    p = tmp_path / "profile.json"
    p.write_text(json.dumps({"batch_per_worker": 32, "n_params": 1e5, "points": pts}))
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", "--workload", str(p), "--out", str(tmp_path / "sim")])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("elastic-ring: error: ") and "4 distinct worker counts, got 2" in err


def test_scalar_and_vector_evaluation_agree_bit_for_bit():
    # the simulator evaluates one GPU count at a time, the reports a numpy grid: the same numbers
    rng = np.random.default_rng(7)
    for _ in range(20):
        m = SpeedModel(*rng.uniform(0, 1e-2, size=4), 32, rng.uniform(1e4, 1e7))
        ws = np.arange(1, 65)
        assert [m.step_time(int(w)) for w in ws] == m.step_time(ws).tolist()
        assert [m.predict(int(w)) for w in ws] == m.predict(ws).tolist()
        assert [m.samples_per_s(int(w)) for w in ws] == m.samples_per_s(ws).tolist()
        rate = model_rate(m)
        assert [rate(int(w)) for w in ws] == m.samples_per_s(ws).tolist()
    assert SpeedModel(0, 0, 0, 0, 32, 1e5).samples_per_s(4) == float("inf")


def test_speed_model_dict_round_trip_and_profile_loading(tmp_path):
    true = SpeedModel(0.0008, 0.0015, 8e-10, 0.001, 128, 1727962)
    assert SpeedModel.from_dict(true.to_dict()) == true
    pts = [{"workers": w, "steps_per_s": float(true.predict(w))} for w in (1, 2, 4, 8)]
    p = tmp_path / "profile.json"
    p.write_text(json.dumps({"batch_per_worker": 128, "n_params": 1727962, "points": pts}))
    model, d = load_profile(p)  # no speed_model: fitted from the points
    assert model.predict(6) == pytest.approx(true.predict(6), rel=1e-6)
    p.write_text(json.dumps({"batch_per_worker": 128, "n_params": 1, "points": pts,
                             "speed_model": true.to_dict()}))
    assert load_profile(p)[0] == true
    p.write_text(json.dumps({"points": pts}))
    with pytest.raises(FitError, match="batch_per_worker"):
        load_profile(p)
    with pytest.raises(FitError, match="not found"):
        load_profile(tmp_path / "missing.json")


def test_convergence_predict_and_steps_to_reach():
    m = ConvergenceModel(b0=0.01, b1=1.0, b2=0.5)
    assert m.predict(100) == pytest.approx(1 / 2 + 0.5)
    assert m.steps_to_reach(1.0) == pytest.approx(100.0)
    assert m.steps_to_reach(0.5) == float("inf")
    assert m.steps_to_reach(2.0) == 0.0


def test_fit_convergence_recovers_known_parameters():
    true = ConvergenceModel(0.002, 0.4, 0.3)
    k = np.linspace(0, 20000, 60)
    fit = fit_convergence(k, true.predict(k))
    np.testing.assert_allclose(fit, true, rtol=1e-3)


def test_fit_convergence_never_negative_on_noisy_and_random_data():
    rng = np.random.default_rng(7)
    for i in range(30):
        k = np.sort(rng.uniform(0, 5000, 40))
        if i % 2:
            l = rng.uniform(0.05, 3.0, 40)  # pure noise
        else:
            l = ConvergenceModel(*rng.uniform(0.0005, 0.01, 1), rng.uniform(0.2, 2), rng.uniform(0, 1)).predict(k)
            l = l * (1 + 0.05 * rng.standard_normal(40))
            l = np.abs(l)
        fit = fit_convergence(k, l)
        assert min(fit) >= 0, fit
        assert fit.b2 < l.min()


def test_fit_convergence_needs_three_points():
    with pytest.raises(FitError):
        fit_convergence([1, 2], [1.0, 0.9])


def test_losses_from_events_reads_throughput_events_and_skips_a_truncated_line(tmp_path):
    p = tmp_path / "events.jsonl"
    lines = [json.dumps({"kind": "launch", "time": 1}),
             json.dumps({"kind": "throughput", "step": 10, "loss": 2.0, "time": 2}),
             json.dumps({"kind": "throughput", "step": 20, "loss": 1.5, "time": 3}),
             '{"kind": "throughput", "step": 30, "lo']
    p.write_text("\n".join(lines))
    k, l = losses_from_events(p)
    assert k.tolist() == [10, 20] and l.tolist() == [2.0, 1.5]


def test_load_profile_reads_an_older_median_profile_as_work_over_time(tmp_path):
    # points written as the median of window rates, with their windows: two fast short windows and
    # one slow long one per point. The scheduler must learn the work over time, not the median.
    true = SpeedModel(0.0008, 0.0015, 8e-10, 0.001, 128, 1727962)
    pts = []
    for w in (1, 2, 4, 8):
        f = float(true.predict(w))
        # steps (10, 10, 70) at rates (3f, 3f, x) chosen so that 90 steps take 90 / f seconds
        slow = 70.0 / (90.0 / f - 20.0 / (3 * f))
        fast = {"steps": 10, "seconds": 10 / (3 * f), "steps_per_s": 3 * f, "images_per_s": 3 * f * 128 * w}
        wins = [fast, dict(fast),
                {"steps": 70, "seconds": 70 / slow, "steps_per_s": slow, "images_per_s": slow * 128 * w}]
        med = sorted(x["steps_per_s"] for x in wins)[1]
        pts.append({"workers": w, "steps_per_s": med, "images_per_s": med * 128 * w, "windows": wins})
    wrong = SpeedModel(0.0001, 0.0, 0.0, 0.0, 128, 1727962)  # what a fit to the medians could say
    p = tmp_path / "profile.json"
    p.write_text(json.dumps({"points": pts, "batch_per_worker": 128, "n_params": 1727962,
                             "speed_model": wrong.to_dict()}))
    model, d = load_profile(p)
    for w, pt in zip((1, 2, 4, 8), d["points"]):
        assert pt["rate"] == "work_over_time" and pt["steps_per_s"] == pytest.approx(true.predict(w))
        assert pt["steps_per_s_median"] > pt["steps_per_s"]
        assert model.predict(w) == pytest.approx(true.predict(w), rel=1e-3)
    # a profile already in work over time is read as written (its speed_model kept)
    for pt in pts:
        pt["rate"] = "work_over_time"
    p.write_text(json.dumps({"points": pts, "batch_per_worker": 128, "n_params": 1727962,
                             "speed_model": wrong.to_dict()}))
    assert load_profile(p)[0] == wrong
