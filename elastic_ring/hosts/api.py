"""Value types of the hosts a job may run on, and the rule for how many workers it runs.

* :class:`HostSet` — the hosts and their slots at one moment (ordered: the first host gets the
  lowest ranks), as a discovery script, a hostfile or Slurm says them; :meth:`HostSet.diff` says
  what changed between two of them (:class:`HostDiff`).
* :class:`WorkerBounds` — ``--min-workers``/``--max-workers`` (or ``--workers MIN:MAX``), parsed
  and checked by :func:`resolve_bounds`; :meth:`WorkerBounds.target` is the size a job should run
  at given the free slots: as many as there are, up to the maximum; below the minimum, wait.

Pure values and functions: no I/O, no clock (the discovery runner is :mod:`.discovery`, the
cooldown of failed hosts :mod:`.exclusion`, Slurm's variables :mod:`.slurm`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping

from elastic_ring.errors import UserError

_HOST_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")  # a DNS name, a short node name or an IPv4 address
MAX_SLOTS = 4096  # per host: more is a typo (or garbage that happens to be a number)


class HostsError(ValueError):
    """Host text that does not parse (a discovery script's output, a Slurm variable): the message
    is one line naming what is wrong. Callers turn it into a :class:`UserError` (bad input at
    the start) or a one-line note (a script's answer while the job runs)."""


def check_host_name(name: str, where: str = "") -> str:
    """``name`` if it is a usable host name, else :class:`HostsError` naming it."""
    if not _HOST_NAME.match(name):
        raise HostsError(f"{where}{name!r} is not a host name")
    return name


@dataclass(frozen=True)
class HostDiff:
    """What changed from one :class:`HostSet` to the next: hosts added and removed (with their
    slots), and hosts whose slots changed (old, new)."""

    added: tuple[tuple[str, int], ...] = ()
    removed: tuple[tuple[str, int], ...] = ()
    changed: tuple[tuple[str, int, int], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)

    @property
    def slots_delta(self) -> int:
        """Slots gained (positive) or lost (negative)."""
        return (sum(n for _, n in self.added) - sum(n for _, n in self.removed)
                + sum(new - old for _, old, new in self.changed))

    def line(self) -> str:
        """One line for a log or an event: ``+c:2 -a:1 b:1->4`` (``no change`` when empty)."""
        parts = [f"+{h}:{n}" for h, n in self.added] + [f"-{h}:{n}" for h, n in self.removed]
        parts += [f"{h}:{old}->{new}" for h, old, new in self.changed]
        return " ".join(parts) or "no change"


class HostSet(Mapping[str, int]):
    """Hosts and their slots (host -> slots >= 1), in rank order; immutable.

    Equal when the same hosts have the same slots, whatever the order (the order decides ranks,
    not what is available)."""

    __slots__ = ("_slots",)

    def __init__(self, pairs: Iterable[tuple[str, int]] | Mapping[str, int] = ()):
        items = pairs.items() if isinstance(pairs, Mapping) else pairs
        slots: dict[str, int] = {}
        for host, n in items:
            check_host_name(host)
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise HostsError(f"host {host}: slots must be a whole number >= 1, got {n!r}")
            if host in slots:
                raise HostsError(f"host {host} is listed twice")
            slots[host] = n
        self._slots = slots

    @classmethod
    def parse(cls, text: str, default_slots: int = 1, what: str = "host list") -> "HostSet":
        """Horovod Elastic's discovery-script output: one ``host:slots`` or bare ``host`` (then
        ``default_slots``, as Horovod's ``--slots-per-host``) per line. Blank lines and ``#``
        comments are skipped; ``host:0`` means the host has no free slot (left out); the same
        line twice counts once; no line at all is an empty set (no hosts now).

        Raises:
            HostsError: the first line that is not a host (one line naming it and ``what``).
        """
        slots: dict[str, int] = {}
        for no, raw in enumerate(text.splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            where = f"{what} line {no}: "
            host, sep, n_text = line.partition(":")
            host = host.strip()
            if sep:
                try:
                    n = int(n_text.strip())
                except ValueError:
                    raise HostsError(f"{where}{_clip(line)!r} is not HOST:SLOTS (slots "
                                     f"{_clip(n_text.strip())!r} is not a number)") from None
                if n < 0 or n > MAX_SLOTS:
                    raise HostsError(f"{where}{_clip(line)!r}: slots must be 0..{MAX_SLOTS}")
            else:
                n = default_slots
            if not _HOST_NAME.match(host):
                raise HostsError(f"{where}{_clip(line)!r} is not HOST:SLOTS or HOST")
            if host in slots and slots[host] != n:
                raise HostsError(f"{where}host {host} listed again with other slots "
                                 f"({slots[host]}, then {n})")
            slots[host] = n
        return cls((h, n) for h, n in slots.items() if n > 0)

    @classmethod
    def from_arg(cls, text: str) -> "HostSet":
        """``"a:2,b:1"`` (the form of ``--hosts``)."""
        return cls.parse(text.replace(",", "\n"), what="--hosts")

    def __getitem__(self, host: str) -> int:
        return self._slots[host]

    def __iter__(self) -> Iterator[str]:
        return iter(self._slots)

    def __len__(self) -> int:
        return len(self._slots)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, HostSet):
            return self._slots == other._slots
        return NotImplemented

    def __hash__(self) -> int:
        return hash(frozenset(self._slots.items()))

    def __repr__(self) -> str:
        return f"HostSet({self.arg() or 'no hosts'})"

    @property
    def total(self) -> int:
        """Slots on all hosts together."""
        return sum(self._slots.values())

    def pairs(self) -> list[tuple[str, int]]:
        """[(host, slots)] in order (the form ``parse_hosts`` and ``first_slots`` take)."""
        return list(self._slots.items())

    def arg(self) -> str:
        """``"a:2,b:1"``: the ``--hosts`` / horovodrun ``-H`` form."""
        return ",".join(f"{h}:{n}" for h, n in self._slots.items())

    def first(self, n: int) -> "HostSet":
        """The first ``n`` slots, in order (the hosts a job of ``n`` workers runs on: horovodrun
        starts a worker in every slot it is given, so it is given no more)."""
        out, left = [], n
        for h, k in self._slots.items():
            if left <= 0:
                break
            out.append((h, min(k, left)))
            left -= min(k, left)
        return HostSet(out)

    def without(self, hosts: Iterable[str]) -> "HostSet":
        """This set less ``hosts`` (excluded ones, say)."""
        drop = set(hosts)
        return HostSet((h, n) for h, n in self._slots.items() if h not in drop)

    def ordered_like(self, previous: "HostSet") -> "HostSet":
        """The same hosts, those of ``previous`` first in its order, new ones after in this set's
        order: a host that stays keeps its place, so rank 0 stays where it was."""
        first = [(h, self._slots[h]) for h in previous if h in self._slots]
        return HostSet(first + [(h, n) for h, n in self._slots.items() if h not in previous])

    def diff(self, new: "HostSet") -> HostDiff:
        """What changed from this set to ``new``."""
        return HostDiff(added=tuple((h, n) for h, n in new.items() if h not in self._slots),
                        removed=tuple((h, n) for h, n in self._slots.items() if h not in new),
                        changed=tuple((h, n, new[h]) for h, n in self._slots.items()
                                      if h in new and new[h] != n))


def _clip(s: str, n: int = 60) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


@dataclass(frozen=True)
class WorkerBounds:
    """How many workers a job may run: at least ``min`` (below it, wait), at most ``max`` (None:
    as many as there are slots), starting at ``start`` when given (else as many as it may)."""

    min: int = 1
    max: int | None = None
    start: int | None = None

    def __post_init__(self):
        if self.min < 1:
            raise UserError(f"--min-workers must be >= 1, got {self.min}")
        if self.max is not None and self.max < self.min:
            raise UserError(f"--max-workers {self.max} is below --min-workers {self.min}")
        if self.start is not None and not self.min <= self.start <= (self.max or self.start):
            raise UserError(f"--workers {self.start} is outside --min-workers/--max-workers "
                            f"{self.min}:{self.max if self.max is not None else ''}")

    def target(self, free_slots: int, asked: int | None = None) -> int | None:
        """The size to run at with ``free_slots`` usable slots: ``asked`` (a schedule's, a live
        resize's or the scheduler's size; else the maximum, else every slot), no more than the
        slots and the maximum. None when that is below the minimum: wait for hosts."""
        want = asked if asked is not None else (self.max if self.max is not None else free_slots)
        n = min(want, free_slots, self.max if self.max is not None else want)
        return n if n >= self.min else None

    def check_asked(self, n: int, what: str = "the resize") -> None:
        """A size asked of the job (schedule, ``resize --to``) must lie within the bounds.

        Raises:
            UserError: below the minimum or above the maximum (one line).
        """
        if n < self.min:
            raise UserError(f"{what} to {n} is below --min-workers {self.min}")
        if self.max is not None and n > self.max:
            raise UserError(f"{what} to {n} is above --max-workers {self.max}")

    def waiting_line(self, have: int) -> str:
        """What `status` says below the minimum."""
        return f"waiting for hosts (have {have}, need {self.min})"


def parse_workers(text: str) -> int | tuple[int, int]:
    """``--workers``: ``N`` (a fixed count) or ``MIN:MAX`` (bounds, as torchrun's ``--nnodes``).

    Raises:
        UserError: not a number or a range of two, a count below 1, MIN above MAX (one line).
    """
    s = str(text).strip()
    lo, sep, hi = s.partition(":")
    try:
        vals = [int(lo)] + ([int(hi)] if sep else [])
    except ValueError:
        raise UserError(f"--workers expects N or MIN:MAX, got {s!r}") from None
    if any(v < 1 for v in vals):
        raise UserError(f"--workers expects counts >= 1, got {s!r}")
    if not sep:
        return vals[0]
    if vals[0] > vals[1]:
        raise UserError(f"--workers {s}: MIN {vals[0]} is above MAX {vals[1]}")
    return vals[0], vals[1]


def resolve_bounds(workers: str | int | None = None, min_workers: int | None = None,
                   max_workers: int | None = None, gpus: int | None = None) -> WorkerBounds | None:
    """The bounds a command line asks for, or None when it asks for none (a fixed size, as today).

    ``workers`` is ``--workers`` as typed (``N`` or ``MIN:MAX``), ``gpus`` ``--gpus N`` (a fixed
    count only). ``--workers MIN:MAX`` is the same as ``--min-workers MIN --max-workers MAX``;
    a count (``--workers N`` or ``--gpus N``) with bounds is the size to start at.

    Raises:
        UserError: a bad value, MIN > MAX, a range given twice, ``--gpus`` beside ``--workers``,
            or a start outside the bounds (one line).
    """
    if gpus is not None and workers is not None:
        raise UserError("--gpus and --workers are the same option: give one "
                        "(--workers MIN:MAX for bounds, --gpus N for a count)")
    for name, v in (("--min-workers", min_workers), ("--max-workers", max_workers), ("--gpus", gpus)):
        if v is not None and v < 1:
            raise UserError(f"{name} must be >= 1, got {v}")
    parsed = parse_workers(str(workers)) if workers is not None else gpus
    if isinstance(parsed, tuple):
        if min_workers is not None or max_workers is not None:
            raise UserError("--workers MIN:MAX already gives the bounds: drop --min-workers/--max-workers")
        return WorkerBounds(min=parsed[0], max=parsed[1])
    if min_workers is None and max_workers is None:
        return None
    lo = min_workers if min_workers is not None else 1
    if max_workers is not None and max_workers < lo:
        raise UserError(f"--max-workers {max_workers} is below --min-workers {lo}")
    return WorkerBounds(min=lo, max=max_workers, start=parsed)
