"""Where a new or resumed run's workers run, decided while it is prepared (:func:`.runs.prepare`):
the nodes of a Slurm allocation as ``--hosts`` (:func:`with_slurm_hosts`), the slots of a fixed
host list, of this host's GPUs or of its CPU cores (:func:`_slots`), and the hosts as the
controller's ``HostManager`` (:func:`host_manager`): the ``--host-discovery-script`` and its bounds
(:func:`hosts_slots`), or a fixed host list (``--hosts``, ``--hostfile``, Slurm's nodes) as a
discovery whose answer never changes (:func:`fixed_hosts`), so that a failed host's cooldown and
grow back, ``drain``, a worker's SIGTERM as a notice and ``--relaunch inplace`` over the hosts go
the one way for both; under ``--relaunch inplace`` whether the ring runs over the hosts listed or
on this host only; and the discovery options a resume keeps from its start (:func:`with_run_discovery`).

Bad input raises :class:`~elastic_ring.errors.UserError` (one line, exit status 2) before any
process starts.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from elastic_ring import protocol
from elastic_ring.controller.requests import RunRequest
from elastic_ring.errors import UserError


def _slots(req: RunRequest, device: str, ngpu: int) -> int:
    from elastic_ring.controller.api import parse_hostfile, parse_hosts

    host_list = parse_hosts(req.hosts) if req.hosts else parse_hostfile(req.hostfile) if req.hostfile else None
    if host_list:
        return sum(n for _, n in host_list)
    if device == "cuda":
        return ngpu
    return req.slots or (os.cpu_count() or 1)


def with_slurm_hosts(req: RunRequest, echo: Callable[[str], None],
                     env: dict[str, str] | None = None) -> RunRequest:
    """Inside a Slurm allocation (``SLURM_JOB_ID`` set) and given none of ``--hosts``,
    ``--hostfile``, ``--slots`` (which choose otherwise; the cluster runner always gives
    ``--slots``) nor ``--backend ray`` (whose nodes are Ray's) nor ``--host-discovery-script``: the
    allocation's nodes and slots (:func:`elastic_ring.hosts.slurm.allocation`), said in one line.
    One node that is this host stays a run on this host as without Slurm (its visible GPUs or CPU
    cores as slots); otherwise the nodes become ``--hosts``.

    Raises:
        UserError: Slurm's variables do not parse, or the allocation has no slot (one line).
    """
    from dataclasses import replace

    from elastic_ring.hosts.api import HostsError
    from elastic_ring.hosts.slurm import allocation, in_allocation, is_this_host

    if (req.hosts or req.hostfile or req.slots is not None or req.backend == "ray" or req.host_discovery_script
            or not in_allocation(env)):
        return req
    try:
        alloc = allocation(env, gpus=req.device != "cpu")
    except HostsError as e:
        raise UserError(f"inside a Slurm allocation, {e} (give --hosts to name the hosts)") from None
    (first, n), *more = alloc.hosts.pairs() or [("", 0)]
    if not n:
        raise UserError(f"Slurm job {alloc.job_id} has no slots ({alloc.nodelist}): give --hosts")
    if not more and is_this_host(first):  # as without Slurm: its visible GPUs or CPU cores (a CPU job's
        # one task with -c16 would otherwise get one slot); --slots chooses otherwise
        echo(f"elastic-ring: {alloc.line()}: this host (--slots to choose how many workers it takes)")
        return req
    echo(f"elastic-ring: {alloc.line()}: --hosts {alloc.hosts.arg()} (--hosts, --hostfile or --slots "
         f"to choose otherwise)")
    return replace(req, hosts=alloc.hosts.arg())


FIXED_INTERVAL_S = 1.0  # how often a fixed host list is "asked" (reading a list: no process, no cost)


def fixed_hosts(req: RunRequest, collective: str = "horovod") -> Any:
    """The fixed host list (``--hosts``, ``--hostfile``, or Slurm's nodes made ``--hosts`` by
    :func:`with_slurm_hosts`) that the controller watches as a discovery whose answer never changes,
    as a :class:`~elastic_ring.hosts.api.HostSet`; None where it is not watched: no host list, host
    discovery, ``--backend ray``, ``--slots`` beside the list (the cluster's scheduler places its
    jobs so: the hosts are its to choose), or one host in a relaunch mode (leaving out the only host
    would leave nothing: a failure restarts on it at once, as before). Under ``--relaunch inplace``
    one host is watched too (the ring in place on this host only, as a discovery listing one host),
    except with ``--collective torch``, whose in-place ring on one host is its own launch. With
    ``--collective torch`` relaunched over several hosts the list is watched as under discovery
    (:mod:`~elastic_ring.controller.backends.torch_hosts` launches the workers either way).

    Raises:
        UserError: ``--blacklist-cooldown-range`` where no host list is watched (one line).
    """
    from elastic_ring.controller.api import parse_hostfile, parse_hosts
    from elastic_ring.hosts.api import HostSet

    pairs = parse_hosts(req.hosts) if req.hosts else parse_hostfile(req.hostfile) if req.hostfile else None
    several = bool(pairs) and len(pairs) > 1
    torch_in_place = collective == "torch" and req.relaunch == "inplace"  # (its own launch)
    watched = (pairs and not req.host_discovery_script and req.backend != "ray" and req.slots is None
               and not torch_in_place and (several or req.relaunch == "inplace"))
    if not watched:
        if req.cooldown_range is not None and not req.host_discovery_script:
            raise UserError("--blacklist-cooldown-range goes with --host-discovery-script or several hosts "
                            "(--hosts, --hostfile; not beside --slots): a failed host "
                            "is left out only where others are left")
        if req.min_wait is not None and not req.host_discovery_script:
            raise UserError("--min-wait goes with --host-discovery-script or several hosts (--hosts, --hostfile; "
                            "not beside --slots): a run waits for hosts only where "
                            "a failed host is left out")
        return None
    return HostSet(pairs)


def host_manager(req: RunRequest, echo: Callable[[str], None], collective: str = "horovod") -> Any:
    """The run's hosts as the controller's :class:`~elastic_ring.hosts.manager.HostManager`, asked
    once already (its first answer is the first segment's hosts), or None (no discovery, no watched
    host list: :func:`fixed_hosts`). ``--host-discovery-script`` and its bounds, checked (one that
    fails is its one line, and the controller waits for hosts); or a fixed host list, whose answer
    never changes, within ``--workers MIN:MAX`` where given (else from 1). Under ``--relaunch
    inplace`` the first answer decides (``over_hosts``: :func:`~elastic_ring.hosts.discovery.several_hosts`):
    the ring runs over the hosts as listed, or on this host only, where a host that is not this
    machine is refused."""
    from elastic_ring.hosts.api import WorkerBounds, resolve_bounds
    from elastic_ring.hosts.discovery import (FixedHosts, HostPoller, ScriptDiscovery, ThisHostOnly, check_script,
                                              several_hosts)
    from elastic_ring.hosts.exclusion import Exclusions, parse_cooldown_range
    from elastic_ring.hosts.manager import HostManager

    discovery: Any
    if req.host_discovery_script:
        path = check_script(req.host_discovery_script)
        bounds = resolve_bounds(min_workers=req.min_workers, max_workers=req.max_workers, gpus=req.workers)
        if bounds is None:  # no bounds given: from 1 to every usable slot
            bounds = WorkerBounds(min=1, start=req.workers)
        discovery, name = ScriptDiscovery(path, cwd=os.getcwd()), f"discovery script {Path(path).name}"
        interval = req.discovery_interval or 1.0
    else:
        fixed = fixed_hosts(req, collective)
        if fixed is None:
            return None
        lo, hi = req.worker_range or (1, None)
        bounds = WorkerBounds(min=lo, max=hi)
        discovery, name = FixedHosts(fixed), "--hosts" if req.hosts else f"--hostfile {Path(req.hostfile).name}"
        interval = FIXED_INTERVAL_S
    over_hosts = False
    if req.relaunch == "inplace":  # over the hosts listed first, or on this host only (its slots one host's)
        # (torch.distributed's ring in place is launched on this host: never over hosts)
        over_hosts = collective != "torch" and several_hosts(discovery.find().hosts)
        if not over_hosts:
            discovery = ThisHostOnly(discovery, name)
    poller = HostPoller(discovery, interval_s=interval)
    cooldown = parse_cooldown_range(req.cooldown_range) if req.cooldown_range else None  # (checked: requests)
    hosts = HostManager(poller, bounds, Exclusions(cooldown, clock=poller.clock), min_wait_s=req.min_wait)
    hosts.over_hosts = over_hosts
    first = poller.poll()  # (the controller's first update says what it found: a hosts_changed event)
    if isinstance(discovery, ThisHostOnly) and discovery.foreign is not None:
        raise UserError(f"--relaunch inplace runs on this host only: {name} lists "
                        f"{discovery.foreign} (use another --relaunch mode for several hosts)")
    if first.note:
        echo(f"elastic-ring: {first.note}")
    return hosts


def fixed_kept(req: RunRequest) -> dict[str, Any]:
    """What ``run.json`` keeps of a watched fixed host list (``host_discovery`` with no script): a
    worker then takes a SIGTERM as a notice (:mod:`elastic_ring.worker.notice`) and ``drain``
    accepts the run, as under discovery; a resume takes the hosts given to it (:func:`with_run_discovery`)."""
    return {"script": None, "hosts": req.hosts, "hostfile": req.hostfile, "cooldown_range": req.cooldown_range}


def with_run_discovery(req: RunRequest) -> RunRequest:
    """A ``--resume`` of a run started with ``--host-discovery-script``: its discovery options, kept in
    ``run.json``, for those not given again; unless ``--hosts``/``--hostfile``/``--slots`` or
    ``--backend ray`` choose other hosts (then ``req`` as it is)."""
    from dataclasses import replace

    info = protocol.read_run_json(Path(req.resume_dir))
    kept = info.get("host_discovery") if isinstance(info, dict) else None
    if (not isinstance(kept, dict) or not kept.get("script") or req.hosts or req.hostfile or req.slots is not None
            or req.backend == "ray" or req.host_discovery_script):  # (no script: a fixed host list, given again)
        return req
    pick = lambda given, key: given if given is not None else kept.get(key)  # noqa: E731
    return replace(req, host_discovery_script=kept.get("script"),
                   discovery_interval=pick(req.discovery_interval, "interval"),
                   min_workers=pick(req.min_workers, "min_workers"), max_workers=pick(req.max_workers, "max_workers"),
                   min_wait=pick(req.min_wait, "min_wait"),
                   cooldown_range=pick(req.cooldown_range, "cooldown_range"))


def hosts_slots(hosts: Any) -> int:
    """The run's slots under host discovery (``run.json``'s, which `resize` checks): ``--max-workers``,
    else as many as a host list may hold (the discovered slots bound every size at the time)."""
    from elastic_ring.hosts.api import MAX_SLOTS

    return hosts.bounds.max if hosts.bounds.max is not None else MAX_SLOTS
