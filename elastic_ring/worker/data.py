"""Drop-ins for a plain Horovod script's epoch loop: ``elastic.DistributedSampler`` and the data
position of the epoch being trained (:class:`DataPosition`).

``elastic.DistributedSampler(dataset, num_replicas=None, rank=None, shuffle=True, seed=0,
drop_last=False)`` takes ``torch.utils.data.distributed.DistributedSampler``'s arguments and gives
its order: epoch ``e``'s permutation is drawn from ``seed + e`` (``set_epoch(e)``), padded to a
multiple of the world size by repeating its first indices (or cut, with ``drop_last``), and rank
``r`` takes every ``world``-th index from the r-th. A ``DataLoader(..., batch_size=b,
sampler=sampler)`` over it trains, at step j of an epoch, the contiguous block
``[j * world * b, (j + 1) * world * b)`` of the epoch's permutation (each rank its stride of it).

Under ``elastic-ring train`` the sampler that feeds the registered optimizer's steps (the one
iterated last before a step: a test sampler is not) keeps the epoch's position: each step moves it
by ``world * b``, the checkpoint holds it, and after a resize inside the epoch the sampler yields
only the epoch's not-yet-used indices, split over the new world size as above. So every sample of
the epoch is used once across any number of resizes (plus the padding, as with torch's sampler,
when the rest of the epoch is not a multiple of the new world size). ``b`` is read from the
``DataLoader``'s batch sampler when it iterates this sampler (or give ``batch_size=``).

Under ``--lr-scaling constant-batch`` (``job.global_batch``) a step trains the run's global batch
``G`` at every world size: the epoch's rest is cut (``drop_last``) or padded to a multiple of ``G``,
each step's ``G`` positions are micro-batches of the loader's batch ``b``, and rank r takes its
contiguous share of them (:mod:`elastic_ring.worker.accumulate`); the registered optimizer's
``zero_grad``/``step`` then act once per step (:class:`~elastic_ring.worker.accumulate.EpochAccumulation`).

``len(sampler)`` is the number of indices this rank takes in the current epoch from the current
position, so ``len(loader)`` is the number of batches left in the epoch at this world size: after a
resize inside an epoch, the rest of that epoch, and a full epoch again from the next one (it is
what the iteration yields: a DataLoader and a progress print rely on that). For a quantity over
the whole epoch (a per-batch LR warm-up), ``sampler.epoch_batches`` is the epoch's full length in
the loader's batches at this world size and ``sampler.start_batch`` the batches of the epoch done
before this pass, counted at this size: ``(sampler.start_batch + batch_idx) / sampler.epoch_batches``
goes on across a resize where ``batch_idx / len(loader)`` starts again from 0.
Outside the tool (plain ``horovodrun`` or ``python``) it is torch's sampler.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from elastic_ring.worker import stepcost
from elastic_ring.worker.errors import ContractError


@dataclass
class DataPosition:
    """Where the training data stands, saved in every checkpoint of a script with an epoch loop.

    ``epoch``: the script's epoch in progress (``job.epochs()``'s value; None when it does not
    use it). ``sampler_epoch``: the training sampler's ``set_epoch`` value (its permutation).
    ``pos``: positions of that epoch's permutation used by completed steps (all ranks together).
    ``sampler_index``: which drop-in sampler of the script (by creation order) is the training one.
    """

    epoch: int | None = None
    sampler_epoch: int = 0
    pos: int = 0
    sampler_index: int | None = None

    def state(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "sampler_epoch": self.sampler_epoch, "pos": self.pos,
                "sampler_index": self.sampler_index}

    def load(self, st: dict[str, Any] | None) -> None:
        if st:
            self.epoch, self.sampler_epoch = st.get("epoch"), int(st.get("sampler_epoch") or 0)
            self.pos, self.sampler_index = int(st.get("pos") or 0), st.get("sampler_index")


@dataclass
class EpochData:
    """A job's drop-in samplers (in creation order: the script creates them in the same order
    in every segment), the one iterated last, the data position, and the RNG state to put back
    where the training loader resumes inside an epoch. ``before_batch``: called when the training
    sampler hands out the first index after a completed step (the loader fetches the next batch:
    the script's code after the step has run, the next step's collectives have not started), where
    ``--survive`` keeps its copy of the step (:meth:`elastic_ring.worker.hooked.HookedSteps.keep_copy`)."""

    samplers: list["DistributedSampler"] = field(default_factory=list)
    iterated: "DistributedSampler | None" = None
    position: DataPosition = field(default_factory=DataPosition)
    resume_rng: dict[str, Any] | None = None
    before_batch: Callable[[], None] | None = None

    def training_sampler(self) -> "DistributedSampler | None":
        """The drop-in sampler that feeds the steps: the one that fed them before (restored with
        the checkpoint), else the one iterated last (a test set's sampler iterated in the middle
        of an epoch does not take over once training has claimed one)."""
        i = self.position.sampler_index
        if i is not None and 0 <= i < len(self.samplers):
            return self.samplers[i]
        return self.iterated


def _caller_batch_sampler(frame) -> Any:
    """The ``torch.utils.data.BatchSampler`` whose ``__iter__`` is calling ``iter()`` on us (a
    ``DataLoader`` batching this sampler), or None."""
    torch = sys.modules.get("torch")
    if torch is None or frame is None:
        return None
    owner = frame.f_locals.get("self")
    return owner if isinstance(owner, torch.utils.data.BatchSampler) else None


class DistributedSampler:
    """``torch.utils.data.distributed.DistributedSampler``'s drop-in, elastic under elastic-ring
    (see the module docstring). ``batch_size``: the per-rank batch, when no ``DataLoader``
    batches this sampler (it is read from the loader otherwise)."""

    def __init__(self, dataset, num_replicas: int | None = None, rank: int | None = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False,
                 batch_size: int | None = None) -> None:
        from elastic_ring.worker.session import current

        self.dataset, self.shuffle, self.seed, self.drop_last = dataset, shuffle, seed, drop_last
        self.epoch = 0
        self.batch_size = batch_size
        self.job = current()
        if self.job is None:
            raise ContractError("elastic.DistributedSampler needs elastic.init() first")
        self.num_replicas = self.job.size if num_replicas is None else int(num_replicas)
        self.rank = self.job.rank if rank is None else int(rank)
        if (self.num_replicas, self.rank) != (self.job.size, self.job.rank):
            raise ContractError(f"DistributedSampler(num_replicas={self.num_replicas}, rank={self.rank}): "
                                f"this worker is rank {self.job.rank} of {self.job.size}")
        self.data = self.job._epoch_data
        self.index = len(self.data.samplers)  # the script creates its samplers in the same order
        self._start = 0  # the position this epoch's iteration started at
        self._pulled_n = self._pulled_at_step = 0  # indices handed out by the iteration (at the last step)
        self._listed: Iterator[int] | None = None  # the iteration's list iterator (no copies: _indices)
        self._listed_n = 0  # its length
        self._n: int | None = None  # the dataset's length, read when an iteration starts (size())
        self._loader_batch: int | None = None
        self._loader_drop_last = False  # the DataLoader's own drop_last (its last, short batch)
        self.iterating = False  # an iteration of the epoch is under way (its start fixes len())
        self.data.samplers.append(self)

    # ------------------------------------------------------------------ torch's interface
    def set_epoch(self, epoch: int) -> None:
        """The epoch's permutation is drawn from ``seed + epoch``, as torch's sampler does."""
        if epoch != self.epoch:
            self.iterating = False
        self.epoch = epoch

    def __len__(self) -> int:
        """This rank's indices in the epoch from where its iteration starts (started): stable
        while the loop runs, so ``batch_idx / len(loader)`` is the progress of the loop."""
        rest = len(self.dataset) - (self._start if self.iterating else self._position_now())
        owner = _caller_batch_sampler(sys._getframe(1))  # a DataLoader's len(): its batch is the micro-batch
        if owner is not None:
            self._loader_batch = int(owner.batch_size)
        lay = self._layout()
        if lay is not None:  # whole steps of the global batch; this rank's micro-batches of each
            steps = rest // lay.global_batch if self.drop_last else math.ceil(rest / lay.global_batch)
            return steps * len(lay.share(self.rank)) * lay.micro_batch
        w = self.num_replicas
        return rest // w if self.drop_last else math.ceil(rest / w)

    @property
    def epoch_batches(self) -> int:
        """This rank's batches in the whole epoch at this world size (``len(loader)`` of an epoch
        that no resize interrupted): the loader's batch size once it iterates this sampler (else
        ``batch_size=``; else 1: indices)."""
        n, w, b = len(self.dataset), self.num_replicas, self.batch_size or self._loader_batch or 1
        per_rank = n // w if self.drop_last else math.ceil(n / w)
        return per_rank // b if self._loader_drop_last else math.ceil(per_rank / b)

    @property
    def start_batch(self) -> float:
        """The batches of this epoch trained before this pass over it, counted at this world size
        (in the loader's batches, as :attr:`epoch_batches`): 0 but in the segment that resumes an
        epoch after a resize; a fraction where the samples done are not a whole number of this
        size's batches. ``(start_batch + batch_idx) / epoch_batches``: the epoch's progress."""
        start = self._start if self.iterating else self._position_now()
        return start / (self.num_replicas * (self.batch_size or self._loader_batch or 1))

    def __iter__(self) -> Iterator[int]:
        owner = _caller_batch_sampler(sys._getframe(1))
        if owner is not None:
            self._loader_batch, self._loader_drop_last = int(owner.batch_size), bool(owner.drop_last)
        self.data.iterated = self
        start = self._position_now()
        if self._tracked():
            pos = self.data.position
            pos.sampler_epoch, pos.pos = self.epoch, start
            rng = self.data.resume_rng
            if start and rng is not None:  # resumed inside the epoch: the RNG as right after the
                from elastic_ring.worker.state import _set_rng_state  # step (the loader's own
                _set_rng_state(rng)  # seed, drawn again by this new iterator, would shift it)
                self.data.resume_rng = None
        self._start, self._pulled_n, self._pulled_at_step, self._listed = start, 0, 0, None
        self.iterating = True
        opt = getattr(getattr(self.job, "state", None), "optimizer", None)
        acc = getattr(opt, "_elastic_ring_accumulation", None)  # a constant global batch's
        if acc is not None and self._layout() is not None:
            acc.passes()  # this rank's backward passes per step, set before the first one
        return stepcost.loop(self._indices(start), "sampler.iter")  # (ELASTIC_RING_STEP_COST: timed)

    # ------------------------------------------------------------------ the elastic part
    def _tracked(self) -> bool:
        """Whether this sampler keeps the job's data position (the training one, under the tool)."""
        return self.job.elastic and self.data.position.sampler_index == self.index

    def _position_now(self) -> int:
        """Where this rank's next iteration of the epoch starts (0 but for the training sampler
        inside an epoch a resize interrupted)."""
        if not self._tracked():
            return 0
        pos = self.data.position
        if pos.sampler_epoch != self.epoch or pos.pos >= len(self.dataset):
            return 0  # a new epoch (set_epoch), or this one's data is used up: a new pass
        return pos.pos

    def _layout(self):
        """The micro-batch layout of a step of the run's constant global batch (None: another
        rule, or outside the tool): micro-batches of the loader's batch, or ``batch_size``.

        Raises:
            ContractError: no batch known, or a global batch it cannot split at this world size.
        """
        g = getattr(self.job, "global_batch", None)
        if not g or not self.job.elastic or self.data.training_sampler() is not self:
            return None  # (a test set's sampler splits as torch's does)
        b = self.batch_size or self._loader_batch
        if not b:
            raise ContractError("a constant global batch is split into the loader's batches: iterate "
                                "elastic.DistributedSampler through a DataLoader, or give batch_size=")
        from elastic_ring.worker.accumulate import Layout

        return Layout(g, int(b), self.num_replicas)

    def _indices(self, start: int) -> Iterator[int]:
        import torch

        n = self._n = len(self.dataset)
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = torch.randperm(n, generator=g).tolist()
        else:
            order = list(range(n))
        lay = self._layout()
        if lay is not None:  # the whole epoch cut or padded to whole global batches, then its rest:
            # the same last step whatever the position a resize resumed at (a multiple of the batch)
            mine = _micro_batch_share(_whole(order, lay.global_batch, self.drop_last)[start:], lay, self.rank)
        else:
            mine = _whole(order[start:], self.num_replicas, self.drop_last)[self.rank::self.num_replicas]
        if not self._copies_possible():  # the common case: the loader pulls from a list iterator,
            mine = list(mine)  # nothing of ours per index (the pulled count is read off it)
            self._listed, self._listed_n = iter(mine), len(mine)
            return self._listed
        return self._counted(mine)

    def _counted(self, mine) -> Iterator[int]:
        """``mine``, each index counted, the next batch's first one calling ``before_batch``
        (where a survivors' copy may be kept: it is taken there)."""
        for i in mine:
            if self._pulled_n == self._pulled_at_step and self.data.before_batch is not None \
                    and self.data.training_sampler() is self:  # the next batch's first index
                self.data.before_batch()
            self._pulled_n += 1
            yield i

    def _copies_possible(self) -> bool:
        """Whether a survivors' copy may be kept at a batch's first index (the job keeps copies:
        :func:`~elastic_ring.worker.survive.keeps_copies`): else no index needs a call of ours."""
        from elastic_ring.worker import survive

        return survive.keeps_copies(self.job)

    @property
    def _pulled(self) -> int:
        """Indices handed out by this epoch's iteration so far."""
        it = self._listed
        return self._listed_n - it.__length_hint__() if it is not None else self._pulled_n

    def advance(self, passes: int = 1) -> None:
        """A step of the registered optimizer (of ``passes`` backward passes) trained this
        sampler's next batch: it is the training sampler (claimed at its first step), and the
        epoch's position moves by that step's samples (:meth:`stepped`, which the post-hook calls)."""
        self.stepped(1, passes, True)

    def stepped(self, step: int, passes: int, elastic: bool) -> int:
        """A step of the registered optimizer (of ``passes`` backward passes) is done: under the
        tool (``elastic``) this sampler is the training one (claimed at its first step) and the
        epoch's position moves by the step's samples, all ranks' (``world * b`` per backward pass,
        ``b`` the loader's batch, or with no loader the indices pulled since the last step; the
        global batch, where it is constant). Returns this rank's samples of ``step`` for the
        throughput (which counts rank 0's times the world): the loader's batch, or under a constant
        global batch the global batch's share of one worker (``G / w``,
        :meth:`~elastic_ring.worker.accumulate.Layout.samples_at`: the step trained ``G`` samples
        in all, however many micro-batches each worker ran). The post-hook's one call a step: the
        layout and the pulled count read once (issue 50: each read right after a step costs
        microseconds)."""
        b = self.batch_size or self._loader_batch
        if elastic:
            pos = self.data.position
            if pos.sampler_index != self.index:
                pos.sampler_index, pos.sampler_epoch, pos.pos = self.index, self.epoch, self._start
        lay = self._layout()
        if elastic:
            if lay is not None:
                used = lay.global_batch
            elif b:
                used = b * passes * self.num_replicas
            else:  # no batch known: the indices pulled since the last step
                used = (self._pulled - self._pulled_at_step) * self.num_replicas
            if self._listed is None or not b:  # (else the count at the step is read nowhere)
                self._pulled_at_step = self._pulled
            n = self._n
            size = n if n is not None and self.iterating else len(self.dataset)
            at = pos.pos + used
            pos.pos = at if at < size else size
        if lay is not None:
            return lay.samples_at(step)
        return int(b) if b else 0

    def size(self) -> int:
        """The dataset's length: as the iteration under way read it at its start (a step reads it
        twice, and a dataset's ``len()`` may be a tensor's size: a call into torch, slow right
        after a step), else read now."""
        n = self._n
        return n if n is not None and self.iterating else len(self.dataset)


def _whole(order: list[int], unit: int, drop_last: bool) -> list[int]:
    """``order`` cut (``drop_last``) or padded with its first indices to a multiple of ``unit``."""
    if drop_last:
        return order[:len(order) - len(order) % unit]
    if order and len(order) % unit:
        pad = unit - len(order) % unit
        return order + (order * math.ceil(pad / len(order)))[:pad]
    return order


def _micro_batch_share(rest: list[int], lay: Any, rank: int) -> Iterator[int]:
    """This rank's indices of ``rest`` (a multiple of the global batch long): step after step,
    its contiguous micro-batches of the step (:meth:`elastic_ring.worker.accumulate.Layout.share`)."""
    g, b = lay.global_batch, lay.micro_batch
    share = lay.share(rank)
    for s in range(0, len(rest), g):
        yield from rest[s + share.start * b:s + share.stop * b]
