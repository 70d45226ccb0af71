"""Value types of the live scheduler.

Slots are the units a policy hands out: GPUs on a GPU node (a job gets its own set through
``CUDA_VISIBLE_DEVICES``), CPU worker processes on a CPU machine (there may be more slots than
cores: the jobs then share the cores, as any oversubscribed machine does). With a hostfile the
slots span several hosts and a job gets a horovodrun ``-H host:n,...`` list of its slots. On a Ray
cluster (``ray``) the slots are the alive nodes' CPUs or GPUs, read at every pass
(:mod:`elastic_ring.cluster.ray_slots`); ``hosts`` is then the nodes seen last.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import Any, Mapping

from elastic_ring.errors import UserError

DB_FILE = "cluster.db"
LOCK_FILE = "scheduler.lock"
LIVE_POLICIES = ("eight", "precompute", "exploratory", "optimus", "srtf", "precompute-rc", "optimus-rc",
                 "srtf-rc")
"""``NAME-rc``: NAME, growing a running job only when the gain over 10 resize costs exceeds the resize,
with each job's cost measured from its ``resize_overhead`` events (:mod:`elastic_ring.sched.resize_cost`)."""


def job_dir(cluster_dir: str | Path, jid: int) -> Path:
    """A job's run folder: ``CLUSTER/jobs/<id>``."""
    return Path(cluster_dir) / "jobs" / str(jid)


def job_log(cluster_dir: str | Path, jid: int) -> Path:
    """A job's controller output (its `train` command line, its progress and its error line):
    ``CLUSTER/logs/job-<id>.log``."""
    return Path(cluster_dir) / "logs" / f"job-{jid}.log"


class ClusterError(UserError):
    """A user mistake about the cluster (bad folder, bad job, no scheduler): one line, exit 2."""


class JobStartError(ClusterError):
    """A job's controller cannot be started (the folder it was submitted from is gone): the job
    fails with this line as its message, the scheduler goes on."""


class JobState(str, Enum):
    """Lifecycle of a cluster job.

    QUEUED -> RUNNING (its controller started) -> FINISHED | FAILED.
    RUNNING -> STOPPING (preempted to 0 slots, cancelled, or `cluster down`) -> PAUSED (stopped at a
    checkpoint; resumed later with ``train --resume``) | CANCELLED | FINISHED (it ended first).
    PAUSED -> RUNNING (resumed). QUEUED | PAUSED -> CANCELLED.
    A resize happens while RUNNING (``resize_to`` set while it is in flight).
    A job that ran all its steps is ``finished``, the word ``elastic-ring status`` uses for a run
    (stores written before the rename hold ``succeeded``, read as FINISHED).
    """

    QUEUED = "queued"
    RUNNING = "running"
    STOPPING = "stopping"
    PAUSED = "paused"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @classmethod
    def _missing_(cls, value: object) -> "JobState | None":
        return cls.FINISHED if value == "succeeded" else None

    @property
    def terminal(self) -> bool:
        return self in (JobState.FINISHED, JobState.FAILED, JobState.CANCELLED)


@dataclass(frozen=True)
class JobRequest:
    """What `elastic-ring submit` asks for (validated on construction).

    kind: "script" (a user script run with ``train --script``) or "config" (the built-in ResNet).
    path: the script or config file; steps: total steps (scripts; configs may set total_steps).
    sets: ``--set k=v`` for configs; args: the script's own arguments.
    profile: a ``profile.json`` (Eq. 5) for precompute / optimus / srtf; None: linear speed-up.
    target_loss: if given, remaining work is Eq. 1's prediction of the steps to reach it (capped by
        the step budget); else the step budget left.
    cwd: the folder `submit` was run in (absolute): the job's `train` runs there, so its script's
        relative paths mean what they mean under ``python script.py`` from that shell; None (a job
        stored before it was recorded): the scheduler's folder.
    """

    name: str
    kind: str
    path: str
    steps: int | None = None
    min_workers: int = 1
    max_workers: int = 0  # 0: the cluster's slots
    sets: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    profile: str | None = None
    target_loss: float | None = None
    train_args: tuple[str, ...] = ()  # extra `train` options (e.g. --checkpoint-every 20)
    cwd: str | None = None
    form: str = "library"  # a script's form: "torchrun" (its own length and snapshot: no --steps)

    def __post_init__(self) -> None:
        if self.kind not in ("script", "config"):
            raise ClusterError(f"job kind must be script or config, got {self.kind!r}")
        if self.form not in ("library", "torchrun"):
            raise ClusterError(f"a script's form must be library or torchrun, got {self.form!r}")
        if self.form == "torchrun" and self.kind != "script":
            raise ClusterError("only a script can be of torchrun's form")
        if self.form == "torchrun" and self.steps is not None:
            raise ClusterError("--steps does not apply to a script of torchrun's contract: its length is its own")
        if self.kind == "script" and self.form != "torchrun" and (self.steps is None or self.steps < 1):
            raise ClusterError("a script job needs --steps >= 1")
        if self.min_workers < 1:
            raise ClusterError(f"--min-workers must be >= 1, got {self.min_workers}")
        if self.max_workers and self.max_workers < self.min_workers:
            raise ClusterError(f"--max-workers {self.max_workers} is below --min-workers {self.min_workers}")
        if self.target_loss is not None and not (self.target_loss > 0 and math.isfinite(self.target_loss)):
            raise ClusterError(f"--target-loss must be > 0, got {self.target_loss}")
        if self.cwd is not None and not Path(self.cwd).is_absolute():
            raise ClusterError(f"a job's folder must be absolute, got {self.cwd!r}")

    def batch_rule(self) -> tuple[str, int, int]:
        """(the LR/batch rule, the global batch, the per-worker batch) the job gives ``train``:
        ``--lr-scaling``/``--global-batch``/``--batch-size`` among its train options, else (a
        config job) ``lr_scaling``/``global_batch`` as its config file or ``--set``s state them and
        the ``batch_size`` its ``train`` reads (the default where none does), else (a script, or a
        config that no longer reads) among its ``--set``s; ``""``/0 where not given. The
        scheduler's speed model of a ``constant-batch`` job is the accumulated step's
        (:func:`elastic_ring.cluster.daemon.rate_for`)."""
        found = {"lr_scaling": "", "global_batch": "", "batch_size": ""}
        config = self._config_rule() if self.kind == "config" else None
        if config is not None:
            found.update(config)
        else:
            for item in self.sets:
                key, _, value = item.partition("=")
                if key.strip() in found:
                    found[key.strip()] = value.strip()
        args = list(self.train_args)
        for i, a in enumerate(args):
            name, eq, value = a.partition("=")
            key = name[2:].replace("-", "_") if name.startswith("--") else ""
            if key in found:
                found[key] = value if eq else (args[i + 1] if i + 1 < len(args) else "")

        def number(v: str) -> int:
            return int(v) if v.isdigit() else 0

        return found["lr_scaling"], number(found["global_batch"]), number(found["batch_size"])

    def _config_rule(self) -> dict[str, str] | None:
        """A config job's ``lr_scaling``, ``global_batch`` and ``batch_size`` as its ``train`` reads
        them from its file and ``--set``s; None where the file no longer reads (checked at
        ``submit``; the job's ``train`` will say why: not the scheduler's to stop on)."""
        from elastic_ring.config.api import load_config

        try:
            cfg = load_config(self.path, self.sets)
        except Exception:  # noqa: BLE001 - a config changed since submit must not stop the scheduler
            return None
        given = cfg.model_fields_set  # the rule as the file or a --set states it (else a profile's may)
        return {"lr_scaling": str(cfg.lr_scaling) if "lr_scaling" in given else "",
                "global_batch": str(cfg.global_batch or "") if "global_batch" in given else "",
                "batch_size": str(cfg.batch_size)}  # (its default too: train's micro-batch)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "JobRequest":
        """A stored request; a key it lacks (``cwd`` in a store of an older version) takes its
        default."""
        d = dict(d)
        for k in ("sets", "args", "train_args"):
            d[k] = tuple(d.get(k) or ())
        return cls(**d)


@dataclass(frozen=True)
class ClusterConfig:
    """Blueprint of one cluster: its slots (host, count per host), the device kind, the policy.

    ray: None (fixed hosts), or the Ray cluster whose nodes give the slots ("": $RAY_ADDRESS, else
    a local Ray); ``hosts`` is then the nodes seen last (it may be empty: a head without CPUs).
    """

    hosts: tuple[tuple[str, int], ...]
    policy: str = "precompute"
    device: str = "cpu"  # cpu: worker processes; cuda: GPUs through CUDA_VISIBLE_DEVICES
    network_interface: str | None = None
    poll_s: float = 0.5
    profile: str | None = None  # default profile for jobs without one
    ray: str | None = None

    def __post_init__(self) -> None:
        if self.ray is None and (not self.hosts or any(n < 1 for _, n in self.hosts)):
            raise ClusterError("a cluster needs at least one slot")
        if self.policy not in LIVE_POLICIES:
            raise ClusterError(f"unknown policy {self.policy!r} for the live scheduler; choose from "
                               f"{', '.join(LIVE_POLICIES)}")
        if self.device not in ("cpu", "cuda"):
            raise ClusterError(f"device must be cpu or cuda, got {self.device!r}")

    @property
    def slots(self) -> int:
        return sum(n for _, n in self.hosts)

    @property
    def multi_host(self) -> bool:
        """Several fixed hosts (horovodrun -H lists); never for Ray (Ray places the workers)."""
        return self.ray is None and len(self.hosts) > 1

    def slot_table(self) -> list[tuple[str, int]]:
        """Slot index -> (host, index on that host)."""
        return [(h, i) for h, n in self.hosts for i in range(n)]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["hosts"] = [list(h) for h in self.hosts]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ClusterConfig":
        d = dict(d)
        d["hosts"] = tuple((str(h), int(n)) for h, n in d["hosts"])
        return cls(**d)


class _RowView:
    """``row["column"]``, ``row.get``, ``keys`` and ``items`` on a frozen row dataclass: the dict the
    store gave before its rows were typed, for the callers not yet converted."""

    @classmethod
    def columns(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))  # type: ignore[arg-type]

    def __getitem__(self, key: str) -> Any:
        if key not in self.columns():
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self.columns() else default

    def keys(self) -> tuple[str, ...]:
        return self.columns()

    def items(self) -> list[tuple[str, Any]]:
        return [(k, self[k]) for k in self.columns()]


@dataclass(frozen=True)
class JobEvent(_RowView):
    """One entry of the store's history (its ``events`` table): an action on a job (``submitted``,
    ``started``, ``resize_requested``, ``explore_measured``, ...) or on the cluster (``job_id``
    None), with its details in ``data``."""

    id: int
    time: float
    job_id: int | None
    kind: str
    data: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_columns(cls, row: Mapping[str, Any]) -> "JobEvent":
        """A row of the ``events`` table (``data`` still JSON text, or already decoded)."""
        data = row["data"]
        return cls(id=row["id"], time=row["time"], job_id=row["job_id"], kind=row["kind"],
                   data=json.loads(data) if isinstance(data, str) else dict(data or {}))


@dataclass(frozen=True)
class JobRow(_RowView):
    """One job as the store holds it (a row of its ``jobs`` table), read back typed.

    request: what was submitted. slots: the slot numbers it holds now (a resize in flight keeps
    the old ones until the old workers exit). target: the policy's last allocation. resize_to /
    resize_mark: the size of the resize in flight, and the controller's ``workers_exited`` count
    when it was asked (None: none in flight). cancel: 1 once a cancel was asked. step / total /
    workers / images_per_s: the progress last observed. message: why it stopped (``preempt``,
    ``resize``, ``cancel``, ``down``, ``explore``) or why it failed.

    A row is a value: the store changes the job (:meth:`~elastic_ring.cluster.store.Store.update`),
    and :meth:`replace` gives the row with some fields changed.
    """

    id: int
    name: str
    request: JobRequest
    state: JobState
    submitted: float
    started: float | None = None
    finished: float | None = None
    slots: tuple[int, ...] = ()
    target: int = 0
    resize_to: int | None = None
    resize_mark: int | None = None
    pid: int | None = None
    run_dir: str | None = None
    cancel: int = 0
    step: int = 0
    total: int = 0
    workers: int = 0
    images_per_s: float = 0.0
    message: str = ""

    @classmethod
    def from_columns(cls, row: Mapping[str, Any]) -> "JobRow":
        """The row of a ``jobs`` table read as a mapping (its JSON columns still text). A column
        this version does not know (a newer store's) is left out; one it lacks takes its default."""
        known = set(cls.columns())
        d = {k: row[k] for k in row.keys() if k in known}
        d["slots"] = tuple(json.loads(d.get("slots") or "[]"))
        d["request"] = JobRequest.from_dict(json.loads(d["request"]))
        d["state"] = JobState(d["state"])
        return cls(**d)

    def replace(self, **changes: Any) -> "JobRow":
        """This row with ``changes`` (field names of the row)."""
        return dataclasses.replace(self, **changes)

    def __getitem__(self, key: str) -> Any:
        v = super().__getitem__(key)
        return list(v) if key == "slots" else v  # a list, as the dict rows held it


@dataclass
class Observation:
    """What the runner reads of one job's run folder and controller.

    alive: the controller process runs. state: controller.json's state (None before it exists).
    world_size: workers of the current segment; step / total: progress; images_per_s: last
    throughput; launches / exits: counts of ``launch`` and ``workers_exited`` events so far;
    outcome: summary.json's state once the controller is gone (``controller.api.RunState``: finished,
    failed, stopped; an older one's succeeded, interrupted);
    losses: (step, loss) of the throughput events.
    throughput: the ``throughput`` windows read since the previous observation, each
    (launches so far, world_size, steps, seconds): what ``exploratory`` measures a job with (the
    launch count tells the first window after each launch, a warm-up, apart).
    resize_lost_s: ``total_lost_s`` of the ``resize_overhead`` events read since the previous
    observation (each resize's seconds without training): what the ``-rc`` policies weigh.
    restarts: launches that followed a ``restart`` event (a failure: the controller relaunched from
    its checkpoint, on a Ray cluster perhaps on fewer workers).
    error: once the controller is gone without finishing, why, in one line (its error line in the
    job's log, else its last error event), or None.
    """

    alive: bool
    state: str | None = None
    world_size: int = 0
    step: int = 0
    total: int = 0
    images_per_s: float = 0.0
    launches: int = 0
    exits: int = 0
    outcome: str | None = None
    losses: list[tuple[float, float]] = field(default_factory=list)
    throughput: list[tuple[int, int, int, float]] = field(default_factory=list)
    resize_lost_s: list[float] = field(default_factory=list)
    restarts: int = 0
    error: str | None = None
