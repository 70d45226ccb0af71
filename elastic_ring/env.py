"""Every environment variable elastic-ring reads: its name, its default and how its value is read,
one function each (torch-free; nothing is read at import).

Three kinds:

- what the controller (or its launcher) tells a worker beyond :class:`elastic_ring.protocol.LaunchInfo`
  (whose ``ELASTIC_RING_<FIELD>`` variables it reads itself): :func:`survive`, :func:`ring_mode`,
  :func:`member`, :func:`store`, :func:`collective`, :func:`slot_hosts`, :func:`launched_at`, ...;
- what a launcher sets for each worker (horovodrun's ``HOROVOD_*``, torchrun's ``RANK``,
  ``WORLD_SIZE``, ``MASTER_ADDR``, ...): :func:`horovod_ranks`, :func:`torch_ranks`,
  :func:`master_port`, :func:`horovod_hostname`, :func:`launcher_rank`;
- a user's or a test's settings: :func:`cpu_threads`, :func:`stop_latency_ms`, :func:`cache_dir`,
  :func:`tensorboard_dir`, the fault injections, ...

Each function takes the mapping to read (``env``; default ``os.environ``, read at the call). The
names are constants here too: the controller writes its workers' environment with them.
"""

from __future__ import annotations

import os
from typing import Mapping, MutableMapping

# ---------------------------------------------------------------------- names
PREFIX = "ELASTIC_RING_"  # LaunchInfo's fields: ELASTIC_RING_<FIELD> (protocol.LaunchInfo)
RUN_DIR = "ELASTIC_RING_RUN_DIR"  # set: this process was started by elastic-ring (LaunchInfo)
DEVICE = "ELASTIC_RING_DEVICE"  # LaunchInfo.device
CPU_THREADS = "ELASTIC_RING_CPU_THREADS"  # intra-op threads per worker (protocol.cpu_threads)
SLOT_HOSTS = "ELASTIC_RING_SLOT_HOSTS"  # "1": each worker slot is a host name of its own, all on this host
LAUNCHED_AT = "ELASTIC_RING_LAUNCHED_AT"  # when the controller started the segment's launcher (time.time())
PROCESS_START = "ELASTIC_RING_PROCESS_START"  # a forked worker: when its launched command started
STORE_FD = "ELASTIC_RING_STORE_FD"  # rank 0 of a --collective torch segment: the rendezvous socket it inherits
STOP_LATENCY_MS = "ELASTIC_RING_STOP_LATENCY_MS"  # a script run's stop_latency_ms (a config's otherwise)
SURVIVE = "ELASTIC_RING_SURVIVE"  # "1": keep the in-memory copy, and go on after a peer's loss; "auto":
# the same, and time the copy against the step first (the controller decides: worker.survive.CostMeter)
SURVIVE_AUTO = "auto"  # SURVIVE's value where the run measures the copy before it keeps survivors
SURVIVE_COST = "ELASTIC_RING_SURVIVE_COST"  # tests: a worker's measured copy/step ratio is this (e.g. 0.07)
INPLACE = "ELASTIC_RING_INPLACE"  # the ring's kind: "1" Horovod Elastic, RING_BY_CONTROLLER the controller's
RING_BY_CONTROLLER = "controller"  # INPLACE's value where the controller forms the ring (Ray, local torch)
MEMBER = "ELASTIC_RING_MEMBER"  # this worker's name in a resize action's "members"
STORE = "ELASTIC_RING_STORE"  # host:port of the store the controller serves for a torch group
COLLECTIVE = "ELASTIC_RING_COLLECTIVE"  # "torch": the job's collectives are torch.distributed
STEPS = "ELASTIC_RING_STEPS"  # a script run without the tool: its steps
ZYGOTE = "ELASTIC_RING_ZYGOTE"  # the fork server's abstract socket name, in the workers' environment
NO_ZYGOTE = "ELASTIC_RING_NO_ZYGOTE"  # set (to anything): workers start in their own processes
ZYGOTE_COMPILE = "ELASTIC_RING_ZYGOTE_COMPILE"  # "1": the fork server imports torch._dynamo too (its workers would)
ZYGOTE_SHARED = "ELASTIC_RING_ZYGOTE_SHARED"  # a fork server started by a parent process (a test session), for all its runs
STEP_COST = "ELASTIC_RING_STEP_COST"  # set (not "0"): measure the library's cost per step; "parts": each part too
STEP_COST_DIR = "ELASTIC_RING_STEP_COST_DIR"  # a script run without the tool: where that measure goes
STEP_COST_LISTS = "ELASTIC_RING_STEP_COST_LISTS"  # "1": that measure times plain list iterators too (the old meter)
PLAIN_HOROVODRUN = "ELASTIC_RING_PLAIN_HOROVODRUN"  # "1": the controller runs plain horovodrun
ALLOW_NO_NCCL = "ELASTIC_RING_ALLOW_NO_NCCL"  # "1": GPUs with a Horovod built without NCCL
HOST_DEVICES = "ELASTIC_RING_HOST_DEVICES"  # "h1=0,1;h2=2": each host's CUDA_VISIBLE_DEVICES
TENSORBOARD = "ELASTIC_RING_TENSORBOARD"  # "0": no TensorBoard curves
TELEMETRY_EVERY_S = "ELASTIC_RING_TELEMETRY_EVERY_S"  # the controller samples the workers' CPU and memory at most this often
TENSORBOARD_DIR = "ELASTIC_RING_TENSORBOARD_DIR"  # where the curves go (default: the run's tensorboard/)
CACHE = "ELASTIC_RING_CACHE"  # the machine's dataset cache
CLUSTER = "ELASTIC_RING_CLUSTER"  # `elastic-ring cluster`'s default --dir
CLUSTER_FAULT = "ELASTIC_RING_CLUSTER_FAULT"  # tests: POINT[:N], the scheduler kills itself there
PS_FAIL = "ELASTIC_RING_PS_FAIL"  # tests: RANK:PUSH, a parameter-server worker fails before that push
RAY_FOLLOW = "ELASTIC_RING_RAY_FOLLOW"  # "0": a Ray job does not grow onto nodes that join (its scheduler sizes it)
SCRIPT_FORM = "ELASTIC_RING_SCRIPT_FORM"  # "torchrun": the worker entry runs the script as torchrun would
HOROVOD_WAIT = "ELASTIC_RING_HOROVOD_WAIT"  # "spin": a CPU worker waits for Horovod's collectives as Horovod does

HOROVOD_KEYS = ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE")
TORCH_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def _get(name: str, env: Mapping[str, str] | None) -> str | None:
    return (os.environ if env is None else env).get(name)


def _flag(name: str, env: Mapping[str, str] | None) -> bool:
    return _get(name, env) == "1"


def _float(name: str, env: Mapping[str, str] | None) -> float | None:
    try:
        return float(_get(name, env))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


# ---------------------------------------------------------------------- the controller's word
def started_by_elastic_ring(env: Mapping[str, str] | None = None) -> bool:
    """Whether this process runs under ``elastic-ring train`` (its launch settings are set)."""
    return _get(RUN_DIR, env) is not None


def device(env: Mapping[str, str] | None = None) -> str:
    """The worker's device, ``cpu`` or ``cuda`` (default ``cpu``)."""
    return _get(DEVICE, env) or "cpu"


def script_form(env: Mapping[str, str] | None = None) -> str | None:
    """The contract of the script the worker runs, where the launcher names one (``"torchrun"``)."""
    return _get(SCRIPT_FORM, env) or None


def survive(env: Mapping[str, str] | None = None) -> bool:
    """Whether this run keeps survivors going (``--survive``, or the default's measuring: ``auto``)."""
    return _get(SURVIVE, env) in ("1", SURVIVE_AUTO)


def survive_measured(env: Mapping[str, str] | None = None) -> bool:
    """Whether the workers time their state copy against the step first (neither ``--survive`` nor
    ``--no-survive``: the controller keeps survivors where the copy is cheap)."""
    return _get(SURVIVE, env) == SURVIVE_AUTO


def survive_cost(env: Mapping[str, str] | None = None) -> float | None:
    """A test's forced copy/step ratio for the default's measurement (None: the one measured)."""
    return _float(SURVIVE_COST, env)


def ring_mode(env: Mapping[str, str] | None = None) -> str | None:
    """How this worker's ring is formed and re-formed: None (by its launcher, for one segment),
    ``"1"`` (Horovod Elastic) or :data:`RING_BY_CONTROLLER`."""
    return _get(INPLACE, env) or None


def member(env: Mapping[str, str] | None = None, default: str | None = None) -> str | None:
    """This worker's name in a resize action's members (given by an in-place backend), else ``default``."""
    v = _get(MEMBER, env)
    return default if v is None else v


def store(env: Mapping[str, str] | None = None) -> str | None:
    """``host:port`` of the store the controller serves for this worker's torch group, or None."""
    return _get(STORE, env) or None


def collective(env: Mapping[str, str] | None = None) -> str:
    """The collective named for this worker (``"horovod"``, ``"torch"``), or ``""`` where none is."""
    return (_get(COLLECTIVE, env) or "").strip()


def horovod_wait(env: Mapping[str, str] | None = None) -> str:
    """How a CPU worker waits for a Horovod collective: ``"sleep"`` (the default: while the machine
    is crowded, polls asleep between them; :func:`elastic_ring.hvd_patches.wait_asleep`) or
    ``"spin"`` (always Horovod's own wait, which spins on ``sched_yield``)."""
    return "spin" if (_get(HOROVOD_WAIT, env) or "").strip().lower() == "spin" else "sleep"


def slot_hosts(env: Mapping[str, str] | None = None) -> bool:
    """Whether each worker slot is a host name of its own, all on this host."""
    return _flag(SLOT_HOSTS, env)


def launched_at(env: Mapping[str, str] | None = None) -> float | None:
    """When the controller started this segment's launcher (``time.time()``), where it says."""
    return _float(LAUNCHED_AT, env)


def process_start(env: Mapping[str, str] | None = None) -> float | None:
    """A forked worker: when the command it was launched as started."""
    return _float(PROCESS_START, env)


def take_store_fd(env: MutableMapping[str, str] | None = None) -> int | None:
    """The rendezvous socket rank 0 inherited from the local launcher, taken once (the variable is
    removed, so that a process group formed later does not take it again)."""
    raw = (os.environ if env is None else env).pop(STORE_FD, "")
    return int(raw) if raw.isdigit() else None


def store_fd_given(env: Mapping[str, str] | None = None) -> bool:
    """Whether the launcher's rendezvous socket is still there, not taken yet."""
    return _get(STORE_FD, env) is not None


def cpu_threads(env: Mapping[str, str] | None = None) -> int | None:
    """The intra-op threads per worker the user fixed (``ELASTIC_RING_CPU_THREADS``, at least 1),
    or None where unset or not a number."""
    raw = (_get(CPU_THREADS, env) or "").strip()
    try:
        return max(1, int(raw)) if raw else None
    except ValueError:
        return None


def stop_latency_ms(env: Mapping[str, str] | None = None) -> int | None:
    """``ELASTIC_RING_STOP_LATENCY_MS``: its value, None where unset.

    Raises:
        ValueError: not whole milliseconds >= 0 (one line, for the user).
    """
    raw = (_get(STOP_LATENCY_MS, env) or "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ValueError(f"{STOP_LATENCY_MS}={raw!r}: give whole milliseconds >= 0")
    return value


def steps(env: Mapping[str, str] | None = None) -> int | None:
    """A script run without the tool: its number of steps, where given."""
    raw = (_get(STEPS, env) or "").strip()
    return int(raw) if raw.isdigit() else None


def zygote(env: Mapping[str, str] | None = None) -> str | None:
    """The name of the fork server that starts this worker command, where there is one."""
    return _get(ZYGOTE, env) or None


def no_zygote(env: Mapping[str, str] | None = None) -> bool:
    """Whether workers start in their own processes (no fork server)."""
    return bool(_get(NO_ZYGOTE, env))


def zygote_shared(env: Mapping[str, str] | None = None) -> str | None:
    """The name of a fork server that a parent process (a test session) started for all the runs
    below it, where there is one: a controller uses it instead of starting its own."""
    return _get(ZYGOTE_SHARED, env) or None


def zygote_compile(env: Mapping[str, str] | None = None) -> bool:
    """Whether the fork server imports ``torch._dynamo`` before it forks (set by the controller)."""
    return _flag(ZYGOTE_COMPILE, env)


def step_cost(env: Mapping[str, str] | None = None) -> bool:
    """Whether the library measures its own cost per step."""
    return (_get(STEP_COST, env) or "") not in ("", "0")


def step_cost_dir(env: Mapping[str, str] | None = None) -> str | None:
    """Where a script run without the tool (no run directory) writes that measure (None: nowhere)."""
    return _get(STEP_COST_DIR, env) or None


def step_cost_lists(env: Mapping[str, str] | None = None) -> bool:
    """Whether that measure also times a plain list iterator's ``next()`` (as it did before: no code
    of ours runs there; ``scripts/bench_step_cost.py``'s mode ``timed_lists`` compares)."""
    return _flag(STEP_COST_LISTS, env)


def step_cost_parts(env: Mapping[str, str] | None = None) -> bool:
    """Whether that measure also times each part of the step boundary (``parts``)."""
    return (_get(STEP_COST, env) or "").strip().lower() == "parts"


def plain_horovodrun(env: Mapping[str, str] | None = None) -> bool:
    """Whether the controller starts plain ``horovodrun`` (not its patched one)."""
    return _flag(PLAIN_HOROVODRUN, env)


def allow_no_nccl(env: Mapping[str, str] | None = None) -> bool:
    """Whether GPUs may run with a Horovod built without NCCL."""
    return _flag(ALLOW_NO_NCCL, env)


def host_devices(env: Mapping[str, str] | None = None) -> str | None:
    """Each host's GPUs (``h1=0,1;h2=2``), where the cluster gave them."""
    return _get(HOST_DEVICES, env) or None


def tensorboard_on(env: Mapping[str, str] | None = None) -> bool:
    """Whether runs write TensorBoard curves (default yes)."""
    return (_get(TENSORBOARD, env) or "1") != "0"


def telemetry_every_s(env: Mapping[str, str] | None = None) -> float:
    """How often, at most, the controller samples the workers' processes and GPUs (seconds; 0: at
    every throughput event, as before issue 50's measure of the controller's own CPU)."""
    v = _float(TELEMETRY_EVERY_S, env)
    return 1.0 if v is None or v < 0 else v


def tensorboard_dir(env: Mapping[str, str] | None = None) -> str | None:
    """Where the curves go, where set (default: the run folder's ``tensorboard/``)."""
    return _get(TENSORBOARD_DIR, env) or None


def cache_dir(env: Mapping[str, str] | None = None) -> str:
    """The machine's dataset cache: ``$ELASTIC_RING_CACHE``, else ``~/.cache/elastic-ring``."""
    return _get(CACHE, env) or os.path.join(os.path.expanduser("~"), ".cache", "elastic-ring")


def cluster_dir(env: Mapping[str, str] | None = None) -> str:
    """``elastic-ring cluster``'s default folder (``cluster``)."""
    return _get(CLUSTER, env) or "cluster"


def cluster_fault(env: Mapping[str, str] | None = None) -> str:
    """The scheduler's fault point for tests (``POINT[:N]``; ``""``: none). Parsed by the scheduler."""
    return (_get(CLUSTER_FAULT, env) or "").strip()


def ps_fail(env: Mapping[str, str] | None = None) -> tuple[int, int] | None:
    """A parameter-server worker's injected failure for tests: ``(rank, push)`` (``RANK:PUSH``,
    push default 1), or None."""
    raw = _get(PS_FAIL, env) or ""
    if not raw:
        return None
    r, _, p = raw.partition(":")
    return int(r), int(p or 1)


def ray_address(env: Mapping[str, str] | None = None) -> str | None:
    """Ray's ``RAY_ADDRESS`` (the cluster to join), where set."""
    return _get("RAY_ADDRESS", env) or None


def ray_follow(env: Mapping[str, str] | None = None) -> bool:
    """Whether a Ray job grows onto the nodes that join its cluster (not under `elastic-ring cluster`,
    whose scheduler sizes it: :data:`RAY_FOLLOW` "0")."""
    return _get(RAY_FOLLOW, env) != "0"


def cuda_visible_devices(env: Mapping[str, str] | None = None) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` as set (None: unset, every device visible); parsed by
    :func:`elastic_ring.telemetry.gpu.visible_entries`."""
    return _get("CUDA_VISIBLE_DEVICES", env)


def omp_threads_set(env: Mapping[str, str] | None = None) -> bool:
    """Whether ``OMP_NUM_THREADS`` is set (the user's count, or a launcher's)."""
    return bool((_get("OMP_NUM_THREADS", env) or "").strip())


# ---------------------------------------------------------------------- what launchers set
HOROVODRUN_RANK_KEYS = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")  # horovodrun's, mpirun's ranks
TORCHRUN_KEYS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def launched_by_horovodrun(env: Mapping[str, str] | None = None) -> bool:
    """Whether horovodrun or mpirun started this process (a rank of theirs is set)."""
    e = os.environ if env is None else env
    return any(k in e for k in HOROVODRUN_RANK_KEYS)


def launched_by_torchrun(env: Mapping[str, str] | None = None) -> bool:
    """Whether torchrun (or a launcher setting its variables) started this process."""
    e = os.environ if env is None else env
    return all(k in e for k in TORCHRUN_KEYS)


def world_size(env: Mapping[str, str] | None = None, default: int = 1) -> int:
    """torchrun's ``WORLD_SIZE`` (``default`` where unset)."""
    return int(_get("WORLD_SIZE", env) or default)


def torchrun_local(env: Mapping[str, str] | None = None, size: int = 1) -> tuple[int, int]:
    """(local rank, local world size) as torchrun sets them (defaults 0 and ``size``)."""
    return int(_get("LOCAL_RANK", env) or 0), int(_get("LOCAL_WORLD_SIZE", env) or size)


def horovod_ranks(env: Mapping[str, str] | None = None) -> tuple[int, int, int, int] | None:
    """(rank, size, local rank, local size) as horovodrun sets them, or None where one is missing."""
    e = os.environ if env is None else env
    if not all(k in e for k in HOROVOD_KEYS):
        return None
    return tuple(int(e[k]) for k in HOROVOD_KEYS)  # type: ignore[return-value]


def torch_ranks(env: Mapping[str, str] | None = None) -> tuple[int, int, int, int] | None:
    """(rank, world size, local rank, local world size) as torchrun sets them, or None where one is
    missing (:func:`missing_torch_keys` names which)."""
    e = os.environ if env is None else env
    if missing_torch_keys(e):
        return None
    return tuple(int(e[k]) for k in TORCH_KEYS)  # type: ignore[return-value]


def missing_torch_keys(env: Mapping[str, str] | None = None) -> list[str]:
    e = os.environ if env is None else env
    return [k for k in TORCH_KEYS if k not in e]


def master_addr(env: Mapping[str, str] | None = None) -> str:
    """torchrun's rendezvous host (default ``127.0.0.1``)."""
    return _get("MASTER_ADDR", env) or "127.0.0.1"


def master_port(env: Mapping[str, str] | None = None) -> int | None:
    """torchrun's rendezvous port, or None where unset or not a number."""
    raw = _get("MASTER_PORT", env) or ""
    return int(raw) if raw.isdigit() else None


def horovod_local_rank(env: Mapping[str, str] | None = None) -> int:
    """``HOROVOD_LOCAL_RANK`` as horovodrun's driver set it for this worker (0 where unset)."""
    return int(_get("HOROVOD_LOCAL_RANK", env) or "0")


def horovod_hostname(env: Mapping[str, str] | None = None) -> str | None:
    """This worker's host in horovodrun's host list (``-H``: a name, an address or an alias)."""
    return _get("HOROVOD_HOSTNAME", env)


def launcher_rank(env: Mapping[str, str] | None = None) -> int | None:
    """This process's rank as any launcher set it (horovodrun's, mpirun's, torchrun's), or None."""
    r = _get("HOROVOD_RANK", env)
    if r is None:
        r = _get("OMPI_COMM_WORLD_RANK", env)
    if r is None:
        r = _get("RANK", env)
    return int(r) if r is not None and r.isdigit() else None
