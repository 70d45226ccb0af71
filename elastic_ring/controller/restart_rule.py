"""Which worker failures are not worth a restart: the deterministic ones.

A restart costs a relaunch and the steps since the last checkpoint; for a failure that will come
back at once it only doubles the time to fail. The worker's crash record says what kind of failure
it was (``kind``, set by :mod:`elastic_ring.worker.run`); this module turns that into the reason
the controller gives when it does not retry, and keeps the run's recent failures
(:class:`FailureHistory`: how many in a row, and whether the same error came back at the same
step). Pure functions of the records (no I/O but :func:`append_traceback`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPEAT_KEY = ("type", "message", "step", "from_step")  # the same error at the same point

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


@dataclass
class FailureHistory:
    """The failures since the last saved progress.

    A failure is a dict with ``type``, ``message``, ``step`` (the step it happened in, None before
    the first) and ``from_step`` (the checkpoint the restart resumes from). The count starts again
    only once a checkpoint newer than the last failure's ``from_step`` exists
    (:meth:`progress_saved`): steps done and lost again are no progress. (Counting any finished
    segment as progress let a deterministic error loop for ever under ``--relaunch inplace``,
    where a resize writes no checkpoint: restart from step c, resize at step r > c, fail at the
    same step again, counted as the first failure each time.)
    """

    failures: list[dict[str, Any]] = field(default_factory=list)

    def record(self, failure: dict[str, Any]) -> tuple[int, bool]:
        """Add ``failure``; returns (its attempt number, whether it repeats the previous one: the
        same error type and message at the same step from the same checkpoint)."""
        last = self.failures[-1] if self.failures else None
        repeated = bool(last and failure.get("type")
                        and all(last.get(k) == failure.get(k) for k in REPEAT_KEY))
        self.failures.append(failure)
        return len(self.failures), repeated

    def progress_saved(self, checkpoint_step: int | None) -> bool:
        """Forget the failures when the newest checkpoint lies beyond the last restart's; True
        when it did."""
        if self.failures and checkpoint_step is not None and checkpoint_step > self.failures[-1]["from_step"]:
            self.failures = []
            return True
        return False

    def __len__(self) -> int:
        return len(self.failures)


def give_up_reason(rec: dict[str, Any] | None, failure: dict[str, Any], attempt: int, repeated: bool,
                   max_restarts: int, new_world: int) -> str | None:
    """Why the run ends after ``failure`` (its crash record ``rec``, its ``attempt`` number and
    whether it ``repeated`` the previous one, from :meth:`FailureHistory.record`), or None: restart
    at ``new_world`` workers. First that applies: a deterministic error, the same error at the
    same point twice, no slot left, ``max_restarts`` used up."""
    deterministic = not_retried(rec)
    if deterministic:
        return deterministic
    if repeated:
        where = (f"at step {failure['step']}" if failure.get("step") is not None
                 else f"before the first step after step {failure['from_step']}")
        return f"the same error {where} twice: not retrying"
    if new_world < 1:
        return "no slot answers"
    if attempt > max_restarts:
        return f"{max_restarts} restart(s) tried"
    return None
