"""Unit tests of the core's pure logic: config, LR rules (Eq. 7), sample stream, checkpoints,
ResNet sizes, schedule validation and the run summary."""

from __future__ import annotations


import pytest
import torch

from elastic_ring.ckpt import CheckpointStore, load_verified, save_atomic
from elastic_ring.config.api import load_config
from elastic_ring.config.base import parse_overrides
from elastic_ring.controller.api import Resize, RunSpec, parse_hosts, parse_schedule
from elastic_ring.controller.summary import render, summarize
from elastic_ring.data import SampleStream, make_batch, load_dataset, materialize
from elastic_ring.errors import CheckpointError, ConfigError, UserError
from elastic_ring.nn import count_parameters, resnet
from elastic_ring.worker.lr import RULES, LRState, decay_multiplier, initial_base_lr


# ---------------------------------------------------------------- model
def test_resnet110_has_about_1_7M_parameters():
    n = count_parameters(resnet(110))
    assert 1.70e6 <= n <= 1.75e6, n


@pytest.mark.parametrize("depth,paper_m", [(20, 0.27), (32, 0.46), (44, 0.66), (56, 0.85)])
def test_resnet_depths_match_he_et_al(depth, paper_m):
    assert abs(count_parameters(resnet(depth)) / 1e6 - paper_m) < 0.01


def test_resnet_rejects_bad_depth_and_shapes_output():
    with pytest.raises(ValueError):
        resnet(21)
    m = resnet(8, width=4)
    assert m(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    assert len([x for x in m.modules() if isinstance(x, torch.nn.Conv2d)]) == 7  # 6n+1 convs + fc = 6n+2


# ---------------------------------------------------------------- config
def test_config_files_load_and_unknown_key_is_error(tmp_path):
    paper = load_config("configs/paper.yaml")
    assert paper.depth == 110 and paper.batch_size == 128 and paper.momentum == 0.9
    assert paper.decay_steps == (8000, 12000)
    p = tmp_path / "c.yaml"
    p.write_text("depth: 20\nbogus_key: 1\n")
    with pytest.raises(ConfigError, match="unknown key 'bogus_key'"):
        load_config(p)
    p.write_text("depth: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(p)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="depth: must be 6n"):
        load_config("configs/cpu_small.yaml", {"depth": 21})
    with pytest.raises(ConfigError, match="wrong type"):
        load_config("configs/cpu_small.yaml", {"batch_size": "many"})


def test_overrides_parse_yaml_scalars():
    assert parse_overrides(["depth=56", "augment=false", "lr=0.05"]) == {"depth": 56, "augment": False, "lr": 0.05}
    with pytest.raises(ConfigError):
        parse_overrides(["novalue"])


# ---------------------------------------------------------------- LR, Eq. 7
def test_initial_lr_scales_linearly_with_global_batch():
    assert initial_base_lr(0.1, 128, 128, 4) == pytest.approx(0.4)
    assert initial_base_lr(0.1, 128, 32, 1) == pytest.approx(0.025)


def test_eq7_resize_and_decays_fire_at_same_steps():
    decay = (50, 75)
    s4 = LRState(0.4)
    s8 = s4.resized(RULES["linear"], 4, 8, at_step=30, warmup_steps=0)
    for step in (31, 50, 51, 75, 76, 99):
        assert s8.lr_at(step, decay, 0.1) == pytest.approx(2 * s4.lr_at(step, decay, 0.1))
    assert s8.lr_at(51, decay, 0.1) == pytest.approx(0.08)  # 0.8 * 0.1, decay at the same step
    s2 = s8.resized(RULES["linear"], 8, 2, at_step=60, warmup_steps=0)
    assert s2.lr_at(60, decay, 0.1) == pytest.approx(0.25 * s8.lr_at(60, decay, 0.1))


def test_resize_warmup_ramps_from_old_to_new():
    s = LRState(0.1).resized(RULES["linear"], 1, 2, at_step=10, warmup_steps=10)
    assert s.base_at(10) == pytest.approx(0.1)
    assert s.base_at(15) == pytest.approx(0.15)
    assert s.base_at(20) == pytest.approx(0.2)
    assert s.base_at(100) == pytest.approx(0.2)


def test_other_scaling_rules_and_decay():
    assert RULES["sqrt"].scale(0.1, 1, 4) == pytest.approx(0.2)
    assert RULES["none"].scale(0.1, 1, 4) == pytest.approx(0.1)
    assert decay_multiplier(50, (50, 75), 0.1) == 1.0
    assert decay_multiplier(51, (50, 75), 0.1) == pytest.approx(0.1)
    assert decay_multiplier(76, (50, 75), 0.1) == pytest.approx(0.01)


# ---------------------------------------------------------------- sample stream
def test_stream_exact_across_world_size_changes():
    """Consume with 2 workers, then 3, then 1: every epoch sees every sample exactly once."""
    n, b = 37, 4
    st = SampleStream(n, seed=3)
    cursor, seen = 0, []
    for world, steps in ((2, 5), (3, 7), (1, 9)):
        for _ in range(steps):
            for r in range(world):
                seen += st.take(cursor + r * b, b).tolist()
            cursor += world * b
    full_epochs = len(seen) // n
    assert full_epochs >= 2
    for e in range(full_epochs):
        assert sorted(seen[e * n:(e + 1) * n]) == list(range(n))
    # and it is the same sequence as an uninterrupted single stream
    assert seen == SampleStream(n, seed=3).take(0, len(seen)).tolist()
    assert st.epoch_of(cursor) == divmod(cursor, n)


def test_augmentation_is_deterministic_given_generator():
    ds = load_dataset("synthetic", True, synthetic_size=16)
    idx = torch.arange(8)
    a, _ = make_batch(ds, idx, True, torch.Generator().manual_seed(5))
    b, _ = make_batch(ds, idx, True, torch.Generator().manual_seed(5))
    c, _ = make_batch(ds, idx, True, torch.Generator().manual_seed(6))
    assert torch.equal(a, b) and not torch.equal(a, c)
    plain, _ = make_batch(ds, idx, False)
    assert plain.shape == a.shape == (8, 3, 32, 32)


def test_a_smaller_synthetic_side_is_cropped_and_flipped_at_its_own_side(tmp_path):
    """``synthetic_side``: the set's images, a batch's augmentation (each a window of the pad-4
    image, flipped or not) and the run's cache file all at that side; 32, the default, as before."""
    ds = load_dataset("synthetic", True, synthetic_size=16, synthetic_side=16)
    assert ds.images.shape == (16, 3, 16, 16)
    assert torch.equal(load_dataset("synthetic", True, synthetic_size=16).images,
                       load_dataset("synthetic", True, synthetic_size=16, synthetic_side=32).images)
    idx = torch.arange(16)
    a, _ = make_batch(ds, idx, True, torch.Generator().manual_seed(5))
    plain, _ = make_batch(ds, idx, False)
    assert a.shape == plain.shape == (16, 3, 16, 16)
    padded = torch.nn.functional.pad(plain, (4, 4, 4, 4), value=float(-0.5 / 0.29))  # a 0 pixel, normalised
    for i in range(16):  # each augmented image is one of the 2 x 9 x 9 windows of its padded image
        wins = [w for oy in range(9) for ox in range(9)
                for w in (padded[i, :, oy:oy + 16, ox:ox + 16], padded[i, :, oy:oy + 16, ox:ox + 16].flip(-1))]
        assert any(torch.allclose(a[i], w) for w in wins), i
    materialize("synthetic", tmp_path, synthetic_size=16, synthetic_side=16)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["synthetic-test-n16-s0-px16.pt", "synthetic-train-n16-s0-px16.pt"]
    back = load_dataset("synthetic", True, synthetic_size=16, cache_dir=tmp_path, synthetic_side=16)
    assert torch.equal(back.images, ds.images)


# ---------------------------------------------------------------- checkpoints
def test_checkpoint_roundtrip_keeps_previous_and_detects_corruption(tmp_path):
    store = CheckpointStore(tmp_path)
    assert store.load_latest() is None
    for step in (10, 20, 30):
        store.save({"step": step, "w": torch.arange(4) * step})
    files = sorted(p.name for p in tmp_path.glob("ckpt-*.pt"))
    assert files == ["ckpt-00000020.pt", "ckpt-00000030.pt"]  # current + previous kept
    assert store.load_latest()["step"] == 30
    assert torch.equal(store.load_latest()["w"], torch.arange(4) * 30)
    path = store.latest_path()
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="SHA-256 mismatch"):
        load_verified(path)
    assert store.load_latest()["step"] == 20  # falls back to the previous one, intact
    (tmp_path / "junk.pt").write_bytes(b"hello")
    with pytest.raises(CheckpointError, match="not an elastic-ring checkpoint"):
        load_verified(tmp_path / "junk.pt")


def test_save_atomic_leaves_no_temp_files(tmp_path):
    n = save_atomic(tmp_path / "a.pt", {"x": 1})
    assert n == (tmp_path / "a.pt").stat().st_size
    assert [p.name for p in tmp_path.iterdir()] == ["a.pt"]


# ---------------------------------------------------------------- schedule validation
def _spec(**kw):
    base = dict(run_dir=".", workers=1, schedule=(), slots=2, device="cpu", total_steps=100)
    base.update(kw)
    return RunSpec(**base)


@pytest.mark.parametrize("kw,msg", [
    ({"workers": 0}, "must be >= 1"),
    ({"workers": 3}, "more than the 2 slot"),
    ({"schedule": (Resize(10, 0),)}, "cannot resize to 0"),
    ({"schedule": (Resize(10, 3),)}, "only 2 slot"),
    ({"schedule": (Resize(100, 2),)}, "not before the last step"),
    ({"schedule": (Resize(50, 2), Resize(40, 1))}, "increasing"),
    ({"schedule": (Resize(50, 1),)}, "already has 1"),
])
def test_spec_validation_errors(kw, msg):
    with pytest.raises(UserError, match=msg):
        _spec(**kw).validate()


def test_spec_validation_accepts_good_schedule_and_parsers():
    _spec(schedule=(Resize(10, 2), Resize(20, 1))).validate()
    assert parse_schedule("5000:8, 10000:4") == (Resize(5000, 8), Resize(10000, 4))
    with pytest.raises(UserError):
        parse_schedule("5000-8")
    assert parse_hosts("localhost:1,127.0.0.1:2") == [("localhost", 1), ("127.0.0.1", 2)]
    with pytest.raises(UserError):
        parse_hosts("h:zero")


# ---------------------------------------------------------------- summary
def test_summary_scaling_efficiency_and_overheads():
    ev = [
        {"kind": "launch", "world_size": 1, "time": 0},
        {"kind": "throughput", "world_size": 1, "images_per_s": 100.0, "steps_per_s": 1.0, "steps": 10, "step": 10, "loss": 2.0},
        {"kind": "throughput", "world_size": 1, "images_per_s": 110.0, "steps_per_s": 1.1, "steps": 10, "step": 20, "loss": 1.5},
        {"kind": "throughput", "world_size": 2, "images_per_s": 180.0, "steps_per_s": 0.9, "steps": 10, "step": 30, "loss": 1.0},
        {"kind": "resize_overhead", "from_workers": 1, "to_workers": 2, "step": 20, "stop_latency_s": 1.0,
         "checkpoint_s": 0.1, "relaunch_to_first_step_s": 4.0, "total_lost_s": 5.5, "steady_step_s": 1.0},
        {"kind": "evaluation", "step": 30, "test_accuracy": 0.9, "test_loss": 0.3},
    ]
    s = summarize(ev)
    secs = 10 / 1.0 + 10 / 1.1  # the two 1-worker windows' seconds (steps / steps per s)
    assert s["sizes"][0]["steps_per_s"] == pytest.approx(20 / secs)  # work over time, not a median
    assert s["sizes"][0]["images_per_s"] == pytest.approx((100.0 * 10 + 110.0 * 10 / 1.1) / secs)
    assert s["sizes"][0]["window_steps_per_s"] == {"min": 1.0, "median": pytest.approx(1.05), "max": 1.1}
    e = s["scaling_efficiency"][0]  # 2 windows and 1: too few to say
    assert e["efficiency"] is None and "too few throughput windows (2 and 1" in e["reason"]
    assert s["resizes"][0]["total_lost_s"] == 5.5
    assert s["train_loss"] == 1.0 and s["test_accuracy"] == 0.9 and s["state"] == "running"
    text = render(s, 40)
    assert "n/a (too few" in text and "final train loss" not in text
    assert "train loss: 1.0000 (window ending at step 30)" in text
    more = [{"kind": "throughput", "world_size": w, "images_per_s": ips, "steps_per_s": 1.0,
             "steps": 10, "step": 40 + 10 * i, "loss": 0.5}
            for i, (w, ips) in enumerate([(1, 90.0), (2, 170.0), (2, 260.0), (2, 200.0)])]
    e = summarize(ev + more)["scaling_efficiency"][0]
    # work over time (images over the windows' seconds = steps / steps per s), not the medians
    one = (100.0 * 10 + 110.0 * 10 / 1.1 + 90.0 * 10) / (10 + 10 / 1.1 + 10)
    two = (180.0 * 10 / 0.9 + 170.0 * 10 + 260.0 * 10 + 200.0 * 10) / (10 / 0.9 + 30)
    assert e["efficiency"] == pytest.approx(two / (2 * one)) and e["windows"] == [3, 4]
    assert e["low"] < e["efficiency"] < e["high"]
    finished = summarize(ev + more + [{"kind": "finished", "step": 70, "wall_s": 9.0}])
    assert "final train loss: 0.5000" in render(finished, 70)


def test_summary_rate_is_work_over_time_when_windows_disagree():
    """Two jobs sharing cores: a few fast windows and one long slow one. The rate is the steps
    over the seconds they took (the issue-22 case: median 159-184 steps/s, 47-50 steps/s of work)."""
    ev = [{"kind": "launch", "world_size": 1, "time": 0}]
    ev += [{"kind": "throughput", "world_size": 1, "images_per_s": 180.0 * 32, "steps_per_s": 180.0,
            "steps": 100, "seconds": 100 / 180.0, "step": 100 * (i + 1), "loss": 1.0} for i in range(3)]
    ev.append({"kind": "throughput", "world_size": 1, "images_per_s": 20.0 * 32, "steps_per_s": 20.0,
               "steps": 1200, "seconds": 60.0, "step": 1500, "loss": 1.0})
    size = summarize(ev)["sizes"][0]
    assert size["window_steps_per_s"]["median"] == 180.0
    assert size["steps_per_s"] == pytest.approx(1500 / (3 * 100 / 180.0 + 60.0))  # ~24.3
    assert "24.3" in render(summarize(ev)).replace(" ", " ")


def test_cpu_threads_share_the_allowed_cores_or_follow_the_override(monkeypatch):
    from elastic_ring import protocol

    monkeypatch.delenv(protocol.CPU_THREADS_ENV, raising=False)
    monkeypatch.setattr(protocol.os, "sched_getaffinity", lambda pid: set(range(6)), raising=False)
    assert [protocol.cpu_threads(n) for n in (1, 2, 4, 8)] == [6, 3, 1, 1]
    monkeypatch.setenv(protocol.CPU_THREADS_ENV, "2")
    assert protocol.cpu_threads(4) == 2
    monkeypatch.setenv(protocol.CPU_THREADS_ENV, "lots")  # unreadable: the default rule
    assert protocol.cpu_threads(2) == 3


def test_digits_read_without_scikit_learn_equal_its_loader_and_import_nothing_of_it():
    """``elastic_ring.data.load_digits`` gives exactly scikit-learn's ``load_digits(return_X_y=True)``
    (values, dtypes, shapes), and a fresh process that calls it never imports scikit-learn."""
    import subprocess
    import sys

    import numpy as np
    from sklearn.datasets import load_digits as sk_load

    from elastic_ring.data import load_digits

    x, y = load_digits()
    want_x, want_y = sk_load(return_X_y=True)
    assert x.dtype == want_x.dtype and y.dtype == want_y.dtype and x.shape == (1797, 64)
    assert np.array_equal(x, want_x) and np.array_equal(y, want_y)
    code = ("import sys; from elastic_ring.data import load_digits; x, y = load_digits(); "
            "print(len(y), any(m == 'sklearn' or m.startswith('sklearn.') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["1797", "False"], out.stderr


def test_summary_loss_is_the_last_recorded_one_and_says_when_none_is():
    """A script's windows without a loss (NaN: it never calls job.record(loss)) do not hide the last
    loss recorded; with none at all the summary says so, and "no evaluation" without one (not
    "nan" and "n/a")."""
    nan = float("nan")

    def win(step, loss):
        return {"kind": "throughput", "world_size": 1, "images_per_s": 10.0, "steps_per_s": 1.0, "steps": 10,
                "seconds": 10.0, "step": step, "loss": loss}
    fin = {"kind": "finished", "step": 40, "wall_s": 5.0}
    ev = [{"kind": "launch", "world_size": 1, "time": 0}, win(10, 2.0), win(20, 1.5), win(30, nan), fin]
    s = summarize(ev)
    assert s["train_loss"] == 1.5 and s["train_loss_step"] == 20
    text = render(s, 40)
    assert "final train loss: 1.5000 (window ending at step 20)   test accuracy: no evaluation" in text, text
    assert "nan" not in text
    s = summarize([ev[0], win(10, nan), win(20, nan), fin])
    assert s["train_loss"] is None
    text = render(s, 40)
    assert "train loss: not recorded (the script does not call job.record(loss))" in text and "nan" not in text
    s = summarize([ev[0], win(10, 2.0), win(40, 1.0), fin,
                   {"kind": "evaluation", "step": 40, "test_accuracy": 0.5, "test_loss": 1.0}])
    assert "final train loss: 1.0000   test accuracy: 50.00%" in render(s, 40)
    assert "train loss: no throughput window yet" in render(summarize(ev[:1]), 40)


def test_report_marks_a_live_resize_at_the_step_it_came_after():
    """A live resize's request names no step (``at_step`` None): its marker is the step before the
    first at the new size, never "resize @ None"."""
    from elastic_ring.events import as_event
    from elastic_ring.report.api import _run_curve

    ev = [as_event(e) for e in [
        {"kind": "launch", "time": 10.0, "segment": 0, "world_size": 1, "start_step": 1, "stop_step": 100,
         "command": []},
        {"kind": "resize_requested", "time": 12.0, "from_workers": 1, "to_workers": 2, "source": "live"},
        {"kind": "first_step_after_resize", "time": 14.0, "segment": 1, "world_size": 2, "step": 31, "lr": 0.2,
         "since_launch_s": 1.0},
        {"kind": "resize_requested", "time": 20.0, "from_workers": 2, "to_workers": 1, "source": "schedule",
         "at_step": 60},
        {"kind": "resize_requested", "time": 30.0, "from_workers": 1, "to_workers": 2, "source": "live"},
    ]]
    assert [r[2] for r in _run_curve(ev)["resizes"]] == ["resize @ 30", "resize @ 60", "resize 1 -> 2"]
