"""After a worker's failure, whether its peers go on from the state they hold in memory
(``--survive``): one wait for the survivors' word, one agreement and one blame, for every backend
that keeps survivors (:class:`~.local.LocalRingBackend`, :class:`~.elastic.ElasticBackend`,
:class:`~.ray.RayBackend`).

A backend names the members of the failed group as :class:`Member` views: the name of the file a
member's record is in (:func:`elastic_ring.seam.survivor_file`), its rank, the process
the record must come from, and how to tell that process is gone. :func:`hear` waits until every
member has either said which steps it holds or is gone (or the wait is over), and returns what it
heard (:class:`Heard`): the records, the members gone, and the step they all go on from, or why
not (the restart's ``memory_refused``: :func:`~elastic_ring.seam.agreement`).
:func:`blame` names the failure of the shrink as a restart would, from what the backend knows: the
gone members' crash records (:func:`elastic_ring.protocol.blame`), a failure its launcher already
blamed (the Ray ring's), the ranks of a lost node. The rest is each backend's own: which members
serve, whether it may go on (a scheduled resize rank 0 took already; free slot hosts), and what it
does after (its group goes on with the survivors, or is ended).
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from elastic_ring import protocol

WAIT_S = 5.0  # after a failure, how long the survivors may take to say which steps they hold
POLL_S = 0.02
TAKEN_AHEAD = "rank 0 had taken the scheduled resize written ahead"  # a refusal before the wait


@dataclass(frozen=True)
class Member:
    """One member of the failed group as the wait sees it: ``name`` (of its survivor file: the
    member's, or its rank's where the launcher names none), ``rank``, ``gone`` (its process has
    exited), ``pid`` (the process a record must come from; None: any), ``who`` (the backend's own
    object for it)."""

    name: str
    rank: int
    gone: Callable[[], bool] = field(compare=False)
    pid: int | None = None
    who: Any = field(default=None, compare=False)


@dataclass
class Heard:
    """What the survivors said: ``records`` (member name -> its record), ``alive`` (the members
    that said, in the order given), ``gone`` (those whose process exited without saying),
    ``silent`` (neither), and ``step`` they go on from, or None with ``refused`` saying why.
    ``t0``: when the wait began."""

    records: dict[str, dict[str, Any]]
    alive: list[Member]
    gone: list[Member]
    silent: int
    step: int | None
    refused: str | None
    t0: float


def _said(m: Member, rec: Any, since: float) -> bool:
    """``rec`` is ``m``'s word on this failure: written since ``since``, by its process."""
    return (isinstance(rec, dict) and float(rec.get("time", 0.0)) >= since
            and (m.pid is None or rec.get("pid") == m.pid))


def hear(run_dir: Path, members: Sequence[Member], segment: int | None, since: float, wait_s: float = WAIT_S,
         known_gone: int = 0, gone_refuses: bool = False) -> Heard:
    """Wait up to ``wait_s`` until each of ``members`` has either said which steps it holds (a
    record written since ``since`` by its process) or is gone; their records are read once (the
    files are removed). Then whether they go on, and from which step: not when a survivor spoke
    of another segment than ``segment`` (a failure at a resize), when a member is gone and
    ``gone_refuses`` (the members are the survivors of a failure already blamed: one more gone is
    a restart; the wait ends at the first), nor when :func:`~elastic_ring.seam.agreement`
    refuses (silent members, none said, none gone: ``known_gone`` counts those gone before the
    wait; no common step, or its copies differ)."""
    from elastic_ring.seam import agreement, survivor_file

    t0 = time.time()
    records: dict[str, dict[str, Any]] = {}
    gone: list[Member] = []
    while True:
        for m in members:
            if m.name in records or m in gone:
                continue
            if m.gone():
                gone.append(m)
                continue
            rec = protocol.read_json(survivor_file(run_dir, m.name))
            if _said(m, rec, since):
                records[m.name] = rec
        if len(records) + len(gone) >= len(members) or (gone_refuses and gone) or time.time() - t0 >= wait_s:
            break
        time.sleep(POLL_S)
    for m in members:
        survivor_file(run_dir, m.name).unlink(missing_ok=True)
    alive = [m for m in members if m.name in records]
    gone = [m for m in members if m in gone]  # in the order given
    silent = len(members) - len(alive) - len(gone)
    step: int | None = None
    if segment is not None and any(r.get("segment") != segment for r in records.values()):
        refused: str | None = "a survivor spoke of another segment (a failure at a resize)"
    elif gone_refuses and gone:
        refused = f"rank(s) {[m.rank for m in gone]} died too"
    else:
        step, refused = agreement([records[m.name] for m in alive], silent, len(gone) + known_gone)
    return Heard(records, alive, gone, silent, step, refused, t0)


STACKS_SIGNAL = signal.SIGUSR2  # a worker actor dumps its threads' stacks into its log on it (faulthandler)


def dump_stacks(pids: Sequence[int], settle_s: float = 0.3) -> list[int]:
    """Ask the processes ``pids`` (this host's worker actors that were silent in :func:`hear`, each
    registered with :mod:`faulthandler` for :data:`STACKS_SIGNAL`) to write every thread's stack to
    their logs, so that a survivor that never said which steps it holds shows where it stood; then
    wait ``settle_s`` for the writes (the restart ends them next). Returns the pids signalled (a pid
    gone meanwhile is skipped)."""
    sent = []
    for pid in pids:
        try:
            os.kill(pid, STACKS_SIGNAL)
        except (OSError, ValueError):
            continue
        sent.append(pid)
    if sent:
        time.sleep(settle_s)
    return sent


def _record_of(rank: int, errors: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The crash record that says why ``rank`` failed: its newest own error, else its newest
    record (a peer's loss), else None (it died without one)."""
    mine = [r for r in errors if r.get("rank") == rank]
    own = [r for r in mine if not protocol.Seen(rank, r).peer_loss]
    return (own or mine or [None])[-1]


def blame(gone: Sequence[Member], errors: list[dict[str, Any]], blamed: protocol.Failure | None = None,
          lost: Sequence[int] = ()) -> protocol.Failure:
    """The failure the survivors went on after, named as for a restart: ``blamed``, where the
    launcher named it already (the Ray ring, by the same rule), else the cause among the ``gone``
    members (:func:`elastic_ring.protocol.blame` in rank order over each one's crash record from
    ``errors``): an own error; else a death without a record (``Killed``); a member that only
    lost a peer is never blamed (``PeerLost``, no rank, when only such members are gone).
    ``lost``: the ranks that ran on a lost node, all named."""
    if blamed is not None:
        failure = blamed
    else:
        seen = [protocol.Seen(m.rank, _record_of(m.rank, errors), who=m) for m in sorted(gone, key=lambda m: m.rank)]
        culprit = protocol.blame(seen)
        if culprit is None:
            failure = protocol.Failure(None, "PeerLost", f"rank(s) {', '.join(str(m.rank) for m in gone)} "
                                       f"only lost a peer")
        elif culprit.record is not None:
            failure = protocol.Failure.of_record(culprit.record)
        else:
            failure = protocol.Failure(culprit.rank, "Killed", f"worker rank {culprit.rank} died (its process is "
                                       f"gone, no error reported)")
    if lost:
        failure = replace(failure, message=f"{failure.message}: rank(s) {', '.join(map(str, lost))} on it lost")
    return failure
