"""The worker library's misuse checks: a mistake that would lose state at a resize is an error
at once (:class:`~elastic_ring.worker.errors.ContractError`), never a silent loss later."""

from __future__ import annotations

import pickle
import sys
from typing import Any, Callable

from elastic_ring.worker.errors import ContractError
from elastic_ring.worker.state import _bind_scheduler, _saved_form


def check_registration(model, optimizer, scheduler, extras: dict[str, Any], registered_optimizer,
                       distributed_optimizers: Callable[[], list]) -> list[Any]:
    """What ``Job.register`` is given, checked before anything is kept; returns the schedulers as a
    list (each bound to the optimizer it will be saved with). ``distributed_optimizers``: the
    ``hvd.DistributedOptimizer`` objects alive in the process.

    Raises:
        ContractError: no ``optimizer`` while a ``hvd.DistributedOptimizer`` exists, a scheduler
            bound to another optimizer or not a scheduler, an extra that does not pickle (named).
    """
    if optimizer is None and model is not None and registered_optimizer is None:
        dist = distributed_optimizers()
        if dist:
            raise ContractError("register(optimizer=...) is missing while a "
                                "hvd.DistributedOptimizer exists: its state and Eq. 7 would be "
                                "lost at every resize")
    scheds = [] if scheduler is None else list(scheduler) if isinstance(scheduler, (list, tuple)) \
        else [scheduler]
    opt = optimizer if optimizer is not None else registered_optimizer
    for sch in scheds:
        if not hasattr(sch, "state_dict") or not hasattr(sch, "load_state_dict"):
            raise ContractError(f"scheduler={type(sch).__name__}: not an LR scheduler "
                                "(no state_dict/load_state_dict)")
        _bind_scheduler(sch, opt)
    for key, value in extras.items():
        if key in ("model", "optimizer", "scheduler"):
            continue
        try:
            pickle.dumps(_saved_form(value))
        except Exception as e:  # noqa: BLE001 - any pickling failure
            raise ContractError(f"register(): extra {key!r} ({type(value).__name__}) does not "
                                f"pickle ({type(e).__name__}: {e}); register its state instead"
                                ) from None
    return scheds


def check_scheduler_count(saved: list[Any], registered: list[Any]) -> None:
    """A checkpoint's schedulers and the script's registered ones, one for one."""
    if len(saved) != len(registered):
        raise ContractError(f"the checkpoint holds {len(saved)} scheduler(s), the "
                            f"script registered {len(registered)}")


_EARLY_GROUP = ("the script initialised a torch.distributed process group before elastic_ring.worker.init(): "
                "call only elastic_ring.worker.init() (with --collective torch it forms the process group)")


def explain_port_clash(exc: BaseException) -> BaseException:
    """A failure of rank 0 of a ``--collective torch`` segment to bind its rendezvous port while the
    launcher's socket on it is still unused by the library (``ELASTIC_RING_STORE_FD`` not taken):
    only a process group the script formed itself before ``elastic_ring.worker.init()`` binds that
    port, so the failure is that mistake, said as :func:`check_collectives_untouched` says it (a
    :class:`ContractError` with ``exc``'s traceback); any other ``exc`` is returned as it is."""
    from elastic_ring import env

    port = env.master_port()
    text = str(exc)
    if env.store_fd_given() and port is not None and f"port: {port}," in text and "EADDRINUSE" in text:
        return ContractError(_EARLY_GROUP).with_traceback(exc.__traceback__)
    return exc


def check_collectives_untouched(collective: str, in_place_elastic: bool = False) -> None:
    """``elastic_ring.worker.init()`` starts the job's collective (``"horovod"``: ``hvd.init()``;
    ``"torch"``: the process group): the script must not have started either before it, except
    Horovod under Horovod Elastic (``in_place_elastic``), whose entry point may have.

    Raises:
        ContractError: a torch.distributed process group or Horovod already initialised; the message
            says which and what to do in a job of ``collective``.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        if collective == "torch":
            raise ContractError(_EARLY_GROUP)
        raise ContractError("the script initialised a torch.distributed process group in a Horovod "
                            "job: run it with --collective torch (and call only elastic_ring.worker.init())")
    hvd = sys.modules.get("horovod.torch")
    if hvd is None or (collective != "torch" and in_place_elastic):
        return
    try:
        started = hvd.is_initialized()
    except Exception:  # noqa: BLE001 - a Horovod built without its extension, or half torn down
        started = False
    if not started:
        return
    if collective == "torch":
        raise ContractError("the script called hvd.init() in a --collective torch job: use "
                            "torch.distributed (DistributedDataParallel), or drop --collective torch")
    raise ContractError("the script called hvd.init() before elastic_ring.worker.init(): "
                        "call only elastic_ring.worker.init() (it initialises Horovod)")
