"""``elastic-ring cluster up|down``, ``submit``, ``jobs``, ``cancel``: the scheduler on a real node.

A cluster is a folder (``--dir``, default ``./cluster`` or ``$ELASTIC_RING_CLUSTER``) holding
``cluster.db`` (SQLite, WAL: jobs, allocations, decisions, events), ``jobs/<id>/`` (each job's run
folder) and ``logs/``. ``cluster up`` runs the scheduler in the foreground; the other commands
only write to or read the database, so they work from any shell of a user who can write the
folder. Nothing listens on a network port unless asked: ``cluster up --web [HOST:]PORT`` or
``cluster web`` serve a read-only page and Prometheus ``/metrics`` (elastic_ring.cluster.web).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
from pathlib import Path

import click

from elastic_ring.cluster.api import LIVE_POLICIES
from elastic_ring.errors import UserError

CTX = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _default_dir() -> str:
    return os.environ.get("ELASTIC_RING_CLUSTER", "cluster")


dir_option = click.option("--dir", "cluster_dir", type=click.Path(file_okay=False), default=_default_dir,
                          show_default="./cluster or $ELASTIC_RING_CLUSTER", help="The cluster folder.")


def _parse_hostfile(path: str) -> tuple[tuple[str, int], ...]:
    from elastic_ring.controller.api import parse_hostfile

    return tuple((h, int(n)) for h, n in parse_hostfile(path))


class _SchedulerLock:
    def __init__(self, d: Path) -> None:
        from elastic_ring.cluster.api import LOCK_FILE

        self.path = d / LOCK_FILE
        self.fd: int | None = None

    def acquire(self) -> None:
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


@click.group(context_settings=CTX)
def cluster() -> None:
    """Run the scheduler on this node: `cluster up` (foreground), `cluster down` (drain), `cluster web`
    (the read-only page and /metrics).

    \b
    elastic-ring cluster up --slots 4 --policy precompute --dir cluster --web 8080
    elastic-ring submit examples/mlp_digits.py --steps 300 --max-workers 4 --dir cluster
    elastic-ring jobs --dir cluster
    elastic-ring cluster down --dir cluster
    """


@cluster.command("up", context_settings=CTX)
@click.option("--slots", type=int, default=None,
              help="Slots on this host: GPUs (--device cuda) or CPU worker processes (may exceed the "
                   "cores: jobs then share them). Default: what the folder's cluster had.")
@click.option("--hostfile", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Slots on several hosts, 'host slots=N' per line; jobs get horovodrun -H lists "
                   "(resizes are then stop + resume on the new hosts).")
@click.option("--ray", "ray_address", is_flag=False, flag_value="", default=None, metavar="[ADDRESS]",
              help="Slots from a Ray cluster's alive nodes (their CPUs, or GPUs with --device cuda), read "
                   "at every pass: jobs grow onto a node that joins; they run with --backend ray. "
                   "ADDRESS: default $RAY_ADDRESS, else a local Ray started here.")
@click.option("--policy", type=click.Choice(list(LIVE_POLICIES)), default=None,
              help="Allocation policy of elastic_ring.sched (the simulator's). Default precompute, or "
                   "the folder's. exploratory: a new job holds the largest power of two <= min(8, slots) "
                   "slots and is resized through 1, 2, 4, ... on them, measured from its own throughput "
                   "(first window after each launch skipped), then planned with the Eq. 5 fit. "
                   "precompute-rc, optimus-rc, srtf-rc: grow a running job only when the steps gained over "
                   "10 resize costs exceed the steps the resize costs, with each job's cost measured from "
                   "its resize_overhead events (before the first: all jobs' median, else 3.5 s on CPU, 10 s "
                   "on GPUs); vetoed grows are grow_vetoed events.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None,
              help="Slot kind (default cpu, or the folder's). cuda: each job's GPUs via CUDA_VISIBLE_DEVICES.")
@click.option("--network-interface", default=None, help="Passed to every job's horovodrun (e.g. lo).")
@click.option("--profile", type=click.Path(exists=True, dir_okay=False), default=None,
              help="profile.json (Eq. 5) for jobs submitted without one; without: linear speed-up.")
@click.option("--poll", type=float, default=0.5, show_default=True, help="Seconds between scheduler passes.")
@click.option("--quiet", is_flag=True, help="No job table, only events.")
@click.option("--web", default=None, metavar="[HOST:]PORT",
              help="Also serve the read-only cluster page and Prometheus /metrics on this address "
                   "(host 127.0.0.1 unless given; reach it from elsewhere through an ssh tunnel).")
@dir_option
def up(slots, hostfile, ray_address, policy, device, network_interface, profile, poll, quiet, web, cluster_dir):
    """Start the scheduler on the cluster folder (creating it), in the foreground.

    It takes submitted jobs, decides allocations at every arrival, completion and cancellation
    with the policy, starts each job under its own `train` controller and resizes it live. Its
    state is in DIR/cluster.db: after a crash (even kill -9), `cluster up` on the same folder
    re-attaches to the controllers that still run and resumes the others from their checkpoints.
    Ctrl-C or SIGTERM drains, as `cluster down` does. With --ray the slots are the Ray cluster's,
    and the policy decides again whenever a node joins or leaves.
    """
    from elastic_ring.cluster.ray_slots import slot_source
    from elastic_ring.cluster.runner import ProcessRunner
    from elastic_ring.cluster.scheduler import Scheduler, live_policy
    from elastic_ring.cluster.store import Store
    from elastic_ring.cluster.web import bind, parse_bind

    d = Path(cluster_dir)
    _check_up(slots, hostfile, ray_address, poll)
    _check_folder(d, new_slots=any(x is not None for x in (slots, hostfile, ray_address)))
    web_addr = parse_bind(web, "--web") if web is not None else None
    lock = _SchedulerLock(d)
    lock.acquire()
    sock = bind(*web_addr) if web_addr is not None else None
    store = Store(d, create=True)
    cfg = _config(store, slots, hostfile, ray_address, policy, device, network_interface, profile, poll)
    source = slot_source(cfg)
    address = source.connect() if cfg.ray is not None else None
    try:
        if cfg.ray is not None:  # the nodes seen now (what `jobs` shows until the scheduler's next pass)
            cfg = dataclasses.replace(cfg, hosts=tuple((n.name, n.slots) for n in source.capacity().nodes))
            store.set_meta("nodes", [list(h) for h in cfg.hosts])
        elif any(len(j["slots"]) and max(j["slots"]) >= cfg.slots for j in store.jobs(active_only=True)):
            raise UserError(f"jobs of {d} hold slots beyond the {cfg.slots} asked; start with the same slots")
        store.set_meta("config", cfg.to_dict())
        store.set_meta("down", False)
        store.set_meta("scheduler_pid", os.getpid())
        runner = ProcessRunner(d, cfg, ray_address=address)
        sched = Scheduler(store, cfg, live_policy(cfg.policy, max(cfg.slots, 1), cfg.device), runner, rate_for=_rate_for(cfg),
                          slots=source)
        click.echo(_banner(cfg, d, address))
        if sock is not None:
            from elastic_ring.cluster.web import WebServer

            server = WebServer(d, sock)
            server.start()
            click.echo(f"web page: {server.url} (metrics: {server.url}metrics)")
        _loop(store, sched, cfg.poll_s, quiet)
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()


def _check_up(slots, hostfile, ray_address, poll) -> None:
    if slots is not None and slots < 1:
        raise UserError(f"--slots must be >= 1, got {slots}")
    if sum(x is not None for x in (slots, hostfile, ray_address)) > 1:
        raise UserError("give one of --slots, --hostfile and --ray")
    if poll <= 0:
        raise UserError(f"--poll must be > 0, got {poll}")


def _check_folder(d: Path, new_slots: bool) -> None:
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


def _config(store, slots, hostfile, ray_address, policy, device, network_interface, profile, poll):
    """The cluster's config: the options given, else the folder's previous one."""
    from elastic_ring.cluster.api import ClusterConfig

    old = store.config()
    ray = None
    if ray_address is not None:
        hosts, ray = (), ray_address  # "": $RAY_ADDRESS, else a local Ray
    elif hostfile:
        hosts = _parse_hostfile(hostfile)
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
                         poll_s=poll, profile=str(Path(profile).resolve()) if profile else (old.profile if old else None),
                         ray=ray)


def _banner(cfg, d: Path, address: str | None) -> str:
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


def _loop(store, sched, poll_s: float, quiet: bool) -> None:
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
            click.echo("draining: running jobs checkpoint and stop")
        more = sched.tick()
        if sched.capacity.nodes != last_nodes:
            last_nodes = sched.capacity.nodes
            click.echo(f"{time.strftime('%H:%M:%S')} nodes: {_nodes_line([(n.name, n.slots) for n in last_nodes])}")
        for e in store.events():
            if e["id"] > last_event:
                last_event = e["id"]
                click.echo(f"{time.strftime('%H:%M:%S', time.localtime(e['time']))} job {e['job_id']}: "
                           f"{e['kind']} {json.dumps(e['data']) if e['data'] else ''}".rstrip())
        if not quiet:
            table = _table(store.jobs(), store.dir)
            if table != last_table:
                click.echo(table)
                last_table = table
        if not more:
            click.echo("cluster down: every job stopped at a checkpoint (continue with `cluster up`)")
            return
        time.sleep(poll_s)


def _nodes_line(nodes) -> str:
    return (", ".join(f"{h}:{n}" for h, n in nodes) or "none") + f" ({sum(n for _, n in nodes)} slot(s))"


def _rate_for(cfg):
    """Job row -> steps/s by worker count: its profile's Eq. 5 model, else linear (assumed)."""
    from elastic_ring.perfmodel.speed import load_profile

    def rate_for(job):
        path = job["request"].profile or cfg.profile
        if path:
            try:
                model, _ = load_profile(Path(path))
                return lambda w, m=model: float(m.predict(w))
            except Exception:  # noqa: BLE001 - a bad profile must not stop the scheduler
                pass
        return lambda w: float(w)

    return rate_for


@cluster.command("web", context_settings=CTX)
@click.option("--bind", "address", default="127.0.0.1:8080", show_default=True, metavar="[HOST:]PORT",
              help="Address to serve on (host 127.0.0.1 unless given; 0: any free port).")
@dir_option
def web(address, cluster_dir):
    """Serve the read-only page and Prometheus /metrics of a cluster folder, in the foreground.

    It only reads the folder (while `cluster up` schedules it from another process, and while that
    scheduler restarts): the queue and every job, a timeline of the slots with each resize,
    restart and policy decision, per-job curves, updated every second. The page performs no
    action. From another machine: ssh -L 8080:127.0.0.1:8080 NODE, then open localhost:8080.
    """
    from elastic_ring.cluster.web import WebServer, bind, check_dir, parse_bind

    d = Path(cluster_dir)
    check_dir(d)
    sock = bind(*parse_bind(address, "--bind"))
    server = WebServer(d, sock)
    click.echo(f"web page: {server.url} (metrics: {server.url}metrics), reading {d.resolve()}")
    server.serve()


@cluster.command("down", context_settings=CTX)
@click.option("--no-wait", is_flag=True, help="Return at once instead of waiting for the drain.")
@click.option("--timeout", type=float, default=600.0, show_default=True, help="Seconds to wait for the drain.")
@dir_option
def down(no_wait, timeout, cluster_dir):
    """Drain the cluster: running jobs checkpoint at their next agreed step and stop; the
    scheduler exits. `cluster up` on the folder resumes them."""
    from elastic_ring.cluster.store import Store

    d = Path(cluster_dir)
    store = Store(d)
    lock = _SchedulerLock(d)
    if not lock.held_by_other():
        raise UserError(f"no scheduler runs on {d}")
    store.set_meta("down", True)
    if no_wait:
        click.echo(f"drain requested for {d}")
        return
    t0 = time.time()
    while lock.held_by_other():
        if time.time() - t0 > timeout:
            raise UserError(f"the scheduler on {d} did not drain within {timeout:g} s")
        time.sleep(0.5)
    click.echo(f"cluster {d} is down")


@click.command(context_settings=CTX)
@click.argument("target", type=click.Path(exists=True, dir_okay=False), metavar="CONFIG_OR_SCRIPT")
@click.option("--name", default=None, help="Job name (default: the file's stem).")
@click.option("--steps", type=int, default=None, help="Total steps (needed for a script).")
@click.option("--min-workers", type=int, default=1, show_default=True, help="Fewest workers the job runs on.")
@click.option("--max-workers", type=int, default=0, help="Most workers (default: the cluster's slots).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Config override (config jobs).")
@click.option("--profile", type=click.Path(exists=True, dir_okay=False), default=None,
              help="The job's profile.json (Eq. 5), used by precompute, optimus and srtf.")
@click.option("--target-loss", type=float, default=None,
              help="Remaining work = Eq. 1's predicted steps to reach this loss (capped by --steps).")
@click.option("--checkpoint-every", type=int, default=None, metavar="STEPS", help="Passed to train.")
@dir_option
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def submit(target, name, steps, min_workers, max_workers, sets, profile, target_loss, checkpoint_every,
           cluster_dir, script_args):
    """Queue a job: a user script (.py, run with `train --script`; its own arguments after --) or
    a config (.yaml, the built-in ResNet). Prints the job id."""
    from elastic_ring.cluster.api import ClusterError, JobRequest
    from elastic_ring.cluster.store import Store

    p = Path(target).resolve()
    kind = "script" if p.suffix == ".py" else "config" if p.suffix in (".yaml", ".yml") else None
    if kind is None:
        raise ClusterError(f"{target}: submit a script (.py) or a config (.yaml)")
    if kind == "config" and script_args:
        raise ClusterError("arguments after -- are for scripts; a config takes --set KEY=VALUE")
    if kind == "script" and sets:
        raise ClusterError("--set is for configs; give a script its own arguments after --")
    store = Store(Path(cluster_dir))
    cfg = store.config()
    fixed = cfg is not None and cfg.ray is None  # a Ray cluster's slots change as nodes join
    if fixed and max_workers > cfg.slots:
        raise ClusterError(f"--max-workers {max_workers} is more than the cluster's {cfg.slots} slots")
    if fixed and min_workers > cfg.slots:
        raise ClusterError(f"--min-workers {min_workers} is more than the cluster's {cfg.slots} slots")
    if checkpoint_every is not None and checkpoint_every < 0:
        raise ClusterError(f"--checkpoint-every must be >= 0, got {checkpoint_every}")
    train_args = ("--checkpoint-every", str(checkpoint_every)) if checkpoint_every else ()
    req = JobRequest(name=name or p.stem, kind=kind, path=str(p), steps=steps, min_workers=min_workers,
                     max_workers=max_workers, sets=tuple(sets), args=tuple(script_args),
                     profile=str(Path(profile).resolve()) if profile else None, target_loss=target_loss,
                     train_args=train_args)
    if kind == "config":
        _check_config(req, cfg.device if cfg is not None else "cpu")
    jid = store.submit(req)
    click.echo(f"job {jid} ({req.name}) submitted to {cluster_dir}")
    if not _SchedulerLock(Path(cluster_dir)).held_by_other():
        click.echo(f"elastic-ring: warning: no scheduler runs on {cluster_dir}: job {jid} waits in the queue "
                   f"until `elastic-ring cluster up --dir {cluster_dir}`", err=True)


def _check_config(req, device: str) -> None:
    """A config job's config as its `train` will read it (file, --set, --steps), so that a bad key
    or value is refused here, in one line, and not found later in the job's log."""
    from elastic_ring.config.api import load_config
    from elastic_ring.config.base import parse_overrides

    overrides = parse_overrides(req.sets)
    if req.steps:
        overrides["total_steps"] = req.steps
    load_config(req.path, overrides, device=device)


# why the scheduler stopped a job (the store's message), as `jobs` says it
_STOP_WORDS = {"cancel": "cancel requested", "preempt": "preempted", "resize": "moving to other slots",
               "explore": "next exploration size", "down": "cluster down"}


def _state_text(j, cluster_dir: Path | None = None) -> str:
    """The state column: the state, and why for a stopping or paused job (a failed job's reason is
    printed under the table, a cancelled job's is its state); for a running job, what its run says
    when it is not plain stepping (``running (resizing 1 -> 2)``), from the run's own state."""
    from elastic_ring.cluster.api import JobState, job_dir
    from elastic_ring.controller.status import live_note

    state, msg = j["state"], j["message"]
    if state == JobState.RUNNING and not msg:
        rd = j.get("run_dir") or (job_dir(cluster_dir, j["id"]) if cluster_dir is not None else None)
        note = live_note(rd) if rd is not None and Path(rd).is_dir() else None
        return f"{state.value} ({note})" if note else state.value
    if not msg or state.terminal:
        return state.value
    return f"{state.value} ({_STOP_WORDS.get(msg, msg)})"


def _table(jobs, cluster_dir: Path | None = None) -> str:
    from elastic_ring.cluster.api import JobState, job_log

    rows = [("id", "name", "state", "workers", "step/total", "images/s", "submitted", "JCT")]
    notes = []
    for j in jobs:
        total = j["total"] or j["request"].steps or "?"
        jct = f"{j['finished'] - j['submitted']:.1f} s" if j["finished"] else ""
        rows.append((str(j["id"]), j["name"], _state_text(j, cluster_dir),
                     str(j["workers"] or len(j["slots"])), f"{j['step']}/{total}", f"{j['images_per_s']:.0f}",
                     time.strftime("%H:%M:%S", time.localtime(j["submitted"])), jct))
        if j["state"] == JobState.FAILED:
            log = job_log(cluster_dir, j["id"]) if cluster_dir is not None else None
            notes.append(f"job {j['id']} failed: {j['message'] or 'no reason recorded'}"
                         + (f" (log: {log})" if log is not None and log.exists() else ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows] + notes)


def _job_json(j, cluster_dir: Path) -> dict:
    """One job for `jobs --json`: the store's row, with its run folder and log where they exist."""
    from elastic_ring.cluster.api import job_dir, job_log

    out = {k: (v.value if k == "state" else v.to_dict() if k == "request" else v) for k, v in j.items()}
    rd, log = job_dir(cluster_dir, j["id"]), job_log(cluster_dir, j["id"])
    out["run_dir"] = out["run_dir"] or (str(rd.resolve()) if rd.is_dir() else None)
    out["log"] = str(log.resolve()) if log.exists() else None
    return out


@click.command(context_settings=CTX)
@click.option("--json", "as_json", is_flag=True, help="Print the jobs as JSON.")
@dir_option
def jobs(as_json, cluster_dir):
    """The cluster's jobs: state, workers, step/total, images/s, submitted, JCT."""
    from elastic_ring.cluster.store import Store

    store = Store(Path(cluster_dir))
    rows = store.jobs()
    if as_json:
        click.echo(json.dumps([_job_json(j, Path(cluster_dir)) for j in rows], indent=1))
    else:
        cfg = store.config()
        if cfg is not None and cfg.ray is not None:
            click.echo(f"Ray nodes: {_nodes_line(store.get_meta('nodes') or [list(h) for h in cfg.hosts])}")
        click.echo(_table(rows, Path(cluster_dir)))


@click.command(context_settings=CTX)
@click.argument("job")
@dir_option
def cancel(job, cluster_dir):
    """Cancel a job by id or name: a queued one is dropped, a running one stops at a checkpoint."""
    from elastic_ring.cluster.api import ClusterError
    from elastic_ring.cluster.store import Store

    store = Store(Path(cluster_dir))
    j = store.find(job)
    if j["state"].terminal:
        raise ClusterError(f"job {j['id']} is already {j['state'].value}")
    store.update(j["id"], cancel=1)
    store.event(j["id"], "cancel_requested")
    click.echo(f"job {j['id']} ({j['name']}): cancel requested")
