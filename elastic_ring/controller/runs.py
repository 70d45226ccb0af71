"""Starting or resuming a run: one path for `elastic-ring train`, the profiler and the experiment
runner (the cluster runner starts `elastic-ring train` processes, so it takes the same path).

A :class:`RunRequest` holds what was asked, as the command line says it (every field optional);
:func:`prepare` checks it and turns it into a :class:`PreparedRun` (the validated ``RunSpec``, the
training config, the resize plan and where to start), creating the run folder of a new run or
taking over the folder of a resumed one; :func:`start_or_resume` then runs the controller.

Bad input raises :class:`~elastic_ring.errors.UserError` (one line, exit status 2) before any
process starts.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from elastic_ring.controller.api import Plan, Resize, RunSpec
from elastic_ring.errors import UserError
from elastic_ring.worker.hvd_elastic import NO_STEP_CAP, uses_horovod_elastic

RELAUNCH_CHOICES = ("auto", "prelaunch", "overlap", "sequential", "inplace")


@dataclass(frozen=True)
class RunRequest:
    """What a caller asks for (the options of `elastic-ring train`; None: not given)."""

    workers: int | None = None
    script: str | None = None
    script_args: tuple[str, ...] = ()
    resize_at: int | None = None
    resize_to: int | None = None
    schedule: str | None = None
    resizes: tuple[Resize, ...] = ()  # a parsed schedule (runners), instead of resize_at/schedule
    config_path: str | None = None
    overrides: tuple[str, ...] = ()
    config: Any = None  # a resolved TrainConfig (runners); excludes config_path/overrides/ResNet options
    steps: int | None = None
    depth: int | None = None
    dataset: str | None = None
    data_dir: str | None = None
    batch_size: int | None = None
    lr: float | None = None
    seed: int | None = None
    resize_warmup: int | None = None
    device: str = "auto"
    slots: int | None = None
    hosts: str | None = None
    hostfile: str | None = None
    network_interface: str | None = None
    relaunch: str = "auto"
    checkpoint_every: int | None = None
    checkpoint_every_s: float | None = None
    keep: int | None = None
    max_restarts: int = 3
    stall_timeout: float | None = None
    run_dir: str | None = None
    resume_dir: str | None = None
    replace: bool = False  # clear an existing run folder first (runners redoing an unfinished run)
    backend: str = "horovodrun"  # or "ray": workers as Ray actors (controller.backends.ray)
    ray_address: str | None = None
    placement: str = "PACK"
    warm_spares: int | None = None

    def resnet_options(self) -> tuple[Any, ...]:
        return (self.depth, self.dataset, self.data_dir, self.batch_size, self.lr, self.seed,
                self.resize_warmup)


@dataclass
class PreparedRun:
    """A checked request: the blueprint, the recipe, the plan, and where the run starts."""

    spec: RunSpec
    cfg: Any  # TrainConfig, or None for a user's script
    plan: Plan
    start_step: int
    segment: int
    relaunch: str
    extra: dict[str, Any] = field(default_factory=dict)
    stall_timeout: float | None = None  # given, or kept in run.json by the run's start (resumes)


def check(req: RunRequest) -> None:
    """The checks that need nothing but the request (raises UserError)."""
    resnet = any(v is not None for v in req.resnet_options())
    if req.resume_dir and (req.config_path or req.overrides or req.config is not None or req.script
                           or req.script_args or req.steps is not None or resnet):
        raise UserError("--resume continues a run with its own config and script: drop the config "
                        "and script options")
    if req.script_args and not req.script:
        raise UserError(f"unexpected argument {req.script_args[0]!r} (script arguments go after "
                        f"`--script PATH --`)")
    if req.script:
        if not Path(req.script).is_file():
            raise UserError(f"script {req.script} does not exist")
        if req.config_path or req.overrides or req.config is not None or resnet:
            raise UserError("--script runs your own model: the ResNet options (--config, --set, --depth, "
                            "--dataset, --batch-size, --lr, ...) do not apply; pass your script's "
                            "own options after --")
        if req.steps is None and not uses_horovod_elastic(req.script):
            raise UserError("--script needs --steps (the total steps of the run)")
    if (req.resize_at is None) != (req.resize_to is None):
        raise UserError("--resize-at and --to go together")
    if sum(bool(x) for x in (req.schedule, req.resize_at is not None, req.resizes)) > 1:
        raise UserError("use either --resize-at/--to or --schedule, not both")
    if req.hosts and req.hostfile:
        raise UserError("use either --hosts or --hostfile, not both")
    if req.relaunch not in RELAUNCH_CHOICES:
        raise UserError(f"--relaunch must be one of {', '.join(RELAUNCH_CHOICES)}")
    if req.relaunch == "inplace" and (req.hosts or req.hostfile):
        raise UserError("--relaunch inplace runs on one host: drop --hosts/--hostfile, or use "
                        "another relaunch mode")
    if req.backend == "ray" and (req.hosts or req.hostfile):
        raise UserError("--backend ray takes its nodes from the Ray cluster: drop --hosts/--hostfile")
    if req.backend == "ray" and req.relaunch not in ("auto", "inplace"):
        raise UserError(f"--backend ray resizes in place (warm workers): drop --relaunch {req.relaunch}")
    if req.backend != "ray" and (req.ray_address or req.warm_spares is not None or req.placement != "PACK"):
        raise UserError("--ray-address, --placement and --warm-spares go with --backend ray")
    if req.warm_spares is not None and req.warm_spares < 0:
        raise UserError(f"--warm-spares must be >= 0, got {req.warm_spares}")
    _check_numbers(req)


def _check_numbers(req: RunRequest) -> None:
    if req.slots is not None and req.slots < 1:
        raise UserError(f"--slots must be >= 1, got {req.slots}")
    if req.max_restarts < 0:
        raise UserError(f"--max-restarts must be >= 0, got {req.max_restarts}")
    if req.stall_timeout is not None and req.stall_timeout < 0:
        raise UserError(f"--stall-timeout must be >= 0 seconds (0: off), got {req.stall_timeout}")
    if req.keep is not None and req.keep < 1:
        raise UserError(f"--keep must be >= 1, got {req.keep}")


def resolve_device(device: str, echo: Callable[[str], None] | None = None):
    """(cpu|cuda, usable GPUs, the GPU report or None); on cuda, Horovod must have NCCL
    (``elastic_ring.telemetry.gpu``)."""
    from elastic_ring.telemetry import gpu

    device, n, rep = gpu.resolve_device(device)
    gpu.check_nccl(device, warn=echo)
    return device, n, rep


def _slots(req: RunRequest, device: str, ngpu: int) -> int:
    from elastic_ring.controller.api import parse_hostfile, parse_hosts

    host_list = parse_hosts(req.hosts) if req.hosts else parse_hostfile(req.hostfile) if req.hostfile else None
    if host_list:
        return sum(n for _, n in host_list)
    if device == "cuda":
        return ngpu
    return req.slots or (os.cpu_count() or 1)


def _schedule(req: RunRequest) -> tuple[Resize, ...]:
    from elastic_ring.controller.api import parse_schedule

    if req.resizes:
        return tuple(req.resizes)
    if req.resize_at is not None:
        return (Resize(req.resize_at, req.resize_to),)
    return parse_schedule(req.schedule) if req.schedule else ()


def prepare(req: RunRequest, echo: Callable[[str], None]) -> PreparedRun:
    """Check ``req`` and get its run folder ready (a new one created, a resumed one taken over)."""
    from elastic_ring.telemetry.gpu import exclusive_fallback

    check(req)
    if req.backend == "ray":  # before anything is made: not minutes of Ray's retries at the start
        from elastic_ring.controller.backends.ray import check_answers

        check_answers(req.ray_address or os.environ.get("RAY_ADDRESS"))
    device, ngpu, rep = resolve_device(req.device, echo)
    n_slots = _slots(req, device, ngpu)
    sched = _schedule(req)
    relaunch = req.relaunch if req.relaunch != "auto" else ("prelaunch" if device == "cuda" else "overlap")
    relaunch, why = exclusive_fallback(relaunch, device, rep)
    if req.resume_dir:
        run = _prepare_resume(req, device, n_slots, sched, echo)
    else:
        run = _prepare_new(req, device, n_slots, sched, relaunch, echo, rep)
    run.relaunch = relaunch
    run.extra.update(gpu_report=rep, relaunch_note=why)
    if run.cfg is not None:
        from elastic_ring.controller.rundir import ensure_dataset_cache

        ensure_dataset_cache(run.spec.run_dir, run.cfg)  # a resumed run's cache may have been deleted
    return run


def _config(req: RunRequest, device: str):
    from elastic_ring.config.api import load_config
    from elastic_ring.config.base import parse_overrides

    if req.config is not None:
        return req.config
    ov = parse_overrides(req.overrides)
    for k, v in (("total_steps", req.steps), ("depth", req.depth), ("dataset", req.dataset),
                 ("data_dir", req.data_dir), ("batch_size", req.batch_size), ("lr", req.lr),
                 ("seed", req.seed), ("resize_warmup_steps", req.resize_warmup)):
        if v is not None:
            ov[k] = v
    return load_config(req.config_path, ov, device=device)


def _fresh_folder(req: RunRequest, echo: Callable[[str], None]) -> Path:
    rd = Path(req.run_dir) if req.run_dir else Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    if rd.exists() and any(rd.iterdir()):
        if not req.replace:
            raise UserError(f"run folder {rd} already exists and is not empty "
                            f"(continue it with --resume {rd}, or pick another --run-dir)")
        if not (rd / "run.json").exists():
            raise UserError(f"{rd} exists and is not an elastic-ring run folder: move it away")
        import shutil

        echo(f"clearing the earlier (unfinished or replaced) run in {rd}")
        shutil.rmtree(rd)
    return rd


def _prepare_new(req: RunRequest, device: str, n_slots: int, sched: tuple[Resize, ...],
                 relaunch: str, echo: Callable[[str], None], rep: Any = None) -> PreparedRun:
    from elastic_ring.controller.lock import RunLock
    from elastic_ring.controller.rundir import create_run_dir, writing

    rd = _fresh_folder(req, echo)
    cfg = None if req.script else _config(req, device)
    total = (NO_STEP_CAP if req.steps is None else req.steps) if req.script else cfg.total_steps
    spec = RunSpec(run_dir=rd.resolve(), workers=req.workers if req.workers is not None else 1,
                   schedule=sched, slots=n_slots, device=device, total_steps=total, hosts=req.hosts,
                   hostfile=req.hostfile, script=str(Path(req.script).resolve()) if req.script else None,
                   script_args=tuple(req.script_args), checkpoint_every=req.checkpoint_every or 0,
                   checkpoint_every_s=60.0 if req.checkpoint_every_s is None else req.checkpoint_every_s,
                   keep=req.keep or 2)
    if device == "cpu" and rep is not None:  # --device auto chose the CPU: say so
        from elastic_ring.telemetry.gpu import check_cpu_fallback

        check_cpu_fallback([r.step for r in sched], total, rep)
    spec.validate()
    if cfg is not None:  # the built-in model (a --script run's controller never imports torch)
        from elastic_ring.data import check_dataset

        check_dataset(cfg.dataset, cfg.data_dir)
    with writing(rd):
        rd.mkdir(parents=True, exist_ok=True)
        RunLock(rd).acquire()
    create_run_dir(spec, cfg, relaunch=relaunch, stall_timeout=req.stall_timeout)
    return PreparedRun(spec, cfg, Plan.from_spec(spec.workers, spec.schedule), 0, 0, relaunch,
                       stall_timeout=req.stall_timeout)


def _prepare_resume(req: RunRequest, device: str, n_slots: int, sched: tuple[Resize, ...],
                    echo: Callable[[str], None]) -> PreparedRun:
    from elastic_ring.ckpt import CheckpointStore
    from elastic_ring.config.api import load_config
    from elastic_ring.controller.lock import RunLock, stop_stale_workers
    from elastic_ring.controller.rundir import update_run_info, update_worker_settings, worker_settings
    from elastic_ring.events.api import read_events

    rd = Path(req.resume_dir)
    if not (rd / "run.json").exists():
        raise UserError(f"{rd} is not an elastic-ring run folder (no run.json)")
    RunLock(rd).acquire()  # a live controller: exit 2, nothing touched
    stale = stop_stale_workers(rd)
    if stale:
        echo(f"stopped {len(stale)} process(es) the previous controller left running")
    run_info = json.loads((rd / "run.json").read_text())
    script = run_info.get("script")
    cfg = None if script else load_config(rd / "config.yaml")
    total = int(run_info.get("total_steps") or (cfg.total_steps if cfg else 0))
    keep_now = req.keep or int(run_info.get("worker", {}).get("keep", 2))
    ckpt = CheckpointStore(rd / "checkpoints", keep=keep_now).load_latest(warn=echo)
    start_step = int(ckpt["step"]) if ckpt else 0
    if ckpt is None:
        echo(f"elastic-ring: no checkpoint in {rd / 'checkpoints'}: the run starts again at step 1")
    if start_step >= total:
        raise UserError(f"run {rd} already finished (step {start_step} of {total})")
    plan = _resume_plan(rd, run_info, start_step, req.workers, sched)
    old_ws = run_info.get("worker", {})
    spec = RunSpec(run_dir=rd.resolve(), workers=plan.world_after(start_step),
                   schedule=plan.resizes_after(start_step), slots=n_slots, device=device,
                   total_steps=total, hosts=req.hosts, hostfile=req.hostfile, script=script,
                   script_args=tuple(run_info.get("script_args", [])),
                   checkpoint_every=int(req.checkpoint_every if req.checkpoint_every is not None
                                        else old_ws.get("checkpoint_every", 0)),
                   checkpoint_every_s=float(req.checkpoint_every_s if req.checkpoint_every_s is not None
                                            else old_ws.get("checkpoint_every_s", 60.0)),
                   keep=keep_now)
    validate_resume(spec, start_step)
    update_worker_settings(rd, **worker_settings(spec, cfg))
    stall = req.stall_timeout if req.stall_timeout is not None else run_info.get("stall_timeout")
    if req.stall_timeout is not None:  # kept for later resumes (a cluster's stop and resume too)
        update_run_info(rd, stall_timeout=req.stall_timeout)
    segment = len(read_events(rd / "events.jsonl", kind="launch"))
    return PreparedRun(spec, cfg, plan, start_step, segment, req.relaunch, stall_timeout=stall)


def _resume_plan(rd: Path, run_info: dict[str, Any], start_step: int, workers: int | None,
                 sched: tuple[Resize, ...]) -> Plan:
    from elastic_ring.protocol import PLAN_FILE, read_json

    plan_d = read_json(rd / PLAN_FILE)
    plan = (Plan.from_dict(plan_d) if plan_d else
            Plan.from_spec(int(run_info["workers"]),
                           tuple(Resize(int(s), int(t)) for s, t in run_info.get("schedule", []))))
    if workers is not None:
        plan.add(start_step, workers, "resume")
    if sched:
        plan.replace_after(start_step, sched)
    return plan


def validate_resume(spec: RunSpec, start_step: int) -> None:
    """The checks of a new run (RunSpec.validate), plus: every resize lies after the checkpoint."""
    if spec.workers > spec.slots:
        raise UserError(f"cannot resume with {spec.workers} workers: only {spec.slots} slot(s)")
    for r in spec.schedule:
        if r.step <= start_step:
            raise UserError(f"resize at step {r.step} is not after the checkpoint (step {start_step})")
    spec.validate()


def describe(run: PreparedRun) -> list[str]:
    """The lines `train` prints before it starts."""
    spec, cfg = run.spec, run.cfg
    rep = run.extra.get("gpu_report")
    lines = [f"elastic-ring: {rep.line()}"] if rep is not None else []
    if spec.device == "cpu":
        first = (f"elastic-ring: no GPU in use: {spec.workers} CPU worker process(es) with gloo "
                 f"({spec.slots} slot(s)); run folder {spec.run_dir}")
    else:
        first = (f"elastic-ring: {spec.workers} GPU worker(s) (NCCL + gloo), {spec.slots} GPU slot(s); "
                 f"run folder {spec.run_dir}")
    what = (f"script {spec.script}" if spec.script else
            f"model ResNet-{cfg.depth} (width {cfg.width}) on {cfg.dataset}, batch {cfg.batch_size}/worker")
    length = f"{spec.total_steps} steps" if spec.total_steps < NO_STEP_CAP else "until its function returns"
    second = (f"{what}, {length}"
              + (f", from step {run.start_step + 1}" if run.start_step else "") + ", schedule: "
              + (", ".join(f"step {r.step} -> {r.to}" for r in spec.schedule) or "no resize"))
    lines += [first, second]
    if run.extra.get("relaunch_note"):
        lines.append(f"elastic-ring: {run.extra['relaunch_note']}")
    return lines


def start_or_resume(req: RunRequest, echo: Callable[[str], None], out: Callable[[str], None] | None = None,
                    show_progress: bool | None = None) -> dict[str, Any]:
    """Check ``req``, get its folder ready, run the controller to the end; returns the summary.

    Raises:
        UserError: bad input (nothing started).
        WorkerFailedError: the run failed (restarts exhausted or not retried).
    """
    from elastic_ring.controller.controller import Controller

    run = prepare(req, echo)
    for line in describe(run):
        echo(line)
    backend = None
    if req.backend == "ray":
        from elastic_ring.controller.backends.ray import RayBackend

        run.relaunch = "inplace"  # the Controller's in-place path; the backend forms the rings
        backend = RayBackend(run.spec, address=req.ray_address, strategy=req.placement,
                             warm_spares=req.warm_spares,
                             gpus_per_worker=1.0 if run.spec.device == "cuda" else 0.0, out=echo)
        echo(f"backend: Ray ({req.ray_address or os.environ.get('RAY_ADDRESS') or 'a local Ray'}), "
             f"placement {req.placement}, warm workers across resizes")
    ctl = Controller(run.spec, lr_scaling=run.cfg.lr_scaling if run.cfg else "linear", out=out,
                     network_interface=req.network_interface, relaunch=run.relaunch,
                     max_restarts=req.max_restarts, plan=run.plan, stall_timeout=run.stall_timeout,
                     show_progress=show_progress, backend=backend)
    summary = ctl.run(run.start_step, run.spec.workers, run.segment)
    return {**summary, "total_steps": run.spec.total_steps}
