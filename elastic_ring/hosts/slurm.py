"""The hosts of a Slurm allocation, from the variables Slurm sets in a job (``SLURM_JOB_ID``).

* :func:`expand_nodelist` — ``SLURM_JOB_NODELIST``'s compressed form: ``node[01-03,07],gpu-[1-2]``
  -> node01 node02 node03 node07 gpu-1 gpu-2 (zero padding kept, several bracket groups in one
  name multiply: ``r[1-2]n[1-2]`` -> r1n1 r1n2 r2n1 r2n2, text after a group kept).
* :func:`expand_counts` — ``SLURM_TASKS_PER_NODE``'s form: ``2(x3),1`` -> 2 2 2 1.
* :func:`allocation` — the job's hosts and slots: GPUs per node (``SLURM_GPUS_ON_NODE``, else
  ``SLURM_GPUS_PER_NODE``) when the job has GPUs and wants them, else tasks per node, else one
  slot per node; None outside an allocation.

Pure functions of a mapping of variables (``os.environ`` by default); a variable that does not
parse raises :class:`~.api.HostsError` with a line naming it.
"""

from __future__ import annotations

import itertools
import os
import re
import socket
from dataclasses import dataclass
from typing import Mapping

from elastic_ring.hosts.api import HostSet, HostsError

MAX_NODES = 65536  # an expansion larger than any allocation: a typo such as node[1-999999999]
_NAME_CHARS = re.compile(r"^[A-Za-z0-9_.\-]*$")


def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside brackets."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
            if depth > 1:
                raise HostsError(f"nested '[' in {text!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostsError(f"']' without '[' in {text!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise HostsError(f"'[' without ']' in {text!r}")
    parts.append("".join(cur))
    return parts


def _range(spec: str, item: str) -> list[str]:
    """``01-03`` -> ["01", "02", "03"]; ``7`` -> ["7"] (the width of the first number kept)."""
    lo, sep, hi = spec.strip().partition("-")
    if not lo.isdigit() or (sep and not hi.isdigit()):
        raise HostsError(f"{spec!r} in {item!r} is not N or N-M")
    if not sep:
        return [lo]
    a, b = int(lo), int(hi)
    if b < a:
        raise HostsError(f"range {spec!r} in {item!r} goes down")
    if b - a >= MAX_NODES:
        raise HostsError(f"range {spec!r} in {item!r} names more than {MAX_NODES} nodes")
    return [str(i).zfill(len(lo)) for i in range(a, b + 1)]


def _expand_item(item: str) -> list[str]:
    pieces: list[list[str]] = []
    for lit, group in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", item):
        if not _NAME_CHARS.match(lit):
            raise HostsError(f"{item!r} is not a node name")
        if lit:
            pieces.append([lit])
        if group:
            choices = [x for spec in group.split(",") for x in _range(spec, item)]
            pieces.append(choices)
    size = 1
    for p in pieces:
        size *= len(p)
    if size > MAX_NODES:
        raise HostsError(f"{item!r} names more than {MAX_NODES} nodes")
    return ["".join(t) for t in itertools.product(*pieces)]


def expand_nodelist(text: str) -> list[str]:
    """Slurm's hostlist form -> node names, in order.

    Raises:
        HostsError: unbalanced brackets, a bad range, an empty list or name (one line).
    """
    text = text.strip()
    if not text:
        raise HostsError("the node list is empty")
    out: list[str] = []
    for item in _split_top(text):
        item = item.strip()
        if not item:
            raise HostsError(f"an empty name in {text!r}")
        if "[]" in item:
            raise HostsError(f"empty '[]' in {item!r}")
        out.extend(_expand_item(item))
        if len(out) > MAX_NODES:
            raise HostsError(f"{text!r} names more than {MAX_NODES} nodes")
    return out


def expand_counts(text: str) -> list[int]:
    """``2(x3),1`` -> [2, 2, 2, 1] (the form of ``SLURM_TASKS_PER_NODE`` and
    ``SLURM_JOB_CPUS_PER_NODE``).

    Raises:
        HostsError: an entry that is not ``N`` or ``N(xK)`` (one line).
    """
    out: list[int] = []
    for part in text.strip().split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise HostsError(f"{part.strip()!r} in {text!r} is not N or N(xK)")
        k = int(m.group(2) or 1)
        if k < 1 or len(out) + k > MAX_NODES:
            raise HostsError(f"{part.strip()!r} in {text!r}: bad repeat count")
        out.extend([int(m.group(1))] * k)
    return out


def _gpus(env: Mapping[str, str]) -> tuple[int, str] | None:
    """GPUs per node and the variable they came from, or None (no GPUs in the allocation)."""
    on = env.get("SLURM_GPUS_ON_NODE", "").strip()
    if on:
        if not on.isdigit():
            raise HostsError(f"SLURM_GPUS_ON_NODE={on!r} is not a number")
        return (int(on), "SLURM_GPUS_ON_NODE") if int(on) > 0 else None
    per = env.get("SLURM_GPUS_PER_NODE", "").strip()
    if per:  # "4", "a100:4", "gpu:a100:4", or several types "a100:2,v100:2"
        total = 0
        for part in per.split(","):
            last = part.split(":")[-1].split("(")[0].strip()
            if not last.isdigit():
                raise HostsError(f"SLURM_GPUS_PER_NODE={per!r}: {part!r} does not end in a count")
            total += int(last)
        return (total, "SLURM_GPUS_PER_NODE") if total > 0 else None
    return None


@dataclass(frozen=True)
class Allocation:
    """A Slurm job's hosts and slots."""

    job_id: str
    nodelist: str  # as Slurm wrote it
    hosts: HostSet
    slots_from: str  # the variable the slots came from, or "one per node"

    def line(self) -> str:
        n = len(self.hosts)
        return (f"Slurm job {self.job_id}: {n} node{'s' if n != 1 else ''} ({self.nodelist}), "
                f"{self.hosts.total} slot{'s' if self.hosts.total != 1 else ''} from {self.slots_from}")


def is_this_host(name: str) -> bool:
    """Whether node ``name`` is the machine this runs on (its host name, short or full, or a
    loopback name): a one-node allocation seen from its own node."""
    me = {"localhost", "127.0.0.1", "::1"}
    try:
        hn = socket.gethostname()
        me |= {hn, hn.split(".")[0], socket.getfqdn()}
    except OSError:
        pass
    return name in me


def in_allocation(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return bool(env.get("SLURM_JOB_ID", "").strip())


def allocation(env: Mapping[str, str] | None = None, gpus: bool = True) -> Allocation | None:
    """The hosts of the Slurm job this process runs in, or None when ``SLURM_JOB_ID`` is not set.

    Slots per node: the GPUs per node when the job has GPUs and ``gpus`` (not a CPU run), else the
    tasks per node (``SLURM_TASKS_PER_NODE``, one count per node), else one per node.

    Raises:
        HostsError: ``SLURM_JOB_ID`` is set but the node list is missing or does not parse, or the
            tasks per node do not match the nodes (one line naming the variable).
    """
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID", "").strip()
    if not job:
        return None
    var = "SLURM_JOB_NODELIST" if env.get("SLURM_JOB_NODELIST", "").strip() else "SLURM_NODELIST"
    text = env.get(var, "").strip()
    if not text:
        raise HostsError(f"SLURM_JOB_ID={job} is set but SLURM_JOB_NODELIST is not")
    try:
        nodes = expand_nodelist(text)
    except HostsError as e:
        raise HostsError(f"{var}={text!r} does not parse: {e}") from None
    g = _gpus(env) if gpus else None
    tasks = env.get("SLURM_TASKS_PER_NODE", "").strip()
    if g is not None:
        counts, source = [g[0]] * len(nodes), g[1]
    elif tasks:
        try:
            counts = expand_counts(tasks)
        except HostsError as e:
            raise HostsError(f"SLURM_TASKS_PER_NODE does not parse: {e}") from None
        if len(counts) != len(nodes):
            raise HostsError(f"SLURM_TASKS_PER_NODE={tasks!r} gives {len(counts)} counts for the "
                             f"{len(nodes)} nodes of {var}={text!r}")
        source = "SLURM_TASKS_PER_NODE"
    else:
        counts, source = [1] * len(nodes), "one per node"
    try:
        hosts = HostSet((h, n) for h, n in zip(nodes, counts) if n > 0)
    except HostsError as e:
        raise HostsError(f"{var}={text!r}: {e}") from None
    return Allocation(job, text, hosts, source)
