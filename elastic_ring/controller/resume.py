"""What a resumed run (``--resume DIR``) reads and checks of its folder while it is prepared
(:func:`.runs.prepare`, whose ``_prepare_resume`` builds the resumed run from these): its
``run.json`` (:func:`read_run_info`), its collective and the folder its workers run in, whether it
can go on at all (:func:`check_resumable`, before anything slow), its plan from the checkpoint on,
a new total of steps (:func:`extended_config`, recorded by :func:`_write_new_total`) and the
checks of the resumed blueprint (:func:`validate_resume`).

Bad input raises :class:`~elastic_ring.errors.UserError` (one line, exit status 2) before any
process starts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from elastic_ring import protocol
from elastic_ring.controller.api import Plan, Resize, RunSpec
from elastic_ring.controller.requests import RunRequest
from elastic_ring.errors import UserError


def _resumed_collective(req: RunRequest) -> str | None:
    """A resumed run's collective (``run.json``; its damage is named later, by the resume)."""
    info = protocol.read_run_json(Path(req.resume_dir)) if req.resume_dir else None
    ws = info.get("worker") if isinstance(info, dict) else None
    return ws.get("collective") if isinstance(ws, dict) else None


def read_run_info(rd: Path) -> dict[str, Any]:
    """A run folder's ``run.json``.

    Raises:
        UserError: unreadable, not JSON, or not a JSON object (one line naming the file).
    """
    path = rd / protocol.RUN_FILE
    try:
        info = protocol.run_info(rd)  # read once per process while unchanged (the resume's checks read it first)
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror or e}") from None
    except ValueError as e:  # JSONDecodeError, or bytes that are not UTF-8
        where = f" (line {e.lineno}, column {e.colno})" if isinstance(e, json.JSONDecodeError) else ""
        raise UserError(f"{path} is damaged: not valid JSON{where}; the run cannot be resumed from "
                        f"this folder") from None
    if not isinstance(info, dict):
        raise UserError(f"{path} is damaged: a JSON {type(info).__name__}, not an object; the run "
                        f"cannot be resumed from this folder")
    return info


def check_resumable(rd: Path, steps: int | None) -> None:
    """The checks of ``--resume`` that need no torch (a finished run answers at once): a run that
    has reached its last step (its newest checkpoint that passes its checksum) resumes only with a
    new total (``steps``). Raises UserError."""
    from elastic_ring.ckpt.store import newest_valid

    info = protocol.read_run_json(rd)
    if not isinstance(info, dict) or not isinstance(info.get("total_steps"), int):
        return  # _prepare_resume says what is wrong with the folder
    found = newest_valid(rd / "checkpoints")
    at, total = (found[1] if found else 0), int(info["total_steps"])
    if steps is not None and steps <= at:
        raise UserError(f"--steps {steps} is not after the run's checkpoint (step {at}): give the new "
                        f"total, more than {at}")
    if steps is None and at >= total:
        raise UserError(f"run {rd} already finished (step {at} of {total}); train it further with: "
                        f"elastic-ring train --resume {rd} --steps N")


def extended_config(cfg: Any, total: int) -> Any:
    """``cfg`` with ``total`` steps and its LR decays at the same steps as before (a fraction of
    the new total each; those at or after ``total`` dropped): a longer run goes on at the LR it
    ended at, a shorter one keeps the decays it has passed."""
    from elastic_ring.config.api import TrainConfig, config_to_dict

    d = config_to_dict(cfg)
    d.update(total_steps=total, decay_at=[s / total for s in cfg.decay_steps if 0 < s < total])
    new = TrainConfig.model_validate(d)
    if tuple(new.decay_steps) != tuple(s for s in cfg.decay_steps if 0 < s < total):
        raise UserError(f"cannot keep the LR decays at steps {list(cfg.decay_steps)} with {total} steps")
    return new


def _write_new_total(rd: Path, cfg: Any, total: int) -> None:
    """Record a resumed run's new total steps (``--resume DIR --steps N``) in its folder."""
    import yaml

    from elastic_ring.config.api import config_to_dict
    from elastic_ring.controller.rundir import update_run_info, writing

    with writing(rd):
        update_run_info(rd, total_steps=total)
        if cfg is not None:
            tmp = rd / ".config.yaml.tmp"
            tmp.write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
            tmp.replace(rd / "config.yaml")


def _resume_plan(rd: Path, run_info: dict[str, Any], start_step: int, workers: int | None,
                 sched: tuple[Resize, ...]) -> Plan:
    from elastic_ring.protocol import PLAN_FILE, read_json

    plan_d = read_json(rd / PLAN_FILE)
    plan = (Plan.from_dict(plan_d) if plan_d else
            Plan.from_spec(int(run_info["workers"]),
                           tuple(Resize(int(s), int(t)) for s, t in run_info.get("schedule", []))))
    if workers is not None:
        plan.add(start_step, workers, "resume")
    if sched:
        plan.replace_after(start_step, sched)
    return plan


def validate_resume(spec: RunSpec, start_step: int) -> None:
    """The checks of a new run (RunSpec.validate), plus: every resize lies after the checkpoint."""
    if spec.workers > spec.slots:
        raise UserError(f"cannot resume with {spec.workers} workers: only {spec.slots} slot(s)")
    for r in spec.schedule:
        if r.step <= start_step:
            raise UserError(f"resize at step {r.step} is not after the checkpoint (step {start_step})")
    spec.validate()


def _resumed_cwd(rd: Path, worker: dict[str, Any]) -> str:
    """The folder a resumed run's workers run in: the one its `train` was run in (recorded in
    ``run.json``), so that the script's relative paths mean what they meant at its start, whatever
    folder the resume is run from; this process's folder for a run recorded before that.

    Raises:
        UserError: the recorded folder is gone (one line naming it).
    """
    cwd = worker.get("cwd") or os.getcwd()
    if not Path(cwd).is_dir():
        raise UserError(f"run {rd} was started in {cwd}, which is gone: its script's relative paths "
                        f"are relative to it (recreate the folder to resume)")
    return cwd
