"""The scheduler daemon: ``elastic-ring cluster up`` (:func:`run`) and ``cluster down`` (:func:`drain`).

One scheduler runs on a cluster folder at a time (:class:`SchedulerLock`). :func:`run` merges the
options given with the folder's previous config, connects the slot source (fixed hosts or a Ray
cluster), recovers the jobs a previous scheduler left (re-attaching to controllers that still run)
and makes a pass of the :class:`~elastic_ring.cluster.scheduler.Scheduler` every ``poll`` seconds,
printing the events and the job table, until a drain (``cluster down``, Ctrl-C or SIGTERM) has
stopped every job at a checkpoint. A signal only sets a flag; the loop acts on it between passes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from pathlib import Path
from typing import Any, Callable

from elastic_ring.cluster.api import ClusterConfig, JobRow
from elastic_ring.cluster.client import jobs_table, nodes_line
from elastic_ring.errors import ConfigError, UserError

Echo = Callable[[str], None]


def hostfile_slots(path: str) -> tuple[tuple[str, int], ...]:
    """(host, slots) of each line of a horovodrun hostfile."""
    from elastic_ring.controller.api import parse_hostfile

    return tuple((h, int(n)) for h, n in parse_hostfile(path))


class SchedulerLock:
    """The cluster folder's scheduler lock: held by the one scheduler that runs on it."""

    def __init__(self, d: Path) -> None:
        from elastic_ring.cluster.api import LOCK_FILE

        self.path = d / LOCK_FILE
        self.fd: int | None = None

    def acquire(self) -> None:
        """Raises: UserError: another scheduler holds it."""
        from elastic_ring.controller.lock import try_lock

        self.fd = try_lock(self.path)
        if self.fd is None:
            raise UserError(f"a scheduler already runs on {self.path.parent} (pid {self.holder()})")

    def holder(self) -> str:
        try:
            return self.path.read_text().strip() or "?"
        except OSError:
            return "?"

    def held_by_other(self) -> bool:
        from elastic_ring.controller.lock import held_by_other

        return held_by_other(self.path)


def run(cluster_dir: str | Path, slots: int | None = None, hostfile: str | None = None,
        ray_address: str | None = None, policy: str | None = None, device: str | None = None,
        network_interface: str | None = None, profile: str | None = None, poll: float = 0.5,
        quiet: bool = False, web: str | None = None, echo: Echo = print) -> None:
    """Start the scheduler on the cluster folder (creating it) and run it in the foreground until
    it has drained. ``ray_address``: "" for $RAY_ADDRESS or a local Ray; ``web``: [HOST:]PORT of
    the read-only page.

    Raises:
        UserError: bad options, a folder that is not a cluster's, or a scheduler already on it.
    """
    from elastic_ring.cluster.ray_slots import slot_source
    from elastic_ring.cluster.runner import ProcessRunner
    from elastic_ring.cluster.scheduler import Scheduler, live_policy
    from elastic_ring.cluster.store import Store
    from elastic_ring.cluster.web import bind, parse_bind

    d = Path(cluster_dir)
    check_options(slots, hostfile, ray_address, poll)
    check_folder(d, new_slots=any(x is not None for x in (slots, hostfile, ray_address)))
    web_addr = parse_bind(web, "--web") if web is not None else None
    lock = SchedulerLock(d)
    lock.acquire()
    sock = bind(*web_addr) if web_addr is not None else None
    store = Store(d, create=True)
    cfg = merge_config(store, slots, hostfile, ray_address, policy, device, network_interface, profile, poll)
    source = slot_source(cfg)
    address = source.connect() if cfg.ray is not None else None
    try:
        if cfg.ray is not None:  # the nodes seen now (what `jobs` shows until the scheduler's next pass)
            cfg = dataclasses.replace(cfg, hosts=tuple((n.name, n.slots) for n in source.capacity().nodes))
            store.set_meta("nodes", [list(h) for h in cfg.hosts])
        elif any(len(j.slots) and max(j.slots) >= cfg.slots for j in store.jobs(active_only=True)):
            raise UserError(f"jobs of {d} hold slots beyond the {cfg.slots} asked; start with the same slots")
        store.set_meta("config", cfg.to_dict())
        store.set_meta("down", False)
        store.set_meta("scheduler_pid", os.getpid())
        runner = ProcessRunner(d, cfg, ray_address=address)
        sched = Scheduler(store, cfg, live_policy(cfg.policy, max(cfg.slots, 1), cfg.device), runner,
                          rate_for=rate_for(cfg), slots=source)
        echo(banner(cfg, d, address))
        if sock is not None:
            from elastic_ring.cluster.web import WebServer

            server = WebServer(d, sock)
            server.start()
            echo(f"web page: {server.url} (metrics: {server.url}metrics)")
        loop(store, sched, cfg.poll_s, quiet, echo)
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()


def check_options(slots: int | None, hostfile: str | None, ray_address: str | None, poll: float) -> None:
    """Raises: UserError: one of the `cluster up` options is bad."""
    if slots is not None and slots < 1:
        raise UserError(f"--slots must be >= 1, got {slots}")
    if sum(x is not None for x in (slots, hostfile, ray_address)) > 1:
        raise UserError("give one of --slots, --hostfile and --ray")
    if poll <= 0:
        raise UserError(f"--poll must be > 0, got {poll}")


def check_folder(d: Path, new_slots: bool) -> None:
    """Before anything is written: refuse a run folder of `train` or `ps` (a cluster's files would
    mix with the run's), and a new cluster without its slots (no cluster.db or lock left behind)."""
    from elastic_ring.cluster.api import DB_FILE

    if (d / DB_FILE).exists():
        return
    marks = [m for m in ("run.json", "ps_config.json", "events.jsonl", "checkpoints") if (d / m).exists()]
    if marks:
        raise UserError(f"{d} is a training run's folder ({marks[0]}), not a cluster folder: give "
                        f"`cluster up` another --dir")
    if not new_slots:
        raise UserError(f"no cluster in {d} yet: a new cluster needs --slots N, --hostfile PATH or "
                        f"--ray [ADDRESS]")


def merge_config(store: Any, slots: int | None, hostfile: str | None, ray_address: str | None,
                 policy: str | None, device: str | None, network_interface: str | None, profile: str | None,
                 poll: float) -> ClusterConfig:
    """The cluster's config: the options given, else the folder's previous one."""
    old = store.config()
    ray = None
    if ray_address is not None:
        hosts, ray = (), ray_address  # "": $RAY_ADDRESS, else a local Ray
    elif hostfile:
        hosts = hostfile_slots(hostfile)
    elif slots is not None:
        hosts = (("localhost", slots),)
    elif old is not None:
        hosts, ray = old.hosts, old.ray
    else:
        raise UserError("a new cluster needs --slots N, --hostfile PATH or --ray [ADDRESS]")
    if old is not None and (old.ray is None) != (ray is None) and store.jobs(active_only=True):
        raise UserError(f"jobs of {store.dir} run {'on Ray' if old.ray is not None else 'on fixed hosts'}: "
                        f"start with the same kind of slots")
    return ClusterConfig(hosts=hosts, policy=policy or (old.policy if old else "precompute"),
                         device=device or (old.device if old else "cpu"),
                         network_interface=network_interface or (old.network_interface if old else None),
                         poll_s=poll,
                         profile=str(Path(profile).resolve()) if profile else (old.profile if old else None),
                         ray=ray)


def banner(cfg: ClusterConfig, d: Path, address: str | None) -> str:
    """The line `cluster up` starts with: the slots, the policy, the folder."""
    kind = "GPU" if cfg.device == "cuda" else "CPU worker"
    where = ", ".join(f"{h}:{n}" for h, n in cfg.hosts)
    if address is not None:
        return (f"elastic-ring cluster: {cfg.slots} {kind} slot(s) on Ray {address} "
                f"({len(cfg.hosts)} node(s): {where or 'none'}; read at every pass), policy {cfg.policy}, "
                f"folder {d.resolve()}")
    cpus = os.cpu_count() or 1
    return (f"elastic-ring cluster: {cfg.slots} {kind} slot(s) on {where}, policy {cfg.policy}, folder {d.resolve()}"
            + (f" ({cfg.slots} slots on {cpus} cores: jobs share the cores)"
               if cfg.device == "cpu" and cfg.slots > cpus else ""))


def loop(store: Any, sched: Any, poll_s: float, quiet: bool, echo: Echo = print) -> None:
    """The scheduler's passes until `cluster down` (or Ctrl-C, SIGTERM) has drained every job."""
    stop = {"n": 0}

    def on_signal(signum, frame):  # only sets a flag
        stop["n"] += 1

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    sched.recover()
    last_event, last_table, last_nodes = 0, "", sched.capacity.nodes
    while True:
        if stop["n"] and not store.get_meta("down"):
            store.set_meta("down", True)
            echo("draining: running jobs checkpoint and stop")
        more = sched.tick()
        if sched.capacity.nodes != last_nodes:
            last_nodes = sched.capacity.nodes
            echo(f"{time.strftime('%H:%M:%S')} nodes: {nodes_line([(n.name, n.slots) for n in last_nodes])}")
        for e in store.events():
            if e.id > last_event:
                last_event = e.id
                echo(f"{time.strftime('%H:%M:%S', time.localtime(e.time))} job {e.job_id}: "
                     f"{e.kind} {json.dumps(e.data) if e.data else ''}".rstrip())
        if not quiet:
            table = jobs_table(store.jobs(), store.dir)
            if table != last_table:
                echo(table)
                last_table = table
        if not more:
            echo("cluster down: every job stopped at a checkpoint (continue with `cluster up`)")
            return
        time.sleep(poll_s)


class AccumulatedRate:
    """Steps/s by worker count of a job that keeps a constant global batch: its profile's Eq. 5
    curve as the accumulated step (:class:`~elastic_ring.perfmodel.accumulated.AccumulatedModel`,
    the simulator's model). ``micro_batches``: the most workers that can share its batch (the
    scheduler gives it no more)."""

    def __init__(self, model: Any) -> None:
        self.model, self.micro_batches = model, int(model.micro_batches)

    def __call__(self, w: int) -> float:
        return float(self.model.predict(w))


def rate_for(cfg: ClusterConfig) -> Callable[[JobRow], Callable[[int], float]]:
    """Job row -> steps/s by worker count: its profile's Eq. 5 model, else linear (assumed).

    A job under ``constant-batch`` (its ``--lr-scaling``/``--set lr_scaling``, or the profile's
    ``"scaling"``, as the simulator reads a workload) trains the same global batch per step at
    every size: its rate is the accumulated step's (:class:`AccumulatedRate`), with the global
    batch its ``--global-batch`` (else the profile's ``global_batch``, else 8 x the profile's
    per-worker batch, the simulator's default). Without a profile the micro-batches are unknown:
    linear, as for any job."""
    from elastic_ring.perfmodel.accumulated import RULES, accumulated
    from elastic_ring.perfmodel.speed import load_profile

    def rate(job: JobRow) -> Callable[[int], float]:
        path = job.request.profile or cfg.profile
        if path:
            try:
                model, d = load_profile(Path(path))
            except Exception:  # noqa: BLE001 - a bad profile must not stop the scheduler
                return lambda w: float(w)
            rule, g, _ = job.request.batch_rule()
            rule = rule or (str(d.get("scaling", RULES[1])) if "scaling" in d or "global_batch" in d else "")
            if rule == RULES[1]:
                try:
                    return AccumulatedRate(accumulated(model, g or float(d.get("global_batch") or 0)
                                                      or 8.0 * float(model.m)))
                except (ConfigError, TypeError, ValueError):  # a global batch the profile's batch does not divide
                    pass
            return lambda w, m=model: float(m.predict(w))
        return lambda w: float(w)

    return rate


def drain(cluster_dir: str | Path, wait: bool = True, timeout: float = 600.0) -> str:
    """Ask the scheduler on the folder to drain (running jobs checkpoint at their next agreed step
    and stop; the scheduler exits) and, with ``wait``, wait until it has; returns what to print.

    Raises:
        UserError: no scheduler runs on the folder, or it did not drain within ``timeout`` seconds.
    """
    from elastic_ring.cluster.store import Store

    d = Path(cluster_dir)
    store = Store(d)
    lock = SchedulerLock(d)
    if not lock.held_by_other():
        raise UserError(f"no scheduler runs on {d}")
    store.set_meta("down", True)
    if not wait:
        return f"drain requested for {d}"
    t0 = time.time()
    while lock.held_by_other():
        if time.time() - t0 > timeout:
            raise UserError(f"the scheduler on {d} did not drain within {timeout:g} s")
        time.sleep(0.5)
    return f"cluster {d} is down"
