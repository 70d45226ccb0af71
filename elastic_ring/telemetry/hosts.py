"""The hosts of a run under host discovery, for the cluster page and Prometheus ``/metrics``.

The controller keeps them as data in the run's ``controller.json`` (``host_state``:
:meth:`elastic_ring.controller.host_watch.HostWatch.state`): the hosts discovered, those in use,
those excluded after a failure (until when) and those draining (leaving with notice). Here they
become one row per host (:func:`host_rows`: its slots, its state, whether discovery lists it, until
when) and the metric families (:func:`metric_families`): the hosts discovered, hosts and slots per
state, and each excluded host's end of cooldown. Nothing is read at import; :func:`read_host_state` reads a run folder.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Iterator

from elastic_ring import protocol

STATES = ("in_use", "idle", "excluded", "draining")  # a host's, as the page and /metrics name them (idle:
# discovered, usable, not in use)


def read_host_state(run_dir: str | Path) -> dict[str, Any] | None:
    """A run's hosts as its controller last wrote them, or None (no host discovery, not written)."""
    ctl = protocol.read_json(Path(run_dir) / protocol.CONTROLLER_FILE)
    st = ctl.get("host_state") if isinstance(ctl, dict) else None
    return st if isinstance(st, dict) else None


def _pairs(v: Any) -> list[tuple[str, int]]:
    out = []
    for p in v or []:
        if isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[1], int):
            out.append((str(p[0]), int(p[1])))
    return out


def host_rows(state: dict[str, Any] | None) -> list[dict[str, Any]]:
    """One row per host: ``{host, slots, state, discovered, in_use_slots, until}``; ``state`` the
    most telling of :data:`STATES` that holds (draining, then excluded, in use, idle); ``discovered``
    whether discovery lists it now; ``until`` an excluded host's end of cooldown or a draining one's
    deadline (wall seconds; None: none). Discovered hosts first, in their order, then any other host
    named (one in use that discovery dropped, say)."""
    if not state:
        return []
    discovered = _pairs(state.get("discovered"))
    in_use = dict(_pairs(state.get("in_use")))
    excluded = {str(e["host"]): e for e in state.get("excluded") or [] if isinstance(e, dict) and "host" in e}
    draining = {str(d["host"]): d for d in state.get("draining") or [] if isinstance(d, dict) and "host" in d}
    slots = dict(discovered)
    order = [h for h, _ in discovered] + [h for h in [*in_use, *excluded, *draining] if h not in slots]
    rows, seen = [], set()
    for h in order:
        if h in seen:
            continue
        seen.add(h)
        if h in draining:
            st, until = "draining", draining[h].get("deadline")
        elif h in excluded:
            st, until = "excluded", excluded[h].get("until")
        elif h in in_use:
            st, until = "in_use", None
        else:
            st, until = "idle", None
        rows.append({"host": h, "slots": int(slots.get(h, in_use.get(h, 0))), "state": st,
                     "discovered": h in slots, "in_use_slots": int(in_use.get(h, 0)),
                     "until": float(until) if isinstance(until, (int, float)) else None})
    return rows


def metric_families(jobs: Iterable[tuple[str, str, list[dict[str, Any]]]]) -> Iterator[Any]:
    """Prometheus families of the hosts of each job (``(id, name, host_rows)``):
    ``elastic_ring_job_hosts_discovered{job,name}`` (hosts discovery lists now),
    ``elastic_ring_job_hosts{job,name,state}`` (hosts per state, every state named),
    ``elastic_ring_job_host_slots{job,name,host,state}`` (each host's slots) and
    ``elastic_ring_job_host_excluded_until_seconds{job,name,host}`` (when an excluded host's
    cooldown ends, Unix seconds)."""
    from prometheus_client.core import GaugeMetricFamily

    found = GaugeMetricFamily("elastic_ring_job_hosts_discovered", "Hosts the discovery of each job lists now",
                              labels=["job", "name"])
    hosts = GaugeMetricFamily("elastic_ring_job_hosts", "Hosts of each job under host discovery, by state "
                              "(in_use; idle: discovered, not in use; excluded after a failure; draining)",
                              labels=["job", "name", "state"])
    slots = GaugeMetricFamily("elastic_ring_job_host_slots", "Slots of each host of a job under host discovery",
                              labels=["job", "name", "host", "state"])
    until = GaugeMetricFamily("elastic_ring_job_host_excluded_until_seconds",
                              "When an excluded host's cooldown ends (Unix seconds)", labels=["job", "name", "host"])
    for job, name, rows in jobs:
        found.add_metric([job, name], sum(1 for r in rows if r["discovered"]))
        counts = dict.fromkeys(STATES, 0)
        for r in rows:
            counts[r["state"]] += 1
            slots.add_metric([job, name, r["host"], r["state"]], r["slots"])
            if r["state"] == "excluded" and r["until"] is not None:
                until.add_metric([job, name, r["host"]], r["until"])
        for st, n in counts.items():
            hosts.add_metric([job, name, st], n)
    yield found
    yield hosts
    yield slots
    yield until
