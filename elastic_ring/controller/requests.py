"""Requests to a running controller through its run folder (no controller code imported: `resize`
and the cluster scheduler use it while another process runs the job); :func:`take_request` is the
controller's side."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

from elastic_ring.errors import UserError
from elastic_ring.words import count


def request_resize(run_dir: str | Path, target: int) -> str:
    """Ask the running `elastic-ring train` in ``run_dir`` to resize to ``target`` workers now:
    writes ``control/REQUEST_FILE``, after the checks a user would want (raises ``UserError``).
    Returns the line to show."""
    from elastic_ring.controller.lock import is_locked
    from elastic_ring.protocol import CONTROLLER_FILE, REQUEST_FILE

    rd = Path(run_dir)
    if not (rd / "run.json").exists():
        raise UserError(f"{rd} is not an elastic-ring run folder (no run.json)")
    try:
        ctl = json.loads((rd / CONTROLLER_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        raise UserError(f"run {rd} is not running (no controller state)") from None
    state = ctl.get("state")
    if state not in ("running", "launching") or not is_locked(rd):
        word = {"running": "controller gone", "launching": "controller gone",
                "succeeded": "finished"}.get(state, state)  # status's words
        raise UserError(f"run {rd} is not running (state: {word})")
    slots = json.loads((rd / "run.json").read_text())["slots"]
    if target < 1:
        raise UserError(f"--to must be >= 1, got {target}")
    if target > slots:
        raise UserError(f"--to {target} is more than the run's {slots} slot(s)")
    if target == ctl.get("world_size"):
        raise UserError(f"the run already has {count(target, 'worker')}")
    req = rd / "control" / REQUEST_FILE
    req.parent.mkdir(parents=True, exist_ok=True)
    tmp = req.with_name(f".{req.name}.tmp")
    tmp.write_text(json.dumps({"to": target, "time": time.time(), "id": uuid.uuid4().hex}))
    os.replace(tmp, req)
    now = ctl.get("world_size")
    return f"resize to {target} requested for {rd} (currently {count(now, 'worker') if now else 'no workers'})"


def take_request(run_dir: Path, seen: set[str]) -> tuple[int, float | None] | None:
    """The resize request waiting in ``run_dir`` as (workers, time asked), taken (the file removed,
    its id added to ``seen``); None when there is none, it is being written, or it was seen."""
    from elastic_ring.protocol import REQUEST_FILE

    path = Path(run_dir) / "control" / REQUEST_FILE
    try:
        req = json.loads(path.read_text())
        rid, target = str(req["id"]), int(req["to"])
    except (OSError, ValueError, KeyError, json.JSONDecodeError):
        return None  # none, or being written: read next time
    if rid in seen:
        return None
    seen.add(rid)
    path.unlink(missing_ok=True)
    t = req.get("time")
    return target, float(t) if t is not None else None
