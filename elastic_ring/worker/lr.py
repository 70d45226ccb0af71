"""Learning-rate rules as pure functions of saved counters, and rescaling strategies (Eq. 7).

The LR at step s (1-based) is ``base * decay(s) * warmup(s)`` where ``base`` is the LR for the
current world size, ``decay(s) = decay_factor ** (number of decay steps < s)`` and the warm-ups are
linear ramps. A resize only changes ``base``: Eq. 7 (``LinearScale``) sets
``base_new = (w_new / w_last) * base_last``, so at any step the new LR is Eq. 7 applied to the LR
the old world would have used, and the decays still fire at the same steps. With
``resize_warmup_steps > 0`` the base ramps from the old to the new value over that many steps.
``constant-batch`` keeps the global batch, so the LR, the same at every world size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol


class ScalingRule(Protocol):
    name: str

    def scale(self, lr: float, w_last: int, w_new: int) -> float: ...


@dataclass(frozen=True)
class LinearScale:
    """Eq. 7 of arXiv 1908.08082 (Goyal et al.'s linear scaling rule)."""

    name: str = "linear"

    def scale(self, lr: float, w_last: int, w_new: int) -> float:
        return (w_new / w_last) * lr


@dataclass(frozen=True)
class SqrtScale:
    name: str = "sqrt"

    def scale(self, lr: float, w_last: int, w_new: int) -> float:
        return math.sqrt(w_new / w_last) * lr


@dataclass(frozen=True)
class NoScale:
    name: str = "none"

    def scale(self, lr: float, w_last: int, w_new: int) -> float:
        return lr


@dataclass(frozen=True)
class ConstantBatch:
    """The global batch stays the same at every world size (the workers accumulate gradients over
    micro-batches: :mod:`elastic_ring.worker.accumulate`), so the LR is not rescaled."""

    name: str = "constant-batch"

    def scale(self, lr: float, w_last: int, w_new: int) -> float:
        return lr


RULES: dict[str, ScalingRule] = {"linear": LinearScale(), "sqrt": SqrtScale(), "none": NoScale(),
                                 "constant-batch": ConstantBatch()}


def initial_base_lr(lr_per_reference: float, reference_batch: int, batch_size: int, world: int) -> float:
    """Linear scaling with the global batch: 0.1 per 128 images -> 0.4 at 4 x 128."""
    return lr_per_reference * batch_size * world / reference_batch


def decay_multiplier(step: int, decay_steps: tuple[int, ...], factor: float) -> float:
    """``factor`` to the number of decay points already passed before ``step``."""
    return factor ** sum(1 for d in decay_steps if step > d)


@dataclass(frozen=True)
class LRState:
    """The saved counters the LR depends on.

    base: LR for the current world at decay multiplier 1.
    ramp_from_base / ramp_start / ramp_steps: a linear ramp of the base after a resize (or from
        ``base / world`` at the start of training); no ramp when ramp_steps == 0.
    """

    base: float
    ramp_from_base: float = 0.0
    ramp_start: int = 0
    ramp_steps: int = 0

    def base_at(self, step: int) -> float:
        if self.ramp_steps <= 0 or step > self.ramp_start + self.ramp_steps:
            return self.base
        frac = (step - self.ramp_start) / self.ramp_steps
        return self.ramp_from_base + (self.base - self.ramp_from_base) * frac

    def lr_at(self, step: int, decay_steps: tuple[int, ...], factor: float) -> float:
        return self.base_at(step) * decay_multiplier(step, decay_steps, factor)

    def resized(self, rule: ScalingRule, w_last: int, w_new: int, at_step: int,
                warmup_steps: int) -> "LRState":
        """The LR state after a resize done after step ``at_step``."""
        current = self.base_at(at_step)
        new_base = rule.scale(current, w_last, w_new)
        if warmup_steps > 0:
            return LRState(new_base, current, at_step, warmup_steps)
        return LRState(new_base)


# ---------------------------------------------------------------------- torch LR schedulers
# Eq. 7 for a script's own ``torch.optim.lr_scheduler``: a scheduler computes each step's LR from
# what it scales from (``base_lrs``, a group's ``initial_lr`` / ``max_lr`` / ``min_lr``, ``eta_min``,
# ``min_lrs``, ``max_lrs``) and, for the chainable ones, from the group's current ``lr``. Scaling
# all of them by the same factor scales the LR of every later step by that factor: the schedule
# goes on as if it had been built for the new world size from the start.

_GROUP_KEYS = ("lr", "initial_lr", "max_lr", "min_lr")  # per param group (OneCycleLR, CyclicLR...)
_SCHED_LISTS = ("base_lrs", "min_lrs", "max_lrs", "_last_lr")  # per scheduler, one per group
_SCHED_SCALARS = ("eta_min",)  # CosineAnnealingLR / WarmRestarts: one for all groups


def _sub_schedulers(sched: Any) -> list[Any]:
    subs = getattr(sched, "_schedulers", None)  # SequentialLR, ChainedScheduler
    return list(subs) if isinstance(subs, (list, tuple)) else []


def all_schedulers(schedulers: "list[Any] | tuple[Any, ...]") -> list[Any]:
    """The schedulers and, depth first, the ones they chain (each once)."""
    out: list[Any] = []
    seen: set[int] = set()
    stack = list(schedulers)[::-1]
    while stack:
        s = stack.pop()
        if id(s) in seen:
            continue
        seen.add(id(s))
        out.append(s)
        stack.extend(_sub_schedulers(s)[::-1])
    return out


def scale_lr_state(optimizer: Any, schedulers: "list[Any] | tuple[Any, ...]", factor: float) -> None:
    """Multiply every LR the optimizer's groups and the schedulers hold or scale from by
    ``factor`` (Eq. 7's ``w_new / w_last``), so that the LR of every later step is ``factor``
    times what the same schedule gives at that step without the rescale."""
    groups: list[dict] = []
    if optimizer is not None:
        groups.extend(optimizer.param_groups)
    for s in all_schedulers(schedulers):
        opt = getattr(s, "optimizer", None)
        if opt is not None:
            groups.extend(opt.param_groups)
        for name in _SCHED_LISTS:
            v = getattr(s, name, None)
            if isinstance(v, (list, tuple)):
                setattr(s, name, type(v)(x * factor if isinstance(x, (int, float)) else x for x in v))
        for name in _SCHED_SCALARS:
            v = getattr(s, name, None)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                setattr(s, name, v * factor)
    seen: set[int] = set()
    for g in groups:
        if id(g) in seen:
            continue
        seen.add(id(g))
        for k in _GROUP_KEYS:
            v = g.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                g[k] = v * factor
            elif hasattr(v, "mul_"):  # a tensor LR
                v.mul_(factor)


def rule_factor(rule: ScalingRule, w_last: int, w_new: int) -> float:
    """The multiplicative factor of a scaling rule from ``w_last`` to ``w_new`` workers."""
    return rule.scale(1.0, w_last, w_new)


# ---------------------------------------------------------------------- a script's own rule (auto)
# ``--lr-scaling auto`` (a script's default): the LR follows the script's own dependence on the world
# size, read from the LR its optimizer is built with at each size it ran at (before a checkpoint is
# loaded into it): a script built with ``lr=base * hvd.size()`` scales linearly (Eq. 7), one built
# with ``lr=base`` does not scale (pytorch/examples' mnist under torchrun).

def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)


def _classify(ratio: float, w_last: int, w_new: int) -> str | None:
    """The named rule whose factor from ``w_last`` to ``w_new`` workers is ``ratio`` (None: none)."""
    for name in ("none", "linear", "sqrt"):
        if _close(ratio, rule_factor(RULES[name], w_last, w_new)):
            return name
    return None


def script_rule(built: dict[int, float], w_last: int, w_new: int) -> tuple[str, float]:
    """(the rule's name, its factor) from ``w_last`` to ``w_new`` workers for a script whose
    optimizer was built with LR ``built[w]`` at ``w`` workers: ``auto:<rule>`` where the two
    sizes' LRs are known (their ratio; ``auto:x<ratio>`` when no named rule gives it) or two
    other sizes' name a rule; ``auto:unknown`` with Eq. 7's factor when one size alone was seen."""
    if built.get(w_last) and w_new in built:
        ratio = built[w_new] / built[w_last]
        name = _classify(ratio, w_last, w_new)
        return (f"auto:{name}" if name else f"auto:x{ratio:.4g}"), ratio
    sizes = sorted(w for w, lr in built.items() if lr)
    if len(sizes) >= 2:
        a, b = sizes[0], sizes[-1]
        name = _classify(built[b] / built[a], a, b)
        if name:
            return f"auto:{name}", rule_factor(RULES[name], w_last, w_new)
    return "auto:unknown", rule_factor(RULES["linear"], w_last, w_new)
