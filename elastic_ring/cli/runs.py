"""`elastic-ring runs` (the runs under a folder, with their state and last step) and `elastic-ring
logs` (a run's worker logs, followed while it runs): :mod:`elastic_ring.controller.runlist` finds
and reads them, these commands print."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path

import click

from elastic_ring.controller.runlist import copy_log, follow_logs, list_runs, log_of, segment_logs
from elastic_ring.controller.status import is_run_folder
from elastic_ring.errors import UserError


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
    rows = list_runs(root)
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in rows], indent=2))
        return
    if not rows:
        click.echo(f"no runs in {root}")
        return
    table = [("run folder", "state", "step", "workers", "started", "model")]
    for r in rows:
        step = "-" if r.step is None else f"{r.step}" + (f"/{r.total_steps}" if r.total_steps else "")
        started = datetime.fromtimestamp(r.created).strftime("%Y-%m-%d %H:%M") if r.created else "-"
        table.append((r.run_dir, r.state, step, "-" if r.workers is None else str(r.workers), started, r.model))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]) - 1)]
    for row in table:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1])


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
        if copy_log(path, 0, _write) == 0:  # nothing printed: say where the run's progress is
            click.echo(f"elastic-ring: {path} is empty (its workers printed nothing); the run's progress: "
                       f"elastic-ring status {rd}, and {rd / 'events.jsonl'}", err=True)
        return
    follow_logs(rd, path, segment, _write, lambda line: click.echo(line, err=True))


def _write(data: bytes) -> None:
    sys.stdout.buffer.write(data)
    sys.stdout.flush()
