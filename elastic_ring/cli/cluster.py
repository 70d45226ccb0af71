"""``elastic-ring cluster up|down``, ``submit``, ``jobs``, ``cancel``: the scheduler on a real node.

A cluster is a folder (``--dir``, default ``./cluster`` or ``$ELASTIC_RING_CLUSTER``) holding
``cluster.db`` (SQLite, WAL: jobs, allocations, decisions, events), ``jobs/<id>/`` (each job's run
folder) and ``logs/``. ``cluster up`` runs the scheduler in the foreground; the other commands
only write to or read the database, so they work from any shell of a user who can write the
folder. Nothing listens on a network port unless asked: ``cluster up --web [HOST:]PORT`` or
``cluster web`` serve a read-only page and Prometheus ``/metrics`` (elastic_ring.cluster.web).

Each command parses its options and calls one function: the scheduler is
:mod:`elastic_ring.cluster.daemon`, the rest :mod:`elastic_ring.cluster.client`.
"""

from __future__ import annotations

from pathlib import Path

import click

from elastic_ring.cluster.api import LIVE_POLICIES

CTX = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _default_dir() -> str:
    from elastic_ring import env

    return env.cluster_dir()


dir_option = click.option("--dir", "cluster_dir", type=click.Path(file_okay=False), default=_default_dir,
                          show_default="./cluster or $ELASTIC_RING_CLUSTER", help="The cluster folder.")


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
    from elastic_ring.cluster.daemon import run

    run(cluster_dir, slots, hostfile, ray_address, policy, device, network_interface, profile, poll, quiet, web,
        echo=click.echo)


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
    from elastic_ring.cluster.daemon import drain

    click.echo(drain(cluster_dir, wait=not no_wait, timeout=timeout))


@click.command(context_settings=CTX)
@click.argument("target", type=click.Path(exists=True, dir_okay=False), metavar="CONFIG_OR_SCRIPT")
@click.option("--name", default=None, help="Job name (default: the file's stem).")
@click.option("--steps", type=int, default=None,
              help="Total steps (needed for a script, except one of torchrun's contract: docs/torchrun.md).")
@click.option("--min-workers", type=int, default=1, show_default=True, help="Fewest workers the job runs on.")
@click.option("--max-workers", type=int, default=0, help="Most workers (default: the cluster's slots).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Config override (config jobs).")
@click.option("--profile", type=click.Path(exists=True, dir_okay=False), default=None,
              help="The job's profile.json (Eq. 5), used by precompute, optimus and srtf.")
@click.option("--target-loss", type=float, default=None,
              help="Remaining work = Eq. 1's predicted steps to reach this loss (capped by --steps).")
@click.option("--checkpoint-every", type=int, default=None, metavar="STEPS", help="Passed to train.")
@click.option("--lr-scaling", type=click.Choice(["linear", "sqrt", "none", "constant-batch", "auto"]), default=None,
              help="Passed to train; under constant-batch the scheduler plans with the accumulated step's speed.")
@click.option("--global-batch", type=click.IntRange(min=1), default=None, metavar="N",
              help="Passed to train (with --lr-scaling constant-batch, or a config that sets it).")
@dir_option
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def submit(target, name, steps, min_workers, max_workers, sets, profile, target_loss, checkpoint_every,
           lr_scaling, global_batch, cluster_dir, script_args):
    """Queue a job: a user script (.py, run with `train --script`; its own arguments after --) or
    a config (.yaml, the built-in ResNet). Prints the job id. The job runs in this shell's folder,
    where the script's relative paths point."""
    from elastic_ring.cluster.client import submit as submit_job

    job = submit_job(cluster_dir, target, name, steps, min_workers, max_workers, sets, profile, target_loss,
                     checkpoint_every, script_args, lr_scaling=lr_scaling, global_batch=global_batch or 0)
    click.echo(f"job {job.job_id} ({job.name}) submitted to {cluster_dir}")
    if not job.scheduler_running:
        click.echo(f"elastic-ring: warning: no scheduler runs on {cluster_dir}: job {job.job_id} waits in the "
                   f"queue until `elastic-ring cluster up --dir {cluster_dir}`", err=True)


@click.command(context_settings=CTX)
@click.option("--json", "as_json", is_flag=True, help="Print the jobs as JSON.")
@dir_option
def jobs(as_json, cluster_dir):
    """The cluster's jobs: state, workers, step/total, images/s, submitted, JCT."""
    from elastic_ring.cluster.client import jobs_view

    click.echo(jobs_view(cluster_dir, as_json))


@click.command(context_settings=CTX)
@click.argument("job")
@dir_option
def cancel(job, cluster_dir):
    """Cancel a job by id or name: a queued one is dropped, a running one stops at a checkpoint."""
    from elastic_ring.cluster.client import cancel as cancel_job

    click.echo(cancel_job(cluster_dir, job))
