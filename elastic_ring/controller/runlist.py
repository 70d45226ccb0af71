"""The training runs under a folder, with the state `status` gives them, and a run's worker logs
(one per segment), printed or followed while the run goes on. Read from the run folders only
(torch-free): the state is :func:`elastic_ring.controller.status.read_status`'s."""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from elastic_ring import protocol
from elastic_ring.controller.status import is_run_folder, read_status
from elastic_ring.errors import UserError

_SEGMENT_LOG = re.compile(r"^segment-(\d+)-w(\d+)\.log$")
MAX_DEPTH = 3  # folders below DIR searched for runs (runs/, runs/ps/..., a cluster's jobs/...)


@dataclass(frozen=True)
class RunRow:
    """One run of `elastic-ring runs` (its JSON is these fields, in this order)."""

    run_dir: str
    state: str  # the status line's state (``resizing 1 -> 2`` spelled out), or ``unreadable``
    phase: str
    step: int | None
    total_steps: int | None
    workers: int | None
    created: float  # run.json's time, else the folder's
    model: str  # the script's file name, ``built-in ResNet``, or why the folder is unreadable

    def to_dict(self) -> dict:
        return asdict(self)


def find_runs(root: Path, depth: int = MAX_DEPTH) -> list[Path]:
    """The run folders at or under ``root`` (a folder holding ``run.json``, or one a controller is
    making), not looking inside a run folder."""
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


def run_row(rd: Path) -> RunRow:
    """What `runs` shows of the run folder ``rd``."""
    info = protocol.read_json(rd / "run.json")
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
    return RunRow(run_dir=str(rd), state=state, phase=phase, step=step, total_steps=total, workers=world,
                  created=created, model=what)


def list_runs(root: Path) -> list[RunRow]:
    """The runs at or under ``root``, oldest first."""
    return sorted((run_row(rd) for rd in find_runs(root)), key=lambda r: (r.created, r.run_dir))


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


def copy_log(path: Path, offset: int, write: Callable[[bytes], None]) -> int:
    """Hand what ``path`` holds from byte ``offset`` on to ``write``; returns the new offset."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return offset
    if data:
        write(data)
    return offset + len(data)


def follow_logs(rd: Path, path: Path | None, segment: int | None, write: Callable[[bytes], None],
                note: Callable[[str], None], poll_s: float = 0.5) -> None:
    """Print ``path`` and what is appended to it; without ``segment``, move on to each newer
    segment's log (``note`` is told of each log as it starts). Ends once the run's controller is
    gone and nothing more is written, or on Ctrl-C."""
    offset = 0
    if path is not None:
        note(f"==> {path} <==")
    try:
        while True:
            if path is not None:
                offset = copy_log(path, offset, write)
            newer, _ = log_of(rd, None) if segment is None else log_of(rd, segment)
            if newer is not None and newer != path:
                if path is not None:
                    offset = copy_log(path, offset, write)
                note(f"==> {newer} <==")
                path, offset = newer, 0
                continue
            if not read_status(rd).phase.live:
                if path is not None:
                    copy_log(path, offset, write)
                return
            time.sleep(poll_s)
    except KeyboardInterrupt:
        return
