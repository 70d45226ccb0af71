"""Runs each cluster job under its own ``elastic-ring train`` controller (a client of the
controller's files, as ``elastic-ring resize`` and ``status`` are).

A job's run folder is ``CLUSTER/jobs/<id>``; its controller's output goes to
``CLUSTER/logs/job-<id>.log``; its TensorBoard curves to ``CLUSTER/tensorboard/<id>-<name>``. Its
controller runs in the folder `submit` was run in (``JobRequest.cwd``; the scheduler's own for a
job stored without it), so its workers do too and the script's relative paths are the user's. A
start is ``train --script|--config ... --run-dir``, a resume ``train --resume``; a live resize is
the request ``elastic-ring resize`` writes; a stop is SIGTERM (the workers checkpoint at the next
agreed step and the controller exits with state stopped).

Slots. CPU, one host: ``--device cpu`` and ``--slots`` = the job's largest size, so the controller
can be resized live up to it; the job's processes run on the cores of its slots (slot i -> the
i-th core this scheduler may use, modulo their count), set before the controller starts and moved
with the slots at every resize (:meth:`ProcessRunner.pin`), so ``protocol.cpu_threads`` gives each
worker its share and two jobs side by side do not share cores (GPU jobs' CPU threads follow their
slots the same way: slot i's GPU and core i). GPUs: ``CUDA_VISIBLE_DEVICES`` = the job's slots,
``--slots`` = its size; several hosts: ``--hosts host:n,...`` of its slots. In these two cases a
resize is a stop and a resume on the new slots (the visible devices and the host list are fixed for
a controller's life).

Ray (``cluster up --ray``): every job runs ``train --backend ray --ray-address`` the scheduler's
cluster, with ``--slots`` = its --max-workers (else :data:`RAY_SLOTS`: it may grow onto any node
that joins) and ``--warm-spares 0`` (a spare actor would hold a CPU or GPU the scheduler gives to
another job); Ray places the workers, so there is no core pinning and no CUDA_VISIBLE_DEVICES, and
every resize is live.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from elastic_ring import protocol
from elastic_ring.cluster.api import ClusterConfig, JobRow, JobStartError, Observation, job_dir, job_log
from elastic_ring.controller.api import TERMINAL, RunState
from elastic_ring.controller.backends.api import package_path
from elastic_ring.controller.lock import holder_pid, is_locked
from elastic_ring.env import RAY_FOLLOW
from elastic_ring.errors import UserError
from elastic_ring.events.api import (ErrorEvent, Event, Launch, ResizeOverhead, Restart, Throughput, WorkersExited,
                                     as_event, read_events)
from elastic_ring.telemetry.tensorboard import ENV_DIR as TB_ENV_DIR


RAY_SLOTS = 1024  # a Ray job's --slots without --max-workers: the scheduler's allocation bounds it


def run_dir(cluster_dir: Path, jid: int) -> Path:
    return job_dir(cluster_dir, jid)


_ERROR_LINE = re.compile(r"^elastic-ring(?: [a-z-]+)?: error: (.+)$")


def failure_reason(log: Path, events: Path) -> str | None:
    """Why a job's controller ended without finishing, in one line: the ``elastic-ring: error:``
    line of its log (what `train` printed: a bad config key, a failed rank), else the last error
    event of its run, else the last line of a traceback in the log; None when nothing says."""
    text = ""
    with contextlib.suppress(OSError), open(log, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        fh.seek(max(0, fh.tell() - 65536))
        text = fh.read().decode(errors="replace")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        m = _ERROR_LINE.match(line)
        if m:
            return m.group(1)
    with contextlib.suppress(Exception):  # a damaged events file: fall through to the log
        errs = [e for e in read_events(events, ErrorEvent) if e.message]
        if errs:
            return str(errs[-1].message)
    if any(line.startswith("Traceback") for line in lines):
        return lines[-1][:300]
    return None


def gpu_env(table: list[tuple[str, int]], slots: list[int], multi_host: bool,
            env: dict[str, str] | None = None) -> dict[str, str]:
    """The variables that give a GPU job its slots. One host: ``CUDA_VISIBLE_DEVICES`` = the slots'
    GPUs, mapped through the ``CUDA_VISIBLE_DEVICES`` the scheduler was started under. Several hosts:
    horovodrun sends one environment to every host, so each host's list travels in
    ``ELASTIC_RING_HOST_DEVICES`` (``h1=0,1;h2=3``), which the worker entry turns into its host's
    ``CUDA_VISIBLE_DEVICES`` (``HOROVOD_HOSTNAME``); the controller's own host is mapped through the
    scheduler's ``CUDA_VISIBLE_DEVICES`` (other hosts' indices are their own), and
    ``CUDA_VISIBLE_DEVICES`` holds the first host's list for the controller's GPU check."""
    from elastic_ring.telemetry.gpu import HOST_DEVICES_ENV, host_devices_env, map_through_parent

    per_host: dict[str, list[int]] = {}
    for s in slots:
        h, i = table[s]
        per_host.setdefault(h, []).append(i)
    if not multi_host:
        return {"CUDA_VISIBLE_DEVICES": ",".join(map_through_parent(next(iter(per_host.values()), []), env))}
    local = {"localhost", "127.0.0.1", socket.gethostname()}
    devs = {h: (map_through_parent(ix, env) if h in local else [str(i) for i in ix]) for h, ix in per_host.items()}
    mine = next((d for h, d in devs.items() if h in local), next(iter(devs.values())))
    return {HOST_DEVICES_ENV: host_devices_env(devs), "CUDA_VISIBLE_DEVICES": ",".join(mine)}


def tensorboard_dir(cluster_dir: Path, job: JobRow) -> Path:
    """``CLUSTER/tensorboard/<id>-<name>``: the job's curves (the name reduced to a safe file name)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(job.name or "")).strip("._")[:60]
    return Path(cluster_dir) / "tensorboard" / (f"{job.id}-{safe}" if safe else str(job.id))


class _Tail:
    """Reads a growing ``events.jsonl`` incrementally (only whole lines)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.buf = path, 0, b""

    def new(self) -> list[Event]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return []
        self.offset += len(data)
        data = self.buf + data
        lines = data.split(b"\n")
        self.buf = lines.pop()
        out = []
        for line in lines:
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if isinstance(d, dict):
                out.append(as_event(d))
        return out


@dataclass
class _Tally:
    """What the events of one job's run read so far add up to (see :class:`Observation`)."""

    launches: int = 0
    exits: int = 0
    world: int = 0
    ips: float = 0.0
    images: float = 0.0  # images and seconds of the current launch's windows
    seconds: float = 0.0
    losses: list[tuple[float, float]] = field(default_factory=list)
    restarts: int = 0
    restarting: bool = False  # a restart was read; the next launch is its relaunch


def _known_length(total) -> int:
    """A run's ``total_steps`` as the scheduler counts it: 0 where it is not known (a torchrun-form
    script's loop decides its own end: the run records :data:`~elastic_ring.protocol.NO_STEP_LIMIT`)."""
    try:
        total = int(total or 0)
    except (TypeError, ValueError):
        return 0
    return total if 0 < total < protocol.NO_STEP_LIMIT else 0


class ProcessRunner:
    """The real side effects of :class:`~elastic_ring.cluster.scheduler.Scheduler`."""

    def __init__(self, cluster_dir: Path, config: ClusterConfig, python: str = sys.executable,
                 ray_address: str | None = None) -> None:
        self.dir = Path(cluster_dir).resolve()
        self.config = config
        self.python = python
        self.ray_address = ray_address  # the Ray cluster the jobs join (config.ray set)
        self._procs: dict[int, subprocess.Popen] = {}
        self._tails: dict[int, _Tail] = {}
        self._seen: dict[int, _Tally] = {}

    # ------------------------------------------------------------------ commands
    def _hosts(self, slots: list[int]) -> str:
        table = self.config.slot_table()
        c = Counter(table[s][0] for s in slots)
        return ",".join(f"{h}:{n}" for h, n in c.items())

    def command(self, job: JobRow, slots: list[int], workers: int, resume: bool) -> tuple[list[str], dict]:
        req = job.request
        rd = run_dir(self.dir, job.id)
        cfg = self.config
        if cfg.ray is not None:
            n_slots = req.max_workers or RAY_SLOTS
        else:
            max_w = min(req.max_workers or cfg.slots, cfg.slots)
            n_slots = max_w if cfg.device == "cpu" and not cfg.multi_host else workers
        cmd = [self.python, "-m", "elastic_ring.cli.main", "train"]
        if resume or (rd / "run.json").exists():  # (a job stopped before its first launch: its folder)
            cmd += ["--resume", str(rd)]
        elif req.kind == "script" and req.form == "torchrun":  # its length and snapshot are its own
            cmd += ["--script", req.path, "--run-dir", str(rd)]
        elif req.kind == "script":
            cmd += ["--script", req.path, "--steps", str(req.steps), "--run-dir", str(rd)]
        else:
            cmd += ["--config", req.path, "--run-dir", str(rd)]
            for s in req.sets:
                cmd += ["--set", s]
            if req.steps:
                cmd += ["--steps", str(req.steps)]
        cmd += ["--workers", str(workers), "--slots", str(n_slots), "--device", cfg.device]
        if cfg.multi_host:
            cmd += ["--hosts", self._hosts(slots)]
        if cfg.ray is not None:
            cmd += ["--backend", "ray", "--ray-address", self.ray_address or cfg.ray or "auto", "--warm-spares", "0"]
        if cfg.network_interface:
            cmd += ["--network-interface", cfg.network_interface]
        if not resume:
            cmd += list(req.train_args)
            if req.kind == "script" and req.args:
                cmd += ["--", *req.args]
        env = dict(os.environ)
        env["PYTHONPATH"] = package_path(env.get("PYTHONPATH", ""))  # it runs in the user's folder
        env[TB_ENV_DIR] = str(tensorboard_dir(self.dir, job))
        if cfg.ray is not None:
            env[RAY_FOLLOW] = "0"  # the scheduler grows it onto a node that joins, not the job itself
        if cfg.device == "cuda" and cfg.ray is None:
            env.update(gpu_env(cfg.slot_table(), slots, cfg.multi_host))
        return cmd, env

    # ------------------------------------------------------------------ CPU affinity
    def cores(self, slots: list[int]) -> set[int]:
        """The cores of ``slots`` (slot i -> the i-th of the cores this process may run on)."""
        try:
            mine = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            return set()
        if not slots or self.config.multi_host or self.config.ray is not None:
            return set()  # other hosts' cores, or Ray's nodes: not ours to pin
        return {mine[s % len(mine)] for s in slots}

    def pin(self, job: JobRow, slots: list[int]) -> bool:
        """Move the job's controller and every process under it to the cores of ``slots``
        (workers started later inherit it). False when the job has no live process."""
        cores = self.cores(slots)
        pid = self._pid(job)
        if not cores or not pid:
            return False
        import psutil

        try:
            root = psutil.Process(pid)
            procs = [root] + root.children(recursive=True)
        except psutil.Error:
            return False
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.cpu_affinity(sorted(cores))
        return True

    # ------------------------------------------------------------------ Runner
    def start(self, job: JobRow, slots: list[int], workers: int, resume: bool) -> int:
        """Start the job's controller in its folder (``JobRequest.cwd``); returns its pid.

        Raises:
            JobStartError: that folder is gone (the line is also the job log's error line).
        """
        cmd, env = self.command(job, slots, workers, resume)
        cores = self.cores(slots)
        cwd = job.request.cwd  # None: a job stored before submit recorded it (the scheduler's folder)
        log = job_log(self.dir, job.id)
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as fh:
            fh.write(("$ " + " ".join(cmd) + "\n").encode())
            fh.flush()
            try:
                if cwd is not None and not Path(cwd).is_dir():
                    raise FileNotFoundError(2, "No such file or directory", cwd)
                p = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                     start_new_session=True, cwd=cwd,
                                     preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None)
            except OSError as e:
                if cwd is None or e.filename != cwd:
                    raise
                why = "is gone" if isinstance(e, FileNotFoundError) else f"cannot be entered ({e.strerror})"
                keep = (f"; its checkpoints stay in {run_dir(self.dir, job.id)}"
                        if resume or (run_dir(self.dir, job.id) / "run.json").exists() else "")
                msg = (f"job {job.id} ({job.name}) was submitted from {cwd}, which {why}: its paths are "
                       f"relative to it{keep}")
                fh.write(f"elastic-ring: error: {msg}\n".encode())
                raise JobStartError(msg) from None
        self._procs[job.id] = p
        return p.pid

    def request_resize(self, job: JobRow, to: int) -> bool:
        """Ask for a live resize through ``elastic-ring resize`` (its checks included), as the
        policy's (its ``membership_change`` says so); False when the controller cannot take it now
        (still launching, already that size, ...)."""
        from elastic_ring.controller.requests import request_resize

        try:
            request_resize(run_dir(self.dir, job.id), to, source="policy")
        except UserError:
            return False
        return True

    def stop(self, job: JobRow) -> None:
        pid = self._pid(job)
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def _pid(self, job: JobRow) -> int | None:
        p = self._procs.get(job.id)
        if p is not None:
            return p.pid if p.poll() is None else None
        rd = run_dir(self.dir, job.id)
        if is_locked(rd):
            return holder_pid(rd)
        if job.pid:
            return int(job.pid) if self.alive(job) else None
        return self.find_controller(job)

    def find_controller(self, job: JobRow) -> int | None:
        """The pid of a live ``train`` controller of the job's run folder started by the command of
        :meth:`command`, or None: a controller started by a scheduler killed before it stored the
        pid, and not yet holding the folder's lock."""
        import psutil

        rd = str(run_dir(self.dir, job.id))
        for proc in psutil.process_iter(["pid", "cmdline", "status"]):
            args = proc.info["cmdline"] or []
            if proc.info["status"] == psutil.STATUS_ZOMBIE or rd not in args:
                continue
            if any(a == "elastic_ring.cli.main" and args[i + 1:i + 2] == ["train"] for i, a in enumerate(args)):
                return int(proc.info["pid"])
        return None

    def alive(self, job: JobRow) -> bool:
        """Our child: it has not exited. Another scheduler's (after a restart): its run folder is
        locked, or the recorded pid is still a `train` of this folder (not yet holding the lock),
        or, no pid recorded, a `train` of this folder runs (:meth:`find_controller`)."""
        p = self._procs.get(job.id)
        if p is not None:
            return p.poll() is None
        rd = run_dir(self.dir, job.id)
        if is_locked(rd):
            return True
        if job.pid:
            import psutil

            try:
                proc = psutil.Process(int(job.pid))
                return proc.status() != psutil.STATUS_ZOMBIE and str(rd) in " ".join(proc.cmdline())
            except psutil.Error:
                return False
        return self.find_controller(job) is not None

    def observe(self, job: JobRow) -> Observation:
        jid = job.id
        rd = run_dir(self.dir, jid)
        alive = self.alive(job)
        seen = self._seen.setdefault(jid, _Tally())
        tail = self._tails.setdefault(jid, _Tail(rd / "events.jsonl"))
        windows: list[tuple[int, int, int, float]] = []
        lost: list[float] = []
        for e in tail.new():
            if isinstance(e, ResizeOverhead) and isinstance(e.total_lost_s, (int, float)):
                lost.append(float(e.total_lost_s))
            elif isinstance(e, Restart) and not e.gave_up:
                seen.restarting = True
            elif isinstance(e, Launch):
                seen.launches += 1
                if seen.restarting:
                    seen.restarts, seen.restarting = seen.restarts + 1, False
                seen.world = int(e.world_size or 0)
                seen.images, seen.seconds = 0.0, 0.0
            elif isinstance(e, WorkersExited):
                seen.exits += 1
            elif isinstance(e, Throughput):
                seen.ips = float(e.images_per_s or 0.0)
                try:
                    sps, steps = float(e.steps_per_s or 0.0), int(e.steps or 0)
                    secs = float(e.seconds) if e.seconds is not None else (steps / sps if sps > 0 else 0.0)
                    windows.append((seen.launches, int(e.world_size or 0), steps, secs))
                    # images/s shown by `jobs`: work over time at the current size, not the last window
                    seen.images += float(e.images_per_s or 0.0) * secs
                    seen.seconds += secs
                    if seen.seconds > 0:
                        seen.ips = seen.images / seen.seconds
                except (TypeError, ValueError):
                    pass
                if e.loss is not None and e.step is not None:
                    seen.losses.append((float(e.step), float(e.loss)))
        ctl = protocol.read_json(rd / protocol.CONTROLLER_FILE) or {}
        prog = protocol.read_json(rd / "control" / protocol.PROGRESS_FILE) or {}
        run = protocol.read_json(rd / "run.json") or {}
        outcome, error = None, None
        if not alive:
            summ = protocol.read_json(rd / "summary.json") or {}
            said = summ.get("state")  # else an ended controller.json's (an older one's words too)
            ended = RunState.read(said) if said else RunState.of_record(ctl)
            ended = ended if said or ended in TERMINAL else None
            outcome = ended.value if ended is not None else said or None
            if ended not in (RunState.FINISHED, RunState.STOPPED):
                error = failure_reason(job_log(self.dir, jid), rd / "events.jsonl")
        return Observation(alive=alive, state=ctl.get("state"), world_size=seen.world,
                           step=int(prog.get("step", 0) or 0), total=_known_length(run.get("total_steps")),
                           images_per_s=seen.ips, launches=seen.launches, exits=seen.exits,
                           outcome=outcome, losses=list(seen.losses), throughput=windows,
                           resize_lost_s=lost, restarts=seen.restarts, error=error)
