"""``horovodrun``, with Horovod's build check asked once per install instead of at every launch.

``python -m elastic_ring.controller.hvdrun ARGS`` is ``horovodrun ARGS``: it runs Horovod's own
launcher (``horovod.runner.launch.run_commandline``) on the same arguments, and nothing else
changes. The one difference: before it starts any worker, horovodrun asks whether Horovod was built
with Gloo (``horovod.common.util.gloo_built``) by forking a process that imports the framework's
extension, torch included. On two CPU cores that takes 1.7 s (1.5 s of CPU) of every launch, on the
critical path of every relaunch and resize. Here a "yes" is remembered per installed extension (its
path, size and modification time; a reinstalled Horovod asks again) in
``$ELASTIC_RING_CACHE/horovod-build.json`` (default ``~/.cache/elastic-ring``). A "no" is not
remembered: Horovod's own error follows, as from horovodrun.

Horovod starts every command (each worker, and the ssh of a remote one) through a middleman
process, a new interpreter it spawns (``safe_shell_exec``), on the path of every worker's start;
here the middlemen are forked from one server process started once (patch ``middleman``), which
does the same in a sixth to a fifth of the time and CPU after its first (``scripts/bench_middleman.py``).

Under Horovod Elastic (``--relaunch inplace``) a second difference: when the host discovery script
is the one the controller wrote (it only prints ``control/hosts``), the driver reads that file
itself, every 0.05 s, instead of running the script in a subprocess once a second. The paused
workers of an in-place resize wait for the driver to see the new host list; a file read is cheap
enough to poll often, so they wait tens of milliseconds instead of up to a second. Another
discovery script is run as horovodrun runs it.

With ``--survive`` (``ELASTIC_RING_SURVIVE=1`` in its environment) a third: a worker's failure no
longer blacklists its host (on one host that would end the job). The survivors go on in their
processes, and the controller shrinks the slot count in the host list (patches ``resume`` and ``blacklist``).
And a fourth: a warm joiner (:class:`Spare`, patch ``warm_joiner``). Once the ring trains, the driver starts one
spare worker process beside it, which imports torch and Horovod, builds the script's model and data
and waits for a go; when the driver next starts a worker for a slot (the grow back after a failure),
it hands that slot's Horovod environment to the spare instead of starting a cold process, and
waits for the spare as for its own worker. Only the ring's re-forming and the state's broadcast are
left on the survivors' path. Once the ring trains again, the next spare is started, so a second
failure's joiner is warm too; a grow that comes before the spare's thread has seen that (a shrink
and a grow a step after the last join) starts the pending spare for its joiner itself instead of a
cold worker (:meth:`Spare.claim`).
A joiner that exits before its ring has trained a step (a rejection inside its ``hvd.init()``, a
crash) would leave the survivors waiting inside theirs for a rank that never comes, up to the
ring's timeout (:meth:`Spare.keep_joining`): its slot's worker is started again (cold), and after
:data:`JOINER_TRIES` failed starts the driver ends the job with one line, so that the controller
restarts it instead of waiting.

And with ``--survive`` on CPUs a fifth: every worker slot is a host of its own, named
``slot<N>.elastic-ring.invalid`` (:func:`slot_host`; the ``.invalid`` domain never resolves), which
this horovodrun starts on this machine (patch ``slot_hosts``). Horovod Elastic's driver keys
each worker by (host, local rank) and numbers a host's slots 0..K-1, so on one ``localhost:K`` only
the highest ranks could go: a survivor at local rank 1 has no slot in a ring of one. With a host per
slot, the controller drops the dead worker's host from the list and any survivor keeps its own key:
rank 0 may die, and the survivors are numbered from 0 again in their order.

Also, for every Horovod Elastic job: the exit of a worker whose slot a shrink removed is never
taken for a failure of the slot's next worker (patches ``start_worker``, ``update_assignments``,
``worker_exit``).

Each of these replaces a private internal of Horovod's runner: every one is a record of
:mod:`elastic_ring.hvd_patches` (the patch names above), which :func:`main` installs (its groups by
the environment: :func:`launcher_groups`) after checking them against the installed Horovod; the
controller checks them before anything starts (:func:`check_horovod_patches`).

And it ends with its controller: started by one (the workers' ``--controller-pid`` in its command
is its parent), it looks ten times a second whether that parent is still there, as the zygote does
(:func:`watch_controller`). When the controller is gone (kill -9 of it, or of its process group:
this horovodrun runs in a session of its own), it ends its workers and spares and exits
(status ``EXIT_ORPHANED``): Horovod Elastic's driver, whose workers exit one at a time, could
otherwise start new ones or wait for hosts long after (once seen: an hour).

The controller uses it for every segment; ``ELASTIC_RING_PLAIN_HOROVODRUN=1`` makes it launch the
plain ``horovodrun`` instead (for comparisons: ``scripts/bench_launcher.py``).
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

from elastic_ring import env as envvars
from elastic_ring.protocol import read_json, waiting_file
from elastic_ring.seam import Go, write_go

CACHE_FILE = "horovod-build.json"


def cache_path() -> Path:
    from elastic_ring.data.check import machine_cache_root

    return machine_cache_root() / CACHE_FILE


def install_key() -> str:
    """Identifies the installed Horovod extensions: what ``gloo_built`` would load, as found on disk."""
    import horovod

    pkg = Path(horovod.__file__).parent
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    parts = [f"horovod {horovod.__version__}", sys.executable]
    for rel in ("tensorflow/mpi_lib", "torch/mpi_lib_v2", "mxnet/mpi_lib"):
        f = pkg / (rel + suffix)
        try:
            st = f.stat()
        except OSError:
            continue
        parts.append(f"{f}:{st.st_size}:{st.st_mtime_ns}")
    return "|".join(parts)


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def cached_check(real, path: Path | None = None):
    """``real`` (Horovod's ``gloo_built``) behind the cache: a remembered yes, or ask and remember it."""
    path = path or cache_path()

    def gloo_built(verbose: bool = False):
        key = install_key()
        if _read(path).get(key) is True:
            return True
        answer = real(verbose=verbose)
        if answer:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                data = _read(path)
                data[key] = True
                tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                tmp.write_text(json.dumps(data, indent=1) + "\n")
                os.replace(tmp, path)
            except OSError:
                pass  # a read-only home: ask every time, as horovodrun does
        return answer

    return gloo_built


HOROVOD_HELP = ("install it with scripts/setup.sh (Horovod 0.28.1 built with PyTorch and Gloo), or run "
                "with --collective torch")


def horovod_installed() -> bool:
    """Whether Horovod can be imported here (without importing it): ``--collective`` defaults to
    it when it can, and to torch.distributed when it cannot (one line says so)."""
    import importlib.util

    try:
        return "horovod" in sys.modules or importlib.util.find_spec("horovod") is not None
    except (ImportError, ValueError):
        return False


def check_horovod_serves(device: str, gloo_check=None) -> None:
    """Before anything starts: the installed Horovod can run the workers, or one line says what is
    missing (:class:`~elastic_ring.errors.UserError`, exit 2) instead of a launch that fails in
    every worker and a restart loop. Checks that Horovod is importable, that its PyTorch extension
    was built, and on CPUs that it was built with Gloo (Horovod's own ``gloo_built``, behind the
    same per-install cache as the launcher: a remembered yes costs a file read). ``gloo_check``:
    that check, for tests."""
    from elastic_ring.errors import UserError

    if not horovod_installed():
        raise UserError(f"--collective horovod: Horovod is not installed: {HOROVOD_HELP}")
    import horovod

    pkg = Path(horovod.__file__).parent
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    ext = pkg / "torch" / ("mpi_lib_v2" + suffix)
    if not ext.exists():
        raise UserError(f"--collective horovod: Horovod {horovod.__version__} has no PyTorch extension "
                        f"({ext.name} missing: it was built without torch): {HOROVOD_HELP}")
    if device == "cpu":
        if gloo_check is None:
            from horovod.common import util

            gloo_check = cached_check(util.gloo_built)
        if not gloo_check(verbose=False):
            raise UserError(f"--collective horovod: Horovod {horovod.__version__} was built without Gloo, "
                            f"which CPU workers need: {HOROVOD_HELP}")


def launcher_groups(env: dict[str, str] | None = None) -> list[str]:
    """The groups of :mod:`elastic_ring.hvd_patches` this horovodrun installs, by its environment:
    ``launcher`` always, ``survive`` with ``ELASTIC_RING_SURVIVE=1``, ``slot-hosts`` with
    ``ELASTIC_RING_SLOT_HOSTS=1``."""
    return ["launcher", *(["survive"] if envvars.survive(env) else []),
            *(["slot-hosts"] if envvars.slot_hosts(env) else [])]


def check_horovod_patches(script: str | None = None, check=None) -> None:
    """Before anything starts (beside :func:`check_horovod_serves`): the installed Horovod still
    has the internals elastic-ring patches, or one line names the first that is missing or changed
    and the installed version (:class:`~elastic_ring.hvd_patches.HorovodChanged`, a
    :class:`~elastic_ring.errors.UserError`: exit 2). Checked: every patch of this launcher (all
    of its groups, whichever options the run has), and the worker's where ``script`` uses Horovod
    Elastic's API. A yes is remembered per install. ``check``: the checker, for tests."""
    from elastic_ring.hvd_patches import check_installed
    from elastic_ring.worker.hvd_elastic import uses_horovod_elastic

    groups = ["launcher", "survive", "slot-hosts", *(["worker"] if script and uses_horovod_elastic(script) else [])]
    (check or check_installed)(*groups)


def command_prefix(plain: bool | None = None) -> list[str]:
    """How the controller starts horovodrun: this module, or the plain script where asked
    (``plain``; by default ``ELASTIC_RING_PLAIN_HOROVODRUN=1``)."""
    if plain is None:
        plain = envvars.plain_horovodrun()
    if plain:
        hr = Path(sys.executable).parent / "horovodrun"
        return [str(hr) if hr.exists() else "horovodrun"]
    return [sys.executable, "-m", "elastic_ring.controller.hvdrun"]


DISCOVERY_POLL_S = 0.05  # how often the driver reads the controller's host list


def discovery_script_text(hosts: Path) -> str:
    """The discovery script of ``--relaunch inplace``: it prints the hosts file (the horovodrun this
    tool starts reads that file itself instead: patch ``discovery`` of :mod:`elastic_ring.hvd_patches`)."""
    return f"#!/bin/sh\ncat '{hosts}'\n"


def hosts_file_of(script: str | os.PathLike) -> Path | None:
    """The file the controller's discovery script prints (``cat 'FILE'``), or None when the script
    is another one."""
    try:
        text = Path(script).read_text()
    except (OSError, ValueError):
        return None
    hosts = Path(script).with_name("hosts")
    return hosts if text == discovery_script_text(hosts) else None


SLOT_DOMAIN = "elastic-ring.invalid"  # RFC 2606: a name under .invalid never resolves


def slot_host(i: int) -> str:
    """The host name of worker slot ``i`` on this machine (see the module docstring)."""
    return f"slot{i}.{SLOT_DOMAIN}"


def is_slot_host(name: str) -> bool:
    return name.endswith("." + SLOT_DOMAIN) and name.startswith("slot")


SPARE_GO = "spare-hvd.json"  # the warm joiner's go file, in the run's control folder
SPARE_POLL_S = 0.2  # how often the next spare's start looks for the ring's training (the progress file)
JOINER_TRIES = 3  # starts of a joining slot's worker that exits before its ring trains, before the job ends
PLACEHOLDER_RANK = {"HOROVOD_HOSTNAME": "localhost", "HOROVOD_RANK": "1", "HOROVOD_SIZE": "2",
                    "HOROVOD_LOCAL_RANK": "1", "HOROVOD_CROSS_RANK": "0", "HOROVOD_CROSS_SIZE": "1"}


def _flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv[:-1] else None


class Spare:
    """The warm joiner (patch ``warm_joiner`` of :mod:`elastic_ring.hvd_patches`): the workers'
    command, run with a placeholder rank, segment -1 (its pid record is under a segment no watch
    reads) and a go file; started once this job's ring trains (the run's progress file is newer
    than the job), so that its imports do not slow the ring's own start, and it is never handed a
    slot of the job's first ring."""

    def __init__(self, run_command: str, env: dict[str, str]) -> None:
        import shlex

        words = shlex.split(run_command)
        cut = next(i for i, w in enumerate(words) if "=" not in w or w.startswith("-"))
        self.run_env = dict(w.split("=", 1) for w in words[:cut])
        argv = words[cut:]
        self.run_dir = Path(_flag(argv, "--run-dir") or ".")
        self.segment = int(_flag(argv, "--segment") or 0)  # a cold joiner's record names it
        self.go = self.run_dir / "control" / SPARE_GO
        self._launches = 0  # each spare its own go file: a later spare's start never removes an earlier one's go
        i = argv.index("--segment")
        argv[i + 1] = "-1"
        cut = argv.index("--")
        self.argv = [*argv[:cut], "--go-file", str(self.go), *argv[cut:]]
        self.env = {**env, **self.run_env, "PYTHONUNBUFFERED": "1"}
        self.proc = None
        self._pending: object | None = None  # the start_when_training call whose spare is not started yet
        self.t0 = self.born = time.time()
        self.shutdown = None
        # the driver starts the slots of a grow from threads of their own, at once: one of them
        # takes the spare (its check and its take under one lock), the others start cold
        import threading

        self._lock = threading.Lock()

    def start_when_training(self, shutdown) -> None:
        """Start the spare once the ring trains (a step after ``self.t0``) from a thread of its own;
        ``shutdown`` (the job's end) stops the wait. Until it starts, the spare is pending: a
        joiner's first start that comes first starts it itself (:meth:`claim`), and the thread then
        starts none."""
        import threading

        self.shutdown = shutdown
        token = object()
        with self._lock:
            self._pending = token

        def run() -> None:
            while not self.trained_since(self.t0):  # (a resumed run's progress file is older)
                if shutdown.wait(SPARE_POLL_S):
                    return
            with self._lock:
                if self._pending is token:
                    self._launch()

        threading.Thread(target=run, daemon=True, name="elastic-ring-spare").start()

    def _launch(self) -> None:
        """Start the pending spare process (under ``self._lock``)."""
        import subprocess

        self._pending = None
        # a go file of its own (spare-hvd.json, spare-hvd-1.json, ...): the spare before it may have
        # been handed its slot a moment ago, its go not read yet (two slots of one grow: the second
        # starts this spare while the first's joiner is still polling its go)
        n = self._launches = self._launches + 1
        go = self.go.with_name(SPARE_GO if n == 1 else f"{Path(SPARE_GO).stem}-{n - 1}.json")
        go.unlink(missing_ok=True)
        waiting_file(go).unlink(missing_ok=True)
        argv = list(self.argv)
        if "--go-file" in argv:
            argv[argv.index("--go-file") + 1] = str(go)
        local = str(max(2, int(self.env.get("HOROVOD_LOCAL_SIZE", "2"))))
        try:
            self.proc = subprocess.Popen(argv, env={**self.env, **PLACEHOLDER_RANK, "HOROVOD_LOCAL_SIZE": local})
            self.proc.go_file = self.go = go
        except OSError as e:  # (the slot's worker starts cold)
            print(f"elastic-ring hvdrun: the warm joiner could not be started: {e}", flush=True)

    def ready(self, events: list) -> bool:
        """Whether the spare takes the slot: it waits for its go (imports and build done), or it
        was started and is on its way there (then it is waited for: it is ahead of a cold start)."""
        p = self.proc
        while p is not None and p.poll() is None and not any(e.is_set() for e in events):
            if waiting_file(self.go).exists():
                return True
            time.sleep(0.02)
        return False

    def claim(self, events: list, start_pending: bool = False) -> Any:
        """The spare's process, taken for one slot when it is :meth:`ready` (then no other slot
        gets it), else None. The check and the take are one step: two slots of one grow, asking at
        once, never both get it. ``start_pending``: a joiner's first start (the driver's grow, the
        ring trained before it): a spare still pending is started now and waited for. Its thread
        starts it only once it sees the ring train since the last join (the progress file, polled
        every :data:`SPARE_POLL_S`), and a grow one step after that join (a shrink and a grow in a
        row) came before it: the grow's worker then started cold, not as the spare."""
        with self._lock:
            if start_pending and self.proc is None and self._pending is not None:
                self._launch()
            if not self.ready(events):
                return None
            p, self.proc = self.proc, None
            return p

    def join(self, p: Any, slot_env: dict[str, str], events: list) -> tuple[int, float]:
        """Hand the spare ``p`` (:meth:`claim`'s) the slot's environment; wait for it as for the
        driver's own worker (its exit status; ended when the job or its host is)."""
        go = getattr(p, "go_file", self.go)  # its own go file (a later spare has another)
        try:  # the worker's own pid, which it wrote (forked from the zygote, it is not p's)
            pid = int(read_json(waiting_file(go))["pid"])
        except (ValueError, KeyError, TypeError):
            pid = p.pid
        print(f"elastic-ring hvdrun: the warm joiner (pid {pid}) takes rank {slot_env.get('HOROVOD_RANK')}",
              flush=True)
        write_go(go, Go(0, time.time(), slot_env, pid_segment=self.segment))
        if self.shutdown is not None:  # the next spare, for the next failure, once the ring trains again
            self.t0 = time.time()
            self.start_when_training(self.shutdown)
        while (rc := p.poll()) is None:
            if any(e.is_set() for e in events):
                p.kill()
            time.sleep(0.05)
        if rc != 0:
            print(f"Process {slot_env.get('HOROVOD_RANK')} exit with status code {rc}.", flush=True)
        return rc, time.time()

    def trained_since(self, t: float) -> bool:
        """Whether the ring has trained a step since ``t`` (the run's progress file is newer; rank 0
        writes it after a step, at most twice a second)."""
        try:
            return (self.run_dir / "control" / "progress.json").stat().st_mtime >= t
        except OSError:
            return False

    def keep_joining(self, start, slot_env: dict[str, str], events: list, stop=None) -> tuple[int, float]:
        """Run ``start()`` (a worker for the slot of ``slot_env``: its exit status and time) and,
        when the ring trained before it started (it joins a ring re-formed in place) and it exits
        non-zero before the ring trains again, start it again (cold: ``start`` takes a spare only
        when one waits): up to :data:`JOINER_TRIES` starts. Such a joiner never formed its ring
        (Horovod's driver once told one that its slot, shrunk off and grown back a step earlier,
        had been removed): the survivors wait for it inside ``hvd.init()``, where only the ring's
        timeout (300 s) would end their wait. After the last try ``stop(line)`` ends the job (the
        driver's stop: the controller sees horovodrun fail and restarts)."""
        joining = self.trained_since(self.born)
        rank = slot_env.get("HOROVOD_RANK")
        for tries in range(1, JOINER_TRIES + 1):
            t0 = time.time()
            rc, ts = start()
            if rc == 0 or not joining or any(e.is_set() for e in events) or self.trained_since(t0):
                return rc, ts
            if tries < JOINER_TRIES:
                print(f"elastic-ring hvdrun: the joiner for rank {rank} exited (status {rc}) before its ring "
                      f"formed: starting it again ({tries + 1} of {JOINER_TRIES})", flush=True)
        line = (f"elastic-ring hvdrun: the joiner for rank {rank} exited (status {rc}) before its ring formed, "
                f"{JOINER_TRIES} times: ending the job (the controller restarts it)")
        print(line, flush=True)
        from elastic_ring.protocol import write_error_record

        try:  # the failure the controller names (rank 0, ended with the job, left no record of its own)
            write_error_record(self.run_dir, RuntimeError(line.split(": ", 1)[1]), int(rank or 0))
        except ValueError:
            pass
        if stop is not None:
            stop(line)
        return rc, ts

    def end(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()


_SPARES: list[Spare] = []  # the warm joiners started (hvd_patches "warm_joiner"), ended with the launcher
_DRIVERS: list[Any] = []  # Horovod Elastic's driver of this launcher (hvd_patches "start_worker" keeps it)

CONTROLLER_POLL_S = 0.1  # how often this horovodrun looks whether its controller is still there (a getppid)


def controller_pid(argv: list[str]) -> int | None:
    """The pid of the controller that started this horovodrun: the workers' ``--controller-pid``
    in its command (:func:`~.backends.horovodrun.worker_args`), when that process is this one's
    parent; None otherwise (started by hand, or by a plain shell: nothing to watch)."""
    try:
        pid = int(_flag(argv, "--controller-pid") or 0)
    except ValueError:
        return None
    return pid if pid > 0 and pid == os.getppid() else None


def _end_orphaned() -> None:
    """The controller is gone: kill this launcher's descendants (the workers, or the zygote's
    stand-ins whose forked workers the zygote ends with them, the spares, ssh clients: remote
    workers stop on the controller's heartbeat) and exit."""
    import psutil

    from elastic_ring.protocol import EXIT_ORPHANED

    for spare in _SPARES:
        spare.end()
    try:
        procs = psutil.Process().children(recursive=True)
    except psutil.Error:
        procs = []
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass
    os._exit(EXIT_ORPHANED)


def watch_controller(pid: int, poll_s: float = CONTROLLER_POLL_S, end=_end_orphaned) -> Any:
    """From a thread of its own: once this process's parent is no longer ``pid`` (the controller
    died; this process was handed to init), say so in one line and ``end()``."""
    import threading

    def run() -> None:
        while os.getppid() == pid:
            time.sleep(poll_s)
        print(f"elastic-ring hvdrun: its controller (pid {pid}) is gone: ending the job and its workers", flush=True)
        end()

    t = threading.Thread(target=run, daemon=True, name="elastic-ring-controller-watch")
    t.start()
    return t


def main() -> None:
    from horovod.runner import launch

    from elastic_ring.hvd_patches import HorovodChanged, apply

    try:
        apply(*launcher_groups())
    except HorovodChanged as e:  # (the controller's start checked it: a Horovod changed since)
        print(e, file=sys.stderr, flush=True)
        sys.exit(2)
    sys.argv[0] = "horovodrun"
    pid = controller_pid(sys.argv[1:])
    if pid is not None:
        watch_controller(pid)
    try:
        sys.exit(launch.run_commandline())
    finally:
        for s in _SPARES:
            s.end()


if __name__ == "__main__":  # the importable module's main: the patches' _SPARES are its own
    from elastic_ring.controller.hvdrun import main as _main

    _main()
