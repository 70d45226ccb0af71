"""The Horovod Elastic backend of ``--relaunch inplace``: one long-lived ``horovodrun --min-np 1
--max-np SLOTS --host-discovery-script RUN_DIR/control/discover.sh`` on one host, or over the
hosts a ``--host-discovery-script`` of the user's lists (:meth:`ElasticBackend.run_over_hosts`). At a resize the
workers pause between two steps; the backend writes the new size into
``control/inplace-<seg>.json`` and into what the discovery script prints, and Horovod's driver
re-forms the ring (a new worker syncs from rank 0; a removed one is ended by Horovod); survivors
keep their processes. A scheduled resize's slot count and action are reported ahead
(:meth:`report_ahead`), once the segment runs, so that the driver has seen it when the workers
pause and rank 0 need not wait for the controller.

Survivors go on (``--survive``): Horovod Elastic's driver, told not to blacklist this host for a
worker's failure (patch ``blacklist`` of :mod:`elastic_ring.hvd_patches`), keeps the job up
when a worker dies; its peers say which steps they hold in memory
(:func:`elastic_ring.seam.survivor_file`), and when they hold one in common the failure
is a shrink (:meth:`ElasticBackend.survivors`): the in-place resize that follows writes the new
host list and rolls them back to that step. On CPUs each worker slot is a host of its own
(:func:`elastic_ring.controller.hvdrun.slot_host`): the list names the survivors' slots in their
order, so any rank may die, rank 0 included, and the survivors are numbered from 0 again. With
``--device cuda`` the list stays ``localhost:K`` (each worker's GPU is its local rank): the driver
numbers a host's slots by their place, so only the highest ranks can go there, and the death of a
lower rank (its slot would leave a hole) is a restart from the checkpoint. No common step or a
silent survivor is a restart from the checkpoint too. The dead worker's slot
comes back (:attr:`ElasticBackend.rejoins`): the controller plans a grow back to the job's size
after the survivors' next step, and the driver starts a new worker there, which receives the state
by broadcast from rank 0 as at any in-place grow.

Over discovered hosts (:meth:`ElasticBackend.run_over_hosts`: the user's script lists several
hosts, or another machine) what the controller's script prints is the hosts the controller placed
the segment on (``host:slots`` lines, :meth:`ElasticBackend.use_hosts`), by their names: a host
drained or dropped from the discovery leaves the list at the next in-place resize, and the driver
ends the workers on it while the others go on in their processes (renumbered in Horovod's order of
the hosts); a host that appears is added the same way (its workers get the state by broadcast). No
slot hosts there (a worker's notice drains its host). A shrink, asked or scheduled, is written ahead
with the hosts the controller placed it on (:meth:`ElasticBackend.shrink_ahead`); a scheduled grow
is not (its hosts are placed when it comes). A worker's failure there leaves its host out
with every worker on it: the survivors on the other hosts go on in their processes (the controller
excludes the failed host for its cooldown and grows back onto it after), unless a survivor shares
that host (then a restart from the checkpoint: :meth:`ElasticBackend.survivors`).
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from pathlib import Path

from elastic_ring import protocol, seam
from elastic_ring.controller import hvdrun
from elastic_ring.controller.hvdrun import discovery_script_text
from elastic_ring.controller.backends import survival
from elastic_ring.controller.backends.api import (BUILTIN_TARGET, Backend, Handle, Launcher, SegmentLaunch, Started,
                                                  Survival, serve_source, worker_env)
from elastic_ring.controller.backends.horovodrun import SubprocessLauncher, first_failed_rank, worker_args
from elastic_ring.controller.membership import StateSource
from elastic_ring.env import SURVIVE as SURVIVE_ENV


def discovery_files(run_dir: Path) -> tuple[Path, Path]:
    """(the discovery script Horovod Elastic runs, the file it prints: ``localhost:N``, or one
    slot host per line)."""
    ctl = protocol.control_dir(run_dir)
    return ctl / "discover.sh", ctl / "hosts"


def write_hosts(run_dir: Path, world: int, names: list[str] | None = None,
                placed: list[tuple[str, int]] | None = None) -> bool:
    """What the discovery script reports from now on: ``world`` slots on this host, or the slot
    hosts ``names`` (one slot each, in rank order), or the discovered hosts ``placed`` (``(host,
    slots)``). Returns False when it already did (Horovod's driver then sees no change and sends no
    notification)."""
    _, hosts = discovery_files(run_dir)
    text = ("".join(f"{h}:{n}\n" for h, n in placed) if placed else
            "".join(f"{n}:1\n" for n in names) if names else f"localhost:{world}\n")
    if hosts.exists() and hosts.read_text() == text:
        return False
    hosts.parent.mkdir(parents=True, exist_ok=True)
    tmp = hosts.with_name(f".{hosts.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, hosts)
    return True


def elastic_horovodrun_command(spec, world: int, segment: int, stop_at: int,
                               owner: str = "", network_interface: str | None = None,
                               names: list[str] | None = None,
                               placed: list[tuple[str, int]] | None = None) -> list[str]:
    """The one long-lived horovodrun of ``--relaunch inplace`` (Horovod Elastic, gloo): it starts
    at ``world`` workers (on the slot hosts ``names``, or the discovered hosts ``placed``, where
    given); the controller resizes by changing what the discovery script prints. Its network
    interface: ``network_interface``, else the loopback while every host is this machine (else
    Horovod finds one the hosts share)."""
    from elastic_ring.hosts.slurm import is_this_host

    script, hosts = discovery_files(spec.run_dir)
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(discovery_script_text(hosts))
    script.chmod(0o755)
    write_hosts(spec.run_dir, world, names, placed)
    nic = network_interface or (None if any(not is_this_host(h) for h, _ in placed or ()) else "lo")
    return [*hvdrun.command_prefix(), "-np", str(world), "--min-np", "1",
            "--max-np", str(spec.slots), "--host-discovery-script", str(script),
            *(["--network-interface", nic] if nic else []), "--gloo", "--start-timeout", "120",
            *worker_args(spec, segment, stop_at, owner), "--inplace",
            "--", spec.script or BUILTIN_TARGET, *spec.script_args]


def _current_records(run_dir: Path, segment: int) -> dict[int, dict]:
    """rank -> the pid record of the process that holds it in ``segment``: of each process's records
    of its newest segment up to this one (:func:`~elastic_ring.protocol.read_pid_records` with
    ``newest``: an in-place re-form may renumber it), each rank's newest by when it was written,
    not by its segment: a joiner Horovod's driver starts names the segment its horovodrun
    was launched for, and a rank's record of an earlier ring is stale once another process holds
    that rank (seen: after rank 0's host left and the ring grew back, the survivor was missing from
    the map at a second failure, which was then restarted from the checkpoint)."""
    best: dict[int, tuple[float, int, dict]] = {}
    for rec in protocol.read_pid_records(run_dir, reformed=True, newest=True, upto=segment):
        try:
            r, s, written = int(rec["rank"]), rec["segment"], rec["written"]
        except (KeyError, TypeError, ValueError):
            continue
        # (a warm spare's record, segment -1, is a placeholder)
        if s >= 0 and (written, s) >= best.get(r, (-1.0, -1, {}))[:2]:
            best[r] = (written, s, rec)
    return {r: rec for r, (_, _, rec) in best.items()}


def _current_pids(run_dir: Path, segment: int) -> dict[int, int]:
    """rank -> the pid of the process that holds it in ``segment`` (:func:`_current_records`)."""
    return {r: int(rec["pid"]) for r, rec in _current_records(run_dir, segment).items()}


def _gone(pid: int) -> bool:
    """The process has exited (a zombie not reaped yet counts as exited)."""
    if not protocol.pid_alive(pid):
        return True
    try:
        import psutil

        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except Exception:  # noqa: BLE001 - gone meanwhile
        return True


class _Watched:
    """horovodrun's handle, with a worker's loss seen while the job stays up (``--survive``: the
    driver no longer ends it): ``poll`` is 1 once a survivor has said so, until the backend lets
    the survivors go on (:meth:`go_on`) or ends the job."""

    def __init__(self, inner: Handle, run_dir: Path, t_start: float) -> None:
        self.inner, self.run_dir, self.t_start = inner, run_dir, t_start
        self.pid = inner.pid
        self.failed = False

    def poll(self) -> int | None:
        rc = self.inner.poll()
        if rc is not None:
            return rc
        if not self.failed:
            self.failed = bool(survivor_records(self.run_dir, self.t_start))
        return 1 if self.failed else None

    def go_on(self) -> None:
        self.failed = False

    def kill(self) -> None:
        self.inner.kill()

    def end(self) -> None:
        """Kill the job and wait until horovodrun has exited."""
        self.inner.kill()
        while self.inner.poll() is None:
            time.sleep(0.05)


def survivor_records(run_dir: Path, since: float) -> list[dict]:
    """The survivors' records (:func:`elastic_ring.seam.survivor_file`) newer than ``since``."""
    out = []
    for f in protocol.control_dir(run_dir).glob("survivor-*.json"):
        rec = protocol.read_json(f)
        if isinstance(rec, dict) and float(rec.get("time", 0.0)) >= since:
            out.append(rec)
    return out


class ElasticBackend(Backend):
    """One Horovod Elastic job for the whole run; an :class:`~.api.InPlaceRing` (see the module docstring)."""

    name = "elastic"
    rejoins = True  # after survivors went on (--survive), a grow back to the planned size starts a new worker

    def __init__(self, spec, launcher: Launcher | None = None, network_interface: str | None = None,
                 survive: bool = False) -> None:
        self.spec = spec
        self.survive = survive  # survivors of a failure go on from their copy in memory
        self.survive_env = "1"  # its workers' ELASTIC_RING_SURVIVE ("auto": they time the copy first)
        self._rollback: int | None = None  # the step the next in-place resize rolls the survivors back to
        self._handle: _Watched | None = None
        self.launcher = launcher or SubprocessLauncher(fork_server=spec.device == "cpu", cwd=spec.cwd)
        self.network_interface = network_interface
        self.hosts_written = 0.0  # when the discovery file last changed
        self.refused: str | None = None  # why the last failure's survivors did not go on from memory
        self._launch: SegmentLaunch | None = None  # the running segment's
        self._ahead: SegmentLaunch | None = None  # the resize whose action is written ahead
        self._ahead_taken = False  # rank 0 took it (renamed the file)
        # a host per worker slot (hvdrun.slot_host): any rank may die; on GPUs the local rank is the device
        self.slot_hosts = survive and spec.device == "cpu"
        self._live: list[str] = []  # the running ring's slot hosts (Horovod orders them, not this list)
        self._dead: set[str] = set()  # slot hosts of failed workers: never given again
        self._leaving: set[str] = set()  # slot hosts of workers leaving with notice at the next resize (leave)
        self._placed: list[tuple[str, int]] = []  # over discovered hosts: the next ring's (use_hosts)

    def _hosts_by_rank(self) -> dict[int, str]:
        """rank -> slot host of the running ring, from the workers' pid records."""
        cur = self._launch
        if cur is None:
            return {}
        recs = _current_records(self.spec.run_dir, cur.segment)
        return {r: rec["launch_host"] for r, rec in recs.items() if r < cur.world and rec.get("launch_host")}

    def _names(self, world: int) -> list[str] | None:
        """The slot hosts of a ring of ``world`` (None: ``localhost:world``): a shrink keeps the
        hosts of ranks 0..world-1 (Horovod on ``localhost:K`` ends the highest ranks too), a grow
        adds the lowest slots no live or failed worker holds."""
        if not self.slot_hosts:
            return None
        names = [n for n in self._live if n not in self._leaving]
        if self._leaving:  # a worker leaving with notice: its slot goes, the others keep their order
            names = names[:world]
        elif world < len(names):
            by_rank = self._hosts_by_rank()
            keep = [by_rank.get(r) for r in range(world)]
            fits = set(keep) <= set(names) and len(set(keep)) == world
            names = keep if fits else names[:world]  # type: ignore[assignment]
        i = 0
        while len(names) < world:
            n = hvdrun.slot_host(i)
            if n not in names and n not in self._dead:
                names.append(n)
            i += 1
        return names

    def _write_hosts(self, world: int) -> list[str] | None:
        """The host list of a ring of ``world``; :attr:`hosts_written` is stamped before the write.
        Rank 0 acts on an action once Horovod's driver has reported a host change at least as new
        (``ElasticRing.takes``), and the driver stamps its report with the whole second it saw the
        change: a stamp taken after the write could be later than the driver's sight of it by more
        than that second's rest (a loaded machine: 0.25 s in a fresh-clone CI run), and rank 0 then
        never took the action (the run hung at that stop)."""
        names = self._names(world)
        t = time.time()
        if write_hosts(self.spec.run_dir, world, names, self._placed_for(world)):
            self.hosts_written = t
        return names

    def run_over_hosts(self) -> None:
        """The ring runs over the hosts the user's discovery script lists (several, or another
        machine: :func:`~elastic_ring.hosts.discovery.several_hosts`), each by its name, as the
        controller places the segments (:meth:`use_hosts`); no slot hosts. After a failure no
        joiner is planned: the failed host is grown back onto when discovery offers it again (its
        cooldown over)."""
        self.over_hosts, self.slot_hosts, self.rejoins = True, False, False

    def _placed_for(self, world: int) -> list[tuple[str, int]] | None:
        """Over discovered hosts: the hosts placed for a ring of ``world`` (None: one host's slots,
        or none placed for that size)."""
        if not self.over_hosts or sum(n for _, n in self._placed) != world:
            return None
        return self._placed

    def leave(self, host: str) -> bool:
        """A SIGTERM to the worker on slot host ``host`` (its notice): the next in-place resize
        drops that slot host (the driver ends its worker, the others are numbered from 0 again in
        their order, rank 0 included). Only with a host per slot (on CPUs, :attr:`slot_hosts`); on
        ``localhost:K`` the driver would end the highest rank instead."""
        if not self.slot_hosts or host not in self._live or len(self._live) - len(self._leaving | {host}) < 1:
            return False
        self._leaving.add(host)
        return True

    def unleave(self) -> None:
        self._leaving.clear()

    def shrink_ahead(self, launch: SegmentLaunch, hosts: str | None, at_step: int = seam.AT_NEXT_STOP) -> bool:
        """A shrink asked while the ring trains (a host dropped from the discovery, drained, a
        worker's notice, a live resize) becomes what a scheduled shrink is: the host list of the
        next ring and its action are written now, the action ahead for the segment's next stop
        (``seam.AT_NEXT_STOP``), so that at the stop the workers agree on rank 0 takes it at once
        (Horovod's driver has reported the list meanwhile) instead of waiting for the controller to
        see the pause and for the driver's next poll and notice. The driver starts or ends no process
        before the workers reset. The controller withdraws it as a scheduled one's
        (:meth:`retract_ahead`: an interrupt, a failure first, rank 0 not there in time). Over
        discovered hosts ``hosts`` is the controller's placement of the next ring (:attr:`_placed`,
        the running ring's, is kept for a failure meanwhile: :meth:`_hosts_after`). A scheduled
        shrink over hosts is written the same way, for its stop's step (``at_step``): there
        :meth:`report_ahead` has no hosts to place. False: nothing written (not a shrink of the
        running segment, one is written ahead already, or the hosts do not make that size)."""
        from elastic_ring.controller.api import parse_hosts

        cur = self._launch
        if cur is None or self._ahead is not None or launch.segment != cur.segment + 1 or launch.world >= cur.world:
            return False
        if self.over_hosts:
            placed = parse_hosts(hosts) if hosts else []
            if sum(n for _, n in placed) != launch.world:
                return False
            t = time.time()
            if write_hosts(self.spec.run_dir, launch.world, None, placed):
                self.hosts_written = t
        else:
            self._write_hosts(launch.world)
        self._ahead, self._ahead_taken = launch, False
        seam.write_resize_action(self.spec.run_dir, cur.segment, launch, time.time(), at_step=at_step,
                                 hosts_written=self.hosts_written)
        return True

    def start(self, launch: SegmentLaunch, log_path: Path) -> Started:
        self._live, self._dead, self._leaving = [], set(), set()
        names = self._names(launch.world)
        cmd = elastic_horovodrun_command(self.spec, launch.world, launch.segment, launch.stop_at,
                                         launch.owner, self.network_interface, names, self._placed_for(launch.world))
        self._live = names or []
        env = worker_env(self.spec, launch.world, elastic=True)
        if self.survive:
            env[SURVIVE_ENV] = self.survive_env  # the workers keep their copies; the driver keeps the host (hvdrun)
        if self.slot_hosts:
            env[protocol.SLOT_HOSTS_ENV] = "1"  # hvdrun starts the slot hosts here; a worker's local rank is its rank
        if self._handle is not None and self._handle.inner.poll() is None:
            self._handle.end()  # a restart after a failure the survivors could not take
        t0 = time.time()
        handle = self.launcher.start(cmd, env, log_path)
        self.hosts_written = time.time()
        self._launch, self._ahead = launch, None
        if self.survive:
            handle = self._handle = _Watched(handle, self.spec.run_dir, t0)
        return Started(handle, cmd)

    def usable_slots(self, want: int) -> int:
        return self.spec.slots  # one host: always all of it

    def use_hosts(self, hosts: str) -> None:
        """The hosts of the next ring (``a:2,b:1``, host discovery's placement: the controller gives
        them before a launch and before an in-place resize). Over discovered hosts they are what the
        driver is told; on this host only (``localhost:N``: runs.host_manager) the ring's size is
        the segment's, on this host's slots, nothing else to choose."""
        from elastic_ring.controller.api import parse_hosts

        self._placed = parse_hosts(hosts)

    def first_failed_rank(self, log_path: Path | None) -> int | None:
        return first_failed_rank(log_path)

    def report_ahead(self, launch: SegmentLaunch) -> None:
        """Horovod's driver notices the new count while the workers train (it starts or ends no
        process before they reset), so at the stop the workers re-form the ring at once instead
        of waiting for the discovery. The next segment's (``launch``) action is written ahead too,
        naming the step it applies at: at the pause rank 0 takes it
        (:func:`elastic_ring.seam.take_ahead_action`) once the driver has reported the new host
        list, without waiting for the controller to see the segment's end. Not over discovered hosts:
        there the controller places the next ring's hosts and writes a shrink ahead with them
        (:meth:`shrink_ahead`; a grow's hosts are placed when it comes: ``use_hosts``)."""
        if self.over_hosts:
            return
        self._write_hosts(launch.world)
        cur = self._launch
        if cur is None or self._ahead is not None or launch.segment != cur.segment + 1:
            return
        self._ahead, self._ahead_taken = launch, False
        seam.write_resize_action(self.spec.run_dir, cur.segment, launch, time.time(), at_step=cur.stop_at,
                            hosts_written=self.hosts_written)

    def retract_ahead(self, segment: int) -> bool:
        """Withdraw the action written ahead for ``segment``: True when withdrawn or none was
        written; False when rank 0 has already taken it (the workers go on at the scheduled size).
        The discovery keeps the count reported ahead until the controller's next word."""
        a, cur = self._ahead, self._launch
        if a is None or cur is None or cur.segment != segment:
            return True
        if not self._ahead_taken:
            self._ahead_taken = not seam.withdraw_action_ahead(self.spec.run_dir, segment)
        if self._ahead_taken:
            return False
        self._ahead = None
        return True

    def resize_in_place(self, paused_segment: int, launch: SegmentLaunch, t_launch: float,
                        source: StateSource) -> None:
        """Tell the paused workers the new size and change what the discovery script reports:
        Horovod's driver notices, starts a worker for a new slot (or ends the one whose slot went),
        and the survivors re-form the ring in their processes. When rank 0 took the action
        written ahead, the workers are already on their way."""
        serve_source(self.name, source)  # memory or peer: from the checkpoint is a new group (start)
        if not self.retract_ahead(paused_segment):
            a = self._ahead
            assert a is not None
            if (a.world, a.segment, a.stop_at) != (launch.world, launch.segment, launch.stop_at):
                raise RuntimeError(f"the workers took the resize to {a.world} written ahead for "
                                   f"segment {a.segment}, the controller decided {launch}")
            self._live = self._names(launch.world) or []
            self._leaving.clear()
            self._launch, self._ahead = launch, None
            return
        self._live = self._write_hosts(launch.world) or []
        self._leaving.clear()
        self._launch = launch
        extra = {"hosts_written": self.hosts_written}
        if self._rollback is not None:  # survivors of a failure: the step they all hold in memory
            extra["rollback_to"], self._rollback = self._rollback, None
        seam.write_resize_action(self.spec.run_dir, paused_segment, launch, t_launch, **extra)

    def ask_exit(self, paused_segment: int, t: float) -> None:
        seam.write_exit_action(self.spec.run_dir, paused_segment, t)

    def failure_detail(self) -> None:
        return None  # horovodrun's log and the crash records say it all

    def survivors(self, wait_s: float = survival.WAIT_S) -> Survival | None:
        """After a worker's loss: whether the others go on in their processes, from the last step
        they all hold in memory (:func:`~.survival.hear`: every rank of the running segment has
        either said which steps it holds or is gone). None (the job is ended: the restart from the
        checkpoint) when the run does not keep survivors, horovodrun itself exited, rank 0 took a
        scheduled resize already, on ``localhost:K`` (a GPU run) a rank below a survivor's is gone
        (its slot would leave a hole), over discovered hosts (:meth:`run_over_hosts`) a survivor
        shares a host with a dead worker (the dead worker's host is left out, with all its workers:
        :meth:`_hosts_after`), or they do not agree (:attr:`refused` says why). The
        failure: :func:`~.survival.blame` over the gone ranks (over hosts its ``node``: the hosts
        that lost a worker; the survivors' hosts are the :class:`Survival`'s ``hosts``)."""
        h, cur = self._handle, self._launch
        self.refused = None
        if not self.survive or h is None or cur is None or h.inner.poll() is not None:
            self.refused = "horovodrun exited" if self.survive and h is not None else None
            return None
        run_dir = self.spec.run_dir
        pids = _current_pids(run_dir, cur.segment)
        members = [survival.Member(str(r), r, lambda pid=pids.get(r, 0): _gone(pid), pid=pids.get(r, 0))
                   for r in range(cur.world)]
        heard = survival.hear(run_dir, members, cur.segment, h.t_start, wait_s)
        left, gone = len(heard.alive), [m.rank for m in heard.gone]
        # localhost:K: only the top ranks may go (over discovered hosts the driver renumbers by host)
        holes = not self.slot_hosts and not self.over_hosts and [m.rank for m in heard.alive] != list(range(left))
        step, kept, lost = None, None, ()
        if not self.retract_ahead(cur.segment):
            self.refused = survival.TAKEN_AHEAD
        elif holes and gone and left:
            self.refused = f"rank(s) {gone} below a survivor's are gone (one host's slots, a GPU run)"
        else:
            step, self.refused = heard.step, heard.refused
        if step is not None and self.over_hosts:  # the hosts that lost a worker leave with all theirs
            kept, lost, why = self._hosts_after(heard)
            if kept is None:
                step, self.refused = None, why
        if step is None:
            h.end()
            return None
        if self.slot_hosts:  # the dead workers' slot hosts go; the survivors are ranks 0.. again, in their order
            by_rank = self._hosts_by_rank()
            dead = {by_rank.get(r) for r in gone}
            live = [n for n in self._live if n not in dead]
            if None in dead or len(live) != left:
                self.refused = "the dead workers' slot hosts are not known"
                h.end()
                return None
            self._live, self._dead = live, self._dead | dead  # type: ignore[operator]
        failure = survival.blame(heard.gone, protocol.read_error_records(run_dir, since=h.t_start))
        if lost:  # (the restart event's node; the controller leaves these hosts out for their cooldown)
            failure = replace(failure, node=", ".join(lost))
        h.go_on()
        self._rollback = step
        return Survival(step, left, failure, 0, time.time() - heard.t0, hosts=kept, lost=lost)

    def _hosts_after(self, heard: survival.Heard) -> tuple[str | None, tuple[str, ...], str | None]:
        """Over discovered hosts, after a failure: (the survivors' hosts, ``a:1,b:2`` in the running
        ring's order; the hosts that lost a worker; None) when every worker on a host that lost one
        is gone, so that the ring re-forms on the survivors' hosts with the others left out (the
        controller excludes them for their cooldown); else (None, those hosts, why not). A
        survivor's host is its process record's name in the driver's list (by its pid: a survivor
        keeps its process, not its rank, across in-place resizes)."""
        host_of = {rec["pid"]: rec.get("launch_host")  # (a renumbered survivor's: its re-form's record)
                   for rec in protocol.read_pid_records(self.spec.run_dir, reformed=True, newest=True)}
        placed = dict(self._placed)
        alive: dict[str | None, int] = {}
        for m in heard.alive:
            host = host_of.get(int(heard.records[m.name].get("pid") or 0))
            alive[host] = alive.get(host, 0) + 1
        if any(host not in placed for host in alive):
            return None, (), "the survivors' hosts are not known"
        lost = tuple(host for host, n in self._placed if alive.get(host, 0) < n)
        shared = [host for host in lost if alive.get(host)]
        if not lost or shared:
            why = (f"a survivor shares host {shared[0]} with the failed worker (the host is left out)" if shared
                   else "no host lost a worker")
            return None, lost, why
        return ",".join(f"{host}:{n}" for host, n in self._placed if host not in lost), lost, None

    def end_ranks(self, ranks: list[int]) -> bool:
        """End these ranks' processes only (a stall the watchdog found: the others lose a peer and
        go on as after its death); False when the run does not keep survivors or a rank's process
        is not known here."""
        import signal

        cur = self._launch
        if not self.survive or cur is None:
            return False
        pids = _current_pids(self.spec.run_dir, cur.segment)
        if any(not pids.get(r) for r in ranks):
            return False
        for r in ranks:
            try:
                os.kill(pids[r], signal.SIGKILL)
            except ProcessLookupError:
                pass
        return True

    def close(self) -> None:
        h = self._handle
        if h is not None and h.inner.poll() is None:
            h.end()  # a job whose failure was seen here but not taken (an interrupt came first)
