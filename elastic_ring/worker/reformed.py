"""``DistributedDataParallel`` over a process group that is re-formed in place
(:class:`ReformedDDP`): what :meth:`elastic_ring.worker.api.Job.parallel` hands a ``--collective
torch`` script whose ring is resized in its own processes.

A DDP wrapper is bound to the process group it was built over; after a resize in place that group
is destroyed and a new one formed at the new size. The script keeps calling the module it was
given, so that module is a thin one that builds ``DistributedDataParallel`` over the same model at
its first call in each group (:attr:`~elastic_ring.worker.ring.TorchControllerRing.generation`):
every rank, survivor or joiner, builds it at the same point of the collectives' order (the first
forward pass after the state's sync), and the script needs no change.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch


class ReformedDDP(torch.nn.Module):
    """``DistributedDataParallel(module, **kwargs)``, rebuilt in each process group ``ring`` forms
    (its ``generation``). ``module`` is the script's model (registered, trained, evaluated as it is)."""

    def __init__(self, ring: Any, module: torch.nn.Module, **kwargs: Any) -> None:
        super().__init__()
        self.module = module
        self.__dict__["_ring"] = ring  # not a submodule: kept out of state_dict() and parameters()
        self.__dict__["_kwargs"] = kwargs
        self.__dict__["_ddp"] = None
        self.__dict__["_generation"] = -1

    def ddp(self) -> Any:
        """The wrapper over the ring's current group (built here when the group is new)."""
        ring = self.__dict__["_ring"]
        if self.__dict__["_ddp"] is None or self.__dict__["_generation"] != ring.generation:
            self.__dict__["_ddp"] = None  # the old group's reducer goes before the new one is built
            self.__dict__["_ddp"] = ring.coll.data_parallel(self.module, **self.__dict__["_kwargs"])
            self.__dict__["_generation"] = ring.generation
        ddp = self.__dict__["_ddp"]
        ddp.training = self.training
        if self.__dict__.get("_grad_sync") is not None:
            ddp.require_backward_grad_sync = self.__dict__["_grad_sync"]
        return ddp

    def set_grad_sync(self, sync: bool) -> None:
        """Whether the next forward pass's gradients are allreduced in its backward pass (DDP's
        ``require_backward_grad_sync``, kept across the rebuilds: a constant global batch's
        accumulation in an epoch loop, :class:`~elastic_ring.worker.accumulate.EpochAccumulation`)."""
        self.__dict__["_grad_sync"] = sync

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.ddp()(*args, **kwargs)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """DDP's ``no_sync()``: gradients accumulate locally until the next synced backward pass."""
        with self.ddp().no_sync():
            yield
