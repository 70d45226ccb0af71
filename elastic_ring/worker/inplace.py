"""In-place resizes, the worker's side: the controller's action files and the pause and reset.

Under ``--relaunch inplace`` (Horovod Elastic) or the Ray backend (ring re-formed by the
controller) a resize does not end the worker processes: the ranks pause between two steps, rank 0
reads the controller's word for the segment's end (:func:`inplace_action_file`), and the ring is
re-formed at the new size in the same processes (:class:`InPlaceMixin`, mixed into
:class:`elastic_ring.worker.api.Job`, whose attributes it uses).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from elastic_ring import protocol

INPLACE_ENV = "ELASTIC_RING_INPLACE"  # "1": running under Horovod Elastic (--relaunch inplace)
# INPLACE_ENV = RING_BY_CONTROLLER: resized in place, but the controller re-forms the ring itself
# (the Ray backend: it serves the rendezvous and hands every member its new Horovod environment)
RING_BY_CONTROLLER = "controller"
MEMBER_ENV = "ELASTIC_RING_MEMBER"  # this worker's name in a resize action's "members"


class Retired(BaseException):
    """Raised out of ``job.steps()`` in a worker whose slot a controller-driven in-place shrink
    removed: it has left the ring; its process may serve again (the Ray backend's actor)."""


def inplace_action_file(run_dir: Path, segment: int) -> Path:
    """The controller's word to paused in-place workers at the end of ``segment`` (a JSON object:
    ``{"action": "exit"}`` or ``{"action": "resize", "to": N, "segment": S, "stop_at": T}``).

    A resize written *ahead* (before the pause, for a scheduled resize) also names ``at_step``,
    the step it applies at: rank 0 takes it only at a scheduled stop at that step, and only by
    renaming the file to :func:`taken_action_file` (the controller withdraws it the same way, so
    exactly one of the two wins; see :func:`take_ahead_action`)."""
    return protocol.control_dir(Path(run_dir)) / f"inplace-{segment}.json"


def withdraw_action_ahead(run_dir: Path, segment: int) -> bool:
    """Withdraw the in-place action the controller wrote ahead for ``segment`` (renamed aside, so
    rank 0 never takes it): True when withdrawn, False when rank 0 has taken it already (the file
    is gone)."""
    src = inplace_action_file(run_dir, segment)
    try:
        os.rename(src, src.with_name(f"inplace-{segment}.withdrawn.json"))
    except FileNotFoundError:
        return False
    return True


def taken_action_file(run_dir: Path, segment: int) -> Path:
    """Where rank 0 moves an action written ahead when it takes it."""
    return protocol.control_dir(Path(run_dir)) / f"inplace-{segment}.taken.json"


def take_ahead_action(run_dir: Path, segment: int) -> bool:
    """Rank 0 takes the action written ahead for ``segment`` (True), unless the controller
    withdrew it first (the file is gone: False). One rename of the same file: one winner."""
    try:
        os.rename(inplace_action_file(run_dir, segment), taken_action_file(run_dir, segment))
    except FileNotFoundError:
        return False
    return True


class InPlaceMixin:
    """The pause between two steps and the re-formed ring (part of :class:`~elastic_ring.worker.api.Job`)."""

    def on_hosts_updated(self, timestamp: float, update_res: Any) -> None:
        """Horovod Elastic's driver (on rank 0): the discovery script reports other slots now."""
        self._hosts_updated_at = timestamp

    def _pause_inplace(self, poll_s: float = 0.05) -> dict[str, Any]:
        """All ranks wait, between two steps, for the controller's word on this segment's end.

        Rank 0 reads ``control/inplace-<segment>.json``: ``{"action": "exit"}`` (a Ctrl-C: checkpoint
        and leave), or ``{"action": "resize", "to": N, "segment": S, "stop_at": T}``, acted on once
        Horovod's driver has told rank 0 that the hosts changed (then the driver has the new slot
        assignment, and a new worker is being started). An action written ahead names ``at_step``:
        rank 0 takes it at a scheduled stop at that step (under Horovod Elastic, once the driver has
        reported the hosts), else waits for the controller's word. Rank 0's decision is broadcast
        each poll.
        The notification must be for the discovery file the action refers to (``hosts_written``:
        Horovod stamps it with the second the driver saw the change; a notification about a slot
        count reported ahead for a scheduled resize may arrive before the pause, which is fine).
        """
        hvd = self.hvd
        while True:
            decision = None
            if self.rank == 0:
                act = protocol.read_json(inplace_action_file(self.run_dir, self.segment))
                updated = self._hosts_updated_at
                if isinstance(act, dict) and "at_step" in act:  # written ahead
                    if (act.get("action") == "resize" and int(act["at_step"]) == self.step
                            and self.stop_reason == "scheduled" and (self.ring_by_controller or (
                                updated is not None and updated >= float(act.get("hosts_written", 0.0)) - 1.0))
                            and take_ahead_action(self.run_dir, self.segment)):
                        decision = act
                        for go, rec in (act.get("go_files") or {}).items():  # its joiners' word
                            protocol.write_json_atomic(Path(go), rec)
                elif isinstance(act, dict) and (act.get("action") == "exit" or (
                        act.get("action") == "resize" and (self.ring_by_controller or (
                            updated is not None and updated >= float(act.get("hosts_written", 0.0)) - 1.0)))):
                    decision = act
            decision = hvd.broadcast_object(decision, root_rank=0, name="inplace_action")
            if decision is not None:
                return decision
            time.sleep(poll_s)

    def _reset_inplace(self, action: dict[str, Any]) -> None:
        """Re-form the ring at the new size in this process (Horovod Elastic's reset), then sync.

        ``hvd.shutdown()`` + ``hvd.init()``: the driver assigns the new ranks (a worker whose slot
        was removed is ended by Horovod inside ``init``); a new worker runs :meth:`restore`, whose
        collectives match :meth:`_sync` here: rank 0 broadcasts the counters (step, sample cursor,
        LR factor, extras, segment and stop step), the optimizer state and the weights; then every
        rank rescales the LR by the run's rule (Eq. 7) through :meth:`_rescale`. The sample cursor
        is global, so the next step's shares are re-partitioned over the new ranks: every sample of
        an epoch is still used once, every step done once.
        """
        hvd = self.hvd
        t0 = time.time()
        meta = self._live_meta(next_segment=int(action["segment"]), stop_at=int(action["stop_at"]))
        hvd.shutdown()
        self._hosts_updated_at = None
        if self.ring_by_controller:  # the controller names every member's new Horovod environment
            mine = (action.get("members") or {}).get(os.environ.get(MEMBER_ENV, ""))
            if mine is None:
                raise Retired(f"not a member of segment {action['segment']}")
            os.environ.update({k: str(v) for k, v in mine.items()})
        hvd.init()
        self._marks = {"reset_request": t0, "hvd_reinit": time.time()}
        self._t_start = t0
        self._set_rank(hvd)
        # a ring of one: rank 0 alone, whose state is the state (a broadcast to itself is a no-op)
        self._sync(meta if self.rank == 0 else None, local=hvd.size() == 1 and self.ring_by_controller)
        self._marks["sync"] = time.time()

    def _live_meta(self, next_segment: int, stop_at: int) -> dict[str, Any]:
        return {"step": self.step, "cursor": self._sampler.cursor if self._sampler is not None else 0,
                "world_size": self.size, "lr_factor": self.lr_factor, "extras": self._saved_extras(),
                "schedulers": [sch.state_dict() for sch in self._schedulers],
                "segment": next_segment, "stop_at": stop_at}
