"""The file protocol between the controller and its workers (torch-free, so `status` and `resize`
start fast).

Everything lives in the run folder, which every host of a job sees (as the checkpoints do):

- ``run.json``                 the request; its ``worker`` entry holds the workers' settings
- ``plan.json``                the effective resize plan (initial size, scheduled and live resizes)
- ``controller.json``          the controller's state (pid, state, step, world size)
- ``.lock``                    held (``fcntl.flock``) by the one controller that owns the folder
- ``worker_events.jsonl``      rank 0's events, relayed by the controller into ``events.jsonl``
- ``control/heartbeat.json``   the owner's id and a counter the controller bumps every second;
                               workers of another owner, or of a silent one, exit by themselves
- ``control/stop-<seg>``       asks segment ``seg``'s workers to stop at the next agreed step
- ``control/go-<seg>``         releases pre-launched workers (carries the stop step: :class:`elastic_ring.seam.Go`)
- ``control/inplace-<seg>.json``  the controller's word to paused in-place workers (:class:`elastic_ring.seam.Action`)
- ``control/survivor-<member>.json``  the steps a survivor of a failure holds (:func:`elastic_ring.seam.survivor_file`)
- ``control/resize-request.json``  a live resize asked by ``elastic-ring resize``
- ``control/progress.json``    rank 0's last completed step (written at most twice a second)
- ``control/pids/seg<n>-rank<r>.json``  each worker's pid, host and owner (to stop orphans)
- ``logs/error-rank<r>.json``  a worker's crash record (one format for ``train`` and ``ps``)

A worker's launch settings are one :class:`LaunchInfo`: its launch (:class:`elastic_ring.seam.Start`,
on the command line of the worker entry point ``python -m elastic_ring.worker.run``) and the run's
settings (``run.json``'s ``worker`` entry), handed to the worker library in the process. What the
controller tells workers later (the in-place action, a go, the survivors' records) is typed in
:mod:`elastic_ring.seam`; every environment variable is read in :mod:`elastic_ring.env`.
"""

from __future__ import annotations

import copy
import json
import os
import socket
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from elastic_ring import env as envvars

RUN_FILE = "run.json"
WORKER_EVENTS = "worker_events.jsonl"
CONTROLLER_FILE = "controller.json"
PLAN_FILE = "plan.json"
LOCK_FILE = ".lock"
REQUEST_FILE = "resize-request.json"
HEARTBEAT_FILE = "heartbeat.json"
PROGRESS_FILE = "progress.json"

HEARTBEAT_EVERY_S = 1.0
HEARTBEAT_TIMEOUT_S = 15.0  # workers exit when the controller's heartbeat stood still this long
EXIT_ORPHANED = 75  # a worker's exit status when its controller is gone or replaced
RETIRED = 3  # what an in-process worker's main returns when an in-place shrink took it out of the ring
# The run length of a --script run without --steps: the script's own loop ends the run
# (``job.epochs()`` running out); no step reaches it.
NO_STEP_LIMIT = 2**62

# Exception types that a rank raises because a *peer* died (not a failure of its own), and the
# words of a collective that broke because the other end went away (Gloo, NCCL, sockets).
# torch.distributed's gloo raises a plain RuntimeError (DistBackendError in some versions) whose
# text names the socket's end (seen with torch 2.14 when the peer was killed: "Read error
# [addr]: Connection reset by peer", "Connection closed by peer [addr]", from DDP's backward hooks
# and from any collective; and, when the peer stops answering, "Timed out waiting 300000ms for
# recv operation to complete").
PEER_LOSS_TYPES = ("HorovodInternalError", "HostsUpdatedInterrupt", "HorovodCollectiveLost")
PEER_LOSS_WORDS = ("Connection reset by peer", "Connection closed by peer", "ncclRemoteError",
                   "ms for recv operation to complete", "ms for send operation to complete")


def is_peer_loss(type_name: str | None, message: str | None) -> bool:
    """True when an error only says that a peer went away (the rank is a victim, not a culprit)."""
    return (type_name in PEER_LOSS_TYPES
            or any(w.lower() in (message or "").lower() for w in PEER_LOSS_WORDS))


CPU_THREADS_ENV = envvars.CPU_THREADS
SLOT_HOSTS_ENV = envvars.SLOT_HOSTS  # "1": each worker slot is a host name of its own, all on this host
LAUNCHED_AT_ENV = envvars.LAUNCHED_AT  # when the controller started the segment's launcher (time.time())
PROCESS_START_ENV = envvars.PROCESS_START  # a forked worker: when its launched command started
STORE_FD_ENV = envvars.STORE_FD  # rank 0 of a --collective torch segment: the rendezvous socket it inherits


def cpu_threads(local_workers: int, cores: float | None = None) -> int:
    """Intra-op threads of one worker (CPU or GPU: a GPU worker's host threads launch its kernels):
    ``$ELASTIC_RING_CPU_THREADS`` if set; else the ``cores`` it was given (a Ray bundle's CPUs: a
    worker cannot see how many of its node's cores other workers hold); else the cores this process
    may run on (its CPU affinity, not the machine's count) shared by the workers of this host. The
    launchers (``OMP_NUM_THREADS``) and the worker (``torch.set_num_threads``) all use it."""
    fixed = envvars.cpu_threads()
    if fixed is not None:
        return fixed
    if cores is not None:
        return max(1, int(cores))
    return max(1, usable_cores() // max(1, local_workers))


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def control_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "control"


def request_file(run_dir: Path) -> Path:
    """The live resize request (``elastic-ring resize``, the cluster's scheduler) the controller reads."""
    return control_dir(run_dir) / REQUEST_FILE


def stop_file(run_dir: Path, segment: int) -> Path:
    """The file whose existence asks segment ``segment``'s workers to stop at the next agreed step."""
    return control_dir(run_dir) / f"stop-{segment}"


def go_file(run_dir: Path, segment: int) -> Path:
    return control_dir(run_dir) / f"go-{segment}"


def waiting_file(go: Path) -> Path:
    """Where a pre-launched worker says it waits for its go ``go`` (its imports and build done):
    ``{"pid", "time"}``."""
    return go.with_name(go.name + ".waiting")


def pid_dir(run_dir: Path) -> Path:
    return control_dir(run_dir) / "pids"


def write_json_atomic(path: Path, obj: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)


def read_json(path: Path) -> Any | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


_RUN_INFO: dict[str, tuple[tuple[int, int, int], Any]] = {}  # run.json's path -> (its stat, its JSON)


def _stat_key(path: Path) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_mtime_ns, st.st_size


def run_info(run_dir: Path) -> Any:
    """The JSON of ``run_dir``'s ``run.json`` (a copy: the caller may change it), read once per
    process while the file stays the same (its inode, change time and size: the controller
    rewrites it by a rename at a resume, :func:`remember_run_info`).

    Raises:
        OSError: it cannot be read.
        ValueError: it is not JSON (``json.JSONDecodeError``), or not UTF-8.
    """
    path = Path(run_dir) / RUN_FILE
    where = os.path.abspath(path)
    key = _stat_key(path)
    hit = _RUN_INFO.get(where)
    if hit is None or hit[0] != key:
        hit = _RUN_INFO[where] = (key, json.loads(path.read_text()))  # (replaced since the stat: read again next time)
    return copy.deepcopy(hit[1])


def remember_run_info(run_dir: Path, info: Any) -> None:
    """``run.json`` of ``run_dir`` was just written with ``info``: later reads of this process take it
    from here (:func:`run_info`)."""
    path = Path(run_dir) / RUN_FILE
    _RUN_INFO[os.path.abspath(path)] = (_stat_key(path), copy.deepcopy(info))


def read_run_json(run_dir: Path) -> Any | None:
    """:func:`run_info`, or None where ``run.json`` is missing or damaged (as :func:`read_json`)."""
    try:
        return run_info(run_dir)
    except (OSError, ValueError):
        return None


# ---------------------------------------------------------------------- launch settings
_ENV = envvars.PREFIX
STOP_LATENCY_MS = 100  # a run's default: a live stop waits at most this long for the next stop vote
STOP_LATENCY_ENV = envvars.STOP_LATENCY_MS  # a script run's setting (a config's: stop_latency_ms)


# LaunchInfo's fields that are its launch's (seam.Start), not the run's settings
START_FIELDS = ("segment", "stop_at", "owner", "go_file", "controller_pid", "controller_host")


@dataclass(frozen=True)
class LaunchInfo:
    """What the controller tells one worker process: its launch (``START_FIELDS``: the worker
    entry's :class:`elastic_ring.seam.Start`) and the run's settings (``run.json``'s ``worker``
    entry). The worker entry makes it and hands it to the worker library in the process
    (``worker.session.launched``)."""

    run_dir: Path
    segment: int
    stop_at: int
    total_steps: int
    device: str = "cpu"
    owner: str = ""
    go_file: Path | None = None
    checkpoint_every: int = 0  # steps between periodic checkpoints (0: none)
    checkpoint_every_s: float = 0.0  # seconds between periodic checkpoints (0: none)
    keep: int = 2
    lr_scaling: str = "linear"
    global_batch: int = 0  # lr_scaling constant-batch: samples per step at every world size
    control_every: int = 1
    stop_latency_ms: int = 0  # the longest a live stop waits for a vote (0: a vote every control_every steps)
    throughput_window: int = 20
    eval_every: int = 0
    controller_pid: int = 0
    controller_host: str = ""
    collective: str = "horovod"  # or "torch" (worker.collective)
    cwd: str = ""  # the folder the worker runs the script in (where `train` was run); "": as started

    def to_env(self) -> dict[str, str]:
        """The run's settings as ``ELASTIC_RING_<FIELD>`` variables, for the worker process and the
        processes it starts (:mod:`elastic_ring.env` reads those it needs: the device, the collective,
        whether elastic-ring started it); the launch's own (``START_FIELDS``) stay out: they change
        with each segment a process serves, and the worker library has them from the entry."""
        out = {}
        for k, v in asdict(self).items():
            if k not in START_FIELDS:
                out[_ENV + k.upper()] = "" if v is None else str(v)
        return out


# ---------------------------------------------------------------------- crash records
def error_file(run_dir: Path, rank: int | str) -> Path:
    return Path(run_dir) / "logs" / f"error-rank{rank}.json"


def write_error_record(run_dir: Path, exc: BaseException, rank: int | None, **extra: Any) -> None:
    """Write a worker's uncaught exception where the controller looks for it (never raises)."""
    try:
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        record = {"rank": rank, "type": type(exc).__name__, "message": last,
                  "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
                  "time": time.time(), "host": socket.gethostname(), "pid": os.getpid(),
                  "peer_loss": is_peer_loss(type(exc).__name__, last), **extra}
        write_json_atomic(error_file(run_dir, "unknown" if rank is None else rank), record)
    except Exception:  # noqa: BLE001 - a crash record must never mask the crash
        pass


def read_error_records(run_dir: Path, since: float = 0.0) -> list[dict[str, Any]]:
    """Crash records newer than ``since``, oldest first."""
    out = []
    for f in sorted((Path(run_dir) / "logs").glob("error-rank*.json")):
        rec = read_json(f)
        if isinstance(rec, dict) and rec.get("time", 0) >= since:
            out.append(rec)
    out.sort(key=lambda r: r.get("time", 0))
    return out


@dataclass(frozen=True)
class Failure:
    """The failure that caused a segment's end, as the controller names it: the ``rank`` that failed
    (None when every worker that failed only lost a peer), what it was (``type``: the exception's
    name, ``Killed``, ``PeerLost``, ``Stalled``, a Ray error), a one-line ``message``, the ``step``
    it happened in, the Ray ``node`` it ran on, and the crash ``record`` it was read from (the JSON
    on disk; None when the worker left none)."""

    rank: int | None
    type: str | None
    message: str | None
    step: int | None = None
    node: str | None = None
    record: dict[str, Any] | None = field(default=None, compare=False)

    @classmethod
    def of_record(cls, rec: dict[str, Any]) -> "Failure":
        return cls(rec.get("rank"), rec.get("type"), rec.get("message"), rec.get("step"), record=rec)


@dataclass(frozen=True)
class Seen:
    """A worker seen failed: its ``rank``, its crash ``record`` (None: it died without one), whether
    its ``node_lost``, and ``who`` it is to the caller (a Ray member, say)."""

    rank: int | None
    record: dict[str, Any] | None = field(default=None, compare=False)
    node_lost: bool = False
    who: Any = field(default=None, compare=False)

    @property
    def peer_loss(self) -> bool:
        r = self.record
        return r is not None and bool(r.get("peer_loss") or is_peer_loss(r.get("type"), r.get("message")))


def blame(seen: list[Seen]) -> Seen | None:
    """The failure that caused the others, among the workers ``seen`` failed (in the order seen):
    one whose node is lost; else one that failed with an error of its own (a crash record that is
    not a peer loss); else one that died without a record (kill -9, the OOM killer). A worker that
    only lost a peer is never the cause: None when only such workers are known."""
    for s in seen:
        if s.node_lost:
            return s
    for s in seen:
        if s.record is not None and not s.peer_loss:
            return s
    for s in seen:
        if s.record is None:
            return s
    return None


def first_failure(records: list[dict[str, Any]], dead_ranks: list[int]) -> Failure | None:
    """The failure that caused the others (:func:`blame`) among the crash ``records`` (oldest
    first) and the ranks that died without a record (``dead_ranks``, first known first): when every
    record is a peer loss and no silent death is known, the failure has no rank (``PeerLost``)."""
    s = blame([Seen(r.get("rank"), r) for r in records] + [Seen(rank) for rank in dead_ranks])
    if s is not None and s.record is not None:
        return Failure.of_record(s.record)
    if s is not None:
        return Failure(s.rank, "Killed", f"rank {s.rank} died without an error (killed by a signal or "
                                         f"the OOM killer)")
    if records:
        ranks = sorted({r.get("rank") for r in records if r.get("rank") is not None})
        return Failure(None, "PeerLost", f"a worker was lost without a trace (rank(s) {', '.join(map(str, ranks))} "
                                         f"only lost a peer: {records[0].get('message')})", records[0].get("step"))
    return None


# ---------------------------------------------------------------------- process records
def write_pid_record(run_dir: Path, rank: int, owner: str, segment: int, reformed: bool = False) -> None:
    """This process's record: ``seg<segment>-rank<rank>.json`` when it starts for a segment; with
    ``reformed``, ``reformed-<pid>.json`` after its ring was re-formed in place (its rank may be
    another now; the records of started workers stay as they were)."""
    try:
        import psutil

        created = psutil.Process().create_time()
    except Exception:  # noqa: BLE001
        created = 0.0
    name = f"reformed-{os.getpid()}.json" if reformed else f"seg{segment:03d}-rank{rank}.json"
    write_json_atomic(pid_dir(run_dir) / name,
                      {"rank": rank, "pid": os.getpid(), "host": socket.gethostname(),
                       # the host's name in the launcher's host list (horovodrun's -H), which may
                       # be an address or an alias: what the controller probes
                       "launch_host": envvars.horovod_hostname(),
                       # the name an in-place backend gave this process (worker.ring.MEMBER_ENV): its
                       # rank may change at an in-place resize, the name does not
                       "member": envvars.member(),
                       "owner": owner, "segment": segment, "created": created})


def read_pid_records(run_dir: Path, reformed: bool = False, newest: bool = False,
                     upto: int | None = None) -> list[dict[str, Any]]:
    """The workers' process records as they started (``seg<N>-rank<R>.json``); with ``reformed``
    also those written after an in-place re-form (``reformed-<pid>.json``: a survivor whose start
    record a joiner's overwrote is only there), after the others.

    With ``newest``, only each process's records of its newest segment (at most ``upto`` where
    given: a re-form's record may name the next segment before the controller runs it; a warm
    spare's placeholder, segment -1, is older than any), in the same order, each also saying when
    its file was written (``written``, its modification time: a rank's record of an earlier ring
    is stale once another process holds that rank)."""
    files = sorted(pid_dir(run_dir).glob("seg*-rank*.json"))
    if reformed:
        files += sorted(pid_dir(run_dir).glob("reformed-*.json"))
    out = []
    for f in files:
        rec = read_json(f)
        if not isinstance(rec, dict):
            continue
        if newest:
            try:
                rec = {**rec, "pid": int(rec["pid"]), "segment": int(rec["segment"]), "written": f.stat().st_mtime}
            except (KeyError, TypeError, ValueError, OSError):
                continue
            if upto is not None and rec["segment"] > upto:
                continue
        out.append(rec)
    if newest:
        last: dict[int, int] = {}  # pid -> its newest segment
        for rec in out:
            last[rec["pid"]] = max(rec["segment"], last.get(rec["pid"], rec["segment"]))
        out = [rec for rec in out if rec["segment"] == last[rec["pid"]]]
    return out


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
