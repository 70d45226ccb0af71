"""Host discovery: where the hosts a job may use come from, asked again every interval.

* :class:`ScriptDiscovery` — Horovod Elastic's contract (``--host-discovery-script``): an
  executable that prints the hosts available now, one ``host:slots`` (or bare ``host``) per line.
  It is run with a timeout; a script that exits non-zero, hangs or prints garbage is one line
  (:attr:`Discovered.error`), never an exception.
* :class:`ThisHostOnly` — a discovery for a job on this machine only (``--relaunch inplace``
  started on this host only: :func:`several_hosts`): its aliases' slots are one host's,
  ``localhost``; another machine is left out, in one line.
* :class:`FixedHosts` — the same interface over a fixed :class:`~.api.HostSet` (``--hosts``,
  Slurm's allocation, a test's value to change).
* :class:`HostPoller` — asks a discovery every ``interval_s`` (clock passed in), keeps the last
  good answer when one fails and says so once per streak of failures, and reports what changed
  (:class:`~.api.HostDiff`).

Nothing here starts a thread: the controller calls :meth:`HostPoller.poll_if_due` from its loop.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from elastic_ring.errors import UserError
from elastic_ring.hosts.api import HostDiff, HostSet, HostsError

DEFAULT_TIMEOUT_S = 10.0  # a discovery script slower than this is taken as hung
DEFAULT_INTERVAL_S = 5.0  # between two runs of the script (--discovery-interval)
MAX_OUTPUT = 1 << 20  # bytes of a script's output read: more is garbage


@dataclass(frozen=True)
class Discovered:
    """One answer of a discovery: the hosts, or (``hosts`` None) why there is none (one line);
    ``note``: a line to say with a good answer (:class:`ThisHostOnly`: the hosts it left out)."""

    hosts: HostSet | None
    error: str | None = None
    note: str | None = None


class HostDiscovery(Protocol):
    def find(self) -> Discovered:
        """The hosts available now (never raises: a failure is ``Discovered(None, reason)``)."""


class FixedHosts:
    """Hosts that change only when told (:meth:`set`)."""

    def __init__(self, hosts: HostSet):
        self.hosts = hosts

    def set(self, hosts: HostSet) -> None:
        self.hosts = hosts

    def find(self) -> Discovered:
        return Discovered(self.hosts)


def check_script(path: str) -> str:
    """The absolute path of a discovery script that can be run, checked before the job starts.

    Raises:
        UserError: missing, a folder, or not executable (one line naming it).
    """
    p = Path(path)
    if not p.exists():
        raise UserError(f"--host-discovery-script {path} does not exist")
    if not p.is_file():
        raise UserError(f"--host-discovery-script {path} is not a file")
    if not os.access(p, os.X_OK):
        raise UserError(f"--host-discovery-script {path} is not executable (chmod +x {path})")
    return str(p.resolve())


class ScriptDiscovery:
    """Runs an executable and parses what it prints (Horovod Elastic's discovery-script contract).

    The script runs in its own process group with ``timeout_s``; on a timeout the whole group is
    killed (a script's own children too), so a hung ``ssh`` in it cannot outlive the poll. Its
    stderr is kept only for the one-line reason of a failure.
    """

    def __init__(self, path: str, timeout_s: float = DEFAULT_TIMEOUT_S, default_slots: int = 1,
                 cwd: str | None = None):
        if timeout_s <= 0:
            raise UserError(f"the discovery timeout must be > 0 s, got {timeout_s}")
        if default_slots < 1:
            raise UserError(f"slots per host must be >= 1, got {default_slots}")
        self.path, self.timeout_s, self.default_slots, self.cwd = path, timeout_s, default_slots, cwd

    def find(self) -> Discovered:
        name = Path(self.path).name
        try:
            proc = subprocess.Popen([self.path], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, cwd=self.cwd, start_new_session=True)
        except OSError as e:
            return Discovered(None, f"discovery script {name} cannot run: {e.strerror or e}")
        try:
            out, err = proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return Discovered(None, f"discovery script {name} did not answer within {self.timeout_s:g} s")
        if proc.returncode != 0:
            how = (f"was killed by signal {-proc.returncode}" if proc.returncode < 0
                   else f"exited with status {proc.returncode}")
            last = _last_line(err)
            return Discovered(None, f"discovery script {name} {how}" + (f": {last}" if last else ""))
        if len(out) > MAX_OUTPUT:
            return Discovered(None, f"discovery script {name} printed {len(out)} bytes: not a host list")
        try:
            text = out.decode()
        except UnicodeDecodeError:
            return Discovered(None, f"discovery script {name} printed bytes that are not text")
        try:
            return Discovered(HostSet.parse(text, self.default_slots, what=f"discovery script {name}"))
        except HostsError as e:
            return Discovered(None, str(e))


class ThisHostOnly:
    """``inner``'s answers for a job on this host only (``--relaunch inplace`` whose first answer
    listed this machine alone): the slots of the hosts that are this machine (``localhost``,
    ``127.0.0.1``, its host name: :func:`~.slurm.is_this_host`) are one host's, ``localhost:N``,
    and a host that is another machine is left out (:attr:`foreign` names the first). Why a ring
    started on one host does not grow onto another machine in place: its workers' ring runs over
    the loopback (horovodrun's ``--network-interface lo``, fixed for the job, unless one was given)
    and its hosts are this host's slots (``localhost:K``, or a slot host per worker), which the
    controller places and drains as one host's: over named hosts it would be another kind of run.
    Each time the hosts left out, or the aliases added up, change, the answer's :attr:`Discovered.note`
    says so in one line (the controller's log and a ``notice`` event)."""

    def __init__(self, inner: HostDiscovery, name: str = "the discovery script") -> None:
        self.inner, self.name = inner, name
        self.foreign: str | None = None  # the last answer's first host that is not this machine
        self._said: tuple = ((), ())  # (the other machines, this machine's names) of the last note

    def find(self) -> Discovered:
        from elastic_ring.hosts.slurm import is_this_host

        got = self.inner.find()
        if got.hosts is None:
            return got
        others = tuple(h for h in got.hosts if not is_this_host(h))
        names = tuple(h for h in got.hosts if is_this_host(h))
        self.foreign = others[0] if others else None
        total = sum(got.hosts[h] for h in names)
        hosts = HostSet([("localhost", total)] if total else [])
        said, self._said = self._said, (others, names if len(names) > 1 else ())
        note = None
        if others and others != said[0]:
            note = (f"{self.name} lists {', '.join(others)}, another machine: not used (this run's ring is in place "
                    f"on this host only, its first answer listed this host alone; to train over several machines "
                    f"in place, start with them listed, or use another --relaunch mode); "
                    f"using {hosts.arg() or 'no slot'}")
        elif len(names) > 1 and names != said[1]:
            note = (f"{self.name} lists {', '.join(names)}: names of this machine, their slots this host's "
                    f"({hosts.arg()}): the ring is in place on this host only")
        return Discovered(hosts, note=note)


def several_hosts(hosts: HostSet | None) -> bool:
    """Whether ``--relaunch inplace`` runs over the hosts of a first answer ``hosts`` as they are
    named (more than one name, or a host that is not this machine: Horovod Elastic's driver starts
    their workers, a host the discovery drops leaves the ring in place), rather than on this host
    only (:class:`ThisHostOnly`: its slots are one ``localhost:N``; no answer yet counts as this
    host). ``localhost`` and ``127.0.0.1`` are two hosts here, as horovodrun over hosts takes them."""
    from elastic_ring.hosts.slurm import is_this_host

    names = list(hosts or ())
    return len(names) > 1 or any(not is_this_host(h) for h in names)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:  # a child that kept the pipes (not in the group): stop reading
        for f in (proc.stdout, proc.stderr):
            if f is not None:
                f.close()
        proc.wait(timeout=5)


def _last_line(err: bytes) -> str:
    lines = [ln.strip() for ln in err.decode(errors="replace").splitlines() if ln.strip()]
    if not lines:
        return ""
    return lines[-1] if len(lines[-1]) <= 160 else lines[-1][:157] + "..."


@dataclass(frozen=True)
class Poll:
    """What one poll found.

    ``hosts`` is the view to act on: this answer, or the last good one when it failed (None when
    no answer has ever been good). ``diff`` is set when that view changed (the first good answer
    is a change from no hosts). ``note`` is a line to show, or None: a failure (once per streak,
    or when its reason changes) and the first good answer after failures.
    """

    hosts: HostSet | None
    diff: HostDiff | None = None
    note: str | None = None
    ok: bool = True  # this poll's answer was good
    age_s: float = 0.0  # how old ``hosts`` is (0 when this answer was good)


class HostPoller:
    """Asks ``discovery`` every ``interval_s`` (``clock`` in seconds; monotonic by default)."""

    def __init__(self, discovery: HostDiscovery, interval_s: float = DEFAULT_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic):
        if interval_s <= 0:
            raise UserError(f"--discovery-interval must be > 0 s, got {interval_s}")
        self.discovery, self.interval_s, self.clock = discovery, interval_s, clock
        self.hosts: HostSet | None = None  # the last good answer
        self._good_at: float | None = None
        self._last_poll: float | None = None
        self._failing: str | None = None  # the reason of the current streak of failures

    def due(self) -> bool:
        return self._last_poll is None or self.clock() - self._last_poll >= self.interval_s

    def poll_if_due(self) -> Poll | None:
        return self.poll() if self.due() else None

    def poll(self) -> Poll:
        """Ask now (whatever the interval)."""
        now = self.clock()
        self._last_poll = now
        try:
            got = self.discovery.find()
        except Exception as e:  # a discovery of the caller's that broke its promise: still one line
            got = Discovered(None, f"host discovery raised {type(e).__name__}: {e}".splitlines()[0])
        if got.hosts is None:
            reason = got.error or "discovery gave no answer"
            note = None
            if reason != self._failing:
                if self.hosts is None:
                    note = f"host discovery failed: {reason}; no hosts known yet"
                else:
                    note = (f"host discovery failed: {reason}; keeping the last hosts "
                            f"({self.hosts.arg() or 'none'}, from {now - self._good_at:.0f} s ago)")
            self._failing = reason
            age = now - self._good_at if self._good_at is not None else 0.0
            return Poll(self.hosts, note=note, ok=False, age_s=age)
        note = "host discovery answers again" if self._failing is not None else None
        if got.note:
            note = f"{note}; {got.note}" if note else got.note
        self._failing = None
        before = self.hosts if self.hosts is not None else HostSet()
        new = got.hosts.ordered_like(before)
        diff = before.diff(new)
        first = self.hosts is None
        self.hosts, self._good_at = new, now
        return Poll(new, diff=diff if (diff or first) else None, note=note)
