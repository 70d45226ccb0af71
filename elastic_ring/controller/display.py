"""What `elastic-ring train` shows while it runs: a progress bar on a terminal (rich), else one
line per throughput window; a line per segment and per evaluation either way."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable


class Display:
    def __init__(self, out: Callable[[str], None], total_steps: int, bar: bool) -> None:
        from elastic_ring.worker.hvd_elastic import NO_STEP_CAP

        self.out, self.total_steps, self.bar = out, total_steps, bar
        no_cap = isinstance(total_steps, int) and total_steps >= NO_STEP_CAP  # the script's return ends it
        self._of = "" if no_cap else f"/{total_steps}"
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
            to = f"to {stop_at}" if self._of or stop_at < self.total_steps else "on"
            self.out(f"segment {index}: {world} worker(s) from step {first_step} {to} (log: {log})")

    def throughput(self, ev: dict[str, Any]) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=ev["step"], world=ev["world_size"],
                                  ips=f"{ev['images_per_s']:.0f}", loss=f"{ev['loss']:.3f}")
        else:
            self.out(f"step {ev['step']}{self._of}  workers {ev['world_size']}  "
                     f"{ev['images_per_s']:.1f} img/s  {ev['steps_per_s']:.2f} steps/s  "
                     f"loss {ev['loss']:.4f}  lr {ev['lr']:.4g}")

    def evaluation(self, ev: dict[str, Any]) -> None:
        self.out(f"test accuracy {100 * ev['test_accuracy']:.2f}% (loss {ev['test_loss']:.4f}) "
                 f"at step {ev['step']}")

    def stop(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
