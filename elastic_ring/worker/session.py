"""The job of this worker process: the one ``elastic.init()`` made, found by the drop-ins
(``elastic.DistributedSampler``, Horovod Elastic's names) and by the entry point.

A process runs one job at a time. It starts another (:func:`start_over`) when the same process
serves the next segment: an epoch-loop script run again in a ring re-formed in place, or a Ray
actor's process that left a ring and now serves a new one (:func:`reset`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class _Process:
    job: Any = None  # the Job or PlainJob of the script's elastic.init()
    init_called: bool = False  # the script called elastic.init() (the entry point's watchdog reads it)
    carried: Any = None  # (ring, segment, stop_at, start-up) for the next init(): the ring re-formed in place
    launch: Any = None  # the LaunchInfo the worker entry was started with (None: not started by elastic-ring)


_PROCESS = _Process()


def launched(info: Any) -> None:
    """The worker entry was started with ``info`` (a :class:`~elastic_ring.protocol.LaunchInfo`:
    its launch, ``seam.Start``, and the run's settings): ``elastic.init()`` makes the job of it."""
    _PROCESS.launch = info


def launch() -> Any:
    """The LaunchInfo this process was started with; None outside ``elastic-ring train``."""
    return _PROCESS.launch


def current() -> Any:
    """This process's job (None before ``elastic.init()``)."""
    return _PROCESS.job


def init_called() -> bool:
    return _PROCESS.init_called


def init_begins() -> None:
    """``elastic.init()`` under the controller is under way (it calls ``hvd.init()`` itself)."""
    _PROCESS.init_called = True


def started(job: Any) -> None:
    """``elastic.init()`` made ``job``."""
    _PROCESS.job = job


def take_carried() -> Any:
    """The ring (and the segment) a previous job of this process left formed, once."""
    carried, _PROCESS.carried = _PROCESS.carried, None
    return carried


def start_over(ring: Any, segment: int, stop_at: int, start: Any) -> None:
    """The next run of the script in this process joins ``ring`` (re-formed in place for
    ``segment``, which stops at ``stop_at``; ``start``: the reset's start-up phases so far): its
    ``elastic.init()`` makes a new job over it."""
    _PROCESS.job, _PROCESS.carried = None, (ring, segment, stop_at, start)


def reset() -> None:
    """A new job in this process, from nothing (a Ray actor serving again after it left a ring)."""
    global _PROCESS
    _PROCESS = _Process()
