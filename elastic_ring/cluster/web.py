"""A read-only web page and Prometheus metrics for a cluster folder.

``elastic-ring cluster up --web [HOST:]PORT`` serves it from the scheduler's process;
``elastic-ring cluster web --dir DIR`` from its own (it reads the folder while another process
schedules it, and goes on while that scheduler restarts). Everything comes from what the scheduler
and the controllers already record: the cluster's SQLite store (opened read-only; WAL lets readers
and the writer go on together), each job's ``events.jsonl``, and a running job's hosts under host
discovery (its ``controller.json``: :mod:`elastic_ring.telemetry.hosts`).

Routes (all GET, no action anywhere):
    /             the page (HTML, JS and CSS shipped in the package: no CDN)
    /api/state    the whole picture as JSON; the page polls it every second
    /metrics      Prometheus text format (``prometheus_client``)
    /static/...   the page's assets

It binds 127.0.0.1 unless told otherwise (reach it from elsewhere through an ssh tunnel).
"""

from __future__ import annotations

import json
import socket
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from elastic_ring.cluster.api import DB_FILE, ClusterError, JobEvent, JobRow, JobState, job_dir, job_log
from elastic_ring.controller.status import live_note
from elastic_ring.controller.summary import membership_change
from elastic_ring.events.api import Launch, MembershipChanged, ResizeOverhead, Restart, Throughput, as_event
from elastic_ring.telemetry.hosts import host_rows, metric_families, read_host_state

STATIC = Path(__file__).with_name("web_static")
TERMINAL = ("finished", "failed", "cancelled")
_CURVE_POINTS = 400  # per job and curve, the newest kept


def parse_bind(value: str, flag: str = "--web") -> tuple[str, int]:
    """``PORT`` or ``HOST:PORT`` -> (host, port); host 127.0.0.1 by default. ``flag``: the option
    the value came from, named in the error.

    Raises:
        ClusterError: not a port number in 0..65535.
    """
    host, _, port = value.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    try:
        p = int(port)
    except ValueError:
        raise ClusterError(f"{flag} wants [HOST:]PORT, got {value!r}") from None
    if not 0 <= p <= 65535:
        raise ClusterError(f"{flag} port must be 0..65535, got {p}")
    return host, p


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: any free one).

    Raises:
        ClusterError: the address cannot be bound (port in use, unknown host).
    """
    try:
        info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(info[0], socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(info[4])
        sock.listen(64)
    except OSError as e:
        raise ClusterError(f"cannot serve the web page on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


def check_dir(cluster_dir: Path) -> None:
    """Raises ClusterError unless ``cluster_dir`` holds a readable cluster store."""
    path = Path(cluster_dir) / DB_FILE
    if not path.exists():
        raise ClusterError(f"no cluster in {cluster_dir} (no {DB_FILE})")
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0)
        con.execute("SELECT count(*) FROM jobs").fetchone()
        con.close()
    except sqlite3.Error as e:
        raise ClusterError(f"cannot read the cluster store {path}: {e}") from None


class _Tail:
    """The records of a growing ``events.jsonl`` read so far (only whole lines)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0
        self.loss: list[tuple[float, float]] = []
        self.ips: list[tuple[float, float]] = []
        self.resizes: list[dict[str, Any]] = []
        self.restarts: list[dict[str, Any]] = []
        self.changes: list[dict[str, Any]] = []  # membership changes (summary.membership_change)
        self.steps_per_s = 0.0
        self.world = 0

    def update(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except OSError:
            return
        end = data.rfind(b"\n")
        if end < 0:
            return
        self.offset += end + 1
        for line in data[:end + 1].splitlines():
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if not isinstance(d, dict):
                continue
            e = as_event(d)
            try:
                if isinstance(e, Throughput):
                    self.loss.append((float(e.time), float(e.loss)))
                    self.ips.append((float(e.time), float(e.images_per_s)))
                    self.steps_per_s, self.world = float(e.steps_per_s), int(e.world_size)
                elif isinstance(e, ResizeOverhead):
                    self.resizes.append({k: getattr(e, k) for k in (
                        "time", "from_workers", "to_workers", "step", "stop_latency_s", "checkpoint_s",
                        "relaunch_to_first_step_s", "total_lost_s")})
                elif isinstance(e, MembershipChanged):
                    self.changes.append(membership_change(e))
                elif isinstance(e, Restart):
                    self.restarts.append({k: getattr(e, k) for k in (
                        "time", "attempt", "cause", "rank", "failed_at_step", "steps_redone", "gave_up")})
                elif isinstance(e, Launch):
                    self.world = int(e.world_size)
            except (TypeError, ValueError):
                continue
        del self.loss[:-_CURVE_POINTS], self.ips[:-_CURVE_POINTS]


def _pid_alive(pid: Any) -> bool:
    try:
        import psutil

        p = psutil.Process(int(pid))
        return p.status() != psutil.STATUS_ZOMBIE
    except Exception:  # noqa: BLE001 - no pid, gone, not ours to see
        return False


class ClusterView:
    """Reads a cluster folder into one JSON-able picture (:meth:`state`); thread-safe."""

    def __init__(self, cluster_dir: Path, clock=time.time) -> None:
        self.dir = Path(cluster_dir).resolve()
        self.clock = clock
        self._tails: dict[int, _Tail] = {}
        self._lock = threading.Lock()
        self._sched_seen: float | None = None  # when the scheduler was last seen alive
        self._gaps: list[list[float | None]] = []  # [down since, back at] as this reader saw them

    def _connect(self) -> sqlite3.Connection:
        con = sqlite3.connect(f"file:{self.dir / DB_FILE}?mode=ro", uri=True, timeout=10.0)
        con.row_factory = sqlite3.Row
        return con

    def state(self) -> dict[str, Any]:
        with self._lock:
            return self._state()

    def _state(self) -> dict[str, Any]:
        now = self.clock()
        con = self._connect()
        try:
            meta = {r["key"]: json.loads(r["value"]) for r in con.execute("SELECT key, value FROM meta")}
            jobs = [JobRow.from_columns(r) for r in con.execute("SELECT * FROM jobs ORDER BY id")]
            events = [JobEvent.from_columns(r) for r in con.execute("SELECT * FROM events ORDER BY id")]
            decisions = [dict(r) for r in con.execute("SELECT * FROM decisions ORDER BY id")]
        finally:
            con.close()
        cfg = meta.get("config") or {}
        hosts = meta.get("nodes") if cfg.get("ray") is not None and meta.get("nodes") is not None else cfg.get("hosts", [])
        total_slots = sum(int(n) for _, n in hosts)  # a Ray cluster's: its nodes at the last pass
        sched_pid = meta.get("scheduler_pid")
        alive = _pid_alive(sched_pid) if sched_pid else False
        if alive:
            if self._gaps and self._gaps[-1][1] is None:
                self._gaps[-1][1] = now
            self._sched_seen = now
        elif not meta.get("down") and (not self._gaps or self._gaps[-1][1] is not None):
            self._gaps.append([self._sched_seen or now, None])

        out_jobs = []
        for j in jobs:
            jid = j.id
            rd = Path(j.run_dir) if j.run_dir else job_dir(self.dir, jid)
            tail = self._tails.get(jid)
            if tail is None:
                tail = self._tails[jid] = _Tail(rd / "events.jsonl")
            tail.update()
            step, total = int(j.step or 0), int(j.total or 0)
            state = j.state.value  # a store of before the rename holds succeeded: read as finished
            running = j.state == JobState.RUNNING
            log = job_log(self.dir, jid)
            remaining = ((total - step) / tail.steps_per_s
                         if running and total and tail.steps_per_s > 0 else None)
            jct = (j.finished - j.submitted) if j.finished and state in TERMINAL else None
            out_jobs.append({
                "id": jid, "name": j.name, "state": state, "workers": int(j.workers or 0),
                "slots": len(j.slots), "step": step, "total": total,
                "images_per_s": float(j.images_per_s or 0.0) if running else 0.0,
                "remaining_s": remaining, "jct_s": jct, "submitted": j.submitted,
                "started": j.started, "finished": j.finished,
                "restarts": len(tail.restarts), "resizes": len(tail.resizes),
                "resize_lost_s": sum(float(r.get("total_lost_s") or 0.0) for r in tail.resizes),
                "message": j.message,
                # what the run itself says while the scheduler says running: resizing 1 -> 2, ...
                "run_state": live_note(rd) if running and rd.is_dir() else None,
                "run_dir": str(rd) if rd.is_dir() else None, "log": str(log) if log.exists() else None,
                "curves": {"loss": tail.loss, "images_per_s": tail.ips},
                "resize_events": tail.resizes, "restart_events": tail.restarts,
                "membership_changes": tail.changes, "last_change": tail.changes[-1]["what"] if tail.changes else None,
                # under host discovery: discovered, in use, excluded (until when), draining
                "hosts": host_rows(read_host_state(rd)) if running and rd.is_dir() else [],
            })
        return {
            "now": now, "dir": str(self.dir),
            "cluster": {"slots": total_slots, "policy": cfg.get("policy"), "device": cfg.get("device"),
                        "hosts": hosts, "down_requested": bool(meta.get("down"))},
            "scheduler": {"pid": sched_pid, "alive": alive,
                          "gaps": [{"from": a, "to": b} for a, b in self._gaps]},
            "slots_used": sum(j["slots"] for j in out_jobs),
            "jobs": out_jobs,
            "timeline": timeline(events, now),
            "decisions": [{"time": d["time"], "cause": d["cause"], "job_id": d["job_id"],
                           "allocation": json.loads(d["allocation"])} for d in decisions],
        }


def timeline(events: list[JobEvent], now: float) -> list[dict[str, Any]]:
    """Slots held per job over time, from the store's events: ``[{job_id, from, to, slots}]``
    (``to`` None: still held)."""
    held: dict[int, tuple[float, int]] = {}
    bars: list[dict[str, Any]] = []

    def set_count(jid: int, t: float, n: int) -> None:
        cur = held.get(jid)
        if cur is not None and cur[1] == n:
            return
        if cur is not None and cur[1] > 0:
            bars.append({"job_id": jid, "from": cur[0], "to": t, "slots": cur[1]})
        held[jid] = (t, n)

    for e in events:
        jid, kind, t, data = e.job_id, e.kind, float(e.time), e.data
        if jid is None:
            continue
        if kind in ("started", "resumed", "resized") and "slots" in data:
            set_count(jid, t, len(data["slots"]))
        elif kind == "resize_requested" and "slots" in data:  # a grow claims its slots at once
            set_count(jid, t, len(data["slots"]))
        elif kind == "adopted":
            set_count(jid, t, int(data.get("workers") or 0))
        elif kind in ("finished", "succeeded", "failed", "cancelled", "paused"):
            set_count(jid, t, 0)
    for jid, (t0, n) in held.items():
        if n > 0:
            bars.append({"job_id": jid, "from": t0, "to": None, "slots": n})
    return sorted(bars, key=lambda b: (b["from"], b["job_id"]))


# ---------------------------------------------------------------------- Prometheus
class _Collector:
    """Builds the metrics from a fresh :meth:`ClusterView.state` at every scrape."""

    def __init__(self, view: ClusterView) -> None:
        self.view = view

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s = self.view.state()
        by_state = GaugeMetricFamily("elastic_ring_jobs", "Jobs by state", labels=["state"])
        counts: dict[str, int] = {k: 0 for k in ("queued", "running", "stopping", "paused", *TERMINAL)}
        for j in s["jobs"]:
            counts[j["state"]] = counts.get(j["state"], 0) + 1
        for k, n in counts.items():
            by_state.add_metric([k], n)
        yield by_state
        yield GaugeMetricFamily("elastic_ring_slots_total", "Slots of the cluster", value=s["cluster"]["slots"])
        yield GaugeMetricFamily("elastic_ring_slots_used", "Slots held by jobs", value=s["slots_used"])
        yield GaugeMetricFamily("elastic_ring_scheduler_up", "1 while the scheduler process runs",
                                value=1 if s["scheduler"]["alive"] else 0)
        yield CounterMetricFamily("elastic_ring_resizes", "Resizes done, all jobs",
                                  value=sum(j["resizes"] for j in s["jobs"]))
        yield CounterMetricFamily("elastic_ring_restarts", "Worker restarts after failures, all jobs",
                                  value=sum(j["restarts"] for j in s["jobs"]))
        yield CounterMetricFamily("elastic_ring_resize_lost_seconds", "Training time lost to resizes, all jobs",
                                  value=sum(j["resize_lost_s"] for j in s["jobs"]))
        ips = GaugeMetricFamily("elastic_ring_job_images_per_second", "Throughput of each running job",
                                labels=["job", "name"])
        ws = GaugeMetricFamily("elastic_ring_job_world_size", "Workers of each running job", labels=["job", "name"])
        for j in s["jobs"]:
            if j["state"] == "running":
                ips.add_metric([str(j["id"]), j["name"]], j["images_per_s"])
                ws.add_metric([str(j["id"]), j["name"]], j["workers"])
        yield ips
        yield ws
        yield from metric_families((str(j["id"]), j["name"], j["hosts"]) for j in s["jobs"] if j["hosts"])


# ---------------------------------------------------------------------- server
def make_app(cluster_dir: Path):
    """The Starlette app (GET only) for ``cluster_dir``."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
    from starlette.applications import Starlette
    from starlette.responses import FileResponse, JSONResponse, Response
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    view = ClusterView(cluster_dir)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(view))
    headers = {"Cache-Control": "no-store"}

    async def index(request):
        return FileResponse(STATIC / "index.html", headers={
            **headers, "Content-Security-Policy": "default-src 'self'; style-src 'self'; script-src 'self'"})

    async def api_state(request):
        return JSONResponse(view.state(), headers=headers)

    async def metrics(request):
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST, headers=headers)

    return Starlette(routes=[
        Route("/", index, methods=["GET"]),
        Route("/api/state", api_state, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Mount("/static", StaticFiles(directory=str(STATIC)), name="static"),
    ])


class WebServer:
    """uvicorn serving :func:`make_app` on an already bound socket, in a thread or in the foreground."""

    def __init__(self, cluster_dir: Path, sock: socket.socket) -> None:
        import uvicorn

        self.sock = sock
        self.config = uvicorn.Config(make_app(cluster_dir), log_level="warning", access_log=False,
                                     lifespan="off")
        self.server = uvicorn.Server(self.config)
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.sock.getsockname()[:2]
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}/"

    def serve(self) -> None:
        """In the foreground (until SIGINT/SIGTERM)."""
        self.server.run(sockets=[self.sock])

    def start(self) -> None:
        """In a daemon thread (the scheduler's own loop keeps the main thread)."""
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       daemon=True, name="elastic-ring-web")
        self.thread.start()

    def stop(self) -> None:
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout=5)
