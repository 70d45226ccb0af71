"""`elastic-ring runs` (the runs under a folder, with their state and last step) and `elastic-ring
logs` (a run's worker logs, followed while it runs). Both read the run folders only (torch-free):
the state is :func:`elastic_ring.controller.status.read_status`'s, the one `status` prints."""

from __future__ import annotations

import json
import re
import sys
import time
from datetime import datetime
from pathlib import Path

import click

from elastic_ring.errors import UserError

_SEGMENT_LOG = re.compile(r"^segment-(\d+)-w(\d+)\.log$")
MAX_DEPTH = 3  # folders below DIR searched for runs (runs/, runs/ps/..., a cluster's jobs/...)


def find_runs(root: Path, depth: int = MAX_DEPTH) -> list[Path]:
    """The run folders at or under ``root`` (a folder holding ``run.json``, or one a controller is
    making), not looking inside a run folder."""
    from elastic_ring.controller.status import is_run_folder

    if is_run_folder(root):
        return [root]
    if depth <= 0 or not root.is_dir():
        return []
    out: list[Path] = []
    try:
        children = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []
    for child in children:
        out.extend(find_runs(child, depth - 1))
    return out


def _row(rd: Path) -> dict:
    from elastic_ring.controller.status import read_status
    from elastic_ring.protocol import read_json

    info = read_json(rd / "run.json")
    info = info if isinstance(info, dict) else {}
    created = info.get("created") if isinstance(info.get("created"), (int, float)) else None
    if created is None:
        try:
            created = rd.stat().st_mtime
        except OSError:
            created = 0.0
    what = Path(info["script"]).name if info.get("script") else ("built-in ResNet" if info else "")
    try:
        st = read_status(rd)
        state, phase, step, total, world = st.phase.value, st.phase.value, st.step, st.total_steps, st.world_size
        if st.phase.value == "resizing" and st.resize_from and st.resize_to:
            state = st.line()
    except UserError as e:
        state, phase, step, total, world = "unreadable", "unreadable", None, None, None
        what = str(e)
    return {"run_dir": str(rd), "state": state, "phase": phase, "step": step, "total_steps": total,
            "workers": world, "created": created, "model": what}


@click.command()
@click.argument("folder", required=False, default="runs", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
def runs(folder, as_json):
    """List the training runs in FOLDER (and up to 3 levels below it) with their state, last step
    and workers, oldest first. [default FOLDER: runs]

    The state is the one `elastic-ring status` gives: starting, running, resizing A -> B,
    restarting, stopping, finished, failed, stopped (continue with --resume) or crashed (the
    controller is gone: continue with --resume).
    """
    root = Path(folder)
    if not root.exists():
        raise UserError(f"folder {root} does not exist")
    rows = sorted((_row(rd) for rd in find_runs(root)), key=lambda r: (r["created"], r["run_dir"]))
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo(f"no runs in {root}")
        return
    table = [("run folder", "state", "step", "workers", "started", "model")]
    for r in rows:
        step = "-" if r["step"] is None else f"{r['step']}" + (f"/{r['total_steps']}" if r["total_steps"] else "")
        started = datetime.fromtimestamp(r["created"]).strftime("%Y-%m-%d %H:%M") if r["created"] else "-"
        table.append((r["run_dir"], r["state"], step, "-" if r["workers"] is None else str(r["workers"]),
                      started, r["model"]))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    for row in table:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1])


def segment_logs(rd: Path) -> dict[int, Path]:
    """Segment index -> its log (``logs/segment-NNN-wK.log``)."""
    out: dict[int, Path] = {}
    for p in sorted((rd / "logs").glob("segment-*.log")):
        m = _SEGMENT_LOG.match(p.name)
        if m:
            out[int(m.group(1))] = p
    return out


def log_of(rd: Path, segment: int | None) -> tuple[Path | None, str]:
    """The log holding segment ``segment``'s output (None: the newest), and a note when it is
    another segment's (one whose workers went on in place, ``--relaunch inplace``)."""
    logs = segment_logs(rd)
    if segment is None:
        return (logs[max(logs)] if logs else None), ""
    if segment in logs:
        return logs[segment], ""
    before = [i for i in logs if i < segment]
    if not before:
        return None, ""
    i = max(before)
    return logs[i], f"segment {segment} has no log of its own: its workers went on in segment {i}'s processes"


@click.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--segment", type=int, default=None, metavar="N",
              help="The log of segment N (0: the first launch; each resize or restart starts the next). "
                   "[default: the newest]")
@click.option("--follow", "-f", is_flag=True,
              help="Keep printing what is written, following each new segment's log, until the run ends.")
@click.option("--list", "list_only", is_flag=True, help="List the run's log files instead.")
def logs(run_dir, segment, follow, list_only):
    """Print a run's worker log (what horovodrun and the workers wrote) for one segment.

    A run has one log per segment (RUN_DIR/logs/segment-NNN-wK.log: segment NNN at K workers);
    under --relaunch inplace the workers of later segments write into the first one's. A worker's
    crash record is RUN_DIR/logs/error-rank<R>.json.
    """
    from elastic_ring.controller.status import is_run_folder

    rd = Path(run_dir)
    if not is_run_folder(rd):
        raise UserError(f"{rd} is not an elastic-ring run folder (no run.json)")
    if segment is not None and segment < 0:
        raise UserError(f"--segment must be >= 0, got {segment}")
    if list_only:
        for i, p in sorted(segment_logs(rd).items()):
            click.echo(f"{i:>4}  {p}  ({p.stat().st_size} bytes)")
        for p in sorted((rd / "logs").glob("error-rank*.json")):
            click.echo(f"   -  {p}")
        return
    path, note = log_of(rd, segment)
    if path is None and not follow:
        known = sorted(segment_logs(rd))
        if segment is not None and known:
            raise UserError(f"run {rd} has no log of segment {segment} (segments with a log: "
                            f"{', '.join(map(str, known))})")
        raise UserError(f"run {rd} has no log yet (its workers have not been started)")
    if note:
        click.echo(f"elastic-ring: {note}: {path}", err=True)
    if not follow:
        _copy(path, 0)
        return
    _follow(rd, path, segment)


def _copy(path: Path, offset: int) -> int:
    """Write ``path`` from byte ``offset`` to stdout; returns the new offset."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return offset
    if data:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    return offset + len(data)


def _follow(rd: Path, path: Path | None, segment: int | None, poll_s: float = 0.5) -> None:
    """Print ``path`` and what is appended to it; without ``segment``, move on to each newer
    segment's log. Ends once the run's controller is gone and nothing more is written."""
    from elastic_ring.controller.status import read_status

    offset = 0
    if path is not None:
        click.echo(f"==> {path} <==", err=True)
    try:
        while True:
            if path is not None:
                offset = _copy(path, offset)
            newer, _ = log_of(rd, None) if segment is None else log_of(rd, segment)
            if newer is not None and newer != path:
                if path is not None:
                    offset = _copy(path, offset)
                click.echo(f"==> {newer} <==", err=True)
                path, offset = newer, 0
                continue
            if not read_status(rd).phase.live:
                if path is not None:
                    _copy(path, offset)
                return
            time.sleep(poll_s)
    except KeyboardInterrupt:
        return
