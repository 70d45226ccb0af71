"""In-place resizes: the controller's word to paused workers, as files in the run folder.

Under ``--relaunch inplace`` (Horovod Elastic) or the Ray backend (ring re-formed by the
controller) a resize does not end the worker processes: the ranks pause between two steps, rank 0
reads the controller's word for the segment's end (:func:`inplace_action_file`), and the ring is
re-formed at the new size in the same processes (:meth:`elastic_ring.worker.ring.Ring.await_action`
and ``reform``). The controller writes and withdraws these files; rank 0 takes them.
"""

from __future__ import annotations

import os
from pathlib import Path

from elastic_ring import protocol


def inplace_action_file(run_dir: Path, segment: int) -> Path:
    """The controller's word to paused in-place workers at the end of ``segment`` (a JSON object:
    ``{"action": "exit"}`` or ``{"action": "resize", "to": N, "segment": S, "stop_at": T}``).

    A resize written *ahead* (before the pause, for a scheduled resize) also names ``at_step``,
    the step it applies at: rank 0 takes it only at a scheduled stop at that step, and only by
    renaming the file to :func:`taken_action_file` (the controller withdraws it the same way, so
    exactly one of the two wins; see :func:`take_ahead_action`)."""
    return protocol.control_dir(Path(run_dir)) / f"inplace-{segment}.json"


def write_resize_action(run_dir: Path, segment: int, launch, t: float, **extra) -> None:
    """Write the controller's resize word for the end of ``segment`` (atomically): the new ring's
    size, segment and stop step of ``launch`` (a :class:`~elastic_ring.controller.backends.api.
    SegmentLaunch`), the time ``t``, and what the backend adds (``members``, ``at_step`` for one
    written ahead, ``go_files``, ``hosts_written``, ``rollback_to``)."""
    protocol.write_json_atomic(inplace_action_file(run_dir, segment), {
        "action": "resize", "to": launch.world, "segment": launch.segment, "stop_at": launch.stop_at,
        "time": t, **extra})


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
