"""What a worker tells while it trains: throughput windows, first-step phases, evaluations,
the progress file and its heartbeat (:class:`ProgressMixin`, mixed into
:class:`elastic_ring.worker.api.Job`, whose attributes it uses).

Rank 0 writes the events (``events.api``); every rank writes its own heartbeat for the
controller's stall watchdog (``heartbeat``).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any

from elastic_ring import protocol


@dataclass
class _Window:
    t0: float | None = None
    steps: int = 0
    samples: int = 0
    loss_sum: Any = 0.0
    loss_n: int = 0


class ProgressMixin:
    """Events, throughput windows, evaluations and heartbeats (part of :class:`~elastic_ring.worker.api.Job`)."""

    def _emit(self, event) -> None:
        if self._events is not None:
            self._events.write(event)

    def _warn(self, msg: str) -> None:
        print(f"elastic-ring worker: {msg}", file=sys.stderr, flush=True)
        from elastic_ring.events.api import ErrorEvent

        self._emit(ErrorEvent(message=msg, rank=self.rank, segment=self.segment))

    def _heartbeat(self, step: int, phase: str) -> None:
        """Tell the controller's stall watchdog this rank's step and phase (one ``pwrite``)."""
        key = (self.segment, self.rank)
        if self._beat is None or self._beat_key != key:
            from elastic_ring.heartbeat import Heartbeat

            if self._beat is not None:
                self._beat.close()
            self._beat, self._beat_key = Heartbeat(self.run_dir, *key), key
        self._beat.beat(step, phase, time.time())

    def _on_optimizer_step(self, opt, args, kwargs) -> None:
        """Before the registered optimizer's step (a pre-hook, so before Horovod waits there for
        the other ranks' gradients): the heartbeat says this rank is done with its own part of
        the step (phase ``sync``), so a rank hung in its data loader or its forward pass is told
        apart from the ranks waiting for it. Also the LR the step really runs with (the script
        may set it inside the step, or a scheduler may move it after), for ``first_step``."""
        self._heartbeat(self.step, "sync")
        if opt.param_groups:
            self._lr_stepped = float(opt.param_groups[0]["lr"])

    def _emit_first_step(self, step: int, now: float) -> None:
        """The segment's first step is done: its start-up phases (after an in-place reset: the
        reset's) and the LR it ran with; the first throughput window starts now."""
        from elastic_ring.events.api import FirstStep

        self._check_threads()
        phases, prev = {}, self._t_start
        for name, t in self._marks.items():
            phases[name] = round(t - prev, 4)
            prev = t
        self._emit(FirstStep(segment=self.segment, world_size=self.size, step=step,
                             since_launch_s=now - self._t_start,
                             lr=self._lr_stepped if self._lr_stepped is not None else self._lr_used,
                             phases=phases))
        self._window = _Window(t0=time.time())

    def _check_threads(self) -> None:
        """Warn once when the script set torch's thread count over the library's (the cores of
        this host shared by its workers): more threads than cores slow every worker down."""
        import torch

        if self._threads_warned:
            return
        ours, now = protocol.cpu_threads(self.local_size), torch.get_num_threads()
        if now != ours:
            self._threads_warned = True
            if self.rank == 0:
                print(f"elastic-ring worker: the script set torch's threads to {now}; the library's "
                      f"{ours} ({protocol.CPU_THREADS_ENV} sets it) shares this host's cores among its "
                      f"{self.local_size} worker(s)", file=sys.stderr, flush=True)

    def _close_window(self, step: int) -> tuple[float, float]:
        """End the throughput window at ``step``: the ranks' mean loss (one allreduce), the
        ``throughput`` event; returns (that loss, the time the next window starts)."""
        import torch

        from elastic_ring.events.api import Throughput

        hvd, w = self.hvd, self._window
        local = float(w.loss_sum) / w.loss_n if w.loss_n else float("nan")
        mean_loss = float(hvd.allreduce(torch.tensor([local]), op=hvd.Average, name="window_loss").item())
        now = time.time()
        dt = max(now - (w.t0 or now), 1e-9)
        epoch = self._sampler.epoch if self._sampler is not None else 0
        self._emit(Throughput(segment=self.segment, world_size=self.size, step=step, steps=w.steps,
                              seconds=dt, images_per_s=w.samples * self.size / dt,
                              steps_per_s=w.steps / dt, loss=mean_loss, lr=self.current_lr(), epoch=epoch))
        self._window = _Window(t0=now)
        return mean_loss, now

    def _between_steps(self, step: int, now: float) -> None:
        """After ``step``: the evaluation when due (kept out of the throughput window); on rank 0
        the periodic checkpoint and the progress file (at most twice a second)."""
        if self._eval_every and step % self._eval_every == 0 and step < self.total_steps:
            t_eval = time.time()
            self._heartbeat(step, "eval")
            self._evaluate(step)
            if self._window.t0 is not None:
                self._window.t0 += time.time() - t_eval
        if self.rank == 0:
            self._maybe_periodic_checkpoint(step)
            if now - self._last_progress_t > 0.5:
                self._last_progress_t = now
                protocol.write_json_atomic(protocol.control_dir(self.run_dir) / protocol.PROGRESS_FILE,
                                           {"step": step, "segment": self.segment, "time": now})

    def _evaluate(self, step: int) -> None:
        if self._eval_hook is None:
            return
        res = self._eval_hook(step)
        if res and self.rank == 0:
            from elastic_ring.events.api import Evaluation

            self._emit(Evaluation(step=step, test_loss=float(res.get("test_loss", float("nan"))),
                                  test_accuracy=float(res.get("test_accuracy", float("nan"))),
                                  samples=int(res.get("samples", 0))))
