"""`elastic-ring train`, `elastic-ring resize`, `elastic-ring drain`, `elastic-ring status`."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import click
import yaml

from elastic_ring.errors import EXIT_REQUEUE, UserError

DEVICE_CHOICES = click.Choice(["auto", "cpu", "cuda"])


def _echo(msg: str) -> None:
    click.echo(msg, err=True)


@click.command(context_settings={"max_content_width": 100})
@click.option("--workers", "--gpus", "workers", default=None, metavar="N|MIN:MAX",
              help="Workers to start with: one GPU each on a GPU node, a CPU process each otherwise "
                   "(--gpus is the same option). MIN:MAX (as Horovod Elastic's --min-np/--max-np): start at "
                   "MAX, or at every slot where fewer (fewer than MIN: refused), never resized above MAX, the "
                   "schedule within the bounds; with --host-discovery-script the same as --min-workers MIN "
                   "--max-workers MAX. [default: 1; at --resume: the size the run was at or was going to]")
@click.option("--script", type=click.Path(dir_okay=False), default=None, metavar="PATH",
              help="Run your own Horovod script (written with elastic_ring.worker, or for Horovod "
                   "Elastic as it is, or a torchrun script as it is: docs/torchrun.md) instead of the "
                   "built-in ResNet; its own arguments go after `--`. "
                   "The run ends with the script's `job.epochs()` loop or its @hvd.elastic.run function, "
                   "or at --steps (needed by a `job.steps()` loop; otherwise a cap). Its workers run in "
                   "the folder this command is run in, as `python PATH` would (at --resume: the run's "
                   "first); it is read, not run, before anything starts.")
@click.option("--resize-at", type=int, default=None, metavar="STEP",
              help="Resize after this step completes (with --to).")
@click.option("--to", "resize_to", type=int, default=None, metavar="N", help="Workers after --resize-at.")
@click.option("--schedule", default=None, metavar="STEP:N[,STEP:N...]",
              help="Several resizes, e.g. 5000:8,10000:4 (steps increasing).")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), default=None,
              help="YAML config. [default: configs/paper.yaml on GPUs, configs/cpu_small.yaml on the CPU]")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override any config key (repeatable), e.g. --set depth=56.")
@click.option("--steps", type=int, default=None,
              help="Total steps of the schedule (config: total_steps); with --resume, the run's new total "
                   "(its LR decays stay at their steps).")
@click.option("--depth", type=int, default=None, help="ResNet depth 6n+2: 20, 32, 44, 56, 110.")
@click.option("--dataset", type=click.Choice(["cifar10", "synthetic", "digits"]), default=None,
              help="Training data (config: dataset).")
@click.option("--data-dir", default=None, type=click.Path(file_okay=False),
              help="Where CIFAR-10 lives: cifar-10-python.tar.gz or its cifar-10-batches-py/ folder "
                   "(nothing is downloaded). [default: data]")
@click.option("--batch-size", type=int, default=None, help="Per-worker batch (config: batch_size).")
@click.option("--lr", type=float, default=None, help="LR per lr_reference_batch images (config: lr).")
@click.option("--seed", type=int, default=None, help="Seed of data order, augmentation and weights.")
@click.option("--lr-scaling", type=click.Choice(["auto", "linear", "sqrt", "none", "constant-batch"]),
              default=None,
              help="The LR at a new world size: linear (Eq. 7: x w_new / w_old), sqrt, none (kept), or "
                   "auto: as the script scales it (its optimizer's LR as built at the new size over that "
                   "at the old: a script built with lr=base * hvd.size() gets Eq. 7, one built with "
                   "lr=base keeps its LR); or constant-batch: the global batch stays --global-batch at every "
                   "worker count, each worker accumulating gradients over its share of micro-batches of the "
                   "per-worker batch, and the LR stays. [default: auto for a --script; the config's (linear) "
                   "for the built-in ResNet]")
@click.option("--resize-warmup", type=int, default=None, metavar="STEPS",
              help="Ramp the LR to its Eq. 7 value over STEPS after a resize (0: at once).")
@click.option("--global-batch", type=int, default=None, metavar="N",
              help="--lr-scaling constant-batch: samples per step, a multiple of the per-worker batch; every "
                   "worker count of the run must be at most N / batch (uneven shares allowed). [default: the "
                   "ResNet's --batch-size x the initial workers; a --script must give it]")
@click.option("--device", type=DEVICE_CHOICES, default="auto", show_default=True,
              help="cuda: one GPU per worker (NCCL); cpu: CPU processes with gloo; auto: cuda if NVIDIA GPUs are found.")
@click.option("--slots", type=int, default=None,
              help="Worker slots on this machine (CPU). [default: CPU cores; on GPUs: visible GPUs]")
@click.option("--hosts", default=None, metavar="H:N[,H:N...]",
              help="Hosts and slots, handed to horovodrun -H. Over several hosts, as under "
                   "--host-discovery-script: a failed worker's host is left out for a cooldown, then grown back "
                   "onto; `drain` and a worker's SIGTERM shrink off a host; --relaunch inplace runs over them. "
                   "[default: inside a Slurm allocation with no --hostfile or --slots, its nodes and tasks (or "
                   "GPUs) per node: see docs/hosts.md]")
@click.option("--hostfile", type=click.Path(exists=True, dir_okay=False), default=None,
              help="horovodrun hostfile ('host slots=N' lines).")
@click.option("--host-discovery-script", default=None, type=click.Path(dir_okay=False), metavar="PATH",
              help="The hosts come from this executable, run every --discovery-interval: it prints the hosts "
                   "available now, one HOST:SLOTS per line (Horovod Elastic's contract). When the usable "
                   "slots change, the workers stop at an agreed step with a checkpoint and go on at the size "
                   "they allow on those hosts (horovodrun over hosts; nothing redone); below --min-workers "
                   "the job waits (`status`: waiting for hosts). A script that fails keeps the last hosts "
                   "(one line). --workers N is then the size asked, capped by the hosts discovered, as are "
                   "--schedule's and `resize --to`'s. Not with --hosts/--hostfile/--slots, --backend ray, "
                   "--collective torch. See docs/hosts.md.")
@click.option("--discovery-interval", type=float, default=None, metavar="SECONDS",
              help="Seconds between two runs of --host-discovery-script. [default: 1]")
@click.option("--min-workers", type=int, default=None, metavar="N",
              help="--host-discovery-script: fewer usable slots than N and the job waits for hosts. [default: 1]")
@click.option("--max-workers", type=int, default=None, metavar="N",
              help="--host-discovery-script: the job grows to at most N workers. [default: every usable slot]")
@click.option("--min-wait", type=float, default=None, metavar="SECONDS",
              help="--host-discovery-script: after this long below --min-workers the run stops, its "
                   "checkpoint kept (--resume goes on). [default: it waits]")
@click.option("--blacklist-cooldown-range", "cooldown_range", default=None, metavar="LOW:HIGH",
              help="--host-discovery-script or several --hosts: a host whose worker failed is left out for "
                   "LOW seconds, then 2 LOW, 4 LOW, ... at most HIGH at its next failures; the job grows back onto it "
                   "after. [default: 10:300]")
@click.option("--network-interface", default=None, help="Passed to horovodrun (e.g. lo for several local 'hosts').")
@click.option("--host-probe", default=None, metavar="CMD",
              help="--hosts/--hostfile: how to ask whether a host still answers: CMD HOST is run (a shell-like "
                   "command line, the host appended), exit status 0 = it answers; every host is asked, this "
                   "machine's names too, at each launch and every 5 s while the run runs. A host that stops "
                   "answering while its ranks make no step for 5 s is a stall: those ranks restart without it, the "
                   "host left out for its cooldown, grown back onto after it when it answers again. "
                   "[default: ssh HOST true, this machine's names never asked]")
@click.option("--relaunch", type=click.Choice(["auto", "prelaunch", "overlap", "sequential", "inplace"]),
              default="auto", show_default=True,
              help="prelaunch: start the new workers before the stop; they import and build the model, then "
                   "wait for the checkpoint. overlap: start them once the checkpoint is written, while the old "
                   "ones exit. sequential: wait for the old workers to exit first (the paper's way). inplace: "
                   "one long-lived Horovod Elastic job; at a resize the workers pause between two steps, the "
                   "discovery script reports the new slot count, survivors keep their processes (imports, data, "
                   "CUDA context) and re-form the ring, a new worker syncs from rank 0; no checkpoint or "
                   "relaunch for the resize. What inplace cannot do that the others can: run on several hosts "
                   "(--hosts/--hostfile are refused), and resize without Horovod's rendezvous (a removed "
                   "worker is ended by Horovod: its log shows an abort); a failed worker still restarts the "
                   "run from the last checkpoint. auto: prelaunch on GPUs, overlap on the CPU (where the new "
                   "workers' start-up would compete with training for the cores).")
@click.option("--backend", type=click.Choice(["horovodrun", "ray"]), default="horovodrun", show_default=True,
              help="ray: the workers are Ray actors in a placement group on a Ray cluster (--ray-address); "
                   "they stay warm across resizes: survivors re-form the ring in their process, a joiner "
                   "comes from pre-started spare actors (--warm-spares). --relaunch does not apply.")
@click.option("--collective", type=click.Choice(["horovod", "torch"]), default=None,
              help="The workers' collectives: horovod (horovodrun, or Horovod on Ray), or torch "
                   "(torch.distributed: gloo on the CPU, NCCL on GPUs; one process per worker on this "
                   "host, no horovodrun; with --hosts/--hostfile horovodrun only launches them; or Ray "
                   "actors with --backend ray; the built-in ResNet uses "
                   "DistributedDataParallel; every --relaunch mode: inplace keeps the processes and "
                   "re-forms the process group). [default: horovod; a --script that uses torch.distributed "
                   "and not Horovod: torch; at --resume: the run's own]")
@click.option("--ray-address", default=None, metavar="ADDRESS",
              help="Ray cluster to run on (--backend ray). [default: $RAY_ADDRESS, else a local Ray]")
@click.option("--placement", type=click.Choice(["PACK", "SPREAD"]), default="PACK", show_default=True,
              help="Ray placement group strategy of the workers: PACK (fewest nodes) or SPREAD.")
@click.option("--warm-spares", type=int, default=None, metavar="N",
              help="Spare Ray actors kept warm (torch and the collective imported) for the next grow. "
                   "[default: enough to grow to --slots]")
@click.option("--survive/--no-survive", default=None,
              help="--backend ray or --relaunch inplace: a failed worker (or one the stall watchdog ends) is a "
                   "shrink, not a restart: the other workers keep their processes, roll back to the last step "
                   "they all completed (a copy of its state kept in memory) and go on without it; a restart "
                   "from the checkpoint when they cannot (no step in common or copies of it that differ, a "
                   "survivor silent or dead too; inplace on Horovod with --device cuda: a lost rank below a "
                   "survivor's), and the restart says why. Inplace: a new worker then takes the dead one's place after "
                   "the survivors' next step, its state by broadcast. Both collectives (with --collective "
                   "torch: gloo only, not --device cuda). Failures still count toward --max-restarts. [default: on where the "
                   "launcher can keep survivors and the per-step state copy costs at most 2% of a step, as the "
                   "workers measure it in the first steps (one line says which and why); --no-survive: always "
                   "the restart from the checkpoint]")
@click.option("--checkpoint-every", type=int, default=None, metavar="STEPS",
              help="Also checkpoint every STEPS steps, in the background (0: off). [default: 0]")
@click.option("--checkpoint-every-s", type=float, default=None, metavar="SECONDS",
              help="Also checkpoint every SECONDS of training, in the background (0: off). A crash "
                   "then costs at most this much training plus a restart. [default: 60]")
@click.option("--keep", type=int, default=None, help="Checkpoints kept (a corrupt newest one falls "
              "back to the one before). [default: 2]")
@click.option("--max-restarts", type=int, default=3, show_default=True,
              help="Restart the workers from the last checkpoint after this many failures in a row "
                   "(a worker's exception, kill -9, OOM, horovodrun failing); an error that repeats "
                   "at the same step is not retried. 0: fail at once.")
@click.option("--stall-timeout", type=float, default=None, metavar="SECONDS",
              help="Kill and restart the workers (from the last checkpoint) when the job makes no "
                   "step for this long; a worker in the stopped state is found after 5 s. Longer "
                   "allowances at start-up, checkpoints and evaluations. 0: off (Gloo's own timeout "
                   "only). [default: max(10x the median "
                   "step time, 30 s)]")
@click.option("--stop-grace", type=float, default=None, metavar="SECONDS",
              help="A --script of torchrun's contract (it calls init_process_group and imports neither "
                   "elastic_ring nor horovod; docs/torchrun.md): at a resize, an interrupt or a failure every "
                   "worker gets SIGTERM, then SIGKILL after this long, as under torchrun. [default: 30, "
                   "torchrun's; at --resume: the run's]")
@click.option("--grace", type=float, default=None, metavar="SECONDS",
              help="A SIGTERM to this command (Ctrl-C too): the workers checkpoint at the next agreed step "
                   "within SECONDS, else they are killed and the last checkpoint stands; then the run ends "
                   "stopped (--resume goes on). Also how long a worker's SIGTERM notice may take under "
                   "--host-discovery-script [default: 30 there]. Inside a Slurm job (SLURM_JOB_ID), SIGUSR1 "
                   "does the same and the exit status is 75: requeue (docs/hosts.md). [default: no limit]")
@click.option("--run-dir", type=click.Path(file_okay=False), default=None,
              help="Run folder (events, logs, checkpoints). [default: runs/<time>]")
@click.option("--resume", "resume_dir", type=click.Path(file_okay=False), default=None,
              help="Continue the run in this folder from its last checkpoint, at the size it was at "
                   "or was going to, with its remaining resizes (stops workers a killed controller "
                   "left behind); with --steps N, on to N steps (a finished run too).")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
def train(workers, script, resize_at, resize_to, schedule, config_path, overrides, steps, depth, dataset,
          data_dir, batch_size, lr, seed, lr_scaling, resize_warmup, global_batch, device, slots, hosts,
          hostfile, host_discovery_script, discovery_interval, min_workers, max_workers, min_wait, cooldown_range,
          network_interface, host_probe, relaunch, backend, collective, ray_address, placement, warm_spares, survive,
          checkpoint_every, checkpoint_every_s, keep, max_restarts, stall_timeout, stop_grace, grace, run_dir,
          resume_dir, script_args):
    """Train on Horovod or torch.distributed workers (a CIFAR ResNet, or your --script); resize them live.

    \b
    On an 8-GPU node, the paper's experiment (ResNet-110, CIFAR-10, 4 -> 8 GPUs at step 5000):
        elastic-ring train --gpus 4 --resize-at 5000 --to 8
    On the CPU (gloo), the small default (ResNet-20/8 on the offline digits set):
        elastic-ring train --gpus 1 --resize-at 60 --to 2
    Your own script (see examples/), with its own arguments after --:
        elastic-ring train --script examples/mlp_digits.py --steps 600 --gpus 1 --resize-at 200 --to 2 -- --hidden 64

    At each resize the workers agree on the step, write a checkpoint and exit, and the controller
    relaunches them at the new count (--relaunch inplace and --backend ray: the workers that stay keep
    their processes and re-form the ring); they rescale the learning rate by Eq. 7
    (lr_new = w_new / w_last * lr_last); with --lr-scaling constant-batch the global batch and the LR
    stay the same at every count instead (the workers accumulate micro-batches). While it runs, `elastic-ring resize RUN_DIR --to N` resizes
    live from another shell and `elastic-ring status RUN_DIR` shows progress. Everything lands in
    RUN_DIR: events.jsonl (typed events, incl. each resize's overhead breakdown), logs/, checkpoints/,
    summary.json. Ctrl-C stops at the next step with a checkpoint; --resume continues, and
    --resume RUN_DIR --steps N takes a run (a finished one too) on to N steps in all.
    `elastic-ring runs` lists the runs under runs/; `elastic-ring logs RUN_DIR -f` follows one.

    \b
    The summary's resize table, per resize:
      stop s      resize asked (a scheduled one: its step done) -> the old workers exited,
                  the checkpoint write (ckpt s) included
      relaunch s  the new workers started -> their first step; started before the old ones
                  exit (all modes but sequential), it overlaps the stop and can exceed lost s
      lost s      resize asked -> first step at the new size, less one steady step: the
                  training time the resize cost

    wall is the time the run ran; a run stopped and resumed also shows the elapsed time.

    A worker that dies is restarted from the last checkpoint (--max-restarts), and so is a job that
    makes no step for --stall-timeout (a hung worker); under --survive (inplace and Ray: on by default
    where the state copy is cheap) the others go on from the step they hold in memory instead. Checkpoints are also
    taken periodically in the background (--checkpoint-every, --checkpoint-every-s). One controller
    owns a run folder at a time; its workers exit by themselves within seconds if it is killed.
    """
    from elastic_ring.controller.api import RunState
    from elastic_ring.controller.runs import RunRequest, start_or_resume
    from elastic_ring.controller.summary import render

    from elastic_ring.hosts.api import parse_workers

    parsed = parse_workers(workers) if workers is not None else None
    req = RunRequest(workers=parsed if isinstance(parsed, int) else None,
                     worker_range=parsed if isinstance(parsed, tuple) else None, script=script, script_args=tuple(script_args), resize_at=resize_at,
                     resize_to=resize_to, schedule=schedule, config_path=config_path,
                     overrides=tuple(overrides), steps=steps, depth=depth, dataset=dataset,
                     data_dir=data_dir, batch_size=batch_size, lr=lr, seed=seed, lr_scaling=lr_scaling,
                     resize_warmup=resize_warmup, global_batch=global_batch, device=device, slots=slots,
                     hosts=hosts,
                     hostfile=hostfile, network_interface=network_interface, relaunch=relaunch,
                     checkpoint_every=checkpoint_every, checkpoint_every_s=checkpoint_every_s, keep=keep,
                     max_restarts=max_restarts, stall_timeout=stall_timeout, run_dir=run_dir,
                     resume_dir=resume_dir, backend=backend, ray_address=ray_address, placement=placement,
                     warm_spares=warm_spares, survive=survive, collective=collective, stop_grace=stop_grace,
                     host_discovery_script=host_discovery_script, discovery_interval=discovery_interval,
                     min_workers=min_workers, max_workers=max_workers, min_wait=min_wait,
                     cooldown_range=cooldown_range, grace=grace, host_probe=host_probe)
    summary = start_or_resume(req, _echo)
    click.echo(render(summary, summary.get("total_steps")))
    if summary["state"] == RunState.STOPPED.value:
        sys.exit(EXIT_REQUEUE if summary.get("requeue") else 130)


@click.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--to", "target", type=int, required=True, metavar="N", help="Workers after the resize.")
def resize(run_dir, target):
    """Ask the running `elastic-ring train` in RUN_DIR to resize to N workers now.

    The workers stop at the next step boundary all ranks agree on, checkpoint, and are relaunched
    at the new count (LR rescaled by Eq. 7). Returns at once; watch with `elastic-ring status`.
    A request not yet taken is replaced by a new one, and withdrawn by one to the current size.
    """
    from elastic_ring.controller.requests import request_resize

    click.echo(request_resize(run_dir, target))


@click.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.argument("host")
@click.option("--deadline", type=float, default=None, metavar="SECONDS",
              help="How long the shrink may take before the host's workers are stopped, as a failure. "
                   "[default: 60]")
def drain(run_dir, host, deadline):
    """Ask the running `elastic-ring train` in RUN_DIR to leave HOST now (a host taken away with notice).

    The workers stop at the next step boundary all ranks agree on, checkpoint, and go on on the other
    hosts (with --relaunch inplace the others go on in their processes, no checkpoint): no step is
    redone, and it is not a failure (--max-restarts untouched). HOST stays out until
    the discovery script stops listing it and lists it again. Needs a run with
    --host-discovery-script (docs/hosts.md). Returns at once; `elastic-ring status` shows
    `draining HOST` until it is done.
    """
    from elastic_ring.controller.requests import request_drain

    click.echo(request_drain(run_dir, host, deadline))


@click.command()
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def status(run_dir, as_json):
    """Print the state and summary table of a run: starting, running, resizing A -> B, restarting,
    stopping, finished, failed, stopped (Ctrl-C, or aborted during start-up) or crashed (its
    controller is gone: continue with --resume)."""
    from elastic_ring.controller.status import read_status
    from elastic_ring.controller.summary import render, summarize
    from elastic_ring.controller.survive_choice import recorded
    from elastic_ring.events.api import read_events

    rd = Path(run_dir)
    evs = read_events(rd / "events.jsonl")
    st = read_status(rd, evs)
    s = summarize(evs)
    s.update(state=st.line(), step=st.step, world_size=st.world_size)
    survive, survive_line = recorded(evs)  # whether a failure's survivors go on, and why
    if as_json:
        s.update(phase=st.phase.value, total_steps=st.total_steps, pid=st.pid, vote_every=st.vote_every,
                 vote_lag=st.vote_lag, hosts=st.hosts, survive=survive)
        click.echo(json.dumps(s, indent=2))
        return
    latency = st.stop_latency_line()
    hosts = st.hosts if st.hosts and not st.waiting_for_hosts else None  # (waiting: the state line says it)
    click.echo(render(s, st.total_steps) + "".join(f"\n\n{x}" for x in (hosts, survive_line, latency) if x))
