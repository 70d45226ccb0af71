"""Requests: a run asked for (:class:`RunRequest`, the options of `elastic-ring train`, and
:func:`check`, the one check of them), and a resize asked of a running controller through its run
folder (:func:`request_resize`; nothing slow imported: `resize` and the cluster scheduler use it
while another process runs the job; :func:`take_asked` is the controller's side)."""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elastic_ring.controller.api import Resize
from elastic_ring.controller.backends.resize import MODES
from elastic_ring.errors import UserError
from elastic_ring.words import count

RELAUNCH_CHOICES = ("auto", *MODES)  # auto: prelaunch on GPUs, overlap on the CPU
BACKENDS = ("horovodrun", "ray")
PLACEMENTS = ("PACK", "SPREAD")  # Ray placement groups: fewest nodes, or spread over them
COLLECTIVES = ("horovod", "torch")  # the workers' collectives (worker.collective)
LR_SCALINGS = ("auto", "linear", "sqrt", "none", "constant-batch")  # the LR at a resize (worker.lr; auto: the
# script's own; constant-batch: the global batch kept, so the LR: worker.accumulate)


@dataclass(frozen=True)
class RunRequest:
    """What a caller asks for (the options of `elastic-ring train`; None: not given)."""

    workers: int | None = None
    worker_range: tuple[int, int] | None = None  # --workers MIN:MAX (parsed: hosts.api.parse_workers)
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
    lr_scaling: str | None = None  # the LR rule at a resize (None: auto for a script, the config's otherwise)
    global_batch: int | None = None  # lr_scaling constant-batch: samples per step (config: global_batch)
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
    survive: bool | None = None  # the survivors of a failed worker go on from memory (--backend ray, --relaunch
    # inplace): True --survive, False --no-survive, None the default (on where the state copy is cheap)
    collective: str | None = None  # horovod (None: a new run's default, a resumed run's own) or torch
    stop_grace: float | None = None  # a torchrun-form script: SIGTERM -> SIGKILL at a stop (None: the default)
    host_discovery_script: str | None = None  # the hosts come from this executable, asked every interval
    discovery_interval: float | None = None  # seconds between two runs of it (None: 1)
    min_workers: int | None = None  # host discovery: below this many usable slots the job waits
    max_workers: int | None = None  # host discovery: it grows to no more than this
    min_wait: float | None = None  # host discovery: seconds below the minimum before it stops (None: waits)
    cooldown_range: str | None = None  # host discovery: LOW:HIGH seconds a failed host is left out (None: 10:300)
    grace: float | None = None  # SIGTERM to the controller: seconds for the workers to checkpoint (None: no limit)
    host_probe: str | None = None  # a command asked whether a host answers: CMD HOST, 0 = yes (None: ssh)

    def resnet_options(self) -> tuple[Any, ...]:
        return (self.depth, self.dataset, self.data_dir, self.batch_size, self.lr, self.seed,
                self.resize_warmup)


def check(req: RunRequest) -> None:
    """The one check of a request's options, before anything starts: those that need nothing but
    the request (the run's spec is validated once prepared: ``RunSpec.validate``): the rules of
    :data:`.refusals.RULES` at `train`, then the script read (:func:`_check_collective`).

    Raises:
        UserError: the first option that cannot run (one line naming it).
    """
    from elastic_ring.controller.refusals import TRAIN, refuse

    refuse(TRAIN, req)
    _check_collective(req)
    _check_numbers(req)


def with_worker_range(req: RunRequest) -> RunRequest:
    """``--workers MIN:MAX`` with ``--host-discovery-script``: ``--min-workers MIN --max-workers MAX``
    (the discovery's own bounds); ``--min-workers``/``--max-workers`` over a fixed host list:
    ``--workers MIN:MAX`` (MIN default 1, MAX the list's slots); otherwise ``req`` as it is
    (:func:`range_start` applies).

    Raises:
        UserError: ``--max-workers`` below ``--min-workers`` over a fixed host list (one line).
    """
    from dataclasses import replace

    if not req.host_discovery_script and (req.hosts or req.hostfile) and (
            req.min_workers is not None or req.max_workers is not None):
        from elastic_ring.controller.api import parse_hostfile, parse_hosts

        slots = sum(n for _, n in (parse_hosts(req.hosts) if req.hosts else parse_hostfile(req.hostfile)))
        lo = req.min_workers if req.min_workers is not None else 1
        hi = req.max_workers if req.max_workers is not None else max(slots, lo)
        if hi < lo:
            raise UserError(f"--max-workers {hi} is below --min-workers {lo}")
        return replace(req, worker_range=(lo, hi), min_workers=None, max_workers=None)
    if req.worker_range is None or not req.host_discovery_script:
        return req
    lo, hi = req.worker_range
    return replace(req, worker_range=None, min_workers=lo, max_workers=hi)


def range_start(worker_range: tuple[int, int], slots: int, schedule: Any = ()) -> int:
    """``--workers MIN:MAX`` on fixed slots: the size to start at, MAX or every slot where fewer (as
    Horovod Elastic's ``--max-np`` with ``-np`` left out); the schedule's sizes must lie within.

    Raises:
        UserError: fewer slots than MIN, or a scheduled size outside the bounds (one line).
    """
    lo, hi = worker_range
    if slots < lo:
        raise UserError(f"--workers {lo}:{hi} needs at least {lo} slot(s); {count(slots, 'slot')} found "
                        f"(--slots, --hosts or the GPUs visible)")
    for r in schedule:
        if not lo <= r.to <= hi:
            raise UserError(f"the resize to {r.to} at step {r.step} is outside --workers {lo}:{hi}")
    return min(hi, slots)


def with_script_collective(req: RunRequest) -> tuple[RunRequest, str | None]:
    """``req`` with the collective its script makes plain where ``--collective`` was not given (a
    new run of a torch.distributed script: torch), and the line that says so; else (``req``, None)."""
    if not req.script or req.resume_dir or req.collective is not None:
        return req, None
    from dataclasses import replace

    from elastic_ring.controller.script_check import inferred_collective, read_script

    found = inferred_collective(req.script, read_script(req.script))
    if found is None:
        return req, None
    return replace(req, collective=found[0]), found[1]


def _check_collective(req: RunRequest) -> None:
    """``--collective``: a known one, and a script written for it (every launch has both); the
    script compiles and has what its loop needs (:mod:`.script_check`: read, not run)."""
    if req.collective is not None and req.collective not in COLLECTIVES:
        raise UserError(f"--collective must be one of {', '.join(COLLECTIVES)}, got {req.collective}")
    if req.script and not req.resume_dir:
        from elastic_ring.controller.backends.local import script_collective
        from elastic_ring.controller.script_check import check_script, read_script

        shape = read_script(req.script)  # it compiles (one line naming file:line otherwise)
        if shape.form == "torchrun":  # run as torchrun runs it: its own group, its own snapshot
            check_torchrun_options(req, shape)
            check_script(req.script, shape, req.collective, req.steps)
            return
        if req.stop_grace is not None:
            raise UserError(f"--stop-grace goes with a script of torchrun's contract (it calls init_process_group "
                            f"and imports neither elastic_ring nor horovod); {req.script} is not one")
        uses = script_collective(req.script)
        mine = req.collective or "horovod"
        if uses == "horovod" and mine == "torch":
            raise UserError(f"--collective torch, but {req.script} calls hvd.init(): run it without "
                            f"--collective torch (Horovod), or use torch.distributed in it")
        if uses == "torch":  # elastic_ring.worker.init() forms the group
            raise UserError(f"{req.script} calls torch.distributed's init_process_group() itself: replace "
                            f"the call with elastic_ring.worker.init(), which forms the process group"
                            + (", and add --collective torch" if mine == "horovod" else ""))
        check_script(req.script, shape, req.collective, req.steps)


def check_torchrun_options(req: RunRequest, shape: Any) -> None:
    """A script of torchrun's contract (:attr:`.script_check.ScriptShape.form` ``"torchrun"``) reports
    no step to the controller and keeps its own snapshot: the options that count steps, checkpoint,
    scale the LR or keep workers across a resize do not apply (docs/torchrun.md).

    Raises:
        UserError: the first such option (one line).
    """
    from elastic_ring.controller.refusals import TORCHRUN, refuse

    refuse(TORCHRUN, req, f"{req.script} follows torchrun's contract (init_process_group at line "
                          f"{shape.pg_init_line})")


def check_torch_survive(device: str, survive: bool) -> None:
    """``--survive`` with ``--collective torch`` on the resolved ``device``: survivors go on over
    gloo (the CPU); NCCL's communicators after a peer's death are not handled.

    Raises:
        UserError: ``--survive`` on GPUs (one line).
    """
    if survive and device == "cuda":
        raise UserError("--survive with --collective torch keeps survivors on gloo (--device cpu) only: NCCL "
                        "after a peer's death is not handled; drop --survive or use --collective horovod")


def _check_numbers(req: RunRequest) -> None:
    if req.slots is not None and req.slots < 1:
        raise UserError(f"--slots must be >= 1, got {req.slots}")
    if req.max_restarts < 0:
        raise UserError(f"--max-restarts must be >= 0, got {req.max_restarts}")
    if req.stall_timeout is not None and req.stall_timeout < 0:
        raise UserError(f"--stall-timeout must be >= 0 seconds (0: off), got {req.stall_timeout}")
    if req.keep is not None and req.keep < 1:
        raise UserError(f"--keep must be >= 1, got {req.keep}")
    if req.grace is not None and not req.grace > 0:
        raise UserError(f"--grace must be > 0 seconds, got {req.grace:g}")
    if req.host_probe is not None:
        from elastic_ring.controller.backends.horovodrun import command_probe

        command_probe(req.host_probe)  # (raises the one-line error)
        if not (req.hosts or req.hostfile or req.resume_dir):
            raise UserError("--host-probe goes with --hosts or --hostfile: only their hosts are asked whether "
                            "they answer")




def request_resize(run_dir: str | Path, target: int, source: str = "live") -> str:
    """Ask the running `elastic-ring train` in ``run_dir`` to resize to ``target`` workers now:
    writes ``control/REQUEST_FILE``, after the checks a user would want (raises ``UserError``).
    ``source``: who asks ("live": `elastic-ring resize`, "policy": the cluster's scheduler).
    Returns the line to show."""
    from elastic_ring.controller.api import RunState
    from elastic_ring.controller.status import read_status
    from elastic_ring.protocol import request_file

    rd = Path(run_dir)
    req = request_file(rd)
    st, pending = _consistent_view(rd, req, read_status)
    if st.phase is RunState.RESIZING:
        raise UserError(f"run {rd} is {st.line()}: ask again once it has made a step at the new size")
    if st.phase not in (RunState.STARTING, RunState.RUNNING, RunState.RESTARTING):
        way = f"; {st.resume_hint()}" if st.phase in (RunState.STOPPED, RunState.CRASHED) and st.unfinished else ""
        raise UserError(f"run {rd} is not running (state: {st.phase.value}{way})")
    from elastic_ring.protocol import read_json

    run = read_json(rd / "run.json") or {}
    slots = run.get("slots")
    if slots is None:
        raise UserError(f"run {rd} is still being set up: ask again once it has started")
    if target < 1:
        raise UserError(f"--to must be >= 1, got {target}")
    if target > slots:
        raise UserError(f"--to {target} is more than the run's {slots} slot(s)")
    _check_minimum(run, target)
    _check_constant_batch(rd, target)
    if pending is not None and pending[1]:  # the controller took it: the workers are stopping for it
        if target == pending[0]:
            raise UserError(f"run {rd} is already resizing {st.world_size} -> {pending[0]}")
        raise UserError(f"run {rd} is resizing {st.world_size} -> {pending[0]} (asked live): ask again once "
                        f"it has made a step at the new size")
    if pending is not None and target == pending[0]:
        raise UserError(f"a resize to {count(target, 'worker')} is already requested for {rd}")
    if target == st.world_size:
        if pending is None:
            raise UserError(f"the run already has {count(target, 'worker')}")
        try:  # withdraw the request not yet taken: the run stays at its size
            req.unlink()
        except FileNotFoundError:
            raise UserError(f"run {rd} is resizing {st.world_size} -> {pending[0]}: ask again once it has "
                            f"made a step at the new size") from None
        return (f"the pending resize to {pending[0]} withdrawn for {rd}: it stays at "
                f"{count(target, 'worker')}")
    req.parent.mkdir(parents=True, exist_ok=True)
    tmp = req.with_name(f".{req.name}.tmp")
    tmp.write_text(json.dumps({"to": target, "time": time.time(), "id": uuid.uuid4().hex, "source": source}))
    os.replace(tmp, req)
    now = st.world_size
    instead = f"; it replaces the pending request for {pending[0]}" if pending is not None else ""
    return (f"resize to {target} requested for {rd} (currently {count(now, 'worker') if now else 'no workers'}"
            f"{instead})")


def _check_minimum(run: dict, target: int) -> None:
    """A live resize below the run's minimum (``--workers MIN:MAX`` on fixed slots, or
    ``--min-workers`` with host discovery, as ``run.json`` keeps them) is refused in one line."""
    wr = run.get("worker_range")
    disc = run.get("host_discovery") if isinstance(run.get("host_discovery"), dict) else {}
    if isinstance(wr, list) and len(wr) == 2 and target < int(wr[0]):
        raise UserError(f"--to {target} is below the run's minimum of {count(int(wr[0]), 'worker')} "
                        f"(--workers {wr[0]}:{wr[1]})")
    if disc.get("min_workers") is not None and target < int(disc["min_workers"]):
        raise UserError(f"--to {target} is below the run's minimum of {count(int(disc['min_workers']), 'worker')} "
                        f"(--min-workers {disc['min_workers']})")


def _consistent_view(rd: Path, req: Path, read_status) -> tuple[Any, tuple[int, bool] | None]:
    """The run's status and its pending live resize (:func:`_pending_target`) read from one state of
    ``controller.json``: read again while the controller rewrote it in between (a resize taken and
    done between the two reads would otherwise show the old size with nothing pending, and a second
    request for the size just reached would be accepted)."""
    from elastic_ring.protocol import CONTROLLER_FILE

    def raw() -> bytes | None:
        try:
            return (rd / CONTROLLER_FILE).read_bytes()
        except OSError:
            return None

    for _ in range(20):
        before = raw()
        st = read_status(rd)  # the same answer as `elastic-ring status`
        pending = _pending_target(rd, req)
        if raw() == before:
            break
        time.sleep(0.05)
    return st, pending


def _pending_target(rd: Path, req: Path) -> tuple[int, bool] | None:
    """A live resize asked and not yet done: (its target, whether the controller took it:
    ``controller.json``'s ``live_target``) or None."""
    from elastic_ring.protocol import CONTROLLER_FILE, read_json

    def taken() -> int | None:
        ctl = read_json(rd / CONTROLLER_FILE)
        return ctl["live_target"] if isinstance(ctl, dict) and isinstance(ctl.get("live_target"), int) else None

    if (t := taken()) is not None:
        return t, True
    asked = read_json(req)
    if isinstance(asked, dict) and isinstance(asked.get("to"), int):
        return asked["to"], False
    # the controller takes a request by writing live_target first, then removing the file
    # (:meth:`Controller._check_live_request`): a file gone since the first read is seen here
    if (t := taken()) is not None:
        return t, True
    return None


def _check_constant_batch(rd: Path, target: int) -> None:
    """A run with a constant global batch resizes only to a count of workers that can share it."""
    from elastic_ring.config.api import load_config
    from elastic_ring.worker.accumulate import RULE, layout_problem

    if not (rd / "config.yaml").is_file():
        return  # a script's run
    cfg = load_config(rd / "config.yaml")
    if cfg.lr_scaling == RULE and cfg.global_batch:
        why = layout_problem(cfg.global_batch, cfg.batch_size, (target,))
        if why is not None:
            raise UserError(f"--to {target}: {why}")


def take_request(run_dir: Path, seen: set[str], remove: bool = True) -> tuple[int, float | None] | None:
    """The resize request waiting in ``run_dir`` as (workers, time asked): :func:`take_asked`'s."""
    ask = take_asked(run_dir, seen, remove)
    return None if ask is None else (ask[0], ask[1])


def take_asked(run_dir: Path, seen: set[str], remove: bool = True) -> tuple[int, float | None, str] | None:
    """The resize request waiting in ``run_dir`` as (workers, time asked, who asked: "live" or
    "policy"), taken (the file removed unless ``remove`` is False: the caller removes it once it has
    recorded the request, so that ``resize`` always sees it pending; its id added to ``seen``);
    None when there is none, it is being written, or it was seen."""
    from elastic_ring.protocol import request_file

    path = request_file(Path(run_dir))
    try:
        req = json.loads(path.read_text())
        rid, target = str(req["id"]), int(req["to"])
    except (OSError, ValueError, KeyError, json.JSONDecodeError):
        return None  # none, or being written: read next time
    if rid in seen:
        return None
    seen.add(rid)
    if remove:
        path.unlink(missing_ok=True)
    t = req.get("time")
    return target, float(t) if t is not None else None, "policy" if req.get("source") == "policy" else "live"


DRAIN_DEADLINE_S = 60.0  # `elastic-ring drain`'s default --deadline


def request_drain(run_dir: str | Path, host: str, deadline: float | None = None) -> str:
    """Ask the running `elastic-ring train` in ``run_dir`` to shrink off ``host`` at its next agreed
    step (`elastic-ring drain`): writes ``control/drain-<id>.json`` after the checks a user would
    want (raises ``UserError``: one line). ``deadline``: seconds for the shrink to land before the
    host's workers are killed and it is a failure (default :data:`DRAIN_DEADLINE_S`). Returns the
    line to show."""
    from elastic_ring.controller.api import RunState
    from elastic_ring.controller.status import is_run_folder, read_status
    from elastic_ring.protocol import CONTROLLER_FILE, read_json

    rd = Path(run_dir)
    if not is_run_folder(rd):
        raise UserError(f"{rd} is not an elastic-ring run folder (no run.json)")
    deadline = DRAIN_DEADLINE_S if deadline is None else float(deadline)
    if not deadline > 0:
        raise UserError(f"--deadline must be > 0 s, got {deadline:g}")
    st = read_status(rd)
    if not st.phase.live:
        way = f"; {st.resume_hint()}" if st.phase in (RunState.STOPPED, RunState.CRASHED) and st.unfinished else ""
        raise UserError(f"run {rd} is not running (state: {st.phase.value}{way})")
    info = read_json(rd / "run.json") or {}
    disc = info.get("host_discovery")
    ctl = read_json(rd / CONTROLLER_FILE)
    ctl = ctl if isinstance(ctl, dict) else {}
    usable = ctl.get("usable_hosts") if isinstance(ctl.get("usable_hosts"), dict) else {}
    if info.get("relaunch") == "inplace" and len(usable) < 2:  # (over discovered hosts it has hosts to drain)
        raise UserError(f"run {rd} runs in place on one host (--relaunch inplace): there is no host to drain; "
                        f"SIGTERM a worker to have it leave, or resize the run (docs/hosts.md)")
    if not isinstance(disc, dict):
        raise UserError(f"run {rd} does not take its hosts from --host-discovery-script nor from several --hosts: "
                        f"drain needs a run that does (docs/hosts.md)")
    draining = ctl.get("draining") if isinstance(ctl.get("draining"), list) else []
    if host in draining:
        raise UserError(f"host {host} is already being drained from run {rd}")
    if host not in usable:
        names = ", ".join(usable) or "none yet"
        raise UserError(f"host {host} is not one of run {rd}'s usable hosts ({names})")
    left = sum(int(n) for h, n in usable.items() if h != host and h not in draining)
    need = int(disc.get("min_workers") or 1)
    if left < need:
        raise UserError(f"draining {host} leaves {count(left, 'slot')}, below --min-workers {need}: the run "
                        f"would stop and wait (stop it with Ctrl-C, or drain after another host appears)")
    req = rd / "control" / f"drain-{uuid.uuid4().hex}.json"
    req.parent.mkdir(parents=True, exist_ok=True)
    tmp = req.with_name(f".{req.name}.tmp")
    tmp.write_text(json.dumps({"host": host, "deadline": deadline, "time": time.time()}))
    os.replace(tmp, req)
    return (f"drain of {host} requested for {rd}: the job shrinks off it at the next agreed step "
            f"(deadline {deadline:g} s)")


def take_drains(run_dir: Path) -> list[tuple[str, float, float]]:
    """The drain requests waiting in ``run_dir`` as (host, deadline s, time asked), taken (their files
    removed); a file being written or unreadable is left for the next time (removed when not JSON)."""
    out = []
    for path in sorted((Path(run_dir) / "control").glob("drain-*.json")):
        try:
            req = json.loads(path.read_text())
            out.append((str(req["host"]), float(req["deadline"]), float(req["time"])))
        except OSError:
            continue
        except (ValueError, KeyError, TypeError, json.JSONDecodeError):
            pass  # not ours to keep
        path.unlink(missing_ok=True)
    return out
