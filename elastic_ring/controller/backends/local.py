"""The local launcher of a ``--collective torch`` job: one process per worker on this host, no
horovodrun (used by ``--relaunch prelaunch|overlap|sequential``: new processes per segment).

:class:`LocalBackend` starts one small launcher per segment, ``python -m
elastic_ring.controller.backends.local --nproc N -- WORKER COMMAND`` (through the same
:class:`~.horovodrun.SubprocessLauncher` as horovodrun: its own process group, output to the
segment's log). The launcher imports nothing but the standard library (and the protocol's names);
it binds the segment's rendezvous socket to a free port and listens on it (:func:`rendezvous_socket`)
and starts ``N`` workers, each told, as torchrun tells them, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``: the worker library's
``init_process_group`` forms the group there, rank 0 hosting its store on the socket it inherits
(its descriptor in ``ELASTIC_RING_STORE_FD``). So the port stays bound from the moment it is picked
until the store serves on it: no other process can take it in between (as one could between a
probe of a free port and rank 0's bind, seconds later, after its imports), and the other ranks'
connections wait in the socket's backlog until rank 0 is up. When one
worker fails the launcher ends the others and exits with that worker's status, naming its rank in
the log (:func:`first_failed_rank`), as horovodrun does; when all exit 0, so does it.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from elastic_ring.controller.backends.api import (BUILTIN_TARGET, Launcher, SegmentLaunch, Started,
                                                  worker_env)
from elastic_ring.protocol import STORE_FD_ENV

# a statement that calls it (not a comment's or a docstring's mention)
_HVD_INIT = re.compile(r"^[ \t]*hvd\.init\s*\(", re.M)
_PG_INIT = re.compile(r"^[ \t]*(?:[\w.]+\.)?init_process_group\s*\(", re.M)
_FAILED = "elastic-ring local launcher: rank {rank} exited with status {rc}"
_FIRST_FAILED = re.compile(r"elastic-ring local launcher: rank (\d+) exited with status")
MASTER_ADDR = "127.0.0.1"


def launcher_command(spec, launch: SegmentLaunch) -> list[str]:
    """The command of one segment: the local launcher, then the worker entry with its arguments."""
    from elastic_ring.controller.backends.horovodrun import worker_args

    cmd = [sys.executable, "-m", "elastic_ring.controller.backends.local", "--nproc", str(launch.world), "--",
           *worker_args(spec, launch.segment, launch.stop_at, launch.owner)]
    if launch.go_file is not None:
        cmd += ["--go-file", str(launch.go_file)]
    return [*cmd, "--", spec.script or BUILTIN_TARGET, *spec.script_args]


def script_collective(script: str | Path) -> str | None:
    """Which collective the script starts itself, read from its text: ``"horovod"`` (a call of
    ``hvd.init()``), ``"torch"`` (of ``init_process_group()``), or None (neither, or both, or it
    cannot be read: the worker library then checks at run time)."""
    try:
        text = Path(script).read_text(errors="replace")
    except OSError:
        return None
    hvd, pg = bool(_HVD_INIT.search(text)), bool(_PG_INIT.search(text))
    return "horovod" if hvd and not pg else "torch" if pg and not hvd else None


def first_failed_rank(log_path: Path | None) -> int | None:
    """The rank the local launcher names as the first to fail, from the segment's log."""
    if log_path is None:
        return None
    try:
        m = _FIRST_FAILED.search(log_path.read_text(errors="replace"))
    except OSError:
        return None
    return int(m.group(1)) if m else None


class LocalBackend:
    """One local launcher per segment (see the module docstring); only this host's slots."""

    name = "local"

    def __init__(self, spec, launcher: Launcher | None = None) -> None:
        from elastic_ring.controller.backends.horovodrun import SubprocessLauncher

        self.spec = spec
        self.launcher = launcher or SubprocessLauncher()

    def start(self, launch: SegmentLaunch, log_path: Path) -> Started:
        cmd = launcher_command(self.spec, launch)
        return Started(self.launcher.start(cmd, worker_env(self.spec, launch.world), log_path), cmd)

    def usable_slots(self, want: int) -> int:
        return self.spec.slots

    def first_failed_rank(self, log_path: Path | None) -> int | None:
        return first_failed_rank(log_path)

    def failure_detail(self) -> None:
        return None  # the launcher's line and the crash records say it all

    def close(self) -> None:
        pass


def check_torch_nccl() -> None:
    """On GPUs, torch's NCCL (``--collective torch --device cuda``).

    Raises:
        UserError: this torch has no NCCL (a CPU-only build).
    """
    import torch.distributed as dist

    from elastic_ring.errors import UserError

    if not (dist.is_available() and dist.is_nccl_available()):
        raise UserError("--collective torch --device cuda asks for NCCL, but this torch was built without "
                        "it (a CPU build?): use --device cpu (gloo), or a CUDA build of torch")


# ---------------------------------------------------------------------- the launcher process
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


def start_workers(cmd: list[str], world: int) -> list[subprocess.Popen]:
    """The segment's ``world`` workers, rank 0 handed the rendezvous socket (see the module
    docstring); the launcher's own copy is closed once they run."""
    with rendezvous_socket() as sock:
        port, fd = int(sock.getsockname()[1]), sock.fileno()
        return [subprocess.Popen(cmd, env=rank_env(r, world, port, store_fd=fd), pass_fds=(fd,) if r == 0 else ())
                for r in range(world)]


def supervise(procs: list[subprocess.Popen], poll_s: float = 0.05) -> int:
    """Wait for the workers: the first non-zero status ends the others and is returned (its rank
    named on stderr); 0 once all exited 0."""
    while True:
        codes = [p.poll() for p in procs]
        for rank, rc in enumerate(codes):
            if rc is not None and rc != 0:
                print(_FAILED.format(rank=rank, rc=rc), file=sys.stderr, flush=True)
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                for p in procs:
                    p.wait()
                return rc if rc > 0 else 128 - rc
        if all(rc == 0 for rc in codes):
            return 0
        time.sleep(poll_s)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 4 or argv[0] != "--nproc" or argv[2] != "--":
        print("usage: python -m elastic_ring.controller.backends.local --nproc N -- COMMAND...", file=sys.stderr)
        return 2
    world, cmd = int(argv[1]), argv[3:]
    procs = start_workers(cmd, world)

    def end(signum, frame):  # the controller ends the segment: the workers first
        for p in procs:
            if p.poll() is None:
                p.kill()
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, end)
    return supervise(procs)


if __name__ == "__main__":
    sys.exit(main())
