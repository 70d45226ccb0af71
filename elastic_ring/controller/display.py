"""What `elastic-ring train` shows while it runs: a progress bar on a terminal (rich), else one
line per throughput window; a line per segment and per evaluation either way."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

from elastic_ring.events.api import Evaluation, Throughput

# what the workers' LR rule at a resize was (events.api.FirstStep.rule), for the resize line
_RULE_NAMES = {"linear": "Eq. 7", "sqrt": "the sqrt rule", "none": "--lr-scaling none",
               "auto:linear": "Eq. 7", "auto:unknown": "Eq. 7", "auto:sqrt": "the sqrt rule",
               "auto:none": "the script's rule (LR kept)", "on_resize": "the script's on_resize",
               "adasum": "Adasum (LR kept)", "constant-batch": "constant-batch (LR kept)"}


def rule_words(rule: str | None, factor: float) -> str:
    """How the LR changed at a resize under ``rule`` (None: the built-in model's Eq. 7)."""
    if rule in (None, "linear"):
        return f"Eq. 7: x{factor:.3g}"
    if rule == "sqrt":
        return f"sqrt rule: x{factor:.3g}"
    if rule in ("none", "auto:none"):
        return ("kept: the script's LR does not change with the workers (--lr-scaling auto)"
                if rule == "auto:none" else "kept: --lr-scaling none")
    if rule == "auto:unknown":
        return f"Eq. 7: x{factor:.3g}; the script's own scaling not seen yet (--lr-scaling auto)"
    if rule.startswith("auto:"):  # the script's own scaling, named by the start's line
        return {"auto:linear": f"Eq. 7: x{factor:.3g}", "auto:sqrt": f"sqrt rule: x{factor:.3g}"}.get(
            rule, f"the script's own scaling: x{factor:.3g}")
    if rule == "adasum":
        return "kept: the optimizer uses Adasum"
    if rule == "constant-batch":
        return "kept: constant-batch"
    return f"set by the script (on_resize, reset callbacks): x{factor:.3g}"


def layout_words(constant_batch: tuple[int, int] | None, world: int) -> str | None:
    """A constant global batch ``(global batch, micro-batch)``'s micro-batch layout at ``world``
    workers, as a resize line shows it (None: another LR rule)."""
    if constant_batch is None:
        return None
    from elastic_ring.worker.accumulate import Layout

    g, b = constant_batch
    if not b:  # a script's: its micro-batch is its own batch
        return f"global batch {g} shared by {world} worker(s) in the script's micro-batches"
    return Layout(g, b, world).describe()


class Display:
    def __init__(self, out: Callable[[str], None], total_steps: int, bar: bool) -> None:
        from elastic_ring.protocol import NO_STEP_LIMIT

        self.out, self.bar = out, bar
        self.total_steps = total_steps if total_steps < NO_STEP_LIMIT else None  # None: the script's loop says
        self._unbounded = NO_STEP_LIMIT
        self._progress = None
        self._task = None

    def start(self, step: int) -> None:
        if not self.bar:
            return
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        self._progress = Progress(
            TextColumn("[bold]train"), BarColumn(), TextColumn("step {task.completed}/{task.total}"),
            TextColumn("w={task.fields[world]}"), TextColumn("{task.fields[ips]} img/s"),
            TextColumn("loss {task.fields[loss]}"), TimeRemainingColumn(), transient=False)
        self._task = self._progress.add_task("train", total=self.total_steps, completed=step,
                                             world="-", ips="-", loss="-")
        self._progress.start()

    def segment(self, index: int, world: int, first_step: int, stop_at: int, log: Path) -> None:
        """A segment started (or went on in place) at ``world`` workers."""
        if self._progress is not None:
            self._progress.update(self._task, world=world)
        else:
            to = f"to {stop_at}" if self.total_steps is not None or stop_at < self._unbounded else "on"
            self.out(f"segment {index}: {world} worker(s) from step {first_step} {to} (log: {log})")

    def resized(self, from_workers: int, to_workers: int, step: int, lr_last: float, lr_new: float,
                decays: tuple[int, ...] = (), rule: str | None = None, lr_rule: float | None = None,
                layout: str | None = None) -> None:
        """The LR rescale of a resize (Eq. 7), and a schedule decay that falls on the same step
        (else the LR a line later looks to have moved against the rule). A script's: ``lr_new``
        is the LR its first step used, ``rule`` the rule the workers applied and ``lr_rule`` the
        LR it gave (another ``lr_new``: the script set its own). ``layout``: a constant global
        batch's micro-batches at the new size (its LR is not rescaled)."""
        if rule == "torchrun":  # a script of torchrun's contract: no step counted, its LR its own
            self.out(f"resize {from_workers} -> {to_workers}: every worker stopped and started again, the "
                     f"script resumed from its own snapshot (its LR: {lr_new:.4g})")
            return
        factor = lr_new / lr_last if lr_last else float("nan")
        how = rule_words(rule, factor)
        if lr_rule is not None and not math.isclose(lr_new, lr_rule, rel_tol=1e-6, abs_tol=1e-12):
            by = _RULE_NAMES.get(rule or "linear", "the script's own scaling")
            how = f"LR set by the script: {lr_new:.4g}; {by} would give {lr_rule:.4g}"
        elif layout is not None:
            how = f"constant-batch: {layout}"
        line = (f"resize {from_workers} -> {to_workers} after step {step}: LR {lr_last:.4g} -> {lr_new:.4g} "
                f"({how})")
        if layout is not None and how.startswith("constant-batch") and math.isclose(lr_new, lr_last):
            line = f"resize {from_workers} -> {to_workers} after step {step}: LR {lr_last:.4g} unchanged ({how})"
        if step in decays:
            line += f"; the schedule's LR decay after step {step} applies from step {step + 1} as well"
        self.out(line)

    def throughput(self, ev: Throughput) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=ev.step, world=ev.world_size,
                                  ips=f"{ev.images_per_s:.0f}", loss=f"{ev.loss:.3f}")
        else:
            of = f"/{self.total_steps}" if self.total_steps else ""
            self.out(f"step {ev.step}{of}  workers {ev.world_size}  "
                     f"{ev.images_per_s:.1f} img/s  {ev.steps_per_s:.2f} steps/s  "
                     + (f"loss {ev.loss:.4f}  " if ev.loss == ev.loss else "")  # nan: not recorded
                     + f"lr {ev.lr:.4g}")

    def evaluation(self, ev: Evaluation) -> None:
        self.out(f"test accuracy {100 * ev.test_accuracy:.2f}% (loss {ev.test_loss:.4f}) at step {ev.step}")

    def notice(self, message: str) -> None:
        self.out(f"note: {message}")

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
