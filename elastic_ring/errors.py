"""Error hierarchy shared by all subsystems.

A :class:`UserError` is a mistake in what the user asked for (a bad flag, a missing dataset, a
corrupt checkpoint). The CLI prints it as one line and exits with status 2, never a traceback.
Every other :class:`ElasticRingError` is a failure of the run itself (a crashed worker) and exits
with status 1.
"""

from __future__ import annotations

EXIT_USER_ERROR = 2
EXIT_RUN_FAILED = 1
EXIT_REQUEUE = 75  # `train` stopped by Slurm's notice (SIGUSR1 or SIGTERM in an allocation): requeue it (EX_TEMPFAIL)


class ElasticRingError(Exception):
    """Base class of every error elastic-ring raises on purpose."""

    exit_code = EXIT_RUN_FAILED


class UserError(ElasticRingError):
    """Bad input: printed as one line, exit status 2."""

    exit_code = EXIT_USER_ERROR


class Interrupted(ElasticRingError):
    """Ctrl-C (or SIGTERM) before the workers started: printed as one line naming what was kept
    and how to go on, exit status 130."""

    exit_code = 130


class ConfigError(UserError):
    """An unreadable, unknown or invalid configuration value."""


class DatasetError(UserError):
    """A dataset that is missing, corrupt or unknown."""


class CheckpointError(UserError):
    """A checkpoint that is missing, truncated or fails its checksum."""


class CheckpointWriteError(ElasticRingError):
    """A checkpoint could not be written (permission, disk full); the error names the path."""


class WorkerFailedError(ElasticRingError):
    """A worker process failed; carries the first failure's rank and cause."""

    def __init__(self, message: str, rank: int | None = None, cause: str | None = None):
        super().__init__(message)
        self.rank = rank
        self.cause = cause
