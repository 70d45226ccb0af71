"""Starting or resuming a run: one path for `elastic-ring train`, the profiler and the experiment
runner (the cluster runner starts `elastic-ring train` processes, so it takes the same path).

A :class:`RunRequest` holds what was asked, as the command line says it (every field optional);
:func:`prepare` checks it and turns it into a :class:`PreparedRun` (the validated ``RunSpec``, the
training config, the resize plan and where to start), creating the run folder of a new run or
taking over the folder of a resumed one; :func:`start_or_resume` then runs the controller.
Where the workers run (a Slurm allocation, host discovery, the slots) is decided in
:mod:`.prepare_hosts`; what a resume reads and checks of its folder is :mod:`.resume`.

Bad input raises :class:`~elastic_ring.errors.UserError` (one line, exit status 2) before any
process starts.
"""

from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from elastic_ring import protocol
from elastic_ring.controller.api import Plan, Resize, RunSpec
from elastic_ring.controller.prepare_hosts import (_slots, fixed_kept, host_manager, hosts_slots, with_run_discovery,
                                                   with_slurm_hosts)
from elastic_ring.controller.requests import (RunRequest, check, check_torch_survive, range_start, with_script_collective,
                                              with_worker_range)
from elastic_ring.controller.resume import (_resume_plan, _resumed_collective, _resumed_cwd, _write_new_total,
                                            check_resumable, extended_config, read_run_info, validate_resume)
from elastic_ring.env import ray_address
from elastic_ring.errors import Interrupted, UserError


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
    survive: bool = False  # the workers are launched keeping survivors (forced on, or measuring: ``choice``)
    forced_survive: bool | None = None  # --survive / --no-survive, given or kept in run.json (None: the default)
    choice: Any = None  # survive_choice.Choice: on, off, or measure first


def resolve_device(device: str, echo: Callable[[str], None] | None = None, collective: str = "horovod"):
    """(cpu|cuda, usable GPUs, the GPU report or None); on cuda, the collective must have NCCL
    (Horovod's build, or torch's: ``elastic_ring.telemetry.gpu``)."""
    from elastic_ring.telemetry import gpu

    try:
        device, n, rep = gpu.resolve_device(device)
    except UserError as e:
        if collective != "torch":
            raise
        raise UserError(f"--collective torch asks for NCCL with {e}") from None
    if collective != "torch":
        gpu.check_nccl(device, warn=echo)
    elif device == "cuda":
        from elastic_ring.controller.backends.local import check_torch_nccl

        check_torch_nccl()
    return device, n, rep


def _schedule(req: RunRequest) -> tuple[Resize, ...]:
    from elastic_ring.controller.api import parse_schedule

    if req.resizes:
        return tuple(req.resizes)
    if req.resize_at is not None:
        return (Resize(req.resize_at, req.resize_to),)
    return parse_schedule(req.schedule) if req.schedule else ()


def prepare(req: RunRequest, echo: Callable[[str], None]) -> PreparedRun:
    """Check ``req`` and get its run folder ready (a new one created, a resumed one taken over)."""
    from elastic_ring.controller import hvdrun

    req = with_slurm_hosts(req, echo)  # inside a Slurm allocation with no --hosts: its nodes
    check(req)
    req = with_worker_range(req)  # --workers MIN:MAX with host discovery: its --min/--max-workers
    req, inferred = with_script_collective(req)  # a torch.distributed script: --collective torch
    if req.collective is None and not req.resume_dir and not hvdrun.horovod_installed():
        from dataclasses import replace

        req = replace(req, collective="torch")
        inferred = ("elastic-ring: Horovod is not installed: the workers use --collective torch "
                    "(torch.distributed); the [horovod] extra adds Horovod (docs/install.md)")
    if inferred:
        check(req)  # what goes with --collective torch
    if req.resume_dir:
        check_resumable(Path(req.resume_dir), req.steps)  # before anything slow (torch, the GPUs)
        resumed = with_run_discovery(req)
        if resumed is not req:
            req = resumed
            check(req)
    claimed = None if req.resume_dir else _claim(req, echo)
    try:
        with preparing(claimed[0] if claimed else Path(req.resume_dir or "."), bool(req.resume_dir)):
            run = _prepare(req, echo, claimed[0] if claimed else None)
        if inferred:
            echo(inferred)  # once nothing can refuse the run (a refusal stays one line)
        return run
    except KeyboardInterrupt:
        if claimed is not None:
            _unclaim(*claimed)
        raise _interrupted(req, claimed[0] if claimed else None) from None
    except BaseException:
        if claimed is not None:
            _unclaim(*claimed)
        raise


@contextmanager
def preparing(rd: Path, resume: bool, stream: Any = None) -> Iterator[None]:
    """On a terminal, one line saying what the seconds before the launch go to (the config, torch's
    import, the dataset cache, the checkpoint), erased when they are over: nothing stays behind,
    not even before a one-line error. Elsewhere (a log, a pipe) nothing is written."""
    stream = stream or sys.stderr
    tty = hasattr(stream, "isatty") and stream.isatty()
    if tty:
        what = "checking its checkpoint" if resume else "config, torch and the dataset cache"
        stream.write(f"elastic-ring: preparing {rd} ({what}) ...")
        stream.flush()
    try:
        yield
    finally:
        if tty:
            stream.write("\r\033[K")
            stream.flush()


def _prepare(req: RunRequest, echo: Callable[[str], None], rd: Path | None) -> PreparedRun:
    from elastic_ring.telemetry.gpu import exclusive_fallback

    collective = req.collective or _resumed_collective(req) or "horovod"
    if req.backend == "ray":  # before anything slow: not minutes of Ray's retries at the start
        from elastic_ring import extras
        from elastic_ring.controller.backends.ray import check_answers
        from elastic_ring.controller.hvdrun import HOROVOD_HELP, horovod_installed

        extras.require("--backend ray", "ray")
        if collective == "horovod" and not horovod_installed():  # the controller forms Horovod's rings
            raise UserError(f"--collective horovod: Horovod is not installed: {HOROVOD_HELP}")
        check_answers(req.ray_address or ray_address())
    device, ngpu, rep = resolve_device(req.device, echo, collective)
    if collective == "horovod" and req.backend != "ray":  # a Horovod that cannot serve: one line, not a restart loop
        from elastic_ring.controller.hvdrun import check_horovod_patches, check_horovod_serves

        check_horovod_serves(device)
        check_horovod_patches(req.script)  # the Horovod internals it patches are still there
    if collective == "torch":  # (a resumed run keeps its --survive)
        resumed = protocol.read_run_json(Path(req.resume_dir)) if req.resume_dir else None
        check_torch_survive(device, bool(req.survive) or (req.survive is None and isinstance(resumed, dict)
                                                          and resumed.get("survive") is True))
    watched = host_manager(req, echo, collective)  # discovery, or a fixed host list as one that never changes
    hosts = watched if req.host_discovery_script else None  # (a fixed list's slots and start size: as before)
    n_slots = hosts_slots(hosts) if hosts is not None else _slots(req, device, ngpu)
    sched = _schedule(req)
    if req.worker_range is not None:  # on fixed slots: start at MAX or every slot; never more than MAX
        from dataclasses import replace

        req = replace(req, workers=range_start(req.worker_range, n_slots, sched))
        n_slots = min(n_slots, req.worker_range[1])
    torchrun = collective == "torch" and _torchrun_form(req)  # every worker stopped and started again
    if req.stop_grace is not None and not torchrun:
        raise UserError("--stop-grace goes with a script of torchrun's contract (docs/torchrun.md)")
    relaunch = req.relaunch if req.relaunch != "auto" else ("prelaunch" if device == "cuda" else "overlap")
    relaunch, why = ("sequential", None) if torchrun else exclusive_fallback(relaunch, device, rep)
    if rd is None:
        run = _prepare_resume(req, device, n_slots, sched, echo)
    else:
        run = _prepare_new(req, rd, device, n_slots, sched, relaunch, echo, rep, hosts)
    run.relaunch = relaunch
    run.choice = survive_choice(req, run, relaunch, torchrun)
    run.survive = run.choice.launches_survivors
    if hosts is not None:
        run.extra.update(hosts=hosts, asked_workers=req.workers, discovery=req.host_discovery_script)
    elif watched is not None:  # at the size the run starts at; a failed host left out, then grown back onto
        run.extra.update(hosts=watched, asked_workers=run.spec.workers, fixed_hosts=True)
    _keep_fixed(run.spec.run_dir, req, watched if hosts is None else None)
    if req.worker_range is not None:
        run.extra.update(worker_range=req.worker_range)
    run.extra.update(gpu_report=rep, relaunch_note=why)
    if torchrun:
        run.extra.update(torchrun=True, stop_grace=_stop_grace(req, run.spec.run_dir))
        run.stall_timeout = 0.0  # the controller sees no step of such a script: no stall to find
    if run.cfg is not None:
        from elastic_ring.controller.rundir import ensure_dataset_cache

        ensure_dataset_cache(run.spec.run_dir, run.cfg)  # a resumed run's cache may have been deleted
    return run


def _keep_fixed(rd: Path, req: RunRequest, fixed: Any) -> None:
    """``run.json``'s ``host_discovery`` for a watched fixed host list (:func:`.prepare_hosts.fixed_kept`);
    a resumed run no longer on one loses the one its start kept (a script's stays, for later resumes)."""
    from elastic_ring.controller.rundir import update_run_info

    kept = protocol.read_run_json(rd)
    kept = kept.get("host_discovery") if isinstance(kept, dict) else None
    if fixed is not None:
        update_run_info(rd, host_discovery=fixed_kept(req))
    elif isinstance(kept, dict) and not kept.get("script") and not req.host_discovery_script:
        update_run_info(rd, host_discovery=None)


def survive_choice(req: RunRequest, run: PreparedRun, relaunch: str, torchrun: bool) -> Any:
    """Whether the run keeps survivors after a failure (:func:`.survive_choice.initial`): forced by
    ``--survive``/``--no-survive`` (given, or kept by the run's start), else on where the launcher
    can and the copy proves cheap (measured by the workers: mode ``auto``)."""
    from elastic_ring.controller import survive_choice as sc

    hvd_elastic = False
    if run.spec.script and not torchrun:
        from elastic_ring.worker.hvd_elastic import uses_horovod_elastic

        hvd_elastic = uses_horovod_elastic(run.spec.script)
    return sc.initial(run.forced_survive, req.backend, relaunch, run.spec.collective, run.spec.device,
                      torchrun=torchrun, hvd_elastic=hvd_elastic)


def _torchrun_form(req: RunRequest) -> bool:
    """Whether the run's script (a resumed run's own) follows torchrun's contract only."""
    from elastic_ring.controller.backends.local import is_torchrun_script

    info = protocol.read_json(Path(req.resume_dir) / "run.json") if req.resume_dir else None
    script = (info.get("script") if isinstance(info, dict) else None) if req.resume_dir else req.script
    return is_torchrun_script(script)


def _stop_grace(req: RunRequest, rd: Path) -> float:
    """A torchrun-form run's grace between SIGTERM and SIGKILL: given, else the one its start recorded
    (``run.json``), else torchrun's default; recorded for later resumes."""
    from elastic_ring.controller.rundir import update_run_info
    from elastic_ring.worker.torchrun import DEFAULT_STOP_GRACE_S

    info = protocol.read_json(rd / "run.json")
    kept = info.get("stop_grace") if isinstance(info, dict) else None
    grace = req.stop_grace if req.stop_grace is not None else kept if isinstance(kept, (int, float)) \
        else DEFAULT_STOP_GRACE_S
    if grace != kept:
        update_run_info(rd, stop_grace=grace)
    return float(grace)


def _config(req: RunRequest, device: str):
    from elastic_ring.config.api import load_config
    from elastic_ring.config.base import parse_overrides

    if req.config is not None:
        return req.config
    ov = parse_overrides(req.overrides)
    for k, v in (("total_steps", req.steps), ("depth", req.depth), ("dataset", req.dataset),
                 ("data_dir", req.data_dir), ("batch_size", req.batch_size), ("lr", req.lr),
                 ("seed", req.seed), ("resize_warmup_steps", req.resize_warmup), ("lr_scaling", req.lr_scaling),
                 ("global_batch", req.global_batch)):
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


def _claim(req: RunRequest, echo: Callable[[str], None]) -> tuple[Path, Path | None]:
    """A new run's folder, made and locked before anything slow: `status` says "starting" from
    here on. Returns (folder, the outermost folder made here for it: None if it existed)."""
    from elastic_ring.controller.lock import RunLock
    from elastic_ring.controller.rundir import writing

    rd = _fresh_folder(req, echo)
    made = None
    for p in (rd, *rd.parents):  # runs/ for the default runs/DATE-TIME, too
        if p.exists():
            break
        made = p
    with writing(rd):
        rd.mkdir(parents=True, exist_ok=True)
        RunLock(rd).acquire()
    return rd, made


def _unclaim(rd: Path, made: Path | None) -> None:
    """Bad input or Ctrl-C before the run was recorded (run.json): leave no folder that would block
    a retry. A recorded run stays, to be resumed."""
    from elastic_ring.controller.lock import RunLock
    from elastic_ring.protocol import LOCK_FILE

    if (rd / "run.json").exists():
        return
    RunLock(rd).release()
    if made is not None:
        import shutil

        shutil.rmtree(made, ignore_errors=True)
    else:
        (rd / LOCK_FILE).unlink(missing_ok=True)


def _prepare_new(req: RunRequest, rd: Path, device: str, n_slots: int, sched: tuple[Resize, ...],
                 relaunch: str, echo: Callable[[str], None], rep: Any, hosts: Any = None) -> PreparedRun:
    from elastic_ring.controller.rundir import create_run_dir

    cfg = None if req.script else _config(req, device)
    if cfg is not None and cfg.shard and (req.collective or "horovod") != "torch":
        raise UserError("--set shard=true shards the built-in model with FSDP2 over torch.distributed: "
                        "add --collective torch")
    total = (req.steps if req.steps is not None else protocol.NO_STEP_LIMIT) if req.script else cfg.total_steps
    workers = req.workers if req.workers is not None else 1
    if hosts is not None:  # what the first answer allows (below the minimum: the minimum, once hosts come)
        workers = hosts.view(req.workers).target or hosts.bounds.min
    spec = RunSpec(run_dir=rd.resolve(), workers=workers,
                   schedule=sched, slots=n_slots, device=device, total_steps=total, hosts=req.hosts,
                   hostfile=req.hostfile, script=str(Path(req.script).resolve()) if req.script else None,
                   script_args=tuple(req.script_args), checkpoint_every=req.checkpoint_every or 0,
                   checkpoint_every_s=60.0 if req.checkpoint_every_s is None else req.checkpoint_every_s,
                   keep=req.keep or 2, collective=req.collective or "horovod", cwd=os.getcwd(),
                   lr_scaling=(req.lr_scaling or "auto") if req.script else None,
                   global_batch=(req.global_batch or 0) if req.script else 0)
    steps_given = (req.steps is not None or req.config_path or req.config is not None
                   or any(o.partition("=")[0].strip() == "total_steps" for o in req.overrides))
    if device == "cpu" and rep is not None and not steps_given:
        # --device auto chose the CPU and the CPU default config's steps apply: say so (with --steps
        # or a config of the user's own, the plain check of spec.validate() names the limit)
        from elastic_ring.telemetry.gpu import check_cpu_fallback

        check_cpu_fallback([r.step for r in sched], total, rep)
    spec.validate()
    if cfg is not None:
        cfg = constant_batch_config(cfg, spec.workers, [r.to for r in sched])
    if cfg is not None and cfg.dataset != "synthetic":  # a --script or synthetic run never imports torch
        from elastic_ring.data import check_dataset

        check_dataset(cfg.dataset, cfg.data_dir)
    kept = {"host_discovery": {"script": str(Path(req.host_discovery_script).resolve()),
                               "interval": req.discovery_interval, "min_workers": req.min_workers,
                               "max_workers": req.max_workers, "min_wait": req.min_wait,
                               "cooldown_range": req.cooldown_range}} if hosts else {}
    if req.worker_range is not None:  # --workers MIN:MAX on fixed slots: a live resize stays within
        kept["worker_range"] = list(req.worker_range)
    create_run_dir(spec, cfg, relaunch=relaunch, stall_timeout=req.stall_timeout, survive=req.survive, **kept)
    return PreparedRun(spec, cfg, Plan.from_spec(spec.workers, spec.schedule), 0, 0, relaunch,
                       stall_timeout=req.stall_timeout, forced_survive=req.survive)


def _prepare_resume(req: RunRequest, device: str, n_slots: int, sched: tuple[Resize, ...],
                    echo: Callable[[str], None]) -> PreparedRun:
    from elastic_ring.ckpt import CheckpointStore
    from elastic_ring.config.api import load_config
    from elastic_ring.controller.lock import RunLock, stop_stale_workers
    from elastic_ring.controller.rundir import update_run_info, update_worker_settings, worker_settings
    from elastic_ring.events.api import Launch, read_events

    rd = Path(req.resume_dir)
    if not (rd / "run.json").exists():
        raise UserError(f"{rd} is not an elastic-ring run folder (no run.json)")
    RunLock(rd).acquire()  # a live controller: exit 2, nothing touched
    stale = stop_stale_workers(rd)
    if stale:
        echo(f"stopped {len(stale)} process(es) the previous controller left running")
    run_info = read_run_info(rd)
    script = run_info.get("script")
    cfg = None if script else load_config(rd / "config.yaml")
    total = int(run_info.get("total_steps") or (cfg.total_steps if cfg else 0))
    keep_now = req.keep or int(run_info.get("worker", {}).get("keep", 2))
    # (checked, not loaded: the workers load it; the controller needs no torch for its step)
    ckpt_step = CheckpointStore(rd / "checkpoints", keep=keep_now).latest_step(warn=echo)
    start_step = ckpt_step or 0
    if ckpt_step is None:
        echo(f"elastic-ring: no checkpoint in {rd / 'checkpoints'}: the run starts again at step 1")
    old_total = total
    if req.steps is not None:
        if req.steps <= start_step:
            raise UserError(f"--steps {req.steps} is not after the run's checkpoint (step {start_step}): "
                            f"give the new total, more than {start_step}")
        total = req.steps
        if cfg is not None:
            cfg = extended_config(cfg, total)
    if start_step >= total:
        raise UserError(f"run {rd} already finished (step {start_step} of {total}); "
                        f"train it further with: elastic-ring train --resume {rd} --steps N")
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
                   keep=keep_now, collective=old_ws.get("collective", "horovod"),
                   cwd=_resumed_cwd(rd, old_ws),
                   lr_scaling=old_ws.get("lr_scaling", "linear") if script else None,
                   global_batch=int(old_ws.get("global_batch") or 0) if script else 0)
    if req.collective is not None and req.collective != spec.collective:
        raise UserError(f"--resume continues run {rd} with its own collective ({spec.collective}): "
                        f"drop --collective {req.collective}")
    validate_resume(spec, start_step)
    if cfg is not None and cfg.global_batch:  # constant-batch: the resumed run's world sizes share it
        constant_batch_config(cfg, spec.workers, [r.to for r in spec.schedule])
    if total != old_total:
        _write_new_total(rd, cfg, total)
        echo(f"elastic-ring: run {rd}: {old_total} -> {total} steps"
             + (f" (LR decays stay at steps {', '.join(map(str, cfg.decay_steps))})"
                if cfg is not None and cfg.decay_steps else ""))
    update_worker_settings(rd, **worker_settings(spec, cfg))
    stall = req.stall_timeout if req.stall_timeout is not None else run_info.get("stall_timeout")
    if req.stall_timeout is not None:  # kept for later resumes (a cluster's stop and resume too)
        update_run_info(rd, stall_timeout=req.stall_timeout)
    kept = run_info.get("survive")  # --survive / --no-survive kept, as the collective is (None: the default)
    forced = req.survive if req.survive is not None else kept if isinstance(kept, bool) else None
    if req.survive is not None and req.survive is not kept:
        update_run_info(rd, survive=req.survive)
    segment = len(read_events(rd / "events.jsonl", Launch))
    return PreparedRun(spec, cfg, plan, start_step, segment, req.relaunch, stall_timeout=stall,
                       forced_survive=forced)


def constant_batch_config(cfg: Any, workers: int, resize_to: "list[int]") -> Any:
    """A new run's config under ``constant-batch``: its global batch fixed (``batch_size`` x the
    initial ``workers`` where not given), and every world size of the run able to share it.

    Raises:
        UserError: a world size of the start or the schedule that cannot (the valid ones named).
    """
    from elastic_ring.worker.accumulate import RULE, layout_problem

    if cfg.lr_scaling != RULE:
        return cfg
    if not cfg.global_batch:
        cfg = cfg.model_copy(update={"global_batch": cfg.batch_size * workers})
    why = layout_problem(cfg.global_batch, cfg.batch_size, [workers, *resize_to])
    if why is not None:
        raise UserError(why)
    return cfg


def describe(run: PreparedRun) -> list[str]:
    """The lines `train` prints before it starts."""
    spec, cfg = run.spec, run.cfg
    rep = run.extra.get("gpu_report")
    lines = [f"elastic-ring: {rep.line()}"] if rep is not None else []
    hosts = run.extra.get("hosts")
    slots = f"{spec.slots} slot(s)" if hosts is None or run.extra.get("fixed_hosts") else "slots from host discovery"
    if spec.device == "cpu":
        first = (f"elastic-ring: no GPU in use: {spec.workers} CPU worker process(es) with gloo "
                 f"({slots}); run folder {spec.run_dir}")
    else:
        first = (f"elastic-ring: {spec.workers} GPU worker(s) (NCCL + gloo), {slots}; "
                 f"run folder {spec.run_dir}")
    what = (f"script {spec.script}" if spec.script else
            f"model ResNet-{cfg.depth} (width {cfg.width}) on {cfg.dataset}, "
            + (f"constant global batch {cfg.global_batch} (micro-batches of {cfg.batch_size})"
               if cfg.global_batch else f"batch {cfg.batch_size}/worker"))
    length = (f"{spec.total_steps} steps" if spec.total_steps < protocol.NO_STEP_LIMIT
              else "until the script ends")
    second = (f"{what}, {length}"
              + (f", from step {run.start_step + 1}" if run.start_step else "") + ", schedule: "
              + (", ".join(f"step {r.step} -> {r.to}" for r in spec.schedule) or "no resize"))
    lines += [first, second]
    if spec.collective == "torch":
        lines.append("elastic-ring: collective torch.distributed "
                     f"({'NCCL' if spec.device == 'cuda' else 'gloo'}), one process per worker"
                     + (", kept across resizes (the group re-formed in place)" if run.relaunch == "inplace" else ""))
    if spec.script and run.extra.get("torchrun"):
        lines.append(f"elastic-ring: {torchrun_form_line(spec.script, run.extra['stop_grace'])}")
    elif spec.script:
        lines.append(f"elastic-ring: {lr_rule_line(spec.script, spec.lr_scaling or 'linear')}")
    if run.extra.get("relaunch_note"):
        lines.append(f"elastic-ring: {run.extra['relaunch_note']}")
    if run.extra.get("worker_range"):
        lo, hi = run.extra["worker_range"]
        lines.append(f"elastic-ring: --workers {lo}:{hi}: starting at {spec.workers} ("
                     + ("the maximum" if spec.workers == hi else f"every slot, fewer than {hi}")
                     + f"); resizes to at most {hi}")
    if hosts is not None and run.extra.get("fixed_hosts"):
        lo, hi = hosts.exclusions.cooldown.low, hosts.exclusions.cooldown.high
        lines.append(f"elastic-ring: hosts {spec.hosts or spec.hostfile}, fixed: a host whose worker fails is left out "
                     f"for {lo:g}-{hi:g} s (--blacklist-cooldown-range), then grown back onto")
    elif hosts is not None:
        b = hosts.bounds
        lines.append(f"elastic-ring: hosts from {Path(run.extra['discovery']).name} every "
                     f"{hosts.poller.interval_s:g} s, {b.min} to {b.max if b.max is not None else 'every slot'} "
                     f"worker(s): {hosts.view(run.extra.get('asked_workers')).line()}")
    return lines


def torchrun_form_line(script: str, grace: float) -> str:
    """The form a script of torchrun's contract is run in, said at the start."""
    return (f"form torchrun: {Path(script).name} forms its own process group and keeps its own snapshot "
            f"(no elastic_ring, no horovod): run unchanged with torchrun's environment; at a resize or a "
            f"failure every worker is stopped (SIGTERM, SIGKILL after --stop-grace {grace:g} s) and all "
            f"are started again at the new size, resuming from the script's snapshot")


def lr_rule_line(script: str, rule: str) -> str:
    """What a script's LR becomes at a new world size (``--lr-scaling``), said at the start."""
    from elastic_ring.worker.hvd_elastic import uses_horovod_elastic

    if uses_horovod_elastic(script):
        return "LR at a resize: the script's reset callbacks set it (no rule on top)"
    other = "; --lr-scaling linear|sqrt|none sets one" if rule == "auto" else "; --lr-scaling auto follows the script's"
    return {"auto": "LR at a resize: as the script scales it (--lr-scaling auto): its optimizer's LR as built "
                    "at the new size over that at the old (Eq. 7 where it is not built again)",
            "linear": "LR at a resize: Eq. 7, x w_new / w_old (--lr-scaling linear)",
            "sqrt": "LR at a resize: x sqrt(w_new / w_old) (--lr-scaling sqrt)",
            "none": "LR at a resize: kept (--lr-scaling none)",
            "constant-batch": "LR at a resize: kept, every step trains the same global batch (--lr-scaling "
                              "constant-batch)"}[rule] + other


def start_or_resume(req: RunRequest, echo: Callable[[str], None], out: Callable[[str], None] | None = None,
                    show_progress: bool | None = None) -> dict[str, Any]:
    """Check ``req``, get its folder ready, run the controller to the end; returns the summary.

    Raises:
        UserError: bad input (nothing started).
        WorkerFailedError: the run failed (restarts exhausted or not retried).
        Interrupted: Ctrl-C before the workers started.
    """
    from elastic_ring.controller.lock import RunLock

    run = prepare(req, echo)
    try:
        return _start(req, run, echo, out, show_progress)
    except KeyboardInterrupt:  # before the controller's own handler took Ctrl-C
        raise _interrupted(req, run.spec.run_dir) from None
    finally:
        RunLock(run.spec.run_dir).release()  # (the controller releases its own; this is prepare's)


def _constant_batch(run: PreparedRun) -> tuple[int, int] | None:
    """(global batch, micro-batch; 0: the script's own) of a constant-batch run, else None."""
    if run.cfg is not None:
        return (run.cfg.global_batch, run.cfg.batch_size) if run.cfg.global_batch else None
    return (run.spec.global_batch, 0) if run.spec.lr_scaling == "constant-batch" else None


def _interrupted(req: RunRequest, rd: Path | None) -> Interrupted:
    """Ctrl-C before the workers started: what was kept, and the way on."""
    if req.resume_dir:
        return Interrupted(f"interrupted during start-up: run folder {req.resume_dir} left as it was; "
                           f"continue with: elastic-ring train --resume {req.resume_dir}")
    if rd is not None and (rd / "run.json").exists():
        return Interrupted(f"interrupted during start-up: run folder {rd} kept (no step was run); "
                           f"start it with: elastic-ring train --resume {rd}")
    return Interrupted("interrupted during start-up: nothing was kept")


def _start(req: RunRequest, run: PreparedRun, echo: Callable[[str], None], out: Callable[[str], None] | None,
           show_progress: bool | None) -> dict[str, Any]:
    from elastic_ring.controller.controller import Controller

    for line in describe(run):
        echo(line)
    from elastic_ring.controller.backends import LaunchOptions, make_launch

    options = LaunchOptions(relaunch=run.relaunch, backend=req.backend, network_interface=req.network_interface,
                            ray_address=req.ray_address, placement=req.placement, warm_spares=req.warm_spares,
                            gpus_per_worker=1.0 if run.spec.device == "cuda" else 0.0, survive=run.survive,
                            survive_env=run.choice.worker_env if run.choice is not None else "1",
                            collective=run.spec.collective, stop_grace=run.extra.get("stop_grace"),
                            max_restarts=req.max_restarts, discovered=bool(req.host_discovery_script))
    probe = None
    if req.host_probe:
        from elastic_ring.controller.backends.horovodrun import command_probe

        probe = command_probe(req.host_probe)
    backend, resize = make_launch(options, run.spec, host_probe=probe)
    if getattr(run.extra.get("hosts"), "over_hosts", False):  # in place over the discovered hosts (Horovod Elastic)
        backend.run_over_hosts()
    if req.backend == "ray":
        echo(f"backend: Ray ({req.ray_address or ray_address() or 'a local Ray'}), "
             f"placement {req.placement}, warm workers across resizes")
    rule = run.cfg.lr_scaling if run.cfg else run.spec.lr_scaling or "linear"
    ctl = Controller(run.spec, lr_scaling=rule, out=out,
                     max_restarts=req.max_restarts, plan=run.plan, stall_timeout=run.stall_timeout,
                     show_progress=show_progress, backend=backend, resize=resize,
                     lr_decays=tuple(run.cfg.decay_steps) if run.cfg else (),
                     constant_batch=_constant_batch(run), hosts=run.extra.get("hosts"),
                     asked_workers=run.extra.get("asked_workers"), grace=req.grace, survive=run.choice,
                     host_probe=probe)
    summary = ctl.run(run.start_step, run.spec.workers, run.segment)
    total = run.spec.total_steps
    return {**summary, "total_steps": total if total < protocol.NO_STEP_LIMIT else None}
