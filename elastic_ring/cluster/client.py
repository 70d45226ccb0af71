"""What any shell does to a cluster folder without the scheduler: queue a job (:func:`submit`),
cancel one (:func:`cancel`) and read the jobs (:func:`jobs_view`, :func:`jobs_table`). These
only write to or read the folder's database; the scheduler (:mod:`.daemon`) acts on them at its
next pass.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from elastic_ring.cluster.api import JobRow

# why the scheduler stopped a job (the store's message), as `jobs` says it
STOP_WORDS = {"cancel": "cancel requested", "preempt": "preempted", "resize": "moving to other slots",
              "explore": "next exploration size", "down": "cluster down"}


@dataclass(frozen=True)
class Submitted:
    """A job queued by :func:`submit`."""

    job_id: int
    name: str
    scheduler_running: bool  # False: it waits in the queue until `cluster up`


def submit(cluster_dir: str | Path, target: str, name: str | None = None, steps: int | None = None,
           min_workers: int = 1, max_workers: int = 0, sets: Sequence[str] = (), profile: str | None = None,
           target_loss: float | None = None, checkpoint_every: int | None = None,
           script_args: Sequence[str] = (), cwd: str | Path | None = None, lr_scaling: str | None = None,
           global_batch: int = 0) -> Submitted:
    """Queue a job: a user script (.py, run with `train --script` and ``script_args``) or a config
    (.yaml, the built-in ResNet, with ``sets``). A config is read now as its `train` will read it.
    ``cwd``: the submitting shell's folder (default: this process's), recorded in the request: the
    job's `train` runs there (:class:`~elastic_ring.cluster.api.JobRequest`), and the relative
    paths given here (the file, ``--profile``, the cluster folder) are taken from it now.

    Raises:
        ClusterError: the job does not fit the cluster or mixes a script's and a config's options.
    """
    from elastic_ring.cluster.api import LOCK_FILE, ClusterError, JobRequest
    from elastic_ring.cluster.store import Store
    from elastic_ring.controller.lock import held_by_other

    here = Path(cwd or os.getcwd()).resolve()
    p = (here / target).resolve()
    kind = "script" if p.suffix == ".py" else "config" if p.suffix in (".yaml", ".yml") else None
    if kind is None:
        raise ClusterError(f"{target}: submit a script (.py) or a config (.yaml)")
    if kind == "config" and script_args:
        raise ClusterError("arguments after -- are for scripts; a config takes --set KEY=VALUE")
    if kind == "script" and sets:
        raise ClusterError("--set is for configs; give a script its own arguments after --")
    d = Path(cluster_dir) if cwd is None else here / cluster_dir  # (as given: the messages name it so)
    store = Store(d)
    cfg = store.config()
    fixed = cfg is not None and cfg.ray is None  # a Ray cluster's slots change as nodes join
    if fixed and max_workers > cfg.slots:
        raise ClusterError(f"--max-workers {max_workers} is more than the cluster's {cfg.slots} slots")
    if fixed and min_workers > cfg.slots:
        raise ClusterError(f"--min-workers {min_workers} is more than the cluster's {cfg.slots} slots")
    if checkpoint_every is not None and checkpoint_every < 0:
        raise ClusterError(f"--checkpoint-every must be >= 0, got {checkpoint_every}")
    form = script_form(p, steps, checkpoint_every, target_loss, cfg) if kind == "script" else "library"
    train_args = ("--checkpoint-every", str(checkpoint_every)) if checkpoint_every else ()
    if global_batch and lr_scaling != "constant-batch" and kind == "script":  # (a config's own rule: checked below)
        raise ClusterError(f"--global-batch {global_batch} needs --lr-scaling constant-batch")
    # the job's rule, for train and for the scheduler's speed model (JobRequest.batch_rule; a
    # config job's also from its file)
    train_args += (("--lr-scaling", lr_scaling) if lr_scaling else ()) + \
        (("--global-batch", str(global_batch)) if global_batch else ())
    req = JobRequest(name=name or p.stem, kind=kind, path=str(p), steps=steps, min_workers=min_workers,
                     max_workers=max_workers, sets=tuple(sets), args=tuple(script_args),
                     profile=str((here / profile).resolve()) if profile else None, target_loss=target_loss,
                     train_args=train_args, cwd=str(here), form=form)
    if kind == "config":
        check_config(req, cfg.device if cfg is not None else "cpu", lr_scaling, global_batch)
    jid = store.submit(req)
    return Submitted(jid, req.name, held_by_other(d / LOCK_FILE))



def script_form(path: Path, steps: int | None, checkpoint_every: int | None, target_loss: float | None,
                cfg: Any) -> str:
    """The submitted script's form, read from its source as `train` reads it (docs/torchrun.md):
    ``"torchrun"`` for a script of torchrun's contract only, else ``"library"``. A torchrun-form job
    counts no step and keeps its own snapshot, and its workers run on the scheduler's host.

    Raises:
        ClusterError: an option that does not apply to a torchrun-form script, or a cluster it
            cannot run on (one line).
    """
    from elastic_ring.cluster.api import ClusterError
    from elastic_ring.controller.script_check import read_script
    from elastic_ring.errors import UserError

    try:
        shape = read_script(path)
    except UserError as e:
        raise ClusterError(str(e)) from None
    if shape.form != "torchrun":
        return "library"
    from elastic_ring.controller.refusals import SUBMIT, SubmitOptions, refuse

    refuse(SUBMIT, SubmitOptions(steps, checkpoint_every, target_loss, cfg),
           f"{path.name} follows torchrun's contract (init_process_group at line {shape.pg_init_line})",
           ClusterError)
    return "torchrun"


def check_config(req: Any, device: str, lr_scaling: str | None = None, global_batch: int = 0) -> None:
    """A config job's config as its `train` will read it (file, --set, --steps, --lr-scaling,
    --global-batch), so that a bad key or value (a global batch without the config's
    ``constant-batch`` rule, one the per-worker batch does not divide) is refused here, in one
    line, and not found later in the job's log."""
    from elastic_ring.config.api import load_config
    from elastic_ring.config.base import parse_overrides

    overrides = parse_overrides(req.sets)
    if req.steps:
        overrides["total_steps"] = req.steps
    if lr_scaling and lr_scaling != "auto":  # (auto: a script's rule; train refuses it for a config)
        overrides["lr_scaling"] = lr_scaling
    if global_batch:
        overrides["global_batch"] = global_batch
    load_config(req.path, overrides, device=device)


def cancel(cluster_dir: str | Path, job: str) -> str:
    """Cancel a job by id or name (a queued one is dropped, a running one stops at a checkpoint);
    returns what to print. With no scheduler running (the cluster is down) a queued or paused job,
    which has no process, is cancelled here at once; any other waits for `cluster up`, and the
    line says so.

    Raises:
        ClusterError: no such job, or it has already ended.
    """
    from elastic_ring.cluster.api import LOCK_FILE, ClusterError, JobState
    from elastic_ring.cluster.store import Store
    from elastic_ring.controller.lock import held_by_other

    d = Path(cluster_dir)
    store = Store(d)
    j = store.find(job)
    if j.state.terminal:
        raise ClusterError(f"job {j.id} is already {j.state.value}")
    up = held_by_other(d / LOCK_FILE)
    with store.transaction():
        j = store.find(str(j.id))
        if j.state.terminal:
            raise ClusterError(f"job {j.id} is already {j.state.value}")
        store.update(j.id, cancel=1)
        store.event(j.id, "cancel_requested")
        if not up and j.state in (JobState.QUEUED, JobState.PAUSED):  # nothing runs it: done here
            store.update(j.id, state=JobState.CANCELLED, finished=store.clock(), target=0)
            store.event(j.id, "cancelled")
            return f"job {j.id} ({j.name}): cancelled"
    if not up:
        return (f"job {j.id} ({j.name}): cancel requested; the cluster is down: it is cancelled when "
                f"the scheduler runs again (elastic-ring cluster up)")
    return f"job {j.id} ({j.name}): cancel requested"


def jobs_view(cluster_dir: str | Path, as_json: bool = False) -> str:
    """What `elastic-ring jobs` prints: the job table (with a Ray cluster's nodes above it), or the
    jobs as JSON."""
    from elastic_ring.cluster.store import Store

    d = Path(cluster_dir)
    store = Store(d)
    rows = store.jobs()
    if as_json:
        return json.dumps([job_json(j, d) for j in rows], indent=1)
    cfg = store.config()
    lines = []
    if cfg is not None and cfg.ray is not None:
        lines.append(f"Ray nodes: {nodes_line(store.get_meta('nodes') or [list(h) for h in cfg.hosts])}")
    lines.append(jobs_table(rows, d))
    return "\n".join(lines)


def nodes_line(nodes: Sequence[Sequence[Any]]) -> str:
    """``host:slots, ... (N slot(s))``."""
    return (", ".join(f"{h}:{n}" for h, n in nodes) or "none") + f" ({sum(n for _, n in nodes)} slot(s))"


def state_text(j: JobRow, cluster_dir: Path | None = None) -> str:
    """The state column: the state, and why for a stopping or paused job (a failed job's reason is
    printed under the table, a cancelled job's is its state); for a running job, what its run says
    when it is not plain stepping (``running (resizing 1 -> 2)``), from the run's own state."""
    from elastic_ring.cluster.api import JobState, job_dir
    from elastic_ring.controller.status import live_note

    state, msg = j.state, j.message
    if state == JobState.RUNNING and not msg:
        rd = j.run_dir or (job_dir(cluster_dir, j.id) if cluster_dir is not None else None)
        note = live_note(rd) if rd is not None and Path(rd).is_dir() else None
        return f"{state.value} ({note})" if note else state.value
    if not msg or state.terminal:
        return state.value
    return f"{state.value} ({STOP_WORDS.get(msg, msg)})"


def jobs_table(jobs: Sequence[JobRow], cluster_dir: Path | None = None) -> str:
    """The job table (id, name, state, workers, step/total, images/s, submitted, JCT), with a line
    for each failed job under it."""
    from elastic_ring.cluster.api import JobState, job_log

    rows = [("id", "name", "state", "workers", "step/total", "images/s", "submitted", "JCT")]
    notes = []
    for j in jobs:
        total = j.total or j.request.steps or "?"
        jct = f"{j.finished - j.submitted:.1f} s" if j.finished else ""
        rows.append((str(j.id), j.name, state_text(j, cluster_dir),
                     str(j.workers or len(j.slots)), f"{j.step}/{total}", f"{j.images_per_s:.0f}",
                     time.strftime("%H:%M:%S", time.localtime(j.submitted)), jct))
        if j.state == JobState.FAILED:
            log = job_log(cluster_dir, j.id) if cluster_dir is not None else None
            notes.append(f"job {j.id} failed: {j.message or 'no reason recorded'}"
                         + (f" (log: {log})" if log is not None and log.exists() else ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows] + notes)


def job_json(j: JobRow, cluster_dir: Path) -> dict:
    """One job for `jobs --json`: the store's row, with its run folder and log where they exist."""
    from elastic_ring.cluster.api import job_dir, job_log

    out = {k: getattr(j, k) for k in j.columns()}
    out.update(state=j.state.value, request=j.request.to_dict(), slots=list(j.slots))
    rd, log = job_dir(cluster_dir, j.id), job_log(cluster_dir, j.id)
    out["run_dir"] = j.run_dir or (str(rd.resolve()) if rd.is_dir() else None)
    out["log"] = str(log.resolve()) if log.exists() else None
    return out
