"""The words the tool prints, one per concept, shared by every command's output and errors.

The vocabulary: a job's size is its *workers* (``train --workers`` (alias ``--gpus``), ``ps
--workers``, ``submit --min-workers/--max-workers``, ``profile --workers``); a resize's target is
``--to`` (``train --to``, ``resize --to``); a machine's capacity is its *slots* (``--slots``); a
run or job that ran all its steps is *finished* (``status``, ``jobs``, the cluster page).
"""

from __future__ import annotations


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``1 worker``, ``2 workers``, ``0 workers``."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
