"""This worker's Horovod ring, and how this launch forms it and re-forms it at a resize.

Three launches, one object each, chosen once at start from the environment the entry point sets
(:func:`ring_from_env`):

- :class:`RelaunchRing` (horovodrun, every relaunch mode but ``inplace``): horovodrun gives the
  rank; a resize ends these processes and new ones form the next ring. A pre-launched worker
  waits for its go, and rank 0's stop step is broadcast once the ring is formed.
- :class:`ElasticRing` (``--relaunch inplace``, Horovod Elastic): Horovod's driver assigns the
  ranks (``hvd.init()`` asks it, so they may be newer than the environment's) and tells rank 0
  when the hosts change; a resize re-forms the ring in these processes (``hvd.shutdown()`` +
  ``hvd.init()``), and the controller's word is acted on once the driver has reported the hosts.
- :class:`ControllerRing` (the Ray backend): the controller serves the rendezvous and names every
  member's Horovod environment, in the go of a warm spare and in the resize action; a worker it
  leaves out of the new ring has retired (:class:`Retired`), and its process may serve again.

On ``torch.distributed`` (``--collective torch``) the same two ways: :class:`TorchRing` (the local
launcher names every worker's rank and the segment's rendezvous; a resize ends the processes) and
:class:`TorchControllerRing` (``--relaunch inplace`` or the Ray backend: the controller serves each
group's store and names the ranks; a resize destroys the group and forms the next in place).

A ring knows its rank, size and local size, and nothing about training; the job
(:class:`elastic_ring.worker.api.Job`) holds one.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterator

from elastic_ring import env, protocol
from elastic_ring.seam import AT_NEXT_STOP, Action, Go, read_action, read_go, take_ahead_action, write_go
from elastic_ring.worker.checks import check_collectives_untouched
from elastic_ring.worker.collective import PG_TIMEOUT_S, TorchCollective, rendezvous_store, torch_backend
from elastic_ring.worker.errors import ContractError
from elastic_ring.worker.links import Links

INPLACE_ENV = env.INPLACE  # "1": Horovod Elastic (--relaunch inplace)
RING_BY_CONTROLLER = env.RING_BY_CONTROLLER  # INPLACE_ENV's value on the Ray backend (the controller forms the ring)
MEMBER_ENV = env.MEMBER  # this worker's name in a resize action's "members"
STORE_ENV = env.STORE  # host:port of the store the controller serves for a torch group


class Retired(BaseException):
    """Raised at an in-place resize in a worker the controller left out of the new ring: it has
    left the ring; its process may serve again (the Ray backend's actor)."""


def warm_imports() -> None:
    """Import what a worker's first optimizer step would import lazily on its critical path:
    ``torch.optim`` imports ``torch._dynamo`` at the first ``step()`` or ``load_state_dict()``
    (seconds in a fresh process; Horovod's optimizer-state broadcast is such a first step)."""
    try:
        import torch._dynamo  # noqa: F401
    except Exception:  # noqa: BLE001 - the lazy import later raises it where it matters
        pass


@contextmanager
def _warming_meanwhile(warm: bool = True) -> Iterator[None]:
    """Run :func:`warm_imports` in a thread while the caller waits in C code that imports nothing
    (``hvd.init()``, which holds no GIL while the ring's rendezvous waits for the other ranks);
    joined before the caller goes on, so no import of the caller's runs beside it."""
    if not warm or "torch._dynamo" in sys.modules:
        yield
        return
    t = threading.Thread(target=lambda: warm_imports(), daemon=True, name="elastic-ring-warm-imports")
    t.start()
    try:
        yield
    finally:
        t.join()


def _drop_fixed_cycle_time() -> None:
    """Leave Horovod's cycle time at its default in a process that will re-initialise Horovod.

    Horovod 0.28 keeps its tunable parameters across ``hvd.shutdown()`` + ``hvd.init()``. Each
    ``init()`` first sets the fusion threshold (128 MB) and the cycle time (1 ms) as tunable
    values, then fixes the ones named in the environment; a fixed value leaves the vector of
    tunable values, but a later ``init()`` still writes its default into that vector, at the slot
    of the variable's missing index (slot 0). With ``HOROVOD_CYCLE_TIME`` set (the controller sets
    5 ms on CPUs) a re-initialised survivor therefore gets a 1 MB fusion threshold, where a new
    worker has 128 MB; once the responses are cached each rank fuses them itself, so the two fuse
    different gradients into one allreduce (gloo: ``op.preamble.length <= op.nbytes``); with
    ``HOROVOD_FUSION_THRESHOLD`` set too the vector is empty and the write crashes ``init()``.
    Without ``HOROVOD_CYCLE_TIME`` every rank has the same threshold (the user's fixed one, or
    128 MB) and a 1 ms cycle, as under Horovod Elastic. Called before this process's first
    ``hvd.init()``, whose environment (read in C) is the one that fixes values."""
    os.environ.pop("HOROVOD_CYCLE_TIME", None)


class Ring:
    """The ring as horovodrun forms it (the base of the three launches; see the module docstring)."""

    in_place = False  # a resize keeps this process: pause, re-form, sync from rank 0
    go_timeout_s = 900.0
    warms_compile = True  # warm_imports() before the first step (False: the script's optimizer never needs it)

    def __init__(self) -> None:
        self.hvd: Any = None
        self._coll: Any = None
        self.connected = False
        self.threads: int | None = None  # torch's intra-op threads here, once the ring is formed
        self.rank = self.size = self.local_rank = self.local_size = 0
        self.hosts_updated_at: float | None = None  # Horovod Elastic's driver: the hosts changed then
        if env.horovod_ranks() is not None:
            self._ranks_from_env()
        else:  # not under horovodrun's environment (e.g. mpirun): ask Horovod now
            self.init_horovod()
            self.adopt_ranks()

    def drop_links(self) -> int:
        """After a peer's loss: close this process's connections of the group, so that no peer
        blocked on this one waits on (:mod:`elastic_ring.worker.links`); how many were closed.
        Horovod's rings: none (its own transport)."""
        return 0

    @property
    def coll(self) -> Any:
        """The job's collectives (:mod:`elastic_ring.worker.collective`): Horovod's, over ``hvd``."""
        c = self._coll
        if c is None or (c.name == "horovod" and c.hvd is not self.hvd):
            from elastic_ring.worker.collective import HorovodCollective

            c = self._coll = HorovodCollective(self.hvd)
        return c

    def _ranks_from_env(self) -> None:
        ranks = env.horovod_ranks()
        if ranks is None:
            raise KeyError(f"this worker's environment lacks one of {', '.join(env.HOROVOD_KEYS)}")
        self.rank, self.size, self.local_rank, self.local_size = ranks
        self._slots_of_one_host()

    def _slots_of_one_host(self) -> None:
        """Where each worker slot is a host name of its own (``--relaunch inplace --survive`` on
        CPUs: :func:`elastic_ring.controller.hvdrun.slot_host`), all on this host: its local rank
        and size are the ring's, not Horovod's (0 of 1), so each worker takes its share of the cores."""
        if env.slot_hosts():
            self.local_rank, self.local_size = self.rank, self.size

    def init_horovod(self) -> None:
        """``hvd.init()`` unless done, with the first step's imports warmed meanwhile."""
        import horovod.torch as hvd

        from elastic_ring import hvd_patches

        self.hvd = hvd
        hvd_patches.wait_asleep(env.device())  # CPU workers wait for collectives asleep (idempotent)
        if not hvd.is_initialized():
            if self.in_place:
                _drop_fixed_cycle_time()
            with _warming_meanwhile(self.warms_compile):
                hvd.init()

    def adopt_ranks(self) -> None:
        """Rank and sizes as Horovod has them now, and the CPU threads of this host's share."""
        import torch

        hvd = self.hvd
        self.rank, self.size = hvd.rank(), hvd.size()
        self.local_rank, self.local_size = hvd.local_rank(), hvd.local_size()
        self._slots_of_one_host()
        self.threads = protocol.cpu_threads(self.local_size)  # CPU and GPU workers alike
        torch.set_num_threads(self.threads)

    def keep_threads(self, n: int) -> None:
        """Train on with ``n`` intra-op threads whatever the local size (the survivors of a
        failure: :func:`elastic_ring.worker.survive.survived`); the next :meth:`adopt_ranks` sets
        the share again."""
        import torch

        self.threads = n
        torch.set_num_threads(n)

    def _check_ranks(self) -> None:
        if (self.hvd.rank(), self.hvd.size()) != (self.rank, self.size):
            raise RuntimeError(f"Horovod rank {self.hvd.rank()}/{self.hvd.size()} differs from the "
                               f"environment's {self.rank}/{self.size}")

    def wait_for_go(self, go: Path, timeout_s: float | None = None) -> Go:
        """The controller's go record of a pre-launched worker (:class:`~elastic_ring.seam.Go`)."""
        timeout_s = self.go_timeout_s if timeout_s is None else timeout_s
        t0 = time.time()
        if self.warms_compile:
            warm_imports()  # the first step's imports, off the critical path while the old workers train
        protocol.write_json_atomic(protocol.waiting_file(go), {"pid": os.getpid(), "time": time.time()})
        while True:
            rec = read_go(go)
            if rec is not None:
                return rec
            if time.time() - t0 > timeout_s:
                raise RuntimeError(f"no go from the controller within {timeout_s:.0f} s ({go} never appeared)")
            time.sleep(0.02)

    def connect(self, go: Go | None, stop_at: int) -> int:
        """Form the ring (``go``: the go record a pre-launched worker waited for); returns the
        segment's stop step."""
        if go is not None:
            stop_at = self._went(go)
        self.init_horovod()
        self._formed()
        if go is not None and self.broadcasts_stop:
            import torch

            stop_at = int(self.coll.broadcast(torch.tensor([stop_at]), 0, name="stop_at").item())
        self.connected = True
        return stop_at

    broadcasts_stop = True  # rank 0's stop step to all, once formed (pre-launched workers' go may differ)

    def _went(self, go: Go) -> int:
        return go.stop_at

    def _formed(self) -> None:
        self._check_ranks()

    # ------------------------------------------------------------------ in-place resizes
    def takes(self, action: Action) -> bool:
        """Whether rank 0 may act on the controller's resize ``action`` now."""
        return True

    def take_ahead(self, run_dir: Path, segment: int, step: int, scheduled: bool) -> Action | None:
        """Rank 0 at a scheduled stop at ``step``: the action written ahead for it, taken (renamed,
        so the controller cannot withdraw it too) and its joiners' go records written; None when
        there is none for this stop, it is not this ring's to take, or the controller withdrew it.
        One written ahead of an asked stop (``AT_NEXT_STOP``: a shrink off a dropped or drained host)
        is taken at any stop."""
        act = read_action(run_dir, segment)
        if not (act is not None and act.ahead and act.is_resize
                and ((act.at_step == step and scheduled) or act.at_step == AT_NEXT_STOP)
                and self.takes(act) and take_ahead_action(run_dir, segment)):
            return None
        for go, rec in act.go_files.items():  # its joiners' word
            write_go(Path(go), rec)
        return act

    def await_action(self, run_dir: Path, segment: int, step: int, scheduled: bool,
                     poll_s: float = 0.05, taken: Action | None = None) -> Action:
        """All ranks wait, between two steps, for the controller's word on ``segment``'s end.

        Rank 0 reads ``control/inplace-<segment>.json`` (:class:`~elastic_ring.seam.Action`): an exit
        (a Ctrl-C: checkpoint and leave), or a resize to a new ring, acted on when
        :meth:`takes` allows. An action written ahead names ``at_step``: rank 0 takes it (renaming it,
        so the controller cannot withdraw it too) at a scheduled stop at that step, and first writes
        its joiners' go records (:meth:`take_ahead`; ``taken``: rank 0 took it already, before its
        ``segment_end``). Rank 0's decision is broadcast each poll.
        """
        while True:
            decision = None
            if self.rank == 0 and taken is not None:
                decision, taken = taken, None
            elif self.rank == 0:
                act = read_action(run_dir, segment)
                if act is not None and act.ahead:  # written ahead
                    decision = self.take_ahead(run_dir, segment, step, scheduled)
                elif act is not None and (act.is_exit or (act.is_resize and self.takes(act))):
                    decision = act
            decision = self.coll.broadcast_object(decision, 0, name="inplace_action")
            if decision is not None:
                return decision
            time.sleep(poll_s)

    def reform(self, action: Action) -> None:
        """Re-form the ring at the new size in this process (``hvd.shutdown()`` + ``hvd.init()``)."""
        raise NotImplementedError(f"{type(self).__name__} does not resize in place")

    def alone(self) -> bool:
        """This process is the whole ring re-formed in place, its live state the state: nothing
        to broadcast (a shrink to one worker syncs without a collective)."""
        return self.in_place and self.size == 1


class RelaunchRing(Ring):
    """horovodrun's ring: a resize ends these processes (see the module docstring)."""


class ElasticRing(Ring):
    """Horovod Elastic's ring: the driver assigns ranks and reports host changes to rank 0."""

    in_place = True
    go_timeout_s = 7 * 24 * 3600.0  # the warm joiner (controller.hvdrun.Spare) may wait all run long

    def _went(self, go: Go) -> int:
        """The warm joiner's go: the slot's Horovod environment the driver would have started a
        worker with; it joins a ring re-formed in place, whose rank 0 sends the stop step with the
        state (no broadcast of its own)."""
        if go.env:
            os.environ.update(go.env)
            self._ranks_from_env()
            self.broadcasts_stop = False
        return go.stop_at

    def _formed(self) -> None:
        self.adopt_ranks()  # the driver's assignment may be newer than the environment's
        from horovod.common.elastic import notification_manager

        notification_manager.init()
        notification_manager.register_listener(self)

    def on_hosts_updated(self, timestamp: float, update_res: Any) -> None:
        """Horovod Elastic's driver (on rank 0): the discovery script reports other slots now."""
        self.hosts_updated_at = timestamp

    def takes(self, action: Action) -> bool:
        """Once the driver has told rank 0 that the hosts changed, for the discovery file the
        action refers to (``hosts_written``; Horovod stamps the notification with the second the
        driver saw the change): then the driver has the new slot assignment. A shrink written
        ahead for the next stop (``AT_NEXT_STOP``: a host dropped or drained, asked a few steps
        before the stop) is taken at once where this job's horovodrun reads the host list again
        when the workers reset (``--survive`` and its default's measuring: patch ``resume`` of
        :mod:`elastic_ring.hvd_patches`): the controller wrote the list before the action, so the
        ring re-forms on it whether or not the driver's poll (every 0.05 s) has seen it yet; the
        workers otherwise paused until that notice and rank 0's next look, up to 0.06 s more than a
        scheduled shrink, whose list was written long before. (Other actions still wait for the
        notice: a failure's survivors, whose dead worker's exit the driver handles meanwhile.)"""
        if action.ahead and action.at_step == AT_NEXT_STOP and env.survive():
            return True
        updated = self.hosts_updated_at
        return updated is not None and updated >= (action.hosts_written or 0.0) - 1.0

    def reform(self, action: Action) -> None:
        """The driver assigns the new ranks (a worker whose slot was removed is ended by Horovod
        inside ``hvd.init()``)."""
        self.hvd.shutdown()
        self.hosts_updated_at = None
        _drop_fixed_cycle_time()
        self.hvd.init()
        self.adopt_ranks()


class ControllerRing(Ring):
    """The ring the controller forms (the Ray backend): it names every member's environment."""

    in_place = True
    go_timeout_s = 7 * 24 * 3600.0  # a warm spare may wait for a grow all run long

    broadcasts_stop = False  # every member's go names it

    def _went(self, go: Go) -> int:
        if go.env:  # a warm spare joining a ring: started with a placeholder rank
            os.environ.update(go.env)
            self._ranks_from_env()
        return go.stop_at

    def _formed(self) -> None:
        self._check_ranks()
        self.adopt_ranks()

    def reform(self, action: Action) -> None:
        """Raises :class:`Retired` where the action names no environment for this worker."""
        self.hvd.shutdown()
        mine = action.member_env(env.member(default=""))
        if mine is None:
            raise Retired(f"not a member of segment {action.segment}")
        os.environ.update({k: str(v) for k, v in mine.items()})
        _drop_fixed_cycle_time()
        self.hvd.init()
        self.adopt_ranks()


def controller_store(dist: Any) -> Any:
    """A client of the store the controller serves for this group (``ELASTIC_RING_STORE``:
    ``host:port``).

    Raises:
        ContractError: the environment names none.
    """
    where = env.store()
    if not where:
        raise ContractError(f"this worker needs {STORE_ENV} (host:port of the store the controller serves) "
                            "in its environment")
    host, _, port = where.rpartition(":")
    return dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=PG_TIMEOUT_S))


class TorchRing(Ring):
    """The process group of a job on ``torch.distributed``, formed by these processes for one
    segment (see the module docstring); a resize ends them."""

    def __init__(self) -> None:
        self.hvd: Any = None
        self._coll: Any = None
        self.connected = False
        self.hosts_updated_at = None
        self.threads: int | None = None
        self._ranks_from_env()

    def _ranks_from_env(self) -> None:
        ranks = env.torch_ranks()
        if ranks is None:
            raise ContractError(f"a --collective torch worker needs {', '.join(env.missing_torch_keys())} in "
                                "its environment (the controller's launcher sets them)")
        self.rank, self.size, self.local_rank, self.local_size = ranks

    @property
    def warms_compile(self) -> bool:
        """Always: ``DistributedDataParallel(model)`` imports ``torch._dynamo`` (seconds of CPU)
        whatever the script's optimizer, so it is warmed while the group forms or the go is awaited."""
        return True

    @warms_compile.setter
    def warms_compile(self, value: bool) -> None:
        pass

    @property
    def coll(self) -> Any:
        if self._coll is None:
            raise ContractError("the process group is not formed yet: call job.connect() (or job.restore()) "
                                "before the collectives")
        return self._coll

    def init_horovod(self) -> None:
        """Form the process group (``init_process_group`` from the environment's rendezvous)."""
        import torch
        import torch.distributed as dist

        check_collectives_untouched("torch")
        device = env.device()
        backend = torch_backend(device)
        if backend == "nccl" and not (torch.cuda.is_available() and dist.is_nccl_available()):
            raise ContractError("NCCL asked for (--device cuda) where torch has no usable CUDA/NCCL")
        dev = torch.device("cuda", self.local_rank) if backend == "nccl" else torch.device("cpu")
        with _warming_meanwhile(self.warms_compile):
            self._init_group(dist, backend)
        # the library's host-side collectives (stop votes, metrics) on a gloo group of their own
        control = dist.new_group(backend="gloo", timeout=timedelta(seconds=PG_TIMEOUT_S))
        self._coll = TorchCollective(dist, dev, control)

    def _init_group(self, dist: Any, backend: str) -> None:
        """``init_process_group`` at the launcher's rendezvous (rank 0 hosts the store), or over
        the store the controller serves where it names one (launched by horovodrun on several
        hosts: :func:`~elastic_ring.worker.collective.torchrun_env_from_horovodrun`)."""
        store = controller_store(dist) if env.store() else rendezvous_store(self.rank, self.size)
        dist.init_process_group(backend, store=store, rank=self.rank, world_size=self.size,
                                timeout=timedelta(seconds=PG_TIMEOUT_S))

    def adopt_ranks(self) -> None:
        pass  # the launcher's environment is the group's

    def end_votes(self) -> None:
        """The collective's vote thread ended, its launches done (before the ring is re-formed:
        no vote is launched on a group that is gone)."""
        c = self._coll
        if c is not None:
            c.close()

    def _check_ranks(self) -> None:
        import torch.distributed as dist

        if (dist.get_rank(), dist.get_world_size()) != (self.rank, self.size):
            raise RuntimeError(f"process group rank {dist.get_rank()}/{dist.get_world_size()} differs "
                               f"from the environment's {self.rank}/{self.size}")


class TorchControllerRing(TorchRing):
    """The process group the controller forms for each segment of a ``--collective torch`` job
    that resizes in place (``--relaunch inplace`` on one host, or the Ray backend): it hosts each
    segment's store (``ELASTIC_RING_STORE``: ``host:port``) and names every member's rank and
    sizes, in the go of a warm joiner and in the resize action. A resize destroys the group and
    forms the next one in these processes; ``generation`` counts the groups formed, so that a
    ``DistributedDataParallel`` built over an older one is rebuilt
    (:class:`elastic_ring.worker.reformed.ReformedDDP`). A worker the action leaves out has
    retired (:class:`Retired`)."""

    in_place = True
    go_timeout_s = 7 * 24 * 3600.0  # a warm spare may wait for a grow all run long
    broadcasts_stop = False  # every member's go names it

    def __init__(self) -> None:
        super().__init__()
        self.generation = 0
        self._links = Links()

    @property
    def warms_compile(self) -> bool:
        """Always: ``DistributedDataParallel`` imports ``torch._dynamo`` when it is first built (seconds),
        which a joiner would otherwise do on the first step of the group it joins."""
        return True

    @warms_compile.setter
    def warms_compile(self, value: bool) -> None:
        pass

    def _went(self, go: Go) -> int:
        if go.env:  # a warm spare joining a group: started with a placeholder rank
            os.environ.update(go.env)
            self._ranks_from_env()
        return go.stop_at

    def _init_group(self, dist: Any, backend: str) -> None:
        """``init_process_group`` over the store the controller serves for this segment (the
        connections held before the first group and the store's are noted: :meth:`drop_links`)."""
        if backend == "gloo":
            self._links.mark()
        store = controller_store(dist)
        self._links.keep_port(store.port)
        dist.init_process_group(backend, store=store, rank=self.rank, world_size=self.size,
                                timeout=timedelta(seconds=PG_TIMEOUT_S))

    def drop_links(self) -> int:
        """Shut down this process's gloo connections (every group's: the default, the control
        group, a script's), not the store's: a survivor that left a collective at a peer's loss
        lets a peer still blocked in it on this rank see the loss too (a gloo rank waiting on a
        live peer waits until its connection closes). NCCL groups: none."""
        return self._links.drop()

    def _formed(self) -> None:
        self._check_ranks()
        self.adopt_ranks()

    def adopt_ranks(self) -> None:
        """This host's share of the CPU threads at the group's local size (as a new process's)."""
        import torch

        self.threads = protocol.cpu_threads(self.local_size)
        torch.set_num_threads(self.threads)

    def reform(self, action: Action) -> None:
        """Destroy the group and form the one the action names for this worker.

        Raises:
            Retired: the action names no environment for this worker.
        """
        import torch.distributed as dist

        self.end_votes()  # (before its groups are destroyed)
        dist.destroy_process_group()
        self._coll = None
        mine = action.member_env(env.member(default=""))
        if mine is None:
            raise Retired(f"not a member of segment {action.segment}")
        os.environ.update({k: str(v) for k, v in mine.items()})
        self._ranks_from_env()
        self.init_horovod()
        self._formed()
        self.generation += 1


def ring_from_env() -> Ring:
    """The ring of this launch, from the mode the entry point wrote to ``ELASTIC_RING_INPLACE``."""
    mode = env.ring_mode()
    if env.collective() == "torch":  # torch.distributed (worker.collective)
        return TorchControllerRing() if mode == RING_BY_CONTROLLER else TorchRing()
    if mode == RING_BY_CONTROLLER:
        return ControllerRing()
    if mode == "1":
        return ElasticRing()
    return RelaunchRing()


def launched_under_horovod_elastic() -> bool:
    """Horovod Elastic's entry may have initialised Horovod before the script's ``init()``."""
    return env.ring_mode() == "1"
