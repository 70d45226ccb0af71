"""The collectives the worker library makes, behind one small interface with two implementations:
Horovod (:class:`HorovodCollective`) and ``torch.distributed`` (:class:`TorchCollective`: gloo on
the CPU, NCCL on GPUs), chosen per job (``elastic-ring train --collective horovod|torch``).

The library needs few of them: the stop vote (an allreduce started between two steps and read some
steps later; on ``torch.distributed`` launched by a thread of the collective's own,
:class:`VoteThread`, so that its launch is off the training thread), rank 0's state sent to all at a start or a reset (an object, the optimizer's state,
the model's tensors), the mean of a metric, a sum for an evaluation, and a barrier at a segment's
end. The gradients are the script's: ``hvd.DistributedOptimizer`` or ``DistributedDataParallel``
(:meth:`TorchCollective.data_parallel`); :meth:`elastic_ring.worker.api.Job.parallel` picks the
one of the job's collective.

:class:`elastic_ring.worker.ring.TorchRing` is the ring of a job on ``torch.distributed``: the controller's local launcher
names every worker's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` and the
segment's rendezvous (``MASTER_ADDR``/``MASTER_PORT``; rank 0 hosts its store); a resize ends the
processes and new ones form the next group, as under horovodrun. On several hosts (``--hosts``,
``--hostfile``) horovodrun launches the workers (its ssh and its host list) without Horovod being
used: :func:`torchrun_env_from_horovodrun` gives them torchrun's names for the ranks horovodrun
set, and the group forms over a store the controller serves (``ELASTIC_RING_STORE``). Resized in place (``--relaunch
inplace``, the Ray backend), :class:`elastic_ring.worker.ring.TorchControllerRing` forms each group
over a store the controller serves, in the same processes.
"""

from __future__ import annotations

import os
import queue
import struct
import threading
from typing import Any, Callable, Protocol

from elastic_ring import env as envvars
from elastic_ring.worker.errors import ContractError

COLLECTIVE_ENV = envvars.COLLECTIVE  # "torch": the job's collectives are torch.distributed
COLLECTIVES = ("horovod", "torch")
TORCH_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
# horovodrun's names of the same, and of the host's place (torchrun's GROUP_RANK)
_FROM_HOROVODRUN = (("RANK", "HOROVOD_RANK"), ("WORLD_SIZE", "HOROVOD_SIZE"), ("LOCAL_RANK", "HOROVOD_LOCAL_RANK"),
                    ("LOCAL_WORLD_SIZE", "HOROVOD_LOCAL_SIZE"), ("GROUP_RANK", "HOROVOD_CROSS_RANK"))
PG_TIMEOUT_S = 300.0  # a new group's rendezvous and a collective may wait this long for a peer


class Collective(Protocol):
    """What the worker library asks of a job's collectives (every rank calls each in the same
    order). ``name`` labels the operation (Horovod matches operations by it)."""

    name: str

    def allreduce(self, tensor: Any, op: str = "sum", name: str = "") -> Any:
        """The ranks' ``tensor`` summed (``op="sum"``) or averaged (``"mean"``); a new tensor."""

    def allreduce_async(self, tensor: Any, name: str = "") -> Any:
        """Start the sum of ``tensor`` without waiting; :meth:`wait` returns it."""

    def wait(self, handle: Any) -> Any:
        """The result of an :meth:`allreduce_async` or a :meth:`vote_async`."""

    def vote_async(self, values: list[float], name: str = "") -> Any:
        """The sum of ``values`` (a float32 tensor of them) started as :meth:`allreduce_async`
        would, by the collective's vote thread (:class:`VoteThread`): the caller returns at once;
        :meth:`wait` returns the sum."""

    def close(self) -> None:
        """End the vote thread, its launches done (a segment's end, before the group goes)."""

    def broadcast(self, tensor: Any, root: int = 0, name: str = "") -> Any:
        """Rank ``root``'s ``tensor`` on every rank (a new tensor)."""

    def broadcast_object(self, obj: Any, root: int = 0, name: str = "") -> Any:
        """Rank ``root``'s picklable ``obj`` on every rank."""

    def broadcast_parameters(self, state: dict[str, Any], root: int = 0) -> None:
        """Rank ``root``'s tensors of a module's ``state_dict()`` into every rank's (in place)."""

    def broadcast_optimizer_state(self, optimizer: Any, root: int = 0) -> None:
        """Rank ``root``'s optimizer state (momentum buffers, param groups) into every rank's."""

    def barrier(self, name: str = "") -> None:
        """All ranks get here before any goes on."""


class Launched:
    """A :meth:`VoteThread.submit`'s handle: the collective's own handle once the thread has
    launched it (``lock`` held until then)."""

    __slots__ = ("values", "name", "handle", "error", "lock", "done")

    def __init__(self, values: Any, name: str) -> None:
        self.values, self.name, self.handle, self.error, self.done = values, name, None, None, False
        self.lock = threading.Lock()
        self.lock.acquire()

    def launched(self) -> Any:
        """The collective's handle, waiting for the launch only if it is not done yet; its
        failure raised here, on the caller's thread."""
        if not self.done:
            self.lock.acquire()  # (released by the vote thread once launched)
            self.lock.release()
        if self.error is not None:
            raise self.error
        return self.handle


class VoteThread:
    """Launches the stop vote's allreduce off the training thread (issue 50; ``torch.distributed``'s
    control group): on gloo the launch alone took 0.2-1 ms of the training thread's time every K
    steps (gloo's own thread woken on two busy cores). The training thread hands over the
    vote's few values (:meth:`submit`, a queue's put) and goes on; this thread makes their tensor
    and launches it with ``launch(values, name)`` and goes back to wait; the read, L steps later, waits for the launch
    only if it is not done (:meth:`Launched.launched`), then for the collective as before (on the
    training thread: a hung peer still hangs it, and the stall watchdog sees that). It never
    waits on a collective itself, so :meth:`close` (a segment's end, before a group is
    destroyed) joins it at once. Started at the first vote, after a :meth:`close` at the next."""

    def __init__(self, launch: Callable[[list[float], str], Any]) -> None:
        self._launch = launch
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.last: Launched | None = None  # the vote submitted last

    def submit(self, values: list[float], name: str = "") -> Launched:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True, name="elastic-ring-vote")
            self._thread.start()
        item = self.last = Launched(values, name)
        self._queue.put(item)
        return item

    def fence(self) -> None:
        """The vote submitted last is launched (before the caller's next collective on the same
        group, whose ranks pair the operations in order)."""
        last = self.last
        if last is not None and not last.done:
            last.launched()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                item.handle = self._launch(item.values, item.name)
            except BaseException as e:  # (told at the read, on the training thread)
                item.error = e
            item.done = True
            item.lock.release()

    def close(self) -> None:
        """Every vote submitted launched, then the thread ends (joined)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()


def _wait_launched(handle: Any) -> Any:
    return handle.launched() if isinstance(handle, Launched) else handle


class HorovodCollective:
    """The collectives on Horovod (``hvd``: ``horovod.torch``)."""

    name = "horovod"

    def __init__(self, hvd: Any) -> None:
        self.hvd = hvd
        self._vote: tuple[Any, Any, Any] | None = None  # the votes' tensor, its buffer and packer (vote_async)
        self._vote_handle: Any = None  # the vote launched in it, not yet waited for

    def allreduce(self, tensor: Any, op: str = "sum", name: str = "") -> Any:
        hvd = self.hvd
        return hvd.allreduce(tensor, op=hvd.Average if op == "mean" else hvd.Sum, name=name or None)

    def allreduce_async(self, tensor: Any, name: str = "") -> Any:
        return self.hvd.allreduce_async(tensor, op=self.hvd.Sum, name=name or None)

    def vote_async(self, values: list[float], name: str = "") -> Any:
        """Launched here: Horovod's own launch only queues it for its background thread (a thread
        of ours would add a wake-up and the GIL's hand-overs, measured no cheaper). In place, in
        one tensor kept for the votes, written through its buffer: no tensor made and no
        output allocated on the training thread (right after a step each torch call there costs
        tens of microseconds). A vote's tensor is reused only once the vote before was waited for
        (one in flight at a time); where one was not (a segment stopped without its read), a new
        one is made."""
        vote = self._vote
        if vote is None or self._vote_handle is not None or len(vote[1]) != len(values):
            import torch

            t = torch.zeros(len(values), dtype=torch.float32)
            vote = self._vote = (t, memoryview(t.numpy()), struct.Struct(f"{len(values)}f"))
        vote[2].pack_into(vote[1], 0, *values)  # (one C call: numpy's assignment from a list cost ~10 us after a step)
        h = self._vote_handle = self.hvd.allreduce_async_(vote[0], op=self.hvd.Sum, name=name or None)
        return h

    def wait(self, handle: Any) -> Any:
        if handle is self._vote_handle:  # (the votes' tensor may take the next vote)
            self._vote_handle = None
        return self.hvd.synchronize(handle)

    def wait_values(self, handle: Any) -> Any:
        """:meth:`wait`, and the summed values as floats: a vote's read through the votes' buffer
        (one C call; ``tolist()`` cost ~10 us right after a step), another tensor's listed."""
        out = self.wait(handle)
        vote = self._vote
        if vote is not None and out is vote[0]:
            return vote[2].unpack_from(vote[1])
        return out.tolist()

    def close(self) -> None:
        pass

    def broadcast(self, tensor: Any, root: int = 0, name: str = "") -> Any:
        return self.hvd.broadcast(tensor, root_rank=root, name=name or None)

    def broadcast_object(self, obj: Any, root: int = 0, name: str = "") -> Any:
        return self.hvd.broadcast_object(obj, root_rank=root, name=name or None)

    def broadcast_parameters(self, state: dict[str, Any], root: int = 0) -> None:
        self.hvd.broadcast_parameters(state, root_rank=root)

    def broadcast_optimizer_state(self, optimizer: Any, root: int = 0) -> None:
        self.hvd.broadcast_optimizer_state(optimizer, root_rank=root)

    def barrier(self, name: str = "") -> None:
        import torch

        self.hvd.allreduce(torch.tensor([0.0]), name=name or "barrier")


class TorchCollective:
    """The collectives on ``torch.distributed``'s default process group (``dist``: the module,
    passed in so that the logic is tested with a fake); ``device``: where the backend's tensors
    live (the CPU for gloo, this rank's GPU for NCCL).

    ``control``: a gloo group of the same ranks for the library's host-side values (the stop vote,
    a metric's mean, a barrier, a pickled object: whatever is given as a CPU tensor or an object).
    They then never queue behind the gradients' allreduces on the default group, and on GPUs
    reading them back does not wait for the GPU to finish the steps queued meanwhile (a vote
    read from NCCL is a copy from the device, behind every kernel of the next step). Without it
    (None) everything goes on the default group."""

    name = "torch"

    def __init__(self, dist: Any, device: Any, control: Any = None) -> None:
        self.dist, self.device, self.control = dist, device, control
        self.votes = VoteThread(self._launch_vote)

    def _on(self, tensor: Any, fence: bool = True) -> tuple[Any, Any]:
        """(the group, a copy of ``tensor`` where that group reduces it); ``fence``: a vote
        submitted before is launched first (the control group's ranks pair its operations in
        order; the vote thread itself does not wait for itself)."""
        if self.control is not None and tensor.device.type == "cpu":
            if fence:
                self.votes.fence()
            return self.control, tensor.detach().clone()
        return None, self._here(tensor)

    def _here(self, tensor: Any) -> Any:
        return tensor.detach().clone().to(self.device)

    def allreduce(self, tensor: Any, op: str = "sum", name: str = "") -> Any:
        group, t = self._on(tensor)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.SUM, group=group)
        if op == "mean":
            t = t / self.dist.get_world_size()
        return t.to(tensor.device)

    def allreduce_async(self, tensor: Any, name: str = "", fence: bool = True) -> Any:
        group, t = self._on(tensor, fence)
        return self.dist.all_reduce(t, op=self.dist.ReduceOp.SUM, group=group, async_op=True), t, tensor.device

    def vote_async(self, values: list[float], name: str = "") -> Any:
        return self.votes.submit(values, name)

    def _launch_vote(self, values: list[float], name: str) -> Any:
        import torch

        # (on the vote thread: the fence would wait for this very launch)
        return self.allreduce_async(torch.tensor(values, dtype=torch.float32), name, fence=False)

    def wait(self, handle: Any) -> Any:
        work, t, device = _wait_launched(handle)
        work.wait()
        return t.to(device)

    def close(self) -> None:
        self.votes.close()

    def broadcast(self, tensor: Any, root: int = 0, name: str = "") -> Any:
        t = self._here(tensor)
        self.dist.broadcast(t, src=root)
        return t.to(tensor.device)

    def broadcast_object(self, obj: Any, root: int = 0, name: str = "") -> Any:
        box = [obj]
        if self.control is not None:
            import torch

            self.votes.fence()
            self.dist.broadcast_object_list(box, src=root, group=self.control, device=torch.device("cpu"))
        else:
            self.dist.broadcast_object_list(box, src=root, device=self.device)
        return box[0]

    def broadcast_parameters(self, state: dict[str, Any], root: int = 0) -> None:
        """One broadcast per dtype: the tensors flattened into one buffer, copied back after."""
        import torch

        by_dtype: dict[Any, list[Any]] = {}
        for t in state.values():
            if isinstance(t, torch.Tensor):
                by_dtype.setdefault(t.dtype, []).append(t)
        for dtype in sorted(by_dtype, key=str):  # the same order on every rank
            ts = by_dtype[dtype]
            flat = torch.cat([t.detach().reshape(-1).to(self.device) for t in ts])
            self.dist.broadcast(flat, src=root)
            at = 0
            with torch.no_grad():
                for t in ts:
                    n = t.numel()
                    t.copy_(flat[at:at + n].view_as(t))
                    at += n

    def broadcast_optimizer_state(self, optimizer: Any, root: int = 0) -> None:
        """Rank ``root``'s ``state_dict()`` (param groups' LRs included) loaded by the others."""
        st = optimizer.state_dict() if self.dist.get_rank() == root else None
        st = self.broadcast_object(st, root)
        if self.dist.get_rank() != root:
            optimizer.load_state_dict(st)

    def barrier(self, name: str = "") -> None:
        import torch

        self.allreduce(torch.tensor([0.0]), name=name)

    def data_parallel(self, model: Any, **kwargs: Any) -> Any:
        """``DistributedDataParallel(model)`` on this rank's device (rank 0's weights to all)."""
        from torch.nn.parallel import DistributedDataParallel

        if self.device.type == "cuda":
            kwargs.setdefault("device_ids", [self.device.index])
        return DistributedDataParallel(model, **kwargs)


def torch_backend(device: str) -> str:
    """The process group's backend of a job on ``device``: NCCL on GPUs, gloo on the CPU."""
    return "nccl" if device == "cuda" else "gloo"


def rendezvous_store(rank: int, world: int, timeout_s: float = PG_TIMEOUT_S) -> Any:
    """The segment's store at torchrun's ``MASTER_ADDR``/``MASTER_PORT``: served by rank 0, on the
    listening socket the local launcher bound and handed over where there is one (its descriptor in
    ``ELASTIC_RING_STORE_FD``, taken once: the port held since the launcher picked it), else bound
    by rank 0 itself; the other ranks connect to it.

    Raises:
        ContractError: no ``MASTER_PORT`` in the environment.
    """
    from datetime import timedelta

    import torch.distributed as dist

    port = envvars.master_port()
    if port is None:
        raise ContractError("a --collective torch worker needs MASTER_PORT in its environment (the "
                            "controller's launcher sets it)")
    fd = envvars.take_store_fd() if rank == 0 else None
    return dist.TCPStore(envvars.master_addr(), port, world, is_master=rank == 0,
                         timeout=timedelta(seconds=timeout_s), master_listen_fd=fd)


def torchrun_env_from_horovodrun(env: dict[str, str] | None = None) -> bool:
    """A ``--collective torch`` worker that horovodrun launched (``--hosts``/``--hostfile``): set
    torchrun's ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` and ``GROUP_RANK``
    from horovodrun's ranks, as a script written for torchrun reads them (``env``: default
    ``os.environ``, changed in place). Returns whether it did (horovodrun's ranks there, torchrun's
    not)."""
    env = os.environ if env is None else env
    if envvars.collective(env) != "torch" or "RANK" in env or "HOROVOD_RANK" not in env:
        return False
    for mine, hvd in _FROM_HOROVODRUN:
        if hvd in env:
            env[mine] = env[hvd]
    return True
