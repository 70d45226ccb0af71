"""A script of torchrun's contract, run unchanged: what its workers are told, and what the worker
entry watches in them.

Such a script (:attr:`elastic_ring.controller.script_check.ScriptShape.form` ``"torchrun"``) reads
``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``... from its environment, forms its own
process group (``init_process_group``: rank 0 hosts the store on ``MASTER_PORT``), loads its own
snapshot if there is one and saves it every so often; it never calls the worker library. As
torchrun does, the local launcher (:mod:`elastic_ring.controller.backends.local`) gives each worker
torchrun's environment (:func:`rank_env`), stops every worker at a resize or a failure (SIGTERM,
``--stop-grace`` seconds, SIGKILL) and starts them again at the new size; the script resumes from
its own snapshot.

In the worker (:mod:`elastic_ring.worker.run`, told by :data:`FORM_ENV`), nothing of the library
starts: the script runs as ``python SCRIPT`` would. The entry only watches: the script's first
``optimizer.step()`` (any ``torch.optim`` optimizer) is the segment's ``first_step`` event (rank 0
writes it: the run is "running", a relaunch is measured up to it), and :func:`steps_done` counts
this process's optimizer steps (a crash record after one is not a set-up failure).

Nothing here imports torch at import time: the launcher imports this module for its names.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from elastic_ring import env

FORM_ENV = env.SCRIPT_FORM  # "torchrun": the worker entry runs the script as torchrun would
DEFAULT_STOP_GRACE_S = 30.0  # SIGTERM -> SIGKILL at a stop: torchrun's own default (its agent's shutdown)
ROLE = "default"  # torchrun's ROLE_NAME: one role

_STEPS = [0]  # optimizer steps of this process (the hook's count)


def in_use() -> bool:
    """Whether this worker runs a script of torchrun's contract (the launcher said so)."""
    return env.script_form() == "torchrun"


def run_env(restarts: int, max_restarts: int, run_id: str) -> dict[str, str]:
    """The names every worker of a segment shares (the backend sets them): the form, the restarts so
    far (after failures only, as torchrun counts them), the most allowed (``--max-restarts``), the
    run's id (its folder's name)."""
    return {FORM_ENV: "torchrun", "TORCHELASTIC_RESTART_COUNT": str(restarts),
            "TORCHELASTIC_MAX_RESTARTS": str(max_restarts), "TORCHELASTIC_RUN_ID": run_id}


def rank_env(rank: int, world: int) -> dict[str, str]:
    """torchrun's names for one worker on one host, besides ``RANK``/``WORLD_SIZE``/``LOCAL_*``/
    ``MASTER_*``/``GROUP_RANK`` (the launcher's :func:`~elastic_ring.controller.backends.local_launcher.rank_env`):
    one node (``GROUP_WORLD_SIZE`` 1), one role; rank 0 hosts the store itself (no agent's store)."""
    return {"GROUP_WORLD_SIZE": "1", "ROLE_NAME": ROLE, "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(world),
            "TORCHELASTIC_USE_AGENT_STORE": "False"}


def steps_done() -> int:
    """Optimizer steps this process has made (0 before the first, or where none is a torch.optim one)."""
    return _STEPS[0]


def watch(run_dir: Path, segment: int, rank: int | None, world: int, t_launch: float) -> None:
    """Count the script's optimizer steps; at the first, rank 0 writes the segment's ``first_step``
    (``step`` 0: the controller counts no step of such a script; ``lr``: the first group's)."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    def after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        _STEPS[0] += 1
        if _STEPS[0] != 1 or rank not in (0, None):
            return
        from elastic_ring import protocol
        from elastic_ring.events.api import EventLog, FirstStep

        now = time.time()
        lr = float(optimizer.param_groups[0].get("lr", 0.0)) if optimizer.param_groups else 0.0
        EventLog(run_dir / protocol.WORKER_EVENTS).write(
            FirstStep(segment=segment, world_size=world, step=0, since_launch_s=max(0.0, now - t_launch), lr=lr,
                      rule="torchrun", time=now))

    register_optimizer_step_post_hook(after_step)
