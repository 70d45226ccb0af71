"""One owner per run folder: an exclusive ``fcntl.flock`` on ``RUN_DIR/.lock`` (the same two
primitives, :func:`try_lock` and :func:`held_by_other`, guard a cluster folder's scheduler).

The lock dies with its process (kill -9 included), so a stale lock never blocks a resume; the
workers of a dead controller are stopped by :func:`stop_stale_workers` (and stop by themselves
when the controller's heartbeat, :class:`OwnerHeartbeat`, stands still, see
:mod:`elastic_ring.worker.run`).
"""

from __future__ import annotations

import fcntl
import os
import socket
import threading
import time
from pathlib import Path

from elastic_ring import protocol
from elastic_ring.errors import UserError

_HELD: dict[str, int] = {}  # resolved folder -> fd, for locks this process holds


def try_lock(path: Path) -> int | None:
    """Take the exclusive lock on ``path`` (created if need be) and write our pid into it; the
    open descriptor holding it, or None when another process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


def held_by_other(path: Path) -> bool:
    """Whether some open descriptor holds the lock on ``path`` (checked without disturbing it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


class RunLock:
    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir).resolve() / protocol.LOCK_FILE

    def acquire(self) -> None:
        """Raises UserError when another live controller holds the folder."""
        key = str(self.path)
        if key in _HELD:
            return
        fd = try_lock(self.path)
        if fd is None:
            holder = holder_pid(self.path.parent)
            raise UserError(f"run folder {self.path.parent} is in use by another elastic-ring "
                            f"controller{f' (pid {holder})' if holder else ''}")
        _HELD[key] = fd

    def release(self) -> None:
        fd = _HELD.pop(str(self.path), None)
        if fd is not None:
            os.close(fd)


class OwnerHeartbeat:
    """The owner's heartbeat: ``control/HEARTBEAT_FILE`` rewritten every ``HEARTBEAT_EVERY_S`` by a
    thread from :meth:`start` to :meth:`stop`; the workers exit when it stands still or names
    another owner."""

    def __init__(self, run_dir: Path, owner: str) -> None:
        self.path = protocol.control_dir(run_dir) / protocol.HEARTBEAT_FILE
        self.owner = owner
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="elastic-ring-heartbeat")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _beat(self) -> None:
        seq = 0
        while True:
            seq += 1
            try:
                protocol.write_json_atomic(self.path, {"owner": self.owner, "seq": seq, "pid": os.getpid(),
                                                       "time": time.time()})
            except OSError:
                pass
            if self._stop.wait(protocol.HEARTBEAT_EVERY_S):
                return


def holder_pid(run_dir: Path) -> int | None:
    try:
        return int((Path(run_dir) / protocol.LOCK_FILE).read_text().strip() or 0) or None
    except (OSError, ValueError):
        return None


def is_locked(run_dir: Path) -> bool:
    """Whether a live controller holds the folder (checked without disturbing it)."""
    path = Path(run_dir) / protocol.LOCK_FILE
    return str(path.resolve()) in _HELD or held_by_other(path)


def stop_stale_workers(run_dir: Path, timeout_s: float = 20.0) -> list[int]:
    """Kill the workers (and horovodrun) a dead controller left on this host; returns their pids.

    Call with the lock held. Workers on other hosts see the new owner in the heartbeat file and
    exit by themselves.
    """
    import psutil

    me = socket.gethostname()
    victims: list[psutil.Process] = []
    records = protocol.read_pid_records(run_dir, reformed=True)  # (a pid in two records: killed once)
    ctl = protocol.read_json(Path(run_dir) / protocol.CONTROLLER_FILE) or {}
    if ctl.get("launcher_pid"):
        records.append({"pid": ctl["launcher_pid"], "host": me, "created": ctl.get("launcher_created", 0)})
    seen: set[int] = set()
    for rec in records:
        if rec.get("host") != me or not rec.get("pid") or int(rec["pid"]) in seen:
            continue
        seen.add(int(rec["pid"]))
        try:
            p = psutil.Process(int(rec["pid"]))
            if rec.get("created") and abs(p.create_time() - float(rec["created"])) > 1.0:
                continue  # the pid was reused by another process
            victims.append(p)
        except psutil.Error:
            continue
    for p in victims:
        try:
            for c in p.children(recursive=True):
                c.kill()
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(victims, timeout=timeout_s)
    for f in protocol.pid_dir(run_dir).glob("*.json"):
        f.unlink(missing_ok=True)
    t0 = time.time()
    while time.time() - t0 < timeout_s and any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE
                                                 for p in victims):
        time.sleep(0.1)
    return [p.pid for p in victims]
