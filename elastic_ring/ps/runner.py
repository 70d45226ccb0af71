"""Launch one parameter-server job with mpirun and read its result back.

The side effect (the process launch) is one function, :func:`launch_mpirun`, passed into
:func:`run_job`, so callers (the CLI, the experiment) can be tested without processes. A rank that
fails writes the crash record of ``train`` (:func:`elastic_ring.protocol.write_error_record`,
``RUN_DIR/logs/error-rank<R>.json``); :func:`check_run` reads it back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from elastic_ring import protocol
from elastic_ring.errors import UserError, WorkerFailedError
from elastic_ring.events.api import EventLog, ErrorEvent, read_events
from elastic_ring.ps.api import PSConfig
from elastic_ring.ps.events import PSFinished, PSWorkerSummary

ROOT = Path(__file__).resolve().parents[2]  # the folder that holds the elastic_ring package
ENTRY = ["-m", "elastic_ring.ps.mpi_main"]  # what mpirun executes in every rank


def mpirun_path() -> str:
    """The venv's mpirun (next to the Python running us), else the one on PATH."""
    p = Path(sys.executable).parent / "mpirun"
    if p.exists():
        return str(p)
    import shutil
    found = shutil.which("mpirun")
    if not found:
        raise WorkerFailedError("mpirun not found (the [ps] extra installs it: pip install 'elastic-ring[ps]')")
    return found


def mpirun_command(cfg: PSConfig, run_dir: Path | list[Path]) -> list[str]:
    dirs = run_dir if isinstance(run_dir, list) else [run_dir]
    return [mpirun_path(), "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
            "-np", str(cfg.workers + 1), sys.executable, *ENTRY, *map(str, dirs)]


def default_timeout(cfg: PSConfig) -> float:
    """Real seconds a run may take: twice its budget on the wall clock; on the virtual clock the
    real time depends on the machine's load, not on the budget, so a generous fixed bound."""
    if cfg.clock == "virtual":
        return max(1800.0, 30 * (cfg.time_budget_s or 60))
    return (cfg.time_budget_s or 600) * 2 + 120


def launch_mpirun(cmd: list[str], run_dir: Path, timeout: float | None) -> int:
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}".rstrip(os.pathsep)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    with open(run_dir / "mpirun.log", "ab") as out:
        try:
            return subprocess.run(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            return -9


@dataclass
class JobResult:
    run_dir: Path
    returncode: int
    finished: PSFinished
    summaries: list[PSWorkerSummary]


def new_run_dir(cfg: PSConfig, run_dir: str | Path | None) -> Path:
    """The folder of a new job (default ``runs/ps/<sync>-<time>``); it must be new or empty, because a
    second job's events would mix with the first one's (two ps_finished, the old workers' rows)."""
    out = Path(run_dir) if run_dir else Path("runs") / "ps" / f"{cfg.sync}-{time.strftime('%Y%m%d-%H%M%S')}"
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"run folder {out} already exists and is not empty (pick another --run-dir)")
    return out


def run_job(cfg: PSConfig, run_dir: str | Path, timeout: float | None = None,
            launch: Callable[[list[str], Path, float | None], int] = launch_mpirun) -> JobResult:
    """Run one job to the end.

    Raises:
        WorkerFailedError: a rank failed (its rank and cause in the message), mpirun failed or timed
            out, or the server wrote no ``ps_finished`` event.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "ps_config.json").write_text(json.dumps(cfg.to_dict(), indent=1))
    if timeout is None:
        timeout = default_timeout(cfg)
    cmd = mpirun_command(cfg, run_dir)
    started = time.time()
    rc = launch(cmd, run_dir, timeout)
    return check_run(run_dir, rc, since=started)


def run_batch(jobs: list[tuple[PSConfig, Path]], launch: Callable[[list[str], Path, float | None], int] = launch_mpirun,
              engine: str = "mpi") -> list[JobResult | WorkerFailedError]:
    """Run several jobs (the same number of workers) one after the other in one mpirun, saving the
    processes' start-up per job; ``engine="inprocess"``: in one Python process instead
    (:mod:`elastic_ring.ps.inprocess`, virtual clock only). Returns, per job, its result or the
    error it raised; a failure ends the batch, so the jobs after it fail too."""
    if len({cfg.workers for cfg, _ in jobs}) != 1:
        raise ValueError("a batch needs the same number of workers in every job")
    dirs = []
    for cfg, d in jobs:
        d = Path(d)
        d.mkdir(parents=True, exist_ok=True)
        (d / "ps_config.json").write_text(json.dumps(cfg.to_dict(), indent=1))
        dirs.append(d)
    cmd = (mpirun_command(jobs[0][0], dirs) if engine == "mpi"
           else [sys.executable, "-m", "elastic_ring.ps.inprocess", *map(str, dirs)])
    started = time.time()
    rc = launch(cmd, dirs[0], sum(default_timeout(cfg) for cfg, _ in jobs))
    out: list[JobResult | WorkerFailedError] = []
    for d in dirs:
        try:
            out.append(check_run(d, rc if not read_events(d / "events.jsonl", PSFinished) else 0, since=started))
        except WorkerFailedError as e:
            out.append(e)
    return out


def check_run(run_dir: Path, rc: int, since: float = 0.0) -> JobResult:
    """The job's result, or WorkerFailedError (first failed rank, mpirun status, no ps_finished).

    ``since``: the launch time; older crash records (a previous attempt in the same folder) are
    not this job's."""
    log = EventLog(run_dir / "events.jsonl")
    fail = protocol.first_failure(protocol.read_error_records(run_dir, since=since), [])
    if fail is not None:
        rank = fail.rank
        msg = f"rank {rank} failed: {fail.message} (traceback in {protocol.error_file(run_dir, rank)})"
        log.write(ErrorEvent(msg, rank=rank))
        raise WorkerFailedError(msg, rank=rank, cause=fail.message)
    if rc != 0:
        why = "timed out" if rc == -9 else f"exited with status {rc}"
        msg = f"mpirun {why}; see {run_dir / 'mpirun.log'}"
        log.write(ErrorEvent(msg))
        raise WorkerFailedError(msg)
    fin = read_events(run_dir / "events.jsonl", PSFinished)
    if not fin:
        raise WorkerFailedError(f"the server wrote no ps_finished event; see {run_dir / 'mpirun.log'}")
    return JobResult(run_dir, rc, fin[-1], read_events(run_dir / "events.jsonl", PSWorkerSummary))
