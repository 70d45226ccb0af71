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
    from elastic_ring.controller.status import Phase, read_status
    from elastic_ring.protocol import REQUEST_FILE

    rd = Path(run_dir)
    st = read_status(rd)  # the same answer as `elastic-ring status`
    if st.phase is Phase.RESIZING:
        raise UserError(f"run {rd} is {st.line()}: ask again once it has made a step at the new size")
    if st.phase not in (Phase.STARTING, Phase.RUNNING, Phase.RESTARTING):
        way = (f"; continue with: elastic-ring train --resume {rd}"
               if st.phase in (Phase.STOPPED, Phase.CRASHED) and st.step < (st.total_steps or 0) else "")
        raise UserError(f"run {rd} is not running (state: {st.phase.value}{way})")
    from elastic_ring.protocol import read_json

    slots = (read_json(rd / "run.json") or {}).get("slots")
    if slots is None:
        raise UserError(f"run {rd} is still being set up: ask again once it has started")
    if target < 1:
        raise UserError(f"--to must be >= 1, got {target}")
    if target > slots:
        raise UserError(f"--to {target} is more than the run's {slots} slot(s)")
    if target == st.world_size:
        raise UserError(f"the run already has {count(target, 'worker')}")
    req = rd / "control" / REQUEST_FILE
    req.parent.mkdir(parents=True, exist_ok=True)
    tmp = req.with_name(f".{req.name}.tmp")
    tmp.write_text(json.dumps({"to": target, "time": time.time(), "id": uuid.uuid4().hex}))
    os.replace(tmp, req)
    now = st.world_size
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
