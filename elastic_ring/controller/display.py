"""What `elastic-ring train` shows while it runs: a progress bar on a terminal (rich), else one
line per throughput window; a line per segment and per evaluation either way."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from elastic_ring.events.api import Evaluation, Throughput


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
                decays: tuple[int, ...] = (), layout: str | None = None) -> None:
        """The LR rescale of a resize (Eq. 7), and a schedule decay that falls on the same step
        (else the LR a line later looks to have moved against the rule). ``layout``: a constant
        global batch's micro-batches at the new size (the LR is not rescaled)."""
        factor = lr_new / lr_last if lr_last else float("nan")
        if layout is not None:
            line = (f"resize {from_workers} -> {to_workers} after step {step}: LR {lr_last:.4g} unchanged "
                    f"(constant-batch: {layout})")
        else:
            line = (f"resize {from_workers} -> {to_workers} after step {step}: LR {lr_last:.4g} -> {lr_new:.4g} "
                    f"(Eq. 7: x{factor:.3g})")
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

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
