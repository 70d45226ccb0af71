"""Survivors go on after a failure (``--survive``, on the Ray backend and on ``--relaunch inplace``): a
lost peer is a shrink, not a restart.

Every rank keeps, in memory, the state of its last two completed steps (:class:`MemoryCopy`: the
same CPU snapshot a checkpoint holds, taken at the step boundary before the next step starts:
model, optimizer, schedulers, RNG, data position, extras). Two, because with three or more workers
the survivors of a death inside a step's allreduce may differ by one step (one received the whole
reduction and applied it, another did not): the step every survivor holds is then the older one.

When a collective fails because a peer died (Horovod raises ``HorovodInternalError`` out of the
script's step; ``torch.distributed``'s gloo a ``RuntimeError`` naming the closed socket, from DDP's
backward hooks or the library's own collectives: :func:`elastic_ring.protocol.is_peer_loss`), the
entry point asks :func:`survived`: this rank writes which steps it holds
(:func:`elastic_ring.seam.survivor_file`), and waits for the controller's word for its segment
(:class:`elastic_ring.seam.Action`): the new ring of the survivors and the
step they all hold (``rollback_to``, the largest in every survivor's record whose copies agree:
:func:`elastic_ring.seam.agreement`).
It re-forms its ring in this process (:meth:`~elastic_ring.worker.ring.ControllerRing.reform`; on
``--collective torch`` :meth:`~elastic_ring.worker.ring.TorchControllerRing.reform` destroys the
broken process group, which returns at once after the peer's death, and forms the survivors' one),
and the script runs again here over it; its ``job.restore()`` loads the kept copy of that step
instead of the newest checkpoint on disk (:func:`take_rollback`), rank 0 broadcasts it as after a
checkpoint, and Eq. 7 rescales the LR for the size that is left: the segment goes on as a
scheduled shrink at that step would; a warm spare that takes a dead worker's place receives the
state by the same broadcast. With no word in time, or ``exit``, the error goes on up (the
controller restarts from the disk checkpoint). The copy is kept by the flat loop (``job.steps()``,
before it yields the next step) and by an epoch loop (``job.epochs()``: once per step, when the
training sampler hands out the next batch's first index, else at the next optimizer step's
pre-hook, and after the end-of-epoch code for an epoch's last step; the data position is the one
inside the epoch: :class:`elastic_ring.worker.hooked.HookedSteps`); a Horovod Elastic script needs
none: it holds the step of its last ``state.commit()`` (Horovod's save) and rolls back to it
(:meth:`elastic_ring.worker.hvd_elastic.Session._roll_back`, through the same word:
:func:`rollback_word`).

A sharded model's (FSDP2) state is not held whole by any rank: a dead rank's shards die with it, so
no copy is kept and a failure restarts from the newest sharded checkpoint (one line at start says so:
:mod:`elastic_ring.worker.sharded`).

Memory: two CPU copies of the registered state (for SGD with momentum about 4x the model's
parameters, plus its buffers); time: one copy of it per step, on the training thread (either loop).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from elastic_ring import env, protocol
from elastic_ring.seam import Action, read_action, survivor_file

SURVIVE_ENV = env.SURVIVE  # "1": keep the in-memory copy, and go on after a peer's loss
WAIT_S = 30.0  # how long a survivor waits for the controller's word before it fails as before


def enabled() -> bool:
    """Whether this run keeps survivors going (the controller sets :data:`SURVIVE_ENV`)."""
    return env.survive()


def _tensor_bytes(t: Any) -> bytes:
    import torch

    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def state_digest(snap: dict[str, Any], params: set[str]) -> str:
    """A fingerprint of what every rank of a data-parallel job holds alike in a copy (``snap``): the
    step, the model's parameters named in ``params`` (not its buffers: BatchNorm's running
    statistics are each rank's own) and the optimizer's state tensors (momentum). Taken only after
    a failure, of the copies held (a few milliseconds for the built-in ResNet's two)."""
    import hashlib

    import torch

    h = hashlib.blake2b(digest_size=16)
    h.update(str(snap.get("step")).encode())
    model = snap.get("model") or {}
    for k in sorted(model):
        if k in params and isinstance(model[k], torch.Tensor):
            h.update(k.encode())
            h.update(_tensor_bytes(model[k]))
    state = (snap.get("optimizer") or {}).get("state") or {}
    for i in sorted(state, key=str):
        for k in sorted(state[i]):
            if isinstance(state[i][k], torch.Tensor):
                h.update(f"{i}.{k}".encode())
                h.update(_tensor_bytes(state[i][k]))
    return h.hexdigest()


class MemoryCopy:
    """The state of this rank's last ``keep`` completed steps, in memory (``take(step, into)`` makes
    one: the job's :meth:`~elastic_ring.worker.sync.StateSync.snapshot`; ``into`` is the oldest copy,
    let go, whose tensors the new one reuses, or None). A copy handed out for a rollback is taken
    out of :attr:`copies` first (:func:`survived`), so it is never reused."""

    def __init__(self, take, keep: int = 2) -> None:
        self.take, self.keep_n = take, keep
        self.copies: dict[int, dict[str, Any]] = {}

    def keep(self, step: int) -> None:
        """``step`` is complete on this rank (the next one has not started): copy its state."""
        if step in self.copies:
            return
        into = None
        while len(self.copies) >= self.keep_n:
            into = self.copies.pop(min(self.copies))
        self.copies[step] = self.take(step, into)

    def held(self) -> list[int]:
        return sorted(self.copies)


@dataclass
class _Process:
    copy: MemoryCopy | None = None  # this process's copies (one job at a time)
    rollback: dict[str, Any] | None = None  # the copy the next restore() loads
    said_sharded: bool = False  # the line that a sharded job keeps no copy was said


_P = _Process()


def memory_copy(job: Any) -> MemoryCopy | None:
    """This process's copy, kept by ``job`` (the one running now: its flat loop or its epoch loop),
    when the run keeps survivors going and the ring is re-formed in place (the Ray backend's, or
    Horovod Elastic's); else None."""
    if not enabled() or not job.ring.in_place:
        return None
    if job.state.sharded:  # a dead rank's shards are gone: the sharded checkpoint is the fallback
        if not _P.said_sharded and job.rank == 0:
            from elastic_ring.worker.sharded import NO_SURVIVE, say

            say(NO_SURVIVE)
        _P.said_sharded = True
        return None
    if _P.copy is None:
        _P.copy = MemoryCopy(job.state.snapshot)
    _P.copy.take = job.state.snapshot  # the script's new objects after a rerun
    return _P.copy


def take_rollback() -> dict[str, Any] | None:
    """The kept copy the survivors rolled back to, once (every rank takes it; rank 0 loads it)."""
    r, _P.rollback = _P.rollback, None
    return r


def reset() -> None:
    """Forget the copies (a new job in this process)."""
    _P.copy, _P.rollback = None, None


def _peer_loss(exc: BaseException) -> bool:
    return isinstance(exc, Exception) and protocol.is_peer_loss(type(exc).__name__, str(exc))


def rollback_word(exc: BaseException, job: Any, held: list[int],
                  digests: dict[str, str] | None = None) -> Action | None:
    """After a peer's loss (``exc``): say which steps this rank holds in memory (``held``, with a
    fingerprint of each copy where given: ``digests``, step -> :func:`state_digest`), and wait for
    the controller's word on this segment. Returns the resize action whose ``rollback_to`` is one
    of them, or None (not a peer's loss, no word in time, an exit asked)."""
    if not _peer_loss(exc) or not held or not job.ring.in_place:
        return None
    t0 = time.time()
    run_dir, seg = job.run_dir, job.seg.number
    member = env.member(default=str(job.rank))
    protocol.write_json_atomic(survivor_file(run_dir, member), {
        "member": member, "rank": job.rank, "held": list(held), "pid": os.getpid(), "time": t0,
        "segment": seg, "step": job.seg.step, "error": f"{type(exc).__name__}: {exc}"[:300],
        **({"digests": digests} if digests else {})})
    print(f"elastic-ring worker rank {job.rank}: a peer was lost ({type(exc).__name__}); holding steps "
          f"{list(held)} in memory, waiting for the controller", flush=True)
    while time.time() - t0 < WAIT_S:
        act = read_action(run_dir, seg)
        if act is not None and not act.ahead and (act.is_exit or act.rollback_to is not None):
            return act if act.is_resize and act.rollback_to in held else None
        time.sleep(0.02)
    return None


def reform_survivors(ring: Any, action: Action) -> None:
    """Re-form the survivors' ring (``action`` rolls them back) keeping the intra-op threads they
    trained with, not the share of a smaller ring (``cores / local workers``): with more OpenMP
    threads than the host has idle cores, each parallel region of a step waits at its barrier for
    a thread the scheduler has not run yet (measured: a survivor alone on 2 cores, 1 -> 2 threads
    at load 10: its first step 1.2-3.3 s, 0.1-0.4 s with 1 thread). The dead worker's cores are
    its joiner's (under ``elastic-ring cluster``, the policy's); the next resize sets the share."""
    import torch

    threads = torch.get_num_threads()
    ring.reform(action)
    ring.keep_threads(threads)


def survived(exc: BaseException) -> tuple | None:
    """After the script raised ``exc``: where this rank goes on, as the carried ring of
    :func:`elastic_ring.worker.session.start_over` ``(ring, segment, stop_at, start-up)``; None when
    it does not (not a peer's loss, no copy, no word from the controller in time, an exit asked).

    Raises:
        Retired: the controller left this worker out of the new ring.
    """
    from elastic_ring.worker import session

    job, copy = session.current(), _P.copy
    if not _peer_loss(exc) or copy is None or job is None or not copy.held() or not job.ring.in_place:
        return None
    t0 = time.time()
    model = job.state.model
    params = {k for k, _ in model.named_parameters()} if model is not None else set()
    digests = {str(k): state_digest(c, params) for k, c in copy.copies.items()}
    action = rollback_word(exc, job, copy.held(), digests)
    if action is None:
        return None
    _P.rollback = copy.copies[action.rollback_to]
    copy.copies.clear()  # the steps after the rollback are taken again
    start = job.progress.start
    start.restart(t0)
    reform_survivors(job.ring, action)  # Retired where this worker is not in the new ring
    job.ring.connected = True
    start.mark("hvd_reinit")
    return job.ring, action.segment, action.stop_at, start
