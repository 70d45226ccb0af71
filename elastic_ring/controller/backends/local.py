"""The local launcher of a ``--collective torch`` job: one process per worker on this host, no
horovodrun (used by ``--relaunch prelaunch|overlap|sequential``: new processes per segment); and
:class:`LocalRingBackend`, the same job's workers kept across resizes (``--relaunch inplace``).

:class:`LocalBackend` starts one small launcher per segment, ``python -m
elastic_ring.controller.backends.local --nproc N -- WORKER COMMAND`` (through the same
:class:`~.horovodrun.SubprocessLauncher` as horovodrun: its own process group, output to the
segment's log). The launcher process itself is :mod:`.local_launcher` (this module's
``__main__`` runs it): it starts the workers with torchrun's environment and the segment's
rendezvous socket, and when one fails ends the others and exits with that worker's status, naming
its rank in the log (:func:`first_failed_rank`), as horovodrun does. A script of torchrun's
contract (``--torchrun``: :mod:`elastic_ring.worker.torchrun`) forms its own group, and the
launcher is then torchrun's agent too (stop every worker at a resize or a failure; see
:mod:`.local_launcher`).
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from elastic_ring import protocol, seam
from elastic_ring.controller.backends import survival
from elastic_ring.controller.backends.api import (BUILTIN_TARGET, Backend, Handle, Launcher, SegmentLaunch, Started,
                                                  Survival, describe, note, rank_named_in_log, serve_source, worker_env)
from elastic_ring.controller.membership import StateSource
from elastic_ring.controller.backends.local_launcher import FAILED_LINE, MASTER_ADDR, exit_status, killed_first
from elastic_ring.env import MEMBER as MEMBER_ENV, SURVIVE as SURVIVE_ENV
from elastic_ring.worker.torchrun import DEFAULT_STOP_GRACE_S
from elastic_ring.worker.torchrun import run_env as torchrun_run_env

# a statement that calls it (not a comment's or a docstring's mention)
_HVD_INIT = re.compile(r"^[ \t]*hvd\.init\s*\(", re.M)
_PG_INIT = re.compile(r"^[ \t]*(?:[\w.]+\.)?init_process_group\s*\(", re.M)
_FIRST_FAILED = re.compile(r"elastic-ring local launcher: rank (\d+) exited with status")  # FAILED_LINE's rank


def launcher_command(spec, launch: SegmentLaunch, stop_grace: float | None = None) -> list[str]:
    """The command of one segment: the local launcher, then the worker entry with its arguments;
    with ``stop_grace``, a script of torchrun's contract (see the module docstring)."""
    from elastic_ring.controller.backends.horovodrun import worker_args

    own = ([] if stop_grace is None else ["--torchrun", "--run-dir", str(spec.run_dir), "--segment",
                                          str(launch.segment), "--stop-grace", repr(float(stop_grace))])
    cmd = [sys.executable, "-m", "elastic_ring.controller.backends.local", "--nproc", str(launch.world), *own, "--",
           *worker_args(spec, launch.segment, launch.stop_at, launch.owner, launch.go_file)]
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


def is_torchrun_script(script: str | None) -> bool:
    """Whether ``script`` follows torchrun's contract only (:mod:`..script_check`; False where it
    cannot be read: the request's check names that)."""
    from elastic_ring.controller.script_check import read_script
    from elastic_ring.errors import UserError

    if not script:
        return False
    try:
        return read_script(script).form == "torchrun"
    except UserError:
        return False


def first_failed_rank(log_path: Path | None) -> int | None:
    """The rank the local launcher names as the first to fail, from the segment's log."""
    return rank_named_in_log(log_path, _FIRST_FAILED)


class LocalBackend(Backend):
    """One local launcher per segment (see the module docstring); only this host's slots."""

    name = "local"

    def __init__(self, spec, launcher: Launcher | None = None, stop_grace: float | None = None,
                 max_restarts: int = 3) -> None:
        from elastic_ring.controller.backends.horovodrun import SubprocessLauncher

        self.spec = spec
        self.launcher = launcher or SubprocessLauncher(fork_server=spec.device == "cpu", cwd=spec.cwd)
        self.torchrun = is_torchrun_script(spec.script)  # run as torchrun runs it
        self.stop_grace = DEFAULT_STOP_GRACE_S if stop_grace is None else stop_grace
        self.max_restarts = max_restarts

    def start(self, launch: SegmentLaunch, log_path: Path) -> Started:
        cmd = launcher_command(self.spec, launch, self.stop_grace if self.torchrun else None)
        env = worker_env(self.spec, launch.world)
        if self.torchrun:
            from elastic_ring.events.api import Restart, read_events

            restarts = len(read_events(self.spec.run_dir / "events.jsonl", Restart))
            env.update(torchrun_run_env(restarts, self.max_restarts, self.spec.run_dir.name))
        return Started(self.launcher.start(cmd, env, log_path), cmd)

    def usable_slots(self, want: int) -> int:
        return self.spec.slots

    def first_failed_rank(self, log_path: Path | None) -> int | None:
        return first_failed_rank(log_path)

    def failure_detail(self) -> None:
        return None  # the launcher's line and the crash records say it all

    def close(self) -> None:
        pass


@dataclass
class LocalMember:
    """One worker process of :class:`LocalRingBackend`: its name (``ELASTIC_RING_MEMBER``), rank in
    the current group, process handle, and whether the group it serves has left it (a shrink)."""

    name: str
    handle: Handle | None = None
    rank: int = -1
    retiring: bool = False
    info: dict = field(default_factory=dict)  # no node: one host
    go: Path | None = None  # a warm spare: it waits for this file, which brings its rank and store


class LocalGroup:
    """The worker processes of a group resized in place, one handle for the controller: ``poll`` is
    None while they run, 0 once all finished, the status of the first that failed (the others are
    then ended, unless ``keeps_survivors``: ``--survive``, where the backend decides whether they go
    on, :meth:`LocalRingBackend.survivors`). A member that left the group at a shrink exits with
    ``RETIRED``, not a failure. ``waiting``: joiners started ahead of a resize, not members yet; one
    that fails fails the group."""

    def __init__(self, members: list[LocalMember], log_path: Path, keeps_survivors: bool = False) -> None:
        self.members, self.log_path = members, log_path
        self.keeps_survivors = keeps_survivors
        self.waiting: list[LocalMember] = []
        self.rc: int | None = None
        self.failed_rank: int | None = None
        self.t_start = time.time()  # since when the group is watched (survivors' records are newer)

    @property
    def pid(self) -> int:
        live = [m for m in self.members if not m.retiring and m.handle is not None]
        return min(live, key=lambda m: m.rank).handle.pid if live else 0

    def poll(self) -> int | None:
        from elastic_ring.protocol import RETIRED

        if self.rc is not None:
            return self.rc
        failed: list[tuple[LocalMember, int]] = []
        for m in [*self.members, *self.waiting]:
            rc = m.handle.poll() if m.handle is not None else None
            if rc is None:
                continue
            if m in self.waiting:
                rc = rc or 1  # a joiner cannot end before it has joined
            elif rc == RETIRED or (rc == 0 and m.retiring):
                self.members.remove(m)  # left the group at a shrink
                continue
            if rc != 0:
                failed.append((m, rc))
        named = killed_first(failed)  # (a killed worker, not its peer that exited on the loss)
        if named is not None:
            m, rc = named
            self.failed_rank = m.rank
            try:
                with open(self.log_path, "a") as f:
                    f.write(FAILED_LINE.format(rank=m.rank, rc=rc) + "\n")
            except OSError:
                pass
            if not self.keeps_survivors or m in self.waiting:
                self.kill()
            self.rc = exit_status(rc)
            return self.rc
        if all(m.handle is not None and m.handle.poll() == 0 for m in self.members):
            self.rc = 0
        return self.rc

    def kill(self) -> None:
        for m in [*self.members, *self.waiting]:
            if m.handle is not None:
                m.handle.kill()
        if self.rc is None:
            self.rc = -9

    def go_on(self, survivors: list[LocalMember]) -> None:
        """The group goes on with ``survivors`` (a failure taken as a shrink): the other members
        are ended and the failure forgotten; the group is watched again from now."""
        for m in self.members:
            if m not in survivors and m.handle is not None and m.handle.poll() is None:
                m.handle.kill()
        self.members = list(survivors)
        self.rc, self.failed_rank = None, None
        self.t_start = time.time()


def _describe(members: list[LocalMember], launch: SegmentLaunch) -> str:
    """The segment log's line naming each member's rank and process."""
    return describe("local", launch.segment, [
        f"rank {m.rank}: {m.name} pid {m.handle.pid if m.handle is not None else '?'}"
        for m in sorted(members, key=lambda m: m.rank)])


@dataclass
class _Ahead:
    """The next group, formed while the running segment trains (a scheduled resize): its joiners
    started and waiting for their go, its action written ahead."""

    segment: int
    launch: SegmentLaunch
    members: list[LocalMember]
    leave: list[LocalMember]
    joiners: list[LocalMember]
    server: object
    taken: bool = False


class LocalRingBackend(Backend):
    """``--collective torch --relaunch inplace`` on this host: the worker processes stay across
    resizes and re-form their process group in place; an :class:`~.api.InPlaceRing`.

    The controller serves each group's ``TCPStore`` (:class:`~.torch_ring.TorchRingFormer`) and
    names every member's rank, size and store. At a resize the workers pause between two steps and
    read the action (``control/inplace-<seg>.json``): survivors destroy their group and form the
    new one (rank 0 stays rank 0 and keeps its process), a member left out exits (``RETIRED``).
    A joiner is a warm spare: a process started beside the group (as many as the slots the group
    leaves free) that built its model and data and waits for a go naming its rank and store; when
    none is left, a new process. For a scheduled resize the group is formed ahead, while the
    segment trains, and rank 0 writes the joiners' go when it takes the action written ahead, so
    that the re-form waits for no process start.

    Survivors go on (``survive``: ``--survive``): a member's failure no longer ends the others; they
    say which steps they hold in memory (:func:`elastic_ring.seam.survivor_file`), and when
    they hold one in common the failure is a shrink (:meth:`survivors`): the in-place resize that
    follows forms their new group (any rank may die: the survivors are renumbered from 0) and rolls
    them back to that step. The dead worker's slot comes back (:attr:`rejoins`): the controller
    plans a grow back after the survivors' next step, and a spare started for the free slot joins
    then, its state by broadcast."""

    name = "local"
    rejoins = True  # after survivors went on (--survive), a grow back to the planned size takes a spare

    def __init__(self, spec, launcher: Launcher | None = None, rings=None, survive: bool = False) -> None:
        from elastic_ring.controller.backends.horovodrun import SubprocessLauncher
        from elastic_ring.controller.backends.torch_ring import TorchRingFormer, serve_store_for

        self.spec = spec
        self.launcher = launcher or SubprocessLauncher(fork_server=spec.device == "cpu", cwd=spec.cwd)
        self.rings = rings or TorchRingFormer(lambda: MASTER_ADDR, serve=serve_store_for(self.launcher))
        self.survive = survive  # survivors of a failure go on from their copy in memory
        self.survive_env = "1"  # its workers' ELASTIC_RING_SURVIVE ("auto": they time the copy first)
        self.refused: str | None = None  # why the last failure's survivors did not go on from memory
        self._rollback: int | None = None  # the step the next in-place resize rolls the survivors back to
        self.group: LocalGroup | None = None
        self.launch: SegmentLaunch | None = None  # the running segment's
        self._ahead: _Ahead | None = None
        self.spares: list[LocalMember] = []
        self._n = 0

    def _member(self) -> LocalMember:
        self._n += 1
        return LocalMember(f"w{self._n}")

    def _command(self, launch: SegmentLaunch, go: Path | None = None) -> list[str]:
        from elastic_ring.controller.backends.horovodrun import worker_args

        cmd = [*worker_args(self.spec, launch.segment, launch.stop_at, launch.owner, go), "--ring-by-controller"]
        return [*cmd, "--", self.spec.script or BUILTIN_TARGET, *self.spec.script_args]

    def _spawn(self, m: LocalMember, launch: SegmentLaunch, env: dict[str, str], log_path: Path,
               go: Path | None = None) -> list[str]:
        cmd = self._command(launch, go)
        base = worker_env(self.spec, launch.world)
        if self.survive:
            base[SURVIVE_ENV] = self.survive_env  # the workers keep their last steps' state in memory
        m.handle = self.launcher.start(cmd, {**base, **env}, log_path)
        return cmd

    def _log(self, launch: SegmentLaunch) -> Path:
        return self.spec.run_dir / "logs" / f"segment-{launch.segment:03d}-w{launch.world}.log"

    # ------------------------------------------------------------------ Backend
    def start(self, launch: SegmentLaunch, log_path: Path) -> Started:
        self.close()
        members = [self._member() for _ in range(launch.world)]
        envs = self.rings.form(members)
        cmds = [self._spawn(m, launch, envs[m.name], log_path) for m in members]
        self.group, self.launch = LocalGroup(members, log_path, keeps_survivors=self.survive), launch
        self._rollback = None
        note(log_path, _describe(members, launch))
        self._top_up(launch)
        return Started(self.group, cmds[0])

    # ------------------------------------------------------------------ warm spares
    def _top_up(self, launch: SegmentLaunch) -> None:
        """Keep a spare for every slot the group leaves free: the worker entry with a placeholder
        rank, up to its wait for a go (its segment comes with the sync from rank 0). Under
        ``--survive`` at least one, as the Horovod path's horovodrun keeps: a failed worker's
        joiner is then warm (before, the spare for the freed slot started after the failure and
        the grow back waited for its start-up: 1.26 s lost, `results/bench_failure_resize_inplace_torch.json`
        of that tree)."""
        want = max(0, self.spec.slots - launch.world) or (1 if self.survive else 0)
        while len(self.spares) < want:
            m = self._member()
            m.go = protocol.control_dir(self.spec.run_dir) / f"spare-{m.name}.json"
            m.go.unlink(missing_ok=True)
            env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", MEMBER_ENV: m.name}
            self._spawn(m, SegmentLaunch(launch.world, -1, launch.stop_at, launch.owner), env,
                        self.spec.run_dir / "logs" / f"spare-{m.name}.log", m.go)
            self.spares.append(m)

    def _joiners(self, k: int) -> list[LocalMember]:
        """``k`` joiners: the spares still running first, then new members (no process yet)."""
        self.spares = [m for m in self.spares if m.handle is None or m.handle.poll() is None]
        got, self.spares = self.spares[:k], self.spares[k:]
        return got + [self._member() for _ in range(k - len(got))]

    def _go(self, m: LocalMember, launch: SegmentLaunch, env: dict[str, str], t: float) -> seam.Go:
        """A joiner's go record: a spare's names its rank and store, and the segment of the pid
        record it writes then (its placeholder's, segment -1, is shared by every spare's)."""
        if m.handle is None:
            return seam.Go(launch.stop_at, t)
        return seam.Go(launch.stop_at, t, env, pid_segment=launch.segment)

    def usable_slots(self, want: int) -> int:
        return self.spec.slots

    def use_hosts(self, hosts: str) -> None:
        """Host discovery's usable hosts under ``--relaunch inplace``: this host only (the controller
        reads the answer so: ``prepare_hosts.host_manager``), so the ring's size is the segment's on
        this host's slots and there is nothing else to choose; another machine is refused there."""
        from elastic_ring.controller.api import parse_hosts

        self.placed = parse_hosts(hosts) if hosts else None

    def first_failed_rank(self, log_path: Path | None) -> int | None:
        return self.group.failed_rank if self.group is not None else first_failed_rank(log_path)

    def failure_detail(self) -> None:
        return None  # the failure line and the crash records say it all

    def close(self) -> None:
        if self._ahead is not None:
            self._end_waiting(self._ahead.joiners)
            self._ahead = None
        for m in self.spares:
            if m.handle is not None:
                m.handle.kill()
        self.spares = []
        if self.group is not None and (self.group.poll() is None or self.group.keeps_survivors):
            self.group.kill()  # (survivors of a failure that was not taken may still run)
        self.rings.stop_all()

    # ------------------------------------------------------------------ survivors (--survive)
    def survivors(self, wait_s: float = survival.WAIT_S) -> Survival | None:
        """After a member's failure: whether the others go on in their processes, from the last step
        they all hold in memory (:func:`~.survival.hear`: each member of the running group has
        either said which steps it holds or is gone). None (the group is ended: the restart from
        the checkpoint) when the run does not keep survivors, rank 0 took a resize written ahead
        already, or they do not agree (:attr:`refused` says why). The failure is the gone member's
        own error, else its death (``Killed``): a member that only lost a peer is never blamed
        (:func:`~.survival.blame`)."""
        g, cur = self.group, self.launch
        self.refused = None
        if not self.survive or g is None or cur is None or g.rc in (None, 0):
            return None
        if not self.retract_ahead(cur.segment):
            self.refused = survival.TAKEN_AHEAD
            g.kill()
            return None  # rank 0 took a scheduled resize before the failure: the restart
        members = [survival.Member(m.name, m.rank, lambda h=m.handle: h is None or h.poll() is not None, who=m)
                   for m in self._serving()]
        heard = survival.hear(self.spec.run_dir, members, cur.segment, g.t_start, wait_s)
        self.refused = heard.refused
        if heard.step is None:
            g.kill()
            return None
        failure = survival.blame(heard.gone, protocol.read_error_records(self.spec.run_dir, since=g.t_start))
        note(g.log_path, f"[local] failure in segment {cur.segment}: "
             + ", ".join(f"rank {m.rank} ({m.name})" for m in heard.gone) + " gone; "
             + ", ".join(f"rank {m.rank} ({m.name})" for m in heard.alive)
             + f" go on from step {heard.step}, held in memory")
        g.go_on([m.who for m in heard.alive])
        self._rollback = heard.step
        return Survival(heard.step, len(heard.alive), failure, 0, time.time() - heard.t0)

    def end_ranks(self, ranks: list[int]) -> bool:
        """End these ranks' processes only (a stall the watchdog found: the others lose a peer and
        go on as after its death, :meth:`survivors`); False when the run does not keep survivors or
        a rank is not a running member."""
        g = self.group
        if not self.survive or g is None:
            return False
        ending = [m for m in self._serving() if m.rank in ranks and m.handle is not None]
        if len(ending) != len(set(ranks)):
            return False
        names = {m.name for m in ending}
        for rec in protocol.read_pid_records(self.spec.run_dir):  # the workers' own processes: a worker
            # forked by the zygote outlives its launcher's stand-in while it is stopped
            if rec.get("member") in names and rec.get("owner") in (None, self.launch.owner if self.launch else None):
                try:
                    os.kill(int(rec["pid"]), signal.SIGKILL)
                except (OSError, KeyError, ValueError):
                    pass
        for m in ending:
            m.handle.kill()
        return True

    # ------------------------------------------------------------------ InPlaceRing
    def _serving(self) -> list[LocalMember]:
        assert self.group is not None
        return sorted((m for m in self.group.members if not m.retiring), key=lambda m: m.rank)

    def report_ahead(self, launch: SegmentLaunch) -> None:
        """Form the next group now (its store served, its joiners started with a go file) and
        write its action ahead, naming the step it applies at and the joiners' go records."""
        cur = self.launch
        if self.group is None or cur is None or self._ahead is not None or launch.segment != cur.segment + 1:
            return
        old = self._serving()
        keep, leave = old[:launch.world], old[launch.world:]
        joiners = self._joiners(launch.world - len(keep))
        envs = self.rings.form(keep + joiners)
        go_files = {}
        for m in joiners:
            rec = self._go(m, launch, envs[m.name], time.time())
            if m.handle is None:  # no spare left: a new process, waiting for the same go
                m.go = protocol.control_dir(self.spec.run_dir) / f"go-{m.name}.json"
                m.go.unlink(missing_ok=True)
                self._spawn(m, launch, envs[m.name], self._log(launch), m.go)
            go_files[str(m.go)] = rec
        self.group.waiting += joiners
        self._ahead = _Ahead(cur.segment, launch, keep + joiners, leave, joiners, self.rings.newest)
        seam.write_resize_action(self.spec.run_dir, cur.segment, launch, time.time(), members=envs, at_step=cur.stop_at,
                            go_files=go_files)

    def retract_ahead(self, segment: int) -> bool:
        """Withdraw the action written ahead for ``segment`` (its joiners ended): True when withdrawn
        or none was written; False when rank 0 has taken it already."""
        a = self._ahead
        if a is None or a.segment != segment:
            return True
        if not a.taken:
            a.taken = not seam.withdraw_action_ahead(self.spec.run_dir, segment)
        if a.taken:
            return False
        self._ahead = None
        self._end_waiting(a.joiners)
        self.rings.withdraw(a.server)
        return True

    def _end_waiting(self, joiners: list[LocalMember]) -> None:
        """Joiners taken for a group that will not form: no longer watched; spares again (each
        still waits for its go, withdrawn with the action)."""
        if self.group is not None:
            self.group.waiting = [m for m in self.group.waiting if m not in joiners]
        self.spares[:0] = [m for m in joiners if m.handle is not None]

    def resize_in_place(self, paused_segment: int, launch: SegmentLaunch, t_launch: float,
                        source: StateSource) -> None:
        """The paused workers go on as ``launch``: the group formed ahead (rank 0 took it), or one
        formed now (survivors first, then new processes for the joiners)."""
        serve_source(self.name, source)  # memory or peer: from the checkpoint is a new group (start)
        group = self.group
        assert group is not None
        if self.retract_ahead(paused_segment):
            old = self._serving()
            keep, leave = old[:launch.world], old[launch.world:]
            joiners = self._joiners(launch.world - len(keep))
            members = keep + joiners
            envs = self.rings.form(members)
            extra = {}
            if self._rollback is not None:  # survivors of a failure: the step they all hold in memory
                extra["rollback_to"], self._rollback = self._rollback, None
            seam.write_resize_action(self.spec.run_dir, paused_segment, launch, t_launch, members=envs, **extra)
            for m in joiners:
                if m.handle is not None and m.go is not None:  # a waiting process: its go brings its place
                    seam.write_go(m.go, self._go(m, launch, envs[m.name], t_launch))
                else:
                    self._spawn(m, launch, envs[m.name], self._log(launch))
        else:
            a = self._ahead
            assert a is not None
            if (a.launch.world, a.launch.segment, a.launch.stop_at) != (launch.world, launch.segment, launch.stop_at):
                raise RuntimeError(f"the workers took the resize to {a.launch.world} written ahead for "
                                   f"segment {a.launch.segment}, the controller decided {launch}")
            self._ahead = None
            members, leave, joiners = a.members, a.leave, a.joiners
            group.waiting = [m for m in group.waiting if m not in joiners]
        for m in leave:
            m.retiring = True
        self.rings.in_use()
        note(self._log(launch), _describe(members, launch) + "".join(
            f"; leaving: {m.name}" for m in leave) + "".join(f"; joined: {m.name}" for m in joiners))
        group.members = [*members, *(m for m in leave if m in group.members)]
        group.log_path = self._log(launch)
        self.launch = launch
        self._top_up(launch)

    def ask_exit(self, paused_segment: int, t: float) -> None:
        seam.write_exit_action(self.spec.run_dir, paused_segment, t)


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


if __name__ == "__main__":  # the launcher process of one segment (its command names this module)
    from elastic_ring.controller.backends.local_launcher import main

    sys.exit(main())
