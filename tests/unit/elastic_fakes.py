"""Fakes shared by the unit tests of the in-place backend over hosts (``ElasticBackend``): a
launcher whose horovodrun never ends, and the host list the backend wrote for Horovod's driver."""

from __future__ import annotations

from pathlib import Path

from elastic_ring import protocol


class RunningJob:
    """A started process that keeps running (``poll`` None) and ignores ``kill``."""

    pid = 4242

    def poll(self):
        return None

    def kill(self):
        pass


class Launcher:
    """Starts :class:`RunningJob` s; each ``(cmd, env)`` kept in ``launched``."""

    def __init__(self, launched: list | None = None) -> None:
        self.launched = launched if launched is not None else []

    def start(self, cmd, env, log_path):
        self.launched.append((cmd, env))
        return RunningJob()


def listed_hosts(run_dir: Path) -> str:
    """The hosts file the backend wrote for the driver's discovery script."""
    return (protocol.control_dir(run_dir) / "hosts").read_text()
