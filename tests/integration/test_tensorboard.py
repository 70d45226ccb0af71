"""TensorBoard curves of a real run (horovodrun, gloo, CPU), read back with TensorBoard's own
readers and compared, scalar by scalar, with ``events.jsonl``: across a resize and a ``--resume``.

The run is test_train_resize's live resize, Ctrl-C and resume (made once per session for both:
1 worker resized live to 2, an evaluation every 50 steps, stopped, resumed at 2 workers)."""

from __future__ import annotations

import pytest

from elastic_ring.events import read_events
from elastic_ring.telemetry.tensorboard import scalars_of
from tests.integration.test_train_resize import LIVE_STEPS, live_resize_run

pytestmark = pytest.mark.integration


def _expected(run) -> tuple[dict[tuple[str, int], tuple[float, float]], set[tuple[str, int]]]:
    """The curves the events make: (tag, step) -> (value, wall time) of the timeline the run ended
    on (the last record of a step wins; a launch at step S drops the points at S or later, those of
    steps trained again or not at all, except the restart's that led to it); and every (tag, step)
    of the events."""
    out, every, restart = {}, set(), []
    for ev in read_events(run / "events.jsonl"):
        rows = list(scalars_of(ev))
        every |= {(tag, step) for tag, _, step, _ in rows}
        if ev["kind"] == "launch":
            out = {k: v for k, v in out.items() if k[1] < ev["start_step"]}
            rows, restart = [r for r in restart if r[2] >= ev["start_step"]], []
        elif ev["kind"] == "restart":
            restart = rows
        for tag, value, step, wall in rows:
            out[(tag, step)] = (value, wall)
    return out, every


def _raw(logdir) -> list[tuple[str, int, float, float]]:
    """Every scalar record of every event file, through TensorBoard's event-file loader."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    rows = []
    for f in sorted(logdir.glob("events.out.tfevents.*")):
        for ev in EventFileLoader(str(f)).Load():
            for v in ev.summary.value:
                rows.append((v.tag, ev.step, v.simple_value, ev.wall_time))
    return rows


def _check(run, once: bool = True) -> dict:
    """The curves of ``run`` as TensorBoard's accumulator reads them: each (tag, step) of the events
    once, with the value and time of its last record. ``once``: nothing was trained twice, so no
    scalar is in the files twice either (else a restart's START drops the older points)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logdir = run / "tensorboard"
    want, every = _expected(run)
    raw = _raw(logdir)
    keys = [(t, s) for t, s, _, _ in raw]
    if once:
        assert len(keys) == len(set(keys)), "a scalar was written twice"
    assert set(keys) == every  # every record of the events is in the files
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    points = [(tag, e.step, e.value, e.wall_time) for tag in acc.Tags()["scalars"] for e in acc.Scalars(tag)]
    got = {(tag, step): (v, wall) for tag, step, v, wall in points}
    assert len(got) == len(points), "a step shows twice in a curve"
    assert set(got) == set(want)
    for k, (v, wall) in want.items():
        assert got[k][0] == pytest.approx(v, rel=1e-6, abs=1e-12), k  # stored as float32
        assert got[k][1] == pytest.approx(wall, abs=1e-6), k
    return got


def curves_show_each_step_once(run) -> None:
    """For the kill tests of test_recovery: after a restart from a checkpoint (steps done twice),
    TensorBoard shows each step once, its last values."""
    pytest.importorskip("tensorboard")
    got = _check(run, once=False)
    assert any(t == "train/loss" for t, _ in got)


def test_curves_equal_events_across_a_resize_and_a_resume(tmp_path_factory):
    folder, out = live_resize_run(tmp_path_factory)
    assert out["resize"][0] == 0, out["resize"][1]
    assert out["interrupted"][0] == 130, out["interrupted"][1]
    first = _check(folder / "before")  # the curves of the first controller, before the resume
    tags = {t for t, _ in first}
    assert {"train/loss", "train/lr", "train/images_per_s", "train/world_size", "test/loss", "test/accuracy",
            "resize/total_lost_s", "resize/checkpoint_s", "resize/stop_latency_s"} <= tags
    assert {v for (t, _), (v, _) in first.items() if t == "train/world_size"} == {1.0, 2.0}
    stopped = max(s for t, s in first if t == "train/loss")

    assert out["resume"][0] == 0, out["resume"][1]
    run = folder / "run"
    assert len(list((run / "tensorboard").glob("events.out.tfevents.*"))) == 2  # one per controller
    after = _check(run)
    steps = sorted(s for t, s in after if t == "train/loss")
    assert steps[-1] == LIVE_STEPS and any(s > stopped for s in steps)
    assert {k: v for k, v in after.items() if k in first} == first  # the first part unchanged
