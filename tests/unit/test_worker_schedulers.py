"""Eq. 7 for a script's own LR schedulers: after a resize from w to w', the LR of every later step
is w'/w times what the same schedule gives at that step without the resize.

Property test over the schedulers of ``torch.optim.lr_scheduler`` a user is likely to use and
seeded random resize points (1-3 resizes, worlds 1-8). A resize is what the worker library does:
the state dicts of the optimizer and the schedulers go through a checkpoint (pickled), a fresh
script builds new ones (with another LR, as a script that sets ``lr * world`` does), loads the
state and rescales it with ``scale_lr_state``.
"""

from __future__ import annotations

import io
import math
import random

import pytest
import torch
from torch.optim import lr_scheduler as L

from elastic_ring.worker.lr import scale_lr_state

STEPS = 60


def _plateau_metric(step: int) -> float:
    # improves, then stalls: ReduceLROnPlateau cuts the LR a few times within STEPS
    return 1.0 / (1 + min(step, 12))


def _build(kind: str, lr: float):
    p = torch.nn.Parameter(torch.zeros(3))
    q = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([{"params": [p]}, {"params": [q], "lr": lr * 0.5}], lr=lr, momentum=0.9)
    if kind == "StepLR":
        s = L.StepLR(opt, step_size=7, gamma=0.5)
    elif kind == "MultiStepLR":
        s = L.MultiStepLR(opt, milestones=[10, 25, 40], gamma=0.3)
    elif kind == "CosineAnnealingLR":
        s = L.CosineAnnealingLR(opt, T_max=25, eta_min=lr * 0.01)  # wraps past T_max too
    elif kind == "OneCycleLR":
        s = L.OneCycleLR(opt, max_lr=[lr * 4, lr * 2], total_steps=STEPS + 1)
    elif kind == "LambdaLR":
        s = L.LambdaLR(opt, lr_lambda=lambda e: 1.0 / (1 + 0.1 * e))
    elif kind == "LinearLR+SequentialLR":
        warm = L.LinearLR(opt, start_factor=0.1, total_iters=8)
        decay = L.CosineAnnealingLR(opt, T_max=STEPS - 8, eta_min=lr * 0.05)
        s = L.SequentialLR(opt, [warm, decay], milestones=[8])
    elif kind == "ReduceLROnPlateau":
        s = L.ReduceLROnPlateau(opt, factor=0.5, patience=2, min_lr=lr * 0.02)
    elif kind == "ExponentialLR":
        s = L.ExponentialLR(opt, gamma=0.97)
    elif kind == "PolynomialLR":
        s = L.PolynomialLR(opt, total_iters=40, power=2.0)
    elif kind == "CyclicLR":
        s = L.CyclicLR(opt, base_lr=lr * 0.1, max_lr=lr, step_size_up=6)
    else:
        raise AssertionError(kind)
    return opt, s


def _step(s, step: int) -> None:
    if isinstance(s, L.ReduceLROnPlateau):
        s.step(_plateau_metric(step))
    else:
        s.step()


def _lrs(opt) -> list[float]:
    return [float(g["lr"]) for g in opt.param_groups]


def _reference(kind: str, lr: float) -> list[list[float]]:
    opt, s = _build(kind, lr)
    out = []
    for step in range(1, STEPS + 1):
        out.append(_lrs(opt))  # the LR this step's optimizer.step() uses
        opt.step()
        _step(s, step)
    return out


def _through_checkpoint(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)


def _resized_run(kind: str, lr: float, plan: dict[int, int], w0: int) -> tuple[list[list[float]], list[float]]:
    """LRs used at each step with resizes after the steps in ``plan`` (step -> new world)."""
    opt, s = _build(kind, lr * w0)
    world, out, factors = w0, [], []
    for step in range(1, STEPS + 1):
        out.append(_lrs(opt))
        factors.append(world / w0)
        opt.step()
        _step(s, step)
        if step in plan:
            saved = _through_checkpoint({"opt": opt.state_dict(), "sched": [s.state_dict()]})
            new = plan[step]
            opt, s = _build(kind, lr * 123.0)  # a fresh script: whatever LR it builds with
            opt.load_state_dict(saved["opt"])
            s.load_state_dict(saved["sched"][0])
            scale_lr_state(opt, [s], new / world)
            world = new
    return out, factors


KINDS = ["StepLR", "MultiStepLR", "CosineAnnealingLR", "OneCycleLR", "LambdaLR",
         "LinearLR+SequentialLR", "ReduceLROnPlateau", "ExponentialLR", "PolynomialLR", "CyclicLR"]


@pytest.mark.parametrize("kind", KINDS)
def test_every_later_step_gets_eq7_times_the_unresized_schedule(kind):
    rnd = random.Random(hash(kind) % 1000)
    lr = 0.05
    ref = _reference(kind, lr)
    for trial in range(6):
        w0 = rnd.randint(1, 4)
        points = sorted(rnd.sample(range(1, STEPS), rnd.randint(1, 3)))
        plan = {p: rnd.randint(1, 8) for p in points}
        got, factors = _resized_run(kind, lr, plan, w0)
        for step, (lrs, f, base) in enumerate(zip(got, factors, ref), start=1):
            want = [w0 * f * b for b in base]
            assert lrs == pytest.approx(want, rel=1e-9, abs=1e-15), (
                f"{kind}: w0={w0} plan={plan} step {step}: LR {lrs}, want {want}")
        # the schedule really moves (a constant LR would prove nothing)
        assert len({round(r[0], 12) for r in ref}) > 3


def test_without_the_scheduler_rescale_one_cycle_breaks_eq7():
    """The bug of issue 20: rescaling only the optimizer's current LR lasts one step."""
    lr, w0, plan = 0.05, 1, {10: 2}
    ref = _reference("OneCycleLR", lr)
    opt, s = _build("OneCycleLR", lr)
    for step in range(1, 12):
        opt.step()
        _step(s, step)
        if step == 10:
            for g in opt.param_groups:  # the old rule: the current LR only
                g["lr"] *= 2
    assert not math.isclose(_lrs(opt)[0], 2 * ref[11][0], rel_tol=1e-6)
