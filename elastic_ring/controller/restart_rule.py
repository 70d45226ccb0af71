"""Which worker failures are not worth a restart: the deterministic ones.

A restart costs a relaunch and the steps since the last checkpoint; for a failure that will come
back at once it only doubles the time to fail. The worker's crash record says what kind of failure
it was (``kind``, set by :mod:`elastic_ring.worker.run`); this module turns that into the reason
the controller gives when it does not retry. Pure functions of the records (no I/O but
:func:`append_traceback`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

_REASONS = {
    "syntax": "a syntax error in the script: not retried",
    "import": "an import error in the script: not retried",
    "usage": "not retried",  # the message already says the script rejected its arguments
    "contract": "not retried: the script breaks the worker library's contract",
    "pickling": "a registered object does not pickle: not retried",
    "setup": "the script failed before its first step: not retried",
}


def not_retried(rec: dict[str, Any] | None) -> str | None:
    """Why the failure in crash record ``rec`` is deterministic, or None (it may be transient).

    Deterministic: a syntax or import error in the script, the script rejecting its arguments
    (argparse's status 2), a misuse of the worker library, an object that does not pickle, and an
    exception raised by the script's own code before its first step. A peer's loss never is.
    (An exception at the same step as the previous attempt is the controller's ``repeated`` rule.)
    """
    if not rec or rec.get("peer_loss"):
        return None
    kind = rec.get("kind")
    if kind is None and rec.get("fatal"):
        kind = "contract"
    return _REASONS.get(kind) if kind else None


def append_traceback(log: Path | None, rec: dict[str, Any] | None) -> None:
    """End the segment's log with the failed rank's own traceback (Horovod's launcher prints its
    own after the worker's), so that the last thing in the log is the user's error."""
    if log is None or not rec or not rec.get("traceback"):
        return
    try:
        with open(log, "a") as f:
            f.write(f"\n--- elastic-ring: worker rank {rec.get('rank')} failed with ---\n")
            f.write(str(rec["traceback"]))
    except OSError:
        pass
