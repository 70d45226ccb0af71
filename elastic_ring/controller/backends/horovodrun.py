"""The horovodrun backend: one ``horovodrun`` per segment (``-np N -H localhost:N --gloo`` on one
host, or the user's ``--hosts``/``--hostfile``), run through :mod:`..hvdrun` (Horovod's own
launcher, its build check asked once per install). Used by ``--relaunch prelaunch|overlap|sequential``.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable

from elastic_ring import env as envvars
from elastic_ring import protocol
from elastic_ring.controller import hvdrun
from elastic_ring.controller.backends.api import (BUILTIN_TARGET, Backend, Handle, Launcher, SegmentLaunch,
                                                  Started, rank_named_in_log, start_args, worker_entry, worker_env)

_FIRST_FAILED = re.compile(r"Terminating remaining workers after failure of Process (\d+)")
_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1"}


class SubprocessLauncher:
    """Starts horovodrun in its own process group, output to a log file. ``fork_server``: the
    workers it starts on this host fork from this controller's zygote
    (:mod:`elastic_ring.worker.zygote`; CPU runs). ``cwd``: the folder it starts in (the run's
    ``RunSpec.cwd``, where the user ran `train`; "" or None: this process's), which the workers
    inherit (and change to again themselves: ``LaunchInfo.cwd``)."""

    def __init__(self, fork_server: bool = False, cwd: str | None = None) -> None:
        self.fork_server = fork_server
        self.cwd = cwd or None

    class _H:
        def __init__(self, p: subprocess.Popen, log) -> None:
            self.p, self.pid, self._log = p, p.pid, log

        def poll(self) -> int | None:
            rc = self.p.poll()
            if rc is not None and not self._log.closed:
                self._log.close()
            return rc

        def kill(self) -> None:
            """SIGKILL horovodrun and every descendant (its workers may sit in other groups)."""
            import psutil

            try:
                procs = psutil.Process(self.p.pid).children(recursive=True)
            except psutil.Error:
                procs = []
            for proc in procs:
                try:
                    proc.kill()
                except psutil.Error:
                    pass
            try:
                os.killpg(self.p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def start(self, cmd: list[str], env: dict[str, str], log_path: Path) -> Handle:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        from elastic_ring.worker import zygote

        env = {k: v for k, v in env.items() if k != zygote.ENV}  # only this controller's own
        env[protocol.LAUNCHED_AT_ENV] = repr(time.time())  # the workers' start-up counts from here
        name = zygote.ensure(compile_=_imports_compile(cmd, env)) if self.fork_server else None
        if name is not None:
            env[zygote.ENV] = name
        log = open(log_path, "ab")
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                             start_new_session=True, cwd=self.cwd)
        return self._H(p, log)


def _imports_compile(cmd: list[str], env: dict[str, str]) -> bool:
    """Whether a segment's workers import ``torch._dynamo``: a script's do (its ``torch.optim`` step,
    ``DistributedDataParallel``), as do those of a torch group (the local launchers' (local.py) and
    a store served here for several hosts); the built-in trainer's on Horovod never do. Under
    Horovod Elastic's driver (``--min-np``: ``--relaunch inplace``) too: its warm spare
    (``hvdrun.Spare``), forked with it, is ready to join without its own import of it (about 1.3 s
    of a spare's start at a load of 5, which a grow soon after the ring's start or the last join
    waited for). (Once left out there: two slots of one grow could both take the one spare, which
    a spare ready sooner made likelier; ``Spare.claim`` takes it for one slot only now.)"""
    return (BUILTIN_TARGET not in cmd or envvars.STORE in env or "--ring-by-controller" in cmd
            or "elastic_ring.controller.backends.local" in cmd)


def worker_args(spec, segment: int, stop_at: int, owner: str, go_file: Path | None = None) -> list[str]:
    """The worker entry's arguments of one segment (after the launcher's own): its launch, a
    :class:`~elastic_ring.seam.Start`."""
    return [*worker_entry(), "--run-dir", str(spec.run_dir), *start_args(segment, stop_at, owner, go_file)]


def horovodrun_command(spec, world: int, segment: int, stop_at: int,
                       network_interface: str | None = None, go_file: Path | None = None,
                       owner: str = "", hosts: str | None = None) -> list[str]:
    """The horovodrun command of one segment; ``hosts`` overrides the spec's (a restart on the
    hosts that still answer)."""
    cmd = [*hvdrun.command_prefix(), "-np", str(world)]
    pairs = host_slots(spec, hosts)
    cmd += ["-H", first_slots(pairs, world) if pairs else f"localhost:{world}"]
    cmd += ["--gloo", "--start-timeout", "120"]
    if network_interface:
        cmd += ["--network-interface", network_interface]
    cmd += worker_args(spec, segment, stop_at, owner, go_file)
    cmd += ["--", spec.script or BUILTIN_TARGET, *spec.script_args]
    return cmd


def host_slots(spec, hosts: str | None = None) -> list[tuple[str, int]]:
    """(host, slots) of ``hosts`` (a restart's override), else of the spec's ``--hosts`` or
    ``--hostfile``; [] on this host alone."""
    from elastic_ring.controller.api import parse_hostfile, parse_hosts

    given = hosts or spec.hosts
    return parse_hosts(given) if given else parse_hostfile(spec.hostfile) if spec.hostfile else []


def first_slots(hosts: list[tuple[str, int]], world: int) -> str:
    """The ``-H`` of a segment of ``world`` workers: the first ``world`` slots of ``hosts``, in
    their order. horovodrun's Gloo launch starts a worker in every slot it is given, whatever
    ``-np`` says (Horovod 0.28.1: ``gloo_run`` assigns ranks with ``get_host_assignments(hosts,
    num_proc)``, no maximum), so a 1-worker segment given two one-slot hosts ran two workers."""
    out, left = [], world
    for name, n in hosts:
        if left <= 0:
            break
        out.append(f"{name}:{min(n, left)}")
        left -= min(n, left)
    return ",".join(out)


def probe_hosts(hosts: list[tuple[str, int]], timeout_s: float = 5.0) -> list[tuple[str, int]]:
    """The hosts that answer: local names always; others if ``ssh HOST true`` succeeds."""
    me = {socket.gethostname(), socket.getfqdn()} | _LOCAL_HOSTS
    alive = []
    for name, n in hosts:
        if name in me:
            alive.append((name, n))
            continue
        try:
            rc = subprocess.run(["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={int(timeout_s)}",
                                 name, "true"], capture_output=True, timeout=timeout_s + 5).returncode
        except (OSError, subprocess.TimeoutExpired):
            rc = 1
        if rc == 0:
            alive.append((name, n))
    return alive


def command_probe(command: str, timeout_s: float = 5.0) -> Callable[[list[tuple[str, int]]], list[tuple[str, int]]]:
    """``--host-probe CMD``: a probe like :func:`probe_hosts` that runs ``CMD HOST`` for every host
    (this machine's names too); a host answers when it exits 0 within ``timeout_s``.

    Raises:
        UserError: ``command`` is empty, cannot be split as a command line, or its program is not
            found (one line).
    """
    import shlex
    import shutil

    from elastic_ring.errors import UserError

    try:
        argv = shlex.split(command)
    except ValueError as e:
        raise UserError(f"--host-probe {command!r}: not a command line ({e})") from None
    if not argv:
        raise UserError("--host-probe: empty command")
    if shutil.which(argv[0]) is None:
        raise UserError(f"--host-probe: {argv[0]!r} is not an executable found on PATH or at that path")

    def probe(hosts: list[tuple[str, int]]) -> list[tuple[str, int]]:
        alive = []
        for name, n in hosts:
            try:
                rc = subprocess.run([*argv, name], capture_output=True, timeout=timeout_s).returncode
            except (OSError, subprocess.TimeoutExpired):
                rc = 1
            if rc == 0:
                alive.append((name, n))
        return alive

    return probe


def first_failed_rank(log_path: Path | None) -> int | None:
    """The rank horovodrun names in "Terminating remaining workers after failure of Process N"."""
    return rank_named_in_log(log_path, _FIRST_FAILED)


class HorovodrunBackend(Backend):
    """A fresh horovodrun per segment; after a failure, only the hosts that still answer."""

    name = "horovodrun"

    def __init__(self, spec, launcher: Launcher | None = None, network_interface: str | None = None,
                 host_probe: Callable[[list[tuple[str, int]]], list[tuple[str, int]]] | None = None) -> None:
        self.spec = spec
        self.launcher = launcher or SubprocessLauncher(fork_server=spec.device == "cpu", cwd=spec.cwd)
        self.network_interface = network_interface
        self.host_probe = host_probe or probe_hosts
        self.hosts_override: str | None = None

    def start(self, launch: SegmentLaunch, log_path: Path) -> Started:
        cmd = horovodrun_command(self.spec, launch.world, launch.segment, launch.stop_at,
                                 self.network_interface, launch.go_file, owner=launch.owner,
                                 hosts=self.hosts_override)
        return Started(self.launcher.start(cmd, self.segment_env(launch), log_path), cmd)

    def segment_env(self, launch: SegmentLaunch) -> dict[str, str]:
        """The environment of a segment's workers."""
        return worker_env(self.spec, launch.world)

    def usable_slots(self, want: int) -> int:
        """Slots that answer now (only hosts of --hosts/--hostfile can go away)."""
        spec = self.spec
        if not (spec.hosts or spec.hostfile):
            return spec.slots
        hosts = host_slots(spec)
        alive = self.host_probe(hosts)
        total = sum(n for _, n in alive)
        if total < sum(n for _, n in hosts):
            self.hosts_override = ",".join(f"{h}:{n}" for h, n in alive) or None
        else:
            self.hosts_override = None
        return total

    def use_hosts(self, hosts: str) -> None:
        self.hosts_override = hosts or None

    def first_failed_rank(self, log_path: Path | None) -> int | None:
        return first_failed_rank(log_path)

    def failure_detail(self) -> None:
        return None  # horovodrun's log and the crash records say it all

    def close(self) -> None:
        pass
