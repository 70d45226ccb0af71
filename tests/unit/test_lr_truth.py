"""A script's LR at a resize, and what the run says of it.

``--lr-scaling auto`` (a script's default) follows the script's own scaling, read from the LR its
optimizer is built with at each world size (``worker.lr.script_rule``, applied by ``StateSync``);
the ``relaunched`` event and the console's resize line of a script give the LR its first step after
the resize used, and the rule's where the script set another; the drop-in sampler's
``epoch_batches`` and ``start_batch`` give a per-batch warm-up the whole epoch across a resize; the
flag's bad uses are one line.
"""

from __future__ import annotations

import math

import pytest
import torch

from elastic_ring.controller.display import Display
from elastic_ring.controller.meter import Meter, PendingResize
from elastic_ring.events.api import EventLog, as_event, read_events
from elastic_ring.worker.data import DataPosition
from elastic_ring.worker.lr import RULES, script_rule
from tests.unit.test_worker_epochs import StubJob, _sampler, _steps
from tests.unit.test_worker_library import make_job


@pytest.mark.parametrize("built,old,new,rule,factor", [
    ({1: 0.1, 2: 0.2}, 1, 2, "auto:linear", 2.0),  # lr=base * hvd.size(): Eq. 7
    ({1: 0.1, 2: 0.2}, 2, 1, "auto:linear", 0.5),
    ({1: 1.0, 2: 1.0}, 1, 2, "auto:none", 1.0),  # lr=base (pytorch/examples' mnist)
    ({2: 0.1 * math.sqrt(2), 8: 0.1 * math.sqrt(8)}, 2, 8, "auto:sqrt", 2.0),
    ({1: 0.1, 2: 0.15}, 1, 2, "auto:x1.5", 1.5),  # no named rule: the script's own factor
    ({1: 1.0, 2: 1.0}, 2, 4, "auto:none", 1.0),  # 4 not seen yet: the rule the sizes seen name
    ({1: 0.1, 2: 0.2}, 2, 4, "auto:linear", 2.0),
    ({1: 0.1}, 1, 2, "auto:unknown", 2.0),  # one size seen: Eq. 7
    ({}, 2, 1, "auto:unknown", 0.5),
])
def test_script_rule_follows_the_lr_the_script_builds_at_each_size(built, old, new, rule, factor):
    name, f = script_rule(built, old, new)
    assert name == rule and f == pytest.approx(factor, rel=1e-12)


def _flat_segments(tmp_path, monkeypatch, rule: str, scales: bool) -> list[tuple[int, float, object]]:
    """A flat job.steps() script whose optimizer is built with ``lr=0.1 * size`` (``scales``) or
    ``0.1``, run 1 -> 2 -> 1 worker(s) by checkpoint and relaunch; each step's (world, LR) and each
    segment's rescale."""
    seen = []
    for seg, (stop, w) in enumerate([(3, 1), (5, 2), (7, 1)]):
        job = make_job(tmp_path, monkeypatch, size=w, segment=seg, stop_at=stop, total=7)
        job.state.lr_rule = rule
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1 * (w if scales else 1))
        job.register(model=model, optimizer=opt)
        job.restore()
        for _ in job.steps():
            seen.append((w, opt.param_groups[0]["lr"], job.state.rescaled))
            model(torch.ones(1, 2)).sum().backward()
            opt.step()
    return seen


@pytest.mark.parametrize("rule,scales,lrs,rescaled", [
    ("auto", True, {1: 0.1, 2: 0.2}, "auto:linear"),
    ("auto", False, {1: 0.1, 2: 0.1}, "auto:none"),  # as the script runs under torchrun
    ("linear", False, {1: 0.1, 2: 0.2}, "linear"),  # --lr-scaling linear: Eq. 7 whatever it builds
    ("none", True, {1: 0.1, 2: 0.1}, "none"),
])
def test_the_lr_at_a_new_size_follows_the_rule(tmp_path, monkeypatch, rule, scales, lrs, rescaled):
    seen = _flat_segments(tmp_path, monkeypatch, rule, scales)
    assert [w for w, _, _ in seen] == [1, 1, 1, 2, 2, 1, 1]
    for w, lr, _ in seen:
        assert lr == pytest.approx(lrs[w], rel=1e-12)
    assert seen[0][2] is None  # no resize before the first segment
    for i in (3, 5):  # each segment after a resize: the rule and the LR it left
        name, lr = seen[i][2]
        assert name == rescaled and lr == pytest.approx(lrs[seen[i][0]], rel=1e-12)


def test_relaunched_of_a_script_is_written_at_its_first_step_with_the_rule(tmp_path):
    events = EventLog(tmp_path / "events.jsonl")
    m = Meter(events, RULES["linear"], lr_by_script=True)
    m.pending = PendingResize(1, 2, step=10, t_request=100.0, lr_last=0.0125, segment=0)
    assert m.relaunched(1, t_launch=101.0) is None
    first = as_event({"kind": "first_step", "time": 104.0, "world_size": 2, "step": 11, "lr": 0.013,
                      "rule": "auto:linear", "lr_rule": 0.025})
    rel = m.first_step(1, first, t_launch=101.0, prelaunched=False)
    assert rel is not None
    (saved,) = read_events(tmp_path / "events.jsonl", kind="relaunched")
    assert (saved["lr_new"], saved["rule"], saved["lr_rule"], saved["time"]) == (0.013, "auto:linear", 0.025, 101.0)
    lines: list[str] = []
    Display(lines.append, 100, bar=False).resized(1, 2, 10, rel.lr_last, rel.lr_new, rule=rel.rule,
                                                  lr_rule=rel.lr_rule)
    assert lines == ["resize 1 -> 2 after step 10: LR 0.0125 -> 0.013 (LR set by the script: 0.013; "
                     "Eq. 7 would give 0.025)"]


@pytest.mark.parametrize("rule,lr_new,words", [
    (None, 0.2, "(Eq. 7: x2)"),  # the built-in model's line, as before
    ("auto:linear", 0.2, "(Eq. 7: x2)"),
    ("auto:none", 0.1, "(kept: the script's LR does not change with the workers (--lr-scaling auto))"),
    ("auto:unknown", 0.2, "(Eq. 7: x2; the script's own scaling not seen yet (--lr-scaling auto))"),
    ("none", 0.1, "(kept: --lr-scaling none)"),
    ("on_resize", 0.15, "(set by the script (on_resize, reset callbacks): x1.5)"),
])
def test_the_resize_line_names_the_rule(rule, lr_new, words):
    lines: list[str] = []
    Display(lines.append, 100, bar=False).resized(1, 2, 10, 0.1, lr_new, rule=rule,
                                                  lr_rule=None if rule in (None, "on_resize") else lr_new)
    assert lines == [f"resize 1 -> 2 after step 10: LR 0.1 -> {lr_new:.4g} {words}"]


def test_epoch_batches_and_start_batch_carry_an_epoch_across_a_resize(monkeypatch):
    n, batch, epoch = 48, 4, 3  # 12 batches an epoch at 1 worker, 6 at 2
    one = StubJob(0, 1)
    _, (pos,) = _steps(monkeypatch, [one], n, batch, epoch, k=5)  # 20 samples at 1 worker
    resumed = StubJob(0, 2, position=DataPosition())
    resumed._position.load(pos.state())
    s = _sampler(monkeypatch, resumed, n, num_replicas=2, rank=0)
    s.set_epoch(epoch)
    loader = torch.utils.data.DataLoader(list(range(n)), batch_size=batch, sampler=s)
    fracs = []
    for batch_idx, _ in enumerate(loader):
        assert len(loader) == 4  # the rest of the epoch: 28 samples, 14 for this rank
        fracs.append((s.start_batch + batch_idx) / s.epoch_batches)
    assert s.epoch_batches == 6 and s.start_batch == 2.5  # 20 samples done: 2.5 batches of 8
    assert fracs == pytest.approx([(20 + 8 * i) / n for i in range(4)], abs=1e-12)  # from where it stood
    s.set_epoch(epoch + 1)  # the next epoch: a whole one
    assert [s.start_batch, s.epoch_batches] == [0, 6]
    for batch_idx, _ in enumerate(loader):
        assert s.start_batch == 0 and len(loader) == s.epoch_batches == 6
    plain = _sampler(monkeypatch, StubJob(0, 2, elastic=False), n, num_replicas=2, rank=0)
    next(iter(torch.utils.data.DataLoader(list(range(n)), batch_size=5, sampler=plain, drop_last=True)))
    assert (plain.start_batch, plain.epoch_batches) == (0, 24 // 5)  # outside the tool: torch's loader


@pytest.mark.parametrize("args,needle", [
    (["--lr-scaling", "auto"], "--lr-scaling auto follows a --script's own LR scaling"),
    (["--lr-scaling", "fast"], "Invalid value for '--lr-scaling'"),
])
def test_lr_scaling_bad_input_is_one_line(cli_inproc, tmp_path, args, needle):
    run = tmp_path / "run"
    p = cli_inproc("train", *args, "--run-dir", str(run))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    (line,) = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert needle in line
    assert not run.exists()


def test_lr_scaling_at_a_resume_is_one_line(cli_inproc, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    p = cli_inproc("train", "--resume", str(run), "--lr-scaling", "none")
    assert p.returncode == 2 and "--resume continues a run with its own LR rule: drop --lr-scaling" in p.stderr
    assert list(run.iterdir()) == []
