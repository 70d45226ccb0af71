"""The local launcher process of one segment of a ``--collective torch`` job:
:class:`~.local.LocalBackend` starts it as ``python -m elastic_ring.controller.backends.local
--nproc N [--torchrun --run-dir DIR --segment S --stop-grace SECONDS] -- WORKER COMMAND`` (that
module's ``__main__`` runs :func:`main` here).

The launcher imports nothing but the standard library (and the protocol's names);
it binds the segment's rendezvous socket to a free port and listens on it (:func:`rendezvous_socket`)
and starts ``N`` workers, each told, as torchrun tells them, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``: the worker library's
``init_process_group`` forms the group there, rank 0 hosting its store on the socket it inherits
(its descriptor in ``ELASTIC_RING_STORE_FD``). So the port stays bound from the moment it is picked
until the store serves on it: no other process can take it in between (as one could between a
probe of a free port and rank 0's bind, seconds later, after its imports), and the other ranks'
connections wait in the socket's backlog until rank 0 is up. When one
worker fails the launcher ends the others and exits with that worker's status, naming its rank in
the log (:data:`FAILED_LINE`, read back by :func:`~.local.first_failed_rank`), as horovodrun does;
when all exit 0, so does it (:func:`supervise`).

A script of torchrun's contract (``--torchrun``: :mod:`elastic_ring.worker.torchrun`) forms its
own group: rank 0's ``init_process_group`` binds ``MASTER_PORT`` itself, so the launcher hands it
no socket but a port it found free (as torchrun's static rendezvous does: a port taken by another
process in between fails the segment, which is restarted), and adds the rest of torchrun's
environment. The launcher is then torchrun's agent too (:func:`supervise_torchrun`): the
segment's stop file (a resize, an interrupt) or a failed worker stops every worker (SIGTERM, the
grace, SIGKILL), and the launcher writes the segment's end (``segment_end``: ``requested``, or
``finished`` when all exited 0 by themselves) for the controller, since the script writes none.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import TypeVar

from elastic_ring import protocol
from elastic_ring.env import STORE_FD as STORE_FD_ENV
from elastic_ring.worker.torchrun import rank_env as torchrun_rank_env

FAILED_LINE = "elastic-ring local launcher: rank {rank} exited with status {rc}"  # (first_failed_rank reads it)
MASTER_ADDR = "127.0.0.1"
T = TypeVar("T")


def rendezvous_socket(host: str = MASTER_ADDR, backlog: int = 1024) -> socket.socket:
    """The segment's rendezvous socket: bound to a port free on ``host`` and listening, so that the
    port is this segment's from now on; rank 0 inherits it and serves its store on it, the other
    ranks' connections wait in its backlog until then."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((host, 0))
        s.listen(backlog)
    except OSError:
        s.close()
        raise
    return s


def rank_env(rank: int, world: int, port: int, base: dict[str, str] | None = None,
             store_fd: int | None = None) -> dict[str, str]:
    """A worker's environment: torchrun's names for its rank and the segment's rendezvous; rank 0's
    also names the descriptor of the rendezvous socket it inherits (``store_fd``)."""
    env = dict(os.environ if base is None else base)
    env.pop(STORE_FD_ENV, None)
    env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
               GROUP_RANK="0", MASTER_ADDR=MASTER_ADDR, MASTER_PORT=str(port))
    if rank == 0 and store_fd is not None:
        env[STORE_FD_ENV] = str(store_fd)
    return env


def start_workers(cmd: list[str], world: int, torchrun: bool = False) -> list[subprocess.Popen]:
    """The segment's ``world`` workers, rank 0 handed the rendezvous socket (see the module
    docstring); the launcher's own copy is closed once they run. ``torchrun``: a script that forms
    its own group gets a free port instead, and the rest of torchrun's environment."""
    with rendezvous_socket() as sock:
        port, fd = int(sock.getsockname()[1]), sock.fileno()
        if torchrun:
            sock.close()  # rank 0's init_process_group binds it
            return [subprocess.Popen(cmd, env={**rank_env(r, world, port), **torchrun_rank_env(r, world)})
                    for r in range(world)]
        return [subprocess.Popen(cmd, env=rank_env(r, world, port, store_fd=fd), pass_fds=(fd,) if r == 0 else ())
                for r in range(world)]


def stop_all(procs: list[subprocess.Popen], grace_s: float, poll_s: float = 0.05) -> None:
    """Stop the workers as torchrun does: SIGTERM to each still running, then SIGKILL to those
    still running after ``grace_s`` seconds; returns once all have exited."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace_s
    while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(poll_s)
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait()


def write_segment_end(run_dir: Path, segment: int, world: int, reason: str, t_decided: float) -> None:
    """The segment's end, written for a script that writes none (the controller relays it)."""
    from elastic_ring.events.api import EventLog, SegmentEnd

    EventLog(run_dir / protocol.WORKER_EVENTS).write(
        SegmentEnd(segment=segment, world_size=world, step=0, reason=reason, lr=0.0, stop_decided_at=t_decided))


def killed_first(failed: list[tuple[T, int]]) -> tuple[T, int] | None:
    """The failure to name among ``failed`` ((worker, non-zero exit status), in the workers' order):
    one killed by a signal (a negative status: kill -9, the OOM killer) before one that exited
    non-zero, each the first in order; None when none failed. A peer of a killed worker exits 1 on
    its lost connection, and both may have exited by the same poll: order alone named the peer (a
    fresh-clone CI run)."""
    return min(failed, key=lambda f: f[1] > 0) if failed else None


def first_failed(codes: list[int | None]) -> tuple[int, int] | None:
    """(rank, status) of the worker to name among the exit statuses ``codes`` by rank (None:
    running): :func:`killed_first`."""
    return killed_first([(rank, rc) for rank, rc in enumerate(codes) if rc is not None and rc != 0])


def exit_status(rc: int) -> int:
    """A failed worker's ``Popen`` status as a shell gives it: a signal's ``-N`` is ``128 + N``."""
    return rc if rc > 0 else 128 - rc


def supervise_torchrun(procs: list[subprocess.Popen], run_dir: Path, segment: int, grace_s: float,
                       poll_s: float = 0.05) -> int:
    """torchrun's agent for one segment: the segment's stop file stops every worker (SIGTERM, the
    grace, SIGKILL) and ends the segment (``requested``, status 0); the first worker that fails
    stops the others the same way and its status is returned (its rank named on stderr); all
    exiting 0 ends it ``finished``."""
    stop = protocol.stop_file(run_dir, segment)
    while True:
        if stop.exists():
            t = time.time()
            print(f"elastic-ring local launcher: stop asked: stopping {len(procs)} worker(s) (SIGTERM, "
                  f"SIGKILL after {grace_s:g} s)", file=sys.stderr, flush=True)
            stop_all(procs, grace_s, poll_s)
            write_segment_end(run_dir, segment, len(procs), "requested", t)
            return 0
        codes = [p.poll() for p in procs]
        failed = first_failed(codes)
        if failed is not None:
            rank, rc = failed
            print(FAILED_LINE.format(rank=rank, rc=rc), file=sys.stderr, flush=True)
            stop_all(procs, grace_s, poll_s)
            return exit_status(rc)
        if all(rc == 0 for rc in codes):
            write_segment_end(run_dir, segment, len(procs), "finished", time.time())
            return 0
        time.sleep(poll_s)


def supervise(procs: list[subprocess.Popen], poll_s: float = 0.05) -> int:
    """Wait for the workers: the first non-zero status ends the others and is returned (its rank
    named on stderr); 0 once all exited 0."""
    while True:
        codes = [p.poll() for p in procs]
        failed = first_failed(codes)
        if failed is not None:
            rank, rc = failed
            print(FAILED_LINE.format(rank=rank, rc=rc), file=sys.stderr, flush=True)
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for p in procs:
                p.wait()
            return exit_status(rc)
        if all(rc == 0 for rc in codes):
            return 0
        time.sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else -1
    own, cmd = argv[:cut], argv[cut + 1:]
    torchrun = own[2:3] == ["--torchrun"]
    if (cut < 0 or not cmd or own[:1] != ["--nproc"] or len(own) != (9 if torchrun else 2)
            or (torchrun and own[3::2] != ["--run-dir", "--segment", "--stop-grace"])):
        print("usage: python -m elastic_ring.controller.backends.local --nproc N [--torchrun --run-dir DIR "
              "--segment S --stop-grace SECONDS] -- COMMAND...", file=sys.stderr)
        return 2
    world = int(own[1])
    procs = start_workers(cmd, world, torchrun=torchrun)

    def end(signum, frame):  # the controller ends the segment: the workers first
        for p in procs:
            if p.poll() is None:
                p.kill()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, end)
    if torchrun:
        return supervise_torchrun(procs, Path(own[4]), int(own[6]), float(own[8]))
    return supervise(procs)
