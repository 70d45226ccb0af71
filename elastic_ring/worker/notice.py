"""A worker's SIGTERM taken as a notice: how Kubernetes, a spot reclaim and most schedulers preempt.

Under host discovery (the run's ``run.json`` holds ``host_discovery``: horovodrun relaunched over
the hosts a script lists, or over a fixed host list watched as one that never changes), the first
SIGTERM a worker gets does not end it: it writes a ``preempt_notice`` event (its rank, segment, pid
and host) and trains on; the controller shrinks the job off the worker's host at the next step the
workers agree on (``controller.drains``), and
the worker exits there as every worker of a relaunched segment does. A second SIGTERM ends it at
once (the default action is back), as does the controller past the notice's deadline: then it is a
failure as before.

In place on one host (``--relaunch inplace`` on CPUs, where each worker slot is a host name of its
own: ``ELASTIC_RING_SLOT_HOSTS=1``) the same notice makes the controller shrink the ring in place
with this worker leaving (its slot host dropped from the list Horovod Elastic's driver reads), and
the driver ends it there with a SIGTERM of its own: a SIGTERM that finds this worker's slot host no
longer listed (``control/hosts``) is that end, not a notice. In place on ``localhost:K`` (GPUs,
``--no-survive``: :func:`on_localhost`) the notice is taken too; the driver cannot choose this
worker to leave there, so the controller stops the job with a checkpoint at the agreed step and
relaunches it without this worker; the driver's SIGTERM to a worker whose local rank a shrink left
out (``localhost:K`` with K at most its local rank) is the end as above. Elsewhere (Ray, torchrun's
contract, whose launchers stop workers with SIGTERM themselves) a SIGTERM still ends the worker.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

from elastic_ring import env, protocol


def in_place() -> bool:
    """Whether this worker is one of Horovod Elastic's in place, on a slot host of its own."""
    return env.ring_mode() == "1" and env.slot_hosts()


def on_localhost() -> bool:
    """Whether this worker is one of Horovod Elastic's in place on ``localhost:K`` (no slot host of
    its own: GPUs, ``--no-survive``)."""
    return (env.ring_mode() == "1" and not env.slot_hosts() and env.launched_by_horovodrun()
            and env.horovod_hostname() == "localhost")


def still_listed(run_dir: Path) -> bool:
    """In place: whether this worker's slot host is still in the list the driver reads, or on
    ``localhost:K`` whether its local rank is below K (False: the driver's SIGTERM ending a worker
    whose slot a shrink removed)."""
    host = env.horovod_hostname() or ""
    try:  # (controller.backends.elastic.discovery_files' second)
        listed = (protocol.control_dir(Path(run_dir)) / "hosts").read_text().split()
    except OSError:
        return False
    if on_localhost():
        try:
            local = env.horovod_local_rank()
            return any(line.rsplit(":", 1)[0] == host and local < int(line.rsplit(":", 1)[1]) for line in listed)
        except (ValueError, IndexError):
            return False
    return any(line.rsplit(":", 1)[0] == host for line in listed)


def wanted(run_dir: Path) -> bool:
    """Whether this worker takes a SIGTERM as a notice: its run takes its hosts from discovery, or
    its ring is re-formed in place (:func:`in_place`, :func:`on_localhost`)."""
    if in_place() or on_localhost():
        return True
    try:
        info = protocol.run_info(run_dir)
    except (OSError, ValueError):
        return False
    return isinstance(info, dict) and isinstance(info.get("host_discovery"), dict)


def install(run_dir: Path, segment: int) -> bool:
    """Take the first SIGTERM as a notice (:func:`wanted` runs only; the main thread only);
    returns whether it was installed."""
    if threading.current_thread() is not threading.main_thread() or not wanted(run_dir):
        return False

    def on_term(signum, frame) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second one ends the worker
        if (in_place() or on_localhost()) and not still_listed(run_dir):
            os.kill(os.getpid(), signal.SIGTERM)  # the driver ends a worker a shrink removed: end as before
            return
        from elastic_ring.events.api import EventLog, PreemptNotice

        rank = env.launcher_rank()
        host = env.horovod_hostname() or ""
        try:
            EventLog(Path(run_dir) / protocol.WORKER_EVENTS).write(
                PreemptNotice(rank=rank, segment=segment, pid=os.getpid(), host=host))
        except OSError:
            os.kill(os.getpid(), signal.SIGTERM)  # no way to say it: end as before
            return

    signal.signal(signal.SIGTERM, on_term)
    return True
