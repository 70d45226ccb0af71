"""What a checkpoint holds of the script's objects, and how it is put back.

The RNG states (this rank's own device only), the saved form of a registered extra (its
``state_dict()`` where it has one) and its restore in place (so the script's own references stay
valid), the ``hvd.DistributedOptimizer`` objects alive in the process, and the binding of a
scheduler to the registered optimizer. Used by :class:`elastic_ring.worker.api.Job`.
"""

from __future__ import annotations

import random
import sys
from typing import Any

from elastic_ring.worker.errors import ContractError


def _rng_state() -> dict[str, Any]:
    import numpy as np
    import torch

    st = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # this rank's own device only:
        st["cuda"] = torch.cuda.get_rng_state()  # one state per visible GPU breaks on fewer GPUs
    return st


def _set_rng_state(st: dict[str, Any]) -> None:
    import numpy as np
    import torch

    torch.set_rng_state(st["torch"])
    np.random.set_state(st["numpy"])
    random.setstate(st["python"])
    cuda = st.get("cuda")
    if isinstance(cuda, (list, tuple)):  # older checkpoints: one state per GPU visible then
        dev = torch.cuda.current_device() if cuda and torch.cuda.is_available() else -1
        cuda = cuda[dev] if 0 <= dev < len(cuda) else None
    if cuda is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(cuda)


def _stateful(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def _saved_form(value: Any) -> Any:
    """What a checkpoint holds for a registered extra: its ``state_dict()`` where it has one."""
    return value.state_dict() if _stateful(value) else value


def _restore_in_place(current: Any, saved: Any) -> Any:
    """Put ``saved`` into the registered object ``current`` where it can be (a stateful object, a
    dict, a list, a tensor); returns what ``job.extras`` holds from now on."""
    if current is None or saved is current:  # rank 0 of an in-place reset sends its own objects:
        return saved if current is None else current  # clearing one would empty the other
    if _stateful(current):
        current.load_state_dict(saved)
        return current
    if isinstance(current, dict) and isinstance(saved, dict):
        current.clear()
        current.update(saved)
        return current
    if isinstance(current, list) and isinstance(saved, list):
        current[:] = saved
        return current
    if hasattr(current, "copy_") and hasattr(saved, "shape") and \
            tuple(getattr(current, "shape", ())) == tuple(saved.shape):
        import torch

        with torch.no_grad():
            current.copy_(saved)
        return current
    return saved


def _distributed_optimizers() -> list[Any]:
    """The ``hvd.DistributedOptimizer`` objects alive in this process (Horovod's wrapper class
    carries ``_allreduce_grad_async``)."""
    import gc

    torch = sys.modules.get("torch")
    if torch is None:
        return []
    base = torch.optim.Optimizer
    return [o for o in gc.get_objects()
            if issubclass(type(o), base) and hasattr(type(o), "_allreduce_grad_async")]


def _bind_scheduler(sched: Any, optimizer: Any) -> None:
    """A scheduler built on the optimizer before ``hvd.DistributedOptimizer`` wrapped it shares
    its param groups only until a checkpoint is loaded: point it (and the ones it chains) at the
    registered optimizer. One built on an unrelated optimizer is an error."""
    from elastic_ring.worker.lr import all_schedulers

    for s in all_schedulers([sched]):
        own = getattr(s, "optimizer", None)
        if own is None or optimizer is None or own is optimizer:
            continue
        same = len(own.param_groups) == len(optimizer.param_groups) and all(
            a is b for a, b in zip(own.param_groups, optimizer.param_groups))
        if not same:
            raise ContractError(f"scheduler {type(s).__name__} steps another optimizer than the "
                                "registered one: build it on the registered optimizer")
        s.optimizer = optimizer
