"""The steps of one segment and the agreement on where they stop (:class:`StepLoopMixin`, mixed
into :class:`elastic_ring.worker.api.Job`, whose attributes it uses).

Every ``control_every`` steps all ranks start one allreduce of rank 0's stop flag (the controller's
stop file) and of any rank's ``job.finish()``; it travels with the next step's gradients and is read
one check later, so all ranks stop after the same step without a blocking collective between steps.
"""

from __future__ import annotations

import time
from typing import Iterator

from elastic_ring import protocol
from elastic_ring.worker.progress import _Window


class StepLoopMixin:
    """One segment's steps and the stop vote (part of :class:`~elastic_ring.worker.api.Job`)."""

    def _segment_steps(self) -> Iterator[int]:
        """The steps of one segment (one world size), up to ``stop_at`` or an agreed stop."""
        info = self.info
        self._window = _Window()
        last_loss = float("nan")
        step = self.step
        reason = "finished" if self.stop_at >= self.total_steps else "scheduled"
        first = True
        vote = None  # the stop vote in flight (see _start_stop_vote)
        loader = self._sampler if self._sampler is not None else None
        while step < self.stop_at:
            step += 1
            self._current = step
            if first:
                self._lr_used = self.current_lr()  # before the step: what it runs with unless it
                self._lr_stepped = None            # sets the LR itself (seen by the step hook)
            yield step
            self.step = step
            if loader is not None and loader._loader:
                loader.cursor += loader.batch_size * self.size
            self._heartbeat(step, "step")
            w = self._window
            w.steps += 1
            now = time.time()
            if first:  # start-up cost ends with the first step of a segment
                first = False
                self._emit_first_step(step, now)
            elif w.steps >= info.throughput_window or step == self.stop_at:
                last_loss, now = self._close_window(step)
            self._between_steps(step, now)
            if step < self.stop_at and step % info.control_every == 0:
                # the vote started at the previous check has travelled with this step's gradients
                if vote is not None:
                    stop, early = self._vote_result(vote)
                    if early or stop:
                        vote = None
                        reason = "finished" if early else "requested"
                        break
                vote = self._start_stop_vote()
        if vote is not None:  # every rank has the same vote in flight: complete it
            if self._vote_result(vote)[1] and step < self.total_steps:
                reason = "finished"  # the early stop lands at this segment's last step
        self._decided = time.time()
        self.stop_reason = reason
        self.finished = step >= self.total_steps or reason == "finished"
        self.last_loss = last_loss

    def _start_stop_vote(self):
        """Start, without waiting, the allreduce of rank 0's stop flag (the stop file exists).

        It is completed at the next check (``_vote_result``), one check later: meanwhile it is
        negotiated and reduced by Horovod's background thread together with the next step's
        gradients, so the agreement costs no collective of its own on the training thread (a
        blocking allreduce between steps did: a full negotiation round, ~5-8% of a step on a
        loaded CPU). Every rank starts and completes the same votes at the same steps, so all
        ranks still stop after the same step; a stop lands ``control_every`` steps later.
        """
        import torch

        flag = 1.0 if self.rank == 0 and protocol.stop_file(self.run_dir, self.segment).exists() else 0.0
        early = 1.0 if self._finish_requested else 0.0  # job.finish() on any rank
        return self.hvd.allreduce_async(torch.tensor([flag, early]), op=self.hvd.Sum, name="stop_flag")

    def _vote_result(self, handle) -> tuple[bool, bool]:
        """(the controller asked for a stop, some rank called job.finish())."""
        v = self.hvd.synchronize(handle)
        return bool(v[0].item() > 0), bool(v[1].item() > 0)
