"""The Horovod Elastic backend of ``--relaunch inplace``: one long-lived ``horovodrun --min-np 1
--max-np SLOTS --host-discovery-script RUN_DIR/control/discover.sh`` on one host. At a resize the
workers pause between two steps; the backend writes the new size into
``control/inplace-<seg>.json`` and into what the discovery script prints, and Horovod's driver
re-forms the ring (a new worker syncs from rank 0; a removed one is ended by Horovod); survivors
keep their processes. A scheduled resize's slot count and action are reported ahead
(:meth:`report_ahead`), once the segment runs, so that the driver has seen it when the workers
pause and rank 0 need not wait for the controller.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from elastic_ring import protocol
from elastic_ring.controller import hvdrun
from elastic_ring.controller.hvdrun import discovery_script_text
from elastic_ring.controller.backends.api import BUILTIN_TARGET, Launcher, SegmentLaunch, Started, worker_env
from elastic_ring.controller.backends.horovodrun import SubprocessLauncher, first_failed_rank, worker_args


def discovery_files(run_dir: Path) -> tuple[Path, Path]:
    """(the discovery script Horovod Elastic runs, the file it prints: ``localhost:N``)."""
    ctl = protocol.control_dir(run_dir)
    return ctl / "discover.sh", ctl / "hosts"


def write_hosts(run_dir: Path, world: int) -> bool:
    """What the discovery script reports from now on: ``world`` slots on this host. Returns False
    when it already did (Horovod's driver then sees no change and sends no notification)."""
    _, hosts = discovery_files(run_dir)
    text = f"localhost:{world}\n"
    if hosts.exists() and hosts.read_text() == text:
        return False
    hosts.parent.mkdir(parents=True, exist_ok=True)
    tmp = hosts.with_name(f".{hosts.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, hosts)
    return True


def elastic_horovodrun_command(spec, world: int, segment: int, stop_at: int,
                               owner: str = "", network_interface: str | None = None) -> list[str]:
    """The one long-lived horovodrun of ``--relaunch inplace`` (Horovod Elastic, gloo): it starts
    at ``world`` workers; the controller resizes by changing what the discovery script prints."""
    script, hosts = discovery_files(spec.run_dir)
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(discovery_script_text(hosts))
    script.chmod(0o755)
    write_hosts(spec.run_dir, world)
    return [*hvdrun.command_prefix(), "-np", str(world), "--min-np", "1",
            "--max-np", str(spec.slots), "--host-discovery-script", str(script),
            "--network-interface", network_interface or "lo", "--gloo", "--start-timeout", "120",
            *worker_args(spec, segment, stop_at, owner), "--inplace",
            "--", spec.script or BUILTIN_TARGET, *spec.script_args]


class ElasticBackend:
    """One Horovod Elastic job for the whole run; an :class:`~.api.InPlaceRing` (see the module docstring)."""

    name = "elastic"

    def __init__(self, spec, launcher: Launcher | None = None, network_interface: str | None = None) -> None:
        self.spec = spec
        self.launcher = launcher or SubprocessLauncher()
        self.network_interface = network_interface
        self.hosts_written = 0.0  # when the discovery file last changed
        self._launch: SegmentLaunch | None = None  # the running segment's
        self._ahead: SegmentLaunch | None = None  # the resize whose action is written ahead
        self._ahead_taken = False  # rank 0 took it (renamed the file)

    def start(self, launch: SegmentLaunch, log_path: Path) -> Started:
        cmd = elastic_horovodrun_command(self.spec, launch.world, launch.segment, launch.stop_at,
                                         launch.owner, self.network_interface)
        env = worker_env(self.spec, launch.world, elastic=True)
        handle = self.launcher.start(cmd, env, log_path)
        self.hosts_written = time.time()
        self._launch, self._ahead = launch, None
        return Started(handle, cmd)

    def usable_slots(self, want: int) -> int:
        return self.spec.slots  # one host: always all of it

    def first_failed_rank(self, log_path: Path | None) -> int | None:
        return first_failed_rank(log_path)

    def report_ahead(self, launch: SegmentLaunch) -> None:
        """Horovod's driver notices the new count while the workers train (it starts or ends no
        process before they reset), so at the stop the workers re-form the ring at once instead
        of waiting for the discovery. The next segment's (``launch``) action is written ahead too,
        naming the step it applies at: at the pause rank 0 takes it
        (:func:`elastic_ring.worker.inplace.take_ahead_action`) once the driver has reported the new host
        list, without waiting for the controller to see the segment's end."""
        if write_hosts(self.spec.run_dir, launch.world):
            self.hosts_written = time.time()
        cur = self._launch
        if cur is None or self._ahead is not None or launch.segment != cur.segment + 1:
            return
        from elastic_ring.worker.inplace import inplace_action_file

        self._ahead, self._ahead_taken = launch, False
        protocol.write_json_atomic(inplace_action_file(self.spec.run_dir, cur.segment), {
            "action": "resize", "to": launch.world, "segment": launch.segment, "stop_at": launch.stop_at,
            "time": time.time(), "at_step": cur.stop_at, "hosts_written": self.hosts_written})

    def retract_ahead(self, segment: int) -> bool:
        """Withdraw the action written ahead for ``segment``: True when withdrawn or none was
        written; False when rank 0 has already taken it (the workers go on at the scheduled size).
        The discovery keeps the count reported ahead until the controller's next word."""
        a, cur = self._ahead, self._launch
        if a is None or cur is None or cur.segment != segment:
            return True
        if not self._ahead_taken:
            from elastic_ring.worker.inplace import withdraw_action_ahead

            self._ahead_taken = not withdraw_action_ahead(self.spec.run_dir, segment)
        if self._ahead_taken:
            return False
        self._ahead = None
        return True

    def resize_in_place(self, paused_segment: int, launch: SegmentLaunch, t_launch: float) -> None:
        """Tell the paused workers the new size and change what the discovery script reports:
        Horovod's driver notices, starts a worker for a new slot (or ends the one whose slot went),
        and the survivors re-form the ring in their processes. When rank 0 took the action
        written ahead, the workers are already on their way."""
        from elastic_ring.worker.inplace import inplace_action_file

        if not self.retract_ahead(paused_segment):
            a = self._ahead
            assert a is not None
            if (a.world, a.segment, a.stop_at) != (launch.world, launch.segment, launch.stop_at):
                raise RuntimeError(f"the workers took the resize to {a.world} written ahead for "
                                   f"segment {a.segment}, the controller decided {launch}")
            self._launch, self._ahead = launch, None
            return
        self._launch = launch
        if write_hosts(self.spec.run_dir, launch.world):
            self.hosts_written = time.time()
        protocol.write_json_atomic(inplace_action_file(self.spec.run_dir, paused_segment),
                                   {"action": "resize", "to": launch.world, "segment": launch.segment,
                                    "stop_at": launch.stop_at, "time": t_launch,
                                    "hosts_written": self.hosts_written})

    def ask_exit(self, paused_segment: int, t: float) -> None:
        from elastic_ring.worker.inplace import inplace_action_file

        protocol.write_json_atomic(inplace_action_file(self.spec.run_dir, paused_segment),
                                   {"action": "exit", "time": t})

    def failure_detail(self) -> None:
        return None  # horovodrun's log and the crash records say it all

    def close(self) -> None:
        pass
