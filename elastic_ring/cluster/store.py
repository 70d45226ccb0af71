"""The cluster's durable state: one SQLite database (standard ``sqlite3``, WAL journal) in the
cluster folder. Tables: ``jobs`` (request, state, slots held, controller pid, progress),
``decisions`` (every policy decision: time, cause, allocation), ``events`` (every action on a
job), ``meta`` (the cluster's config, a `down` request). ``submit``, ``cancel`` and ``cluster
down`` write here; the scheduler polls it. Nothing listens on a network port; access is the
folder's file permissions.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any, Iterator

from elastic_ring.cluster.api import DB_FILE, ClusterConfig, ClusterError, JobEvent, JobRequest, JobRow, JobState

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, request TEXT NOT NULL,
    state TEXT NOT NULL, submitted REAL NOT NULL, started REAL, finished REAL,
    slots TEXT NOT NULL DEFAULT '[]', target INTEGER NOT NULL DEFAULT 0, resize_to INTEGER,
    resize_mark INTEGER, pid INTEGER, run_dir TEXT, cancel INTEGER NOT NULL DEFAULT 0,
    step INTEGER NOT NULL DEFAULT 0, total INTEGER NOT NULL DEFAULT 0, workers INTEGER NOT NULL DEFAULT 0,
    images_per_s REAL NOT NULL DEFAULT 0, message TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS decisions (
    id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL, cause TEXT NOT NULL,
    job_id INTEGER, allocation TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT, time REAL NOT NULL, job_id INTEGER, kind TEXT NOT NULL,
    data TEXT NOT NULL DEFAULT '{}');
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

JOB_FIELDS = JobRow.columns()


class Store:
    """One connection to ``DIR/cluster.db`` (created on first use with ``create=True``).

    Raises:
        ClusterError: no cluster in ``DIR`` (and ``create`` is False).
    """

    def __init__(self, cluster_dir: Path, create: bool = False, clock=time.time) -> None:
        self.dir = Path(cluster_dir)
        path = self.dir / DB_FILE
        if not path.exists() and not create:
            raise ClusterError(f"no cluster in {self.dir} (start one with: elastic-ring cluster up --dir {self.dir})")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.clock = clock
        self.db = sqlite3.connect(str(path), timeout=30.0, isolation_level=None)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA busy_timeout=30000")
        self.db.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at each checkpoint, never corrupt
        self.db.executescript(_SCHEMA)

    def close(self) -> None:
        self.db.close()

    # ------------------------------------------------------------------ meta
    def get_meta(self, key: str) -> Any | None:
        row = self.db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return json.loads(row["value"]) if row else None

    def set_meta(self, key: str, value: Any) -> None:
        self.db.execute("INSERT INTO meta(key, value) VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                        (key, json.dumps(value)))

    def config(self) -> ClusterConfig | None:
        d = self.get_meta("config")
        return ClusterConfig.from_dict(d) if d else None

    # ------------------------------------------------------------------ jobs
    def submit(self, req: JobRequest) -> int:
        cur = self.db.execute("INSERT INTO jobs(name, request, state, submitted) VALUES(?, ?, ?, ?)",
                              (req.name, json.dumps(req.to_dict()), JobState.QUEUED.value, self.clock()))
        jid = int(cur.lastrowid)
        self.event(jid, "submitted", name=req.name)
        return jid

    def jobs(self, active_only: bool = False) -> list[JobRow]:
        q = "SELECT * FROM jobs"
        if active_only:
            q += " WHERE state NOT IN ('finished', 'succeeded', 'failed', 'cancelled')"  # succeeded: older stores
        return [JobRow.from_columns(r) for r in self.db.execute(q + " ORDER BY id")]

    def job(self, jid: int) -> JobRow:
        r = self.db.execute("SELECT * FROM jobs WHERE id=?", (jid,)).fetchone()
        if r is None:
            raise ClusterError(f"no job {jid} in {self.dir}")
        return JobRow.from_columns(r)

    def find(self, ref: str) -> JobRow:
        """A job by id or by name (the newest of that name)."""
        if ref.isdigit():
            return self.job(int(ref))
        r = self.db.execute("SELECT * FROM jobs WHERE name=? ORDER BY id DESC LIMIT 1", (ref,)).fetchone()
        if r is None:
            raise ClusterError(f"no job named {ref!r} in {self.dir}")
        return JobRow.from_columns(r)

    def update(self, jid: int, **fields: Any) -> None:
        """Change job ``jid``'s columns (any field of :class:`JobRow` but ``id`` and ``request``)."""
        if not fields:
            return
        for k in fields:
            if k not in JOB_FIELDS or k in ("id", "request"):
                raise KeyError(k)
        vals = [json.dumps(list(v)) if k == "slots" else (v.value if isinstance(v, JobState) else v)
                for k, v in fields.items()]
        self.db.execute(f"UPDATE jobs SET {', '.join(f'{k}=?' for k in fields)} WHERE id=?", (*vals, jid))

    def transaction(self) -> "_Tx":
        return _Tx(self.db)

    # ------------------------------------------------------------------ history
    def event(self, jid: int | None, kind: str, **data: Any) -> None:
        self.db.execute("INSERT INTO events(time, job_id, kind, data) VALUES(?, ?, ?, ?)",
                        (self.clock(), jid, kind, json.dumps(data)))

    def decision(self, cause: str, jid: int | None, allocation: dict[int, int]) -> None:
        self.db.execute("INSERT INTO decisions(time, cause, job_id, allocation) VALUES(?, ?, ?, ?)",
                        (self.clock(), cause, jid, json.dumps({str(k): v for k, v in allocation.items()})))

    def events(self, jid: int | None = None) -> list[JobEvent]:
        q, args = "SELECT * FROM events", ()
        if jid is not None:
            q, args = q + " WHERE job_id=?", (jid,)
        return [JobEvent.from_columns(r) for r in self.db.execute(q + " ORDER BY id", args)]

    def decisions(self) -> list[dict[str, Any]]:
        return [dict(r, allocation={int(k): v for k, v in json.loads(r["allocation"]).items()})
                for r in self.db.execute("SELECT * FROM decisions ORDER BY id")]


class _Tx:
    """``with store.transaction():`` one atomic step (BEGIN IMMEDIATE ... COMMIT / ROLLBACK)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, et, ev, tb) -> None:
        self.db.execute("COMMIT" if et is None else "ROLLBACK")


def iter_slots(jobs: list[JobRow]) -> Iterator[int]:
    for j in jobs:
        yield from j.slots
