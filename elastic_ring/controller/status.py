"""What state a run is in, read from its folder: the one answer `status`, `resize`, `runs` and the
cluster give (torch-free and quick, so those commands start fast).

The controller is the source: its state machine writes ``controller.json`` with its state
(``controller.api.RunState``, the one vocabulary: starting, running, resizing, restarting,
stopping, and at the end finished, failed or stopped). Only the
controller's liveness is judged here: a folder whose lock (``.lock``, an ``flock`` that dies with its
process) no one holds has no live controller, whatever ``controller.json`` last said. So:

=============  ================================================================================
starting       a live controller before the run's first step (also: the folder is being made)
running        a live controller, workers stepping
resizing       a live controller between a resize's decision and the first step at the new size
restarting     a live controller restarting failed workers from the last checkpoint
stopping       a live controller asked to stop (Ctrl-C): the workers checkpoint and exit
finished       the schedule's last step is done
failed         the controller gave up (restarts exhausted, or an error not worth a retry)
stopped        stopped on purpose (Ctrl-C, SIGTERM), or aborted before its workers started
crashed        the controller is gone without saying how it ended (killed, or its state file
               unreadable): ``--resume`` continues from the last checkpoint (from step 1
               when none was written yet: ``status`` says which)
=============  ================================================================================
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elastic_ring import protocol
from elastic_ring.controller.api import RunState
from elastic_ring.controller.summary import last_step
from elastic_ring.errors import UserError
from elastic_ring.events.api import Event, Finished, Launch, read_events


@dataclass(frozen=True)
class RunStatus:
    """A run's state as one value; :meth:`line` is the word(s) `status` prints after ``state:``."""

    run_dir: Path
    phase: RunState  # (`status --json`'s phase)
    step: int  # the newest step known done (rank 0's progress file, else the events)
    total_steps: int | None  # None: not known, or an open-ended run (a script's own loop ends it)
    world_size: int | None
    resize_from: int | None = None  # resizing: from -> to
    resize_to: int | None = None
    pid: int | None = None  # the live controller's
    why: str = ""  # crashed, stopped before any launch: a few words on why this state was chosen
    open_ended: bool = False  # no step limit (a script run without --steps)
    checkpoint_step: int | None = None  # the newest checkpoint's step (checkpoints/latest.json)
    vote_every: int | None = None  # running: the workers' stop vote period (a live stop lands within it + the lag)
    vote_lag: int | None = None  # running: the steps from a vote's start to its read (None: 1, not written)
    hosts: str | None = None  # host discovery, a live run: its hosts line, or "waiting for hosts (have K, need N)"

    @property
    def waiting_for_hosts(self) -> bool:
        return self.phase.live and bool(self.hosts) and self.hosts.startswith("waiting for hosts")

    @property
    def unfinished(self) -> bool:
        """Steps are left to train (a stopped or crashed run: ``--resume`` goes on)."""
        return self.open_ended or self.step < (self.total_steps or 0)

    def resume_hint(self) -> str:
        """How ``--resume`` goes on: from the newest checkpoint, or from step 1 when steps were done
        but none was written yet (the periodic checkpoint is every ``--checkpoint-every-s``)."""
        cmd = f"elastic-ring train --resume {self.run_dir}"
        if self.checkpoint_step:
            return f"continue from the checkpoint at step {self.checkpoint_step} with: {cmd}"
        if self.step > 0:
            return f"no checkpoint yet: {cmd} starts over from step 1"
        return f"continue with: {cmd}"

    def stop_latency_line(self) -> str | None:
        """Running with a stop vote every K > 1 steps: when a live resize or stop lands."""
        if self.phase is RunState.RUNNING and self.vote_every and self.vote_every > 1:
            lag = self.vote_lag or 1
            read = f", read {lag} steps after it starts" if lag > 1 else ""
            return (f"a live resize lands within {self.vote_every + lag} steps (a stop vote every "
                    f"{self.vote_every} steps{read})")
        return None

    def line(self) -> str:
        if self.waiting_for_hosts:
            return self.hosts
        if self.phase is RunState.RESIZING and self.resize_from and self.resize_to:
            return f"resizing {self.resize_from} -> {self.resize_to}"
        if self.phase is RunState.CRASHED:
            return f"crashed: {self.why or 'controller gone'} (last step {self.step}; {self.resume_hint()})"
        if self.phase is RunState.STOPPED and self.unfinished:
            how = f"{self.why}; " if self.why else ""
            return f"stopped ({how}{self.resume_hint()})"
        return self.phase.value


def is_run_folder(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a run (``run.json``) or is one being made (its lock held)."""
    from elastic_ring.controller.lock import is_locked

    rd = Path(run_dir)
    return (rd / "run.json").exists() or ((rd / protocol.LOCK_FILE).exists() and is_locked(rd))


def read_status(run_dir: str | Path, events: list[Event] | None = None) -> RunStatus:
    """The state of the run in ``run_dir`` (``events``: its events if already read).

    Raises:
        UserError: ``run_dir`` is not a run folder and no controller is making one there.
    """
    from elastic_ring.controller.lock import holder_pid, is_locked
    rd = Path(run_dir)
    alive = (rd / protocol.LOCK_FILE).exists() and is_locked(rd)
    info = protocol.read_json(rd / "run.json")
    if info is None and not alive:
        if (rd / "run.json").exists():
            raise UserError(f"{rd}/run.json is unreadable: not a usable elastic-ring run folder")
        raise UserError(f"{rd} is not an elastic-ring run folder (no run.json)")
    info = info if isinstance(info, dict) else {}
    total = info.get("total_steps")
    total = int(total) if isinstance(total, (int, float)) else _config_total(rd)
    open_ended = total is not None and total >= protocol.NO_STEP_LIMIT
    total = None if open_ended else total
    ctl = protocol.read_json(rd / protocol.CONTROLLER_FILE)
    ctl = ctl if isinstance(ctl, dict) and RunState.read(ctl.get("state")) is not None else None
    evs = read_events(rd / "events.jsonl") if events is None else events
    step = _last_step(rd, evs)
    world = _int(ctl.get("world_size")) if ctl else None
    if world is None:
        launches = [e for e in evs if isinstance(e, Launch)]
        world = _int(launches[-1].world_size) if launches else _int(info.get("workers"))
    kw: dict[str, Any] = dict(run_dir=rd, step=step, total_steps=total, world_size=world, open_ended=open_ended,
                              checkpoint_step=_checkpoint_step(rd))
    finished = any(isinstance(e, Finished) for e in evs)
    if ctl is None:
        if alive:
            return RunStatus(phase=RunState.STARTING, pid=holder_pid(rd), **kw)
        if finished:
            return RunStatus(phase=RunState.FINISHED, **kw)
        if (rd / protocol.CONTROLLER_FILE).exists():
            return RunStatus(phase=RunState.CRASHED, why="controller gone, its state file unreadable", **kw)
        return RunStatus(phase=RunState.STOPPED, why="aborted before its workers started", **kw)
    phase = RunState.of_record(ctl)
    if phase.live and not alive:
        return RunStatus(phase=RunState.CRASHED, why=f"controller gone while {phase.value}", **kw)
    if phase is RunState.RESIZING:
        kw.update(resize_from=_int(ctl.get("resize_from")), resize_to=_int(ctl.get("pending_world")))
    if phase is RunState.RUNNING:
        kw.update(vote_every=_vote_every(rd), vote_lag=_vote_every(rd, "vote_lag"))
    if phase.live and isinstance(ctl.get("hosts"), str):
        kw.update(hosts=ctl["hosts"])
    if phase is RunState.STOPPED and isinstance(ctl.get("stopped"), str):
        kw.update(why=ctl["stopped"])  # stopped by the controller itself (the last worker preempted)
    return RunStatus(phase=phase, pid=_int(ctl.get("pid")) if alive else None, **kw)


def _config_total(rd: Path) -> int | None:
    import yaml

    try:
        return _int((yaml.safe_load((rd / "config.yaml").read_text()) or {}).get("total_steps"))
    except (OSError, yaml.YAMLError, AttributeError):
        return None


def _checkpoint_step(rd: Path) -> int | None:
    """The newest checkpoint's step, from the checkpoint index (not the files: quick, torch-free)."""
    idx = protocol.read_json(rd / "checkpoints" / "latest.json")
    return _int(idx.get("step")) if isinstance(idx, dict) else None


def _int(v: Any) -> int | None:
    try:
        return int(v) if v is not None else None
    except (TypeError, ValueError):
        return None


def _last_step(rd: Path, evs: list[Event]) -> int:
    """The newest step known done: rank 0's progress file (written twice a second) or the newest
    step an event names (a failure's ``failed_at_step`` included)."""
    prog = protocol.read_json(rd / "control" / protocol.PROGRESS_FILE)
    best = _int(prog.get("step")) or 0 if isinstance(prog, dict) else 0
    return max(best, last_step(evs))


def _vote_every(rd: Path, key: str = "vote_every") -> int | None:
    """The stop vote's period (``key`` ``vote_lag``: its read lag) rank 0 last wrote in its
    progress file (None: not written)."""
    prog = protocol.read_json(rd / "control" / protocol.PROGRESS_FILE)
    return _int(prog.get(key)) if isinstance(prog, dict) else None


def live_note(run_dir: str | Path | None) -> str | None:
    """What a running cluster job's run is doing when that is not plain stepping (``starting``,
    ``resizing A -> B``, ``restarting``, ``stopping``), for `jobs` and the web page to show beside
    the scheduler's ``running``; None otherwise (or when the folder cannot be read)."""
    if not run_dir:
        return None
    try:
        st = read_status(run_dir)
    except UserError:
        return None
    return st.line() if st.phase.live and st.phase is not RunState.RUNNING else None
