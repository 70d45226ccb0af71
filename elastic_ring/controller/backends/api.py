"""The launch interface between the controller and whatever starts the workers.

The controller owns the segment loop and every decision (when to stop, which size, restart or
give up); a :class:`Backend` owns the processes: it starts a segment's workers, reports their
group's state (:meth:`Backend.monitor`: a :class:`GroupStatus`), reports what is usable, and says
whom it blamed for a failure. Every backend subclasses it: the abilities only
some have (keeping the survivors of a failure, ending single ranks, a slot that comes back) have
defaults there that say "not here", so the controller calls them without asking which backend it
has. A backend whose workers stay across a resize is also an :class:`InPlaceRing` (it tells paused
workers their new size instead of starting new ones), re-forming their ring from the state source
the controller decided (:func:`serve_source`: memory or peer; one from the checkpoint is a new
group, :meth:`Backend.start`). Value types: :class:`SegmentLaunch` (what to start), :class:`Started`
(what came up), :class:`GroupStatus` (how the group is) and :class:`Survival` (survivors that go
on); the segment log's lines of a backend: :func:`note`, :func:`describe`.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from elastic_ring import protocol, seam
from elastic_ring.controller.membership import StateSource

if TYPE_CHECKING:
    from elastic_ring.controller.membership import Cause

ROOT = Path(__file__).resolve().parents[3]  # the folder that holds the elastic_ring package
BUILTIN_TARGET = "elastic_ring.train.worker"


class Handle(Protocol):
    """A running group of workers: ``poll`` is None while it runs, else its exit status."""

    pid: int

    def poll(self) -> int | None: ...
    def kill(self) -> None: ...


class Launcher(Protocol):
    """Starts one command (a launcher such as horovodrun) with its output to a log file."""

    def start(self, cmd: list[str], env: dict[str, str], log_path: Path) -> Handle: ...


@dataclass(frozen=True)
class SegmentLaunch:
    """One segment to start: ``world`` workers running steps up to ``stop_at``; with ``go_file``
    they build everything, then wait for that file (a pre-launch)."""

    world: int
    segment: int
    stop_at: int
    owner: str
    go_file: Path | None = None


@dataclass
class Started:
    handle: Handle
    cmd: list[str] = field(default_factory=list)


class GroupState(str, Enum):
    """How a segment's group of workers is (as torch.distributed.elastic's ``WorkerState``): what
    :meth:`Backend.monitor` reports (``RUNNING``, ``SUCCEEDED``, ``FAILED``) and what the
    controller's watch of a segment ends with, once it knows more than the launcher (``WAITING``:
    paused between two steps for a change, their checkpoint written or their ring to re-form in
    place; ``STALLED``: a hang the watchdog ended; an exit with status 0 before the workers said
    their segment's end is ``FAILED``)."""

    RUNNING = "running"
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STALLED = "stalled"


@dataclass(frozen=True)
class GroupStatus:
    """A group's :class:`GroupState` and, once its launcher exited, its exit status."""

    state: GroupState
    exit_code: int | None = None

    @property
    def failed(self) -> bool:
        """The group failed: a member died, its launcher exited non-zero, or it hung."""
        return self.state in (GroupState.FAILED, GroupState.STALLED)

    def settled(self, ended: bool, hung: bool) -> GroupStatus:
        """This state once the workers' last events are in: an exit with status 0 before they said
        their segment's end (``ended``) is a failure, and a failure of a group the watchdog found
        hung (``hung``) a stall."""
        state = GroupState.FAILED if self.state is GroupState.SUCCEEDED and not ended else self.state
        if state is GroupState.FAILED and hung:
            state = GroupState.STALLED
        return GroupStatus(state, self.exit_code)

    @classmethod
    def of_exit(cls, rc: int | None) -> GroupStatus:
        """The state a launcher's exit status says: running (None), succeeded (0) or failed."""
        if rc is None:
            return cls(GroupState.RUNNING)
        return cls(GroupState.SUCCEEDED if rc == 0 else GroupState.FAILED, rc)


IN_PLACE_SOURCES = (StateSource.MEMORY, StateSource.PEER)  # what a ring re-formed in place goes on from


def serve_source(backend: str, source: StateSource, serves: tuple[StateSource, ...] = IN_PLACE_SOURCES) -> None:
    """Refuse, in one line, a re-form from a state source ``backend`` cannot serve.

    Raises:
        ValueError: ``source`` is not one of ``serves``.
    """
    if source not in serves:
        raise ValueError(f"the {backend} backend cannot re-form from {source.value}: it re-forms from "
                         f"{' or '.join(s.value for s in serves)}")


class Backend:
    """What starts a segment's workers and knows what happened to them; every backend subclasses
    it. The methods up to :meth:`close` each backend has (``monitor`` one for all); the rest are
    abilities of the backends that keep the survivors of a failure (``--survive``: Ray,
    ``--relaunch inplace``), whose defaults here say the backend has none of them."""

    name: str
    refused: str | None = None  # why the last failure's survivors did not go on from memory (the restart says)
    rejoins: bool = False  # after survivors went on, a grow back to the planned size starts a new worker
    over_hosts: bool = False  # in place over the hosts discovery lists (ElasticBackend.run_over_hosts)

    def start(self, launch: SegmentLaunch, log_path: Path) -> Started:
        """Start a segment's workers (a new group: from the checkpoint, or from the start)."""
        raise NotImplementedError

    def monitor(self, handle: Handle) -> GroupStatus:
        """The state of the group ``handle`` holds (one of this backend's :meth:`start`):
        ``RUNNING`` while its launcher runs, then ``SUCCEEDED`` or ``FAILED`` with its exit status
        (each backend's handle turns its own signs of a failure into that status)."""
        return GroupStatus.of_exit(handle.poll())

    def usable_slots(self, want: int) -> int:
        """How many worker slots can be used now (after a failure); may narrow later launches."""
        raise NotImplementedError

    def use_hosts(self, hosts: str) -> None:
        """Start the next segments on ``hosts`` (``a:2,b:1``: host discovery's usable hosts now, the
        first slots taken); only horovodrun over hosts can (the request refuses the others)."""
        raise NotImplementedError(f"the {self.name} backend does not take its hosts from discovery")

    def first_failed_rank(self, log_path: Path | None) -> int | None:
        """The rank the launcher saw fail first, from its log, if it says."""
        raise NotImplementedError

    def failure_detail(self) -> protocol.Failure | None:
        """The failure the backend itself blamed (its rank, node and message), if it did."""
        raise NotImplementedError

    def close(self) -> None:
        """The run is over: end whatever the backend still holds."""
        raise NotImplementedError

    def survivors(self) -> Survival | None:
        """After a failure, before anything is restarted: the survivors go on (the failed members
        ended; the next in-place resize rolls them back to ``Survival.step``), or None: restart from
        the checkpoint (:attr:`refused` says why, where the backend keeps survivors)."""
        return None

    def end_ranks(self, ranks: list[int]) -> bool:
        """End only these ranks' workers (a stall the watchdog found): the others lose a peer and
        the failure goes on as a death would. False when not done (the whole job is then ended)."""
        return False

    def heal_target(self) -> int | None:
        """After the survivors went on fewer: the size to grow back to now, because a warm worker
        waits for a failed member's place; None when none does."""
        return None

    def cluster_change(self, world: int) -> tuple[Cause, int, str] | None:
        """The cluster under a running ring of ``world`` workers changed (Ray: a node joined, or is
        draining): the cause, the size to go on at from the next step boundary, and a line saying
        why; None when nothing changed that the ring follows."""
        return None

    def leave(self, host: str) -> bool:
        """In place on one host: the worker on slot host ``host`` leaves at the next in-place resize
        (a SIGTERM with notice: :mod:`elastic_ring.controller.drains`). False where it cannot (not a
        running worker's slot host, the last worker, or a launcher that cannot choose who leaves)."""
        return False

    def unleave(self) -> None:
        """Withdraw :meth:`leave`'s hosts (the segment failed first)."""

    def shrink_ahead(self, launch: SegmentLaunch, hosts: str | None, at_step: int = 0) -> bool:
        """In place: a shrink to ``launch`` (the next segment) was asked of the running ring (a host
        dropped or drained, a live resize), on ``hosts`` (``a:1,b:2``, host discovery's placement;
        None: none): prepare it while the workers train to the stop they agree on, as a scheduled
        one is (``report_ahead``), for rank 0 to take at that stop (``at_step``: a scheduled
        stop's step; 0, ``seam.AT_NEXT_STOP``: whichever step it lands at). False: nothing prepared."""
        return False


class InPlaceRing(Protocol):
    """A backend whose workers stay across a resize: paused between two steps, they re-form their
    ring at the new size (Horovod Elastic's driver, or a ring the controller forms on Ray). Used by
    the controller's in-place resize strategy (:class:`elastic_ring.controller.resize.InPlace`)."""

    def report_ahead(self, launch: SegmentLaunch) -> None:
        """A scheduled resize to ``launch`` (the next segment) is coming at the end of the running
        segment: prepare it while the workers train."""

    def retract_ahead(self, segment: int) -> bool:
        """Withdraw what ``report_ahead`` prepared for the end of ``segment`` (a live request or an
        interrupt came first). False when the workers already acted on it (then the request or
        interrupt waits for the next segment)."""

    def resize_in_place(self, paused_segment: int, launch: SegmentLaunch, t_launch: float,
                        source: StateSource) -> None:
        """The workers paused at the end of ``paused_segment``: go on as ``launch`` says, from
        ``source`` (the change's :class:`~.membership.StateSource`: memory or peer; anything else
        refused by :func:`serve_source`)."""

    def ask_exit(self, paused_segment: int, t: float) -> None:
        """The workers paused in place: checkpoint and leave (an interrupt)."""


@dataclass(frozen=True)
class Survival:
    """The survivors of a failed worker go on in their processes (a backend that keeps them,
    ``--survive``): they roll back to ``step``, the last step they all hold in
    memory, and re-form their ring at ``world`` workers when the controller resizes them in place
    (:meth:`InPlaceRing.resize_in_place`), of which ``joiners`` are warm spares that take the
    failed workers' places. ``failure``: the failure, named as for a restart
    (:func:`~.survival.blame`). In place over discovered hosts: ``hosts``, the survivors' hosts
    (``a:1,b:2``: the ring re-forms on them), and ``lost``, the hosts that lost a worker (left out
    for their cooldown)."""

    step: int
    world: int
    failure: protocol.Failure
    joiners: int = 0
    waited_s: float = 0.0  # from the failure's detection to every survivor's record
    hosts: str | None = None
    lost: tuple[str, ...] = ()


def rank_named_in_log(log_path: Path | None, pattern: re.Pattern[str]) -> int | None:
    """The rank a launcher's line in a segment's log names (``pattern``'s first group): the first
    to fail, as horovodrun and the local launcher each say it; None without a log or a line."""
    if log_path is None:
        return None
    try:
        m = pattern.search(log_path.read_text(errors="replace"))
    except OSError:
        return None
    return int(m.group(1)) if m else None


def note(log_path: Path, text: str) -> None:
    """Add a backend's line to a segment's log."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as f:
        f.write(text + "\n")


def describe(tag: str, segment: int, rows: list[str]) -> str:
    """The segment log's line naming each worker (``rows``: ``rank R: NAME pid P ...``, by rank)."""
    return f"[{tag}] segment {segment}: {len(rows)} worker(s): {', '.join(rows)}"


def worker_entry() -> list[str]:
    """The command that starts one worker process: a module of the package, so that it runs the same
    from a checkout and from an installed wheel."""
    return [sys.executable, "-u", "-m", "elastic_ring.worker.run"]


def start_args(segment: int, stop_at: int, owner: str, go_file: Path | None = None) -> list[str]:
    """The worker entry's arguments of a worker's launch by this controller: a
    :class:`~elastic_ring.seam.Start` (:meth:`~elastic_ring.seam.Start.args`)."""
    return seam.Start(segment, stop_at, owner, go_file, os.getpid(), socket.gethostname()).args()


def package_path(pythonpath: str) -> str:
    """``PYTHONPATH`` with the folder this package is imported from added (last) where it is a
    checkout's: the workers' ``python -m elastic_ring...`` commands run in the user's folder
    (``RunSpec.cwd``), not the checkout's, and must import this same package there. An installed
    package (site-packages) needs nothing."""
    parts = [p for p in pythonpath.split(os.pathsep) if p]
    if "site-packages" in ROOT.parts or "dist-packages" in ROOT.parts or str(ROOT) in parts:
        return pythonpath
    return os.pathsep.join([*parts, str(ROOT)])


def threads_env(device: str, threads: int) -> dict[str, str]:
    """The thread settings of a worker given ``threads`` cores (:func:`elastic_ring.protocol.cpu_threads`),
    the same under every launcher."""
    env = {"OMP_NUM_THREADS": str(threads)}  # GPU workers too: cores launch kernels
    if device == "cpu":
        # Horovod's background cycle: 5 ms instead of 1 ms fuses more gradients per gloo
        # allreduce and wakes less on busy cores (measured: docs/reports/peers.md)
        env["HOROVOD_CYCLE_TIME"] = "5"
    return env


def worker_env(spec, world: int, elastic: bool = False) -> dict[str, str]:
    """The environment of a segment's workers (on top of this process's)."""
    env = dict(os.environ)
    env.update(spec.extra_env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env["PYTHONPATH"] = package_path(env.get("PYTHONPATH", ""))
    if elastic:  # a joining worker's start-up happens inside the ring's init
        env.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", "300")
    for k, v in threads_env(spec.device, protocol.cpu_threads(world)).items():
        env[k] = env.get(k, v) if k == "HOROVOD_CYCLE_TIME" else v  # a cycle time of the user's stays
    return env
