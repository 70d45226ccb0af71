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
each rank's copy holds its shards and rank r-1's, exchanged at every copy (:class:`ShardedCopy`,
:class:`elastic_ring.worker.sharded.Replica`): after one failure the survivors hold every shard
and rebuild the state at the new size; where they do not (two neighbours dead) or at one worker,
a failure restarts from the newest sharded checkpoint (one line at start says which).

Memory: two CPU copies of the registered state (for SGD with momentum about 4x the model's
parameters, plus its buffers); time: one copy of it per step, on the training thread (either loop).

By default (neither ``--survive`` nor ``--no-survive``, :data:`SURVIVE_ENV` ``auto``) the copy is
timed first (:class:`CostMeter`): after a few steps each rank writes what its copy costs against
its step (:func:`cost_file`), the controller decides for all once every rank has said
(:mod:`elastic_ring.controller.survive_choice`: on where the dearest copy costs at most
:data:`MAX_COST` of a step) and writes its word (:func:`choice_file`); a rank that reads "off"
drops its copies and keeps none after (a failure is then a restart from the checkpoint). A worker
that starts after the word (a joiner, a restart) follows it without measuring.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from elastic_ring import env, protocol
from elastic_ring.seam import MAX_COST, Action, choice_file, cost_file, read_action, survivor_file

SURVIVE_ENV = env.SURVIVE  # "1": keep the in-memory copy, and go on after a peer's loss ("auto": measure first)
WAIT_S = 30.0  # how long a survivor waits for the controller's word before it fails as before
SKIP_COPIES = 2  # the first copies allocate their tensors (and the first steps warm up): not timed
TIMED_COPIES = 5  # copies timed after those: the medians of their times decide


def read_choice(run_dir: Any) -> bool | None:
    """The controller's word (True: keep survivors, False: not), None while it has not said."""
    rec = protocol.read_json(choice_file(run_dir))
    return bool(rec["on"]) if isinstance(rec, dict) and isinstance(rec.get("on"), bool) else None


class CostMeter:
    """Times a rank's copies against its steps (the default: ``auto``): the copy is ``take`` in
    :meth:`MemoryCopy.keep`, the step the time from the end of one copy to the start of the next,
    of consecutive steps only. After :data:`SKIP_COPIES` + :data:`TIMED_COPIES` copies it writes
    the ratio of the medians (``report``: one call with the record); then it reads the controller's
    word at each copy (``word``) until there is one. ``forced``: a test's ratio (the times are still
    measured and written)."""

    def __init__(self, report, word, forced: float | None = None) -> None:
        self.report, self.word, self.forced = report, word, forced
        self.copies: list[float] = []
        self.steps: list[float] = []
        self.seen = 0  # copies made
        self.last: tuple[int, float] | None = None  # (step, the end of its copy)
        self.reported = False
        self.decided: bool | None = None

    def timed(self, step: int, t0: float, t1: float) -> None:
        """A copy of ``step`` ran from ``t0`` to ``t1`` (``time.perf_counter()``)."""
        self.seen += 1
        if self.last is not None and self.last[0] == step - 1 and self.seen > SKIP_COPIES:
            self.copies.append(t1 - t0)
            self.steps.append(max(t0 - self.last[1], 1e-9))
        self.last = (step, t1)
        if not self.reported and len(self.copies) >= TIMED_COPIES:
            self.reported = True
            copy_s, step_s = _median(self.copies), _median(self.steps)
            ratio = self.forced if self.forced is not None else copy_s / step_s
            self.report({"ratio": ratio, "copy_s": copy_s, "step_s": step_s, "steps": len(self.copies),
                         "forced": self.forced is not None})

    def choice(self) -> bool | None:
        """The controller's word once it has said (read at each call until then), else None."""
        if self.decided is None and self.reported:
            self.decided = self.word()
        return self.decided


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


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

    def __init__(self, take, keep: int = 2, meter: CostMeter | None = None) -> None:
        self.take, self.keep_n, self.meter = take, keep, meter
        self.copies: dict[int, dict[str, Any]] = {}
        self.off = False  # the controller's word was "off": no copy kept any more

    def keep(self, step: int) -> None:
        """``step`` is complete on this rank (the next one has not started): copy its state."""
        if self.off or step in self.copies:
            return
        into = self._room()
        meter = self.meter
        if meter is None:
            self.copies[step] = self.take(step, into)
            return
        t0 = time.perf_counter()
        self.copies[step] = self.take(step, into)
        meter.timed(step, t0, time.perf_counter())
        word = meter.choice()
        if word is not None:
            self._follow(word)

    def _room(self) -> Any:
        """Drop the oldest copies down to one fewer than kept: the last dropped, to copy into."""
        into = None
        while len(self.copies) >= self.keep_n:
            into = self.copies.pop(min(self.copies))
        return into

    def _follow(self, word: bool) -> None:
        """The controller's word is read: measure no more, and keep no copy where it says off."""
        self.meter = None
        if not word:
            self.stop()

    def stop(self) -> None:
        """Keep no copy from now on (the default's measurement found it dear): the copies let go."""
        self.off = True
        self.copies.clear()

    def held(self) -> list[int]:
        return sorted(self.copies)


class ShardedCopy(MemoryCopy):
    """A sharded model's copies (:class:`elastic_ring.worker.sharded.Replica`: each a send and a
    receive with the ring's neighbours), so every rank must keep one at the same steps: under
    the default's measurement the controller's word is followed at the first copy at which every
    rank has read it (an ``all_reduce`` of "read" per copy until then, on every rank, measuring or
    not: a rank alone that stopped would leave its neighbours waiting; :func:`_sharded_copy`
    agrees on it again on every new ring)."""

    def keep(self, step: int) -> None:
        if self.off or step in self.copies:
            return
        into = self._room()
        t0 = time.perf_counter()
        kept = self.take(step, into)
        if kept is None:  # (before the optimizer's first step: nothing to copy, on every rank alike)
            return
        self.copies[step] = kept
        meter = self.meter
        if meter is None:
            return
        meter.timed(step, t0, time.perf_counter())
        import torch
        import torch.distributed as dist

        word = meter.choice()
        read = torch.tensor([0 if word is None else 1])
        dist.all_reduce(read, op=dist.ReduceOp.MIN)
        if int(read.item()):  # every rank has read the same word (one file)
            self._follow(word)


@dataclass
class _Process:
    copy: MemoryCopy | None = None  # this process's copies (one job at a time)
    rollback: dict[str, Any] | None = None  # the copy the next restore() loads
    said_sharded: bool = False  # the line that a sharded job keeps no copy was said


_P = _Process()


def keeps_copies(job: Any) -> bool:
    """Whether ``job`` keeps a copy of its steps in memory: the run keeps survivors going and its
    ring is re-formed in place (the Ray backend's, or Horovod Elastic's)."""
    return enabled() and bool(getattr(getattr(job, "ring", None), "in_place", False))


def memory_copy(job: Any) -> MemoryCopy | None:
    """This process's copy, kept by ``job`` (the one running now: its flat loop or its epoch loop),
    where it keeps one (:func:`keeps_copies`); else None."""
    if not keeps_copies(job):
        return None
    take = job.state.snapshot
    if job.state.sharded:  # each rank keeps rank r-1's shards too (a replica), where the ring allows it
        from elastic_ring.worker import sharded

        why = sharded.why_no_replica(job.state.model, job.size)
        if not _P.said_sharded and job.rank == 0:
            sharded.say(sharded.REPLICA if why is None else f"{sharded.NO_SURVIVE} ({why})")
        _P.said_sharded = True
        if why is not None:
            return None
        take = sharded.Replica(job.state, job.rank, job.size).take
        return _sharded_copy(job, take)
    if _P.copy is None:
        _P.copy = MemoryCopy(take, meter=_meter(job))
        if _P.copy.meter is None and env.survive_measured() and read_choice(job.run_dir) is False:
            _P.copy.stop()  # started after the controller's word: off
    if _P.copy.off:
        return None
    _P.copy.take = take  # the script's new objects after a rerun
    return _P.copy


def _sharded_copy(job: Any, take: Any) -> MemoryCopy | None:
    """A sharded model's copy (:class:`ShardedCopy`) on a new ring (the script runs again at every
    resize and after a failure): its copies only. Under the default's measurement every rank must
    follow the controller's word at the same copy: here (every rank, a joiner too, at the loop's
    start) they agree whether all have read it; if not, all measure (again) until all have."""
    if _P.copy is None:
        _P.copy = ShardedCopy(take)
    cp = _P.copy
    cp.copies.clear()
    cp.take = take
    if env.survive_measured():  # (every rank, a stopped one too: the others count on its word)
        import torch
        import torch.distributed as dist

        word = read_choice(job.run_dir)
        read = torch.tensor([0 if word is None else 1])
        dist.all_reduce(read, op=dist.ReduceOp.MIN)
        if int(read.item()):
            cp.meter = None
            if word is False:
                cp.stop()
        elif cp.meter is None:
            cp.meter = _meter(job, force=True)
    return None if cp.off else cp


def _meter(job: Any, force: bool = False) -> CostMeter | None:
    """The default's measurement of this rank's copy (``auto``), unless the controller has said
    already (a worker started after its word follows it: :func:`memory_copy`; ``force``: measure
    anyway)."""
    if not env.survive_measured() or (read_choice(job.run_dir) is not None and not force):
        return None
    run_dir, member = job.run_dir, env.member(default=str(job.rank))

    def report(rec: dict[str, Any]) -> None:
        protocol.write_json_atomic(cost_file(run_dir, member), {
            **rec, "member": member, "rank": job.rank, "segment": job.seg.number, "pid": os.getpid(),
            "time": time.time()})

    return CostMeter(report, lambda: read_choice(run_dir), env.survive_cost())


def take_rollback() -> dict[str, Any] | None:
    """The kept copy the survivors rolled back to, once (every rank takes it; rank 0 loads it)."""
    r, _P.rollback = _P.rollback, None
    return r


def reset() -> None:
    """Forget the copies (a new job in this process)."""
    _P.copy, _P.rollback = None, None


def _peer_loss(exc: BaseException) -> bool:
    """A peer's loss this rank may survive: not a collective Horovod lost in its shut-down, which
    stays in Horovod's queue into the next ring (:class:`elastic_ring.hvd_patches.HorovodCollectiveLost`:
    the rank is a victim, but its process cannot go on)."""
    from elastic_ring.hvd_patches import HorovodCollectiveLost  # (no Horovod imported: only after a failure)

    return (isinstance(exc, Exception) and not isinstance(exc, HorovodCollectiveLost)
            and protocol.is_peer_loss(type(exc).__name__, str(exc)))


def rollback_word(exc: BaseException, job: Any, held: list[int],
                  digests: dict[str, str] | None = None, shards: dict[str, Any] | None = None) -> Action | None:
    """After a peer's loss (``exc``): say which steps this rank holds in memory (``held``, with a
    fingerprint of each copy where given: ``digests``, step -> :func:`state_digest`), and wait for
    the controller's word on this segment; ``shards``: a sharded model's copies hold the shards of
    these ranks (``{"world", "ranks"}``: :class:`elastic_ring.worker.sharded.Replica`). Returns
    the resize action whose ``rollback_to`` is one of them, or None (not a peer's loss, no word in time, an exit asked, the default's word "off"
    written: this rank says nothing, so the controller's wait ends at once)."""
    if not _peer_loss(exc) or not held or not job.ring.in_place:
        return None
    if env.survive_measured() and read_choice(job.run_dir) is False:
        return None  # the default measured the copy dear: the restart, though this rank had not read it yet
    t0 = time.time()
    run_dir, seg = job.run_dir, job.seg.number
    member = env.member(default=str(job.rank))
    protocol.write_json_atomic(survivor_file(run_dir, member), {
        "member": member, "rank": job.rank, "held": list(held), "pid": os.getpid(), "time": t0,
        "segment": seg, "step": job.seg.step, "error": f"{type(exc).__name__}: {exc}"[:300],
        **({"digests": digests} if digests else {}), **({"shards": shards} if shards else {})})
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
    job.ring.drop_links()  # a survivor still blocked in the collective on this rank sees the loss too
    model = job.state.model
    params = {k for k, _ in model.named_parameters()} if model is not None else set()
    digests = {str(k): state_digest(c, params) for k, c in copy.copies.items()}
    reps = [c["replica"] for c in copy.copies.values() if c.get("replica")]
    shards = {"world": reps[0]["world"], "ranks": sorted(reps[0]["pieces"])} if reps else None
    action = rollback_word(exc, job, copy.held(), digests, shards)
    if action is None:
        return None
    _P.rollback = copy.copies[action.rollback_to]
    copy.copies.clear()  # the steps after the rollback are taken again
    start = job.progress.start
    start.restart(t0)
    reform_survivors(job.ring, action)  # Retired where this worker is not in the new ring
    if _P.rollback.get("replica") is not None:  # a sharded model's: the script shards it again
        from elastic_ring.worker.sharded import forget_meshes

        forget_meshes()  # (this process's rank may be another one now)
    job.ring.connected = True
    start.mark("hvd_reinit")
    return job.ring, action.segment, action.stop_at, start
