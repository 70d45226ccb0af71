"""Every private Horovod internal elastic-ring replaces, in one place, checked against the installed Horovod.

Horovod's launcher, its elastic driver and its Elastic worker API have no hooks for what
elastic-ring needs, so a few of their functions are replaced at run time (monkeypatched) by ours,
which call Horovod's own where they keep its part. Each
replacement is one :class:`Patch` record below: what it replaces (module and attribute), why (one
line), the function that builds the replacement from Horovod's own, and what it relies on (the
parameters it calls Horovod's function with, and the other names it reads). The records come in
groups, by who installs them and when:

- ``launcher``: in every ``python -m elastic_ring.controller.hvdrun`` (the controller's horovodrun);
- ``survive``: there too, with ``--survive`` (``ELASTIC_RING_SURVIVE=1``);
- ``slot-hosts``: there too, when each worker slot is a host of its own (``ELASTIC_RING_SLOT_HOSTS=1``);
- ``worker``: in a worker that runs a Horovod Elastic script (:mod:`elastic_ring.worker.hvd_elastic`);
- ``wait``: in every CPU worker on Horovod (:func:`wait_asleep`), unless ``ELASTIC_RING_HOROVOD_WAIT=spin``
  (it waits asleep only while the machine is crowded).

:func:`apply` installs a group's patches (idempotent: a replaced attribute is not replaced again)
after :func:`check` has found every target as the patches expect it. :func:`check` runs again
before anything launches (:func:`check_installed`, from the controller's start, beside
``check_horovod_serves``): a Horovod that changed is one line naming the missing internal and the
installed version (a :class:`HorovodChanged`, exit status 2), not a launch that fails in every
worker. The patches were written for Horovod :data:`WRITTEN_FOR`; another version is accepted when
every target still has the shape the patches rely on (then the instance attributes they read are
looked for in their classes' code too). A yes is remembered per installed Horovod
(the version and its patched source files' sizes and times) in ``$ELASTIC_RING_CACHE``, so the
check, which imports Horovod's runner (and torch, for the worker group) in a child process, runs
once per install.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from elastic_ring.errors import UserError

WRITTEN_FOR = ("0.28.1",)  # the Horovod versions these patches were written and tested against
GROUPS = ("launcher", "survive", "slot-hosts", "worker", "wait")
MARK = "_elastic_ring"  # set on every replacement: an attribute that has it is replaced already
ORIGINAL = "_elastic_ring_original"  # on every replacement: Horovod's own function it calls
CACHE_FILE = "horovod-patches.json"


class HorovodChanged(UserError):
    """The installed Horovod lacks an internal a patch replaces or relies on (one line, exit 2)."""


@dataclass(frozen=True)
class Patch:
    """One replaced Horovod internal.

    ``target``: ``"module:Qual.name"``, the attribute replaced. ``params``: the parameters the
    replacement takes and calls Horovod's function with (``"name="``: passed by keyword); Horovod's
    function must accept them, and take no others where it names its parameters. ``uses``: other
    names the replacement reads (``"module:Qual.name"``; an instance attribute of a class counts
    where the class's code sets ``self.name``). ``make``: Horovod's function -> the replacement."""

    name: str
    group: str
    target: str
    why: str
    make: Callable[[Callable[..., Any]], Callable[..., Any]]
    params: tuple[str, ...] = ()
    uses: tuple[str, ...] = ()

    @property
    def module(self) -> str:
        return self.target.split(":")[0]

    @property
    def attr(self) -> str:
        return self.target.split(":")[1]


# ---- the replacements of the launcher's patches (the controller's horovodrun process) ----

def _gloo_built_cached(real):
    from elastic_ring.controller.hvdrun import cached_check

    return cached_check(real)


def _hosts_read_directly(run_script):
    """The discovery script the controller wrote is its host list read directly, every
    ``hvdrun.DISCOVERY_POLL_S``; any other script runs as before, at Horovod's own interval."""
    from horovod.runner.elastic import driver

    from elastic_ring.controller.hvdrun import DISCOVERY_POLL_S, hosts_file_of

    def execute(self) -> str:
        hosts = hosts_file_of(self._discovery_script)
        if hosts is None:
            return run_script(self)
        driver.DISCOVER_HOSTS_FREQUENCY_SECS = DISCOVERY_POLL_S
        return hosts.read_text()

    return execute


class _ForkedMiddlemen:
    """``multiprocessing`` as Horovod's ``safe_shell_exec.execute`` sees it (everything else of it
    unchanged): the ``spawn`` context it asks for each command's middleman is the ``forkserver``
    one. A spawned middleman is a new interpreter that imports Horovod's runner and the launcher's
    main module again, on the path of every worker's start; a forkserver's is a fork of one process
    that imported them once (``scripts/bench_middleman.py``). Both are clean processes, not forks
    of the launcher's threads, and get their pipes and event the same way."""

    def __init__(self, mp: Any, preload: list[str]) -> None:
        self._mp, self._preload = mp, preload

    def get_context(self, method: str | None = None) -> Any:
        if method != "spawn":
            return self._mp.get_context(method)
        ctx = self._mp.get_context("forkserver")
        ctx.set_forkserver_preload(self._preload)  # (read at the server's start only)
        return ctx

    def __getattr__(self, name: str) -> Any:
        return getattr(self._mp, name)


def _middleman_forked(execute):
    """Horovod's ``execute`` itself, seeing :class:`_ForkedMiddlemen` as its ``multiprocessing``
    (its other names are its module's)."""
    import types

    module = sys.modules[execute.__module__]
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    preload = [module.__name__, *([main.name] if main is not None else [])]
    names = dict(module.__dict__, multiprocessing=_ForkedMiddlemen(module.multiprocessing, preload))
    fn = types.FunctionType(execute.__code__, names, execute.__name__, execute.__defaults__, execute.__closure__)
    fn.__kwdefaults__, fn.__doc__ = execute.__kwdefaults__, execute.__doc__
    return fn


# The exit of a worker whose slot a shrink removed is ignored, also when it comes after a later
# grow gave the slot back (three patches that share the driver's "_er_running"/"_er_retired").
# A worker whose slot is removed learns it in hvd.init() and aborts (status 134); Horovod ignores
# that exit only while the slot has no rank. Under load the abort can come after a grow right after
# the shrink gave the slot back: Horovod then took it for a failure of the slot's new worker, and
# with one host blacklisted it and ended the job ("blacklisted slots count == 2 -> stop running",
# seen once after --schedule 2:1,3:2,4:1,5:2).

def _slots(driver) -> set:
    return {(h, s.local_rank) for h, slots in driver._host_assignments.items() for s in slots}


def _start_worker_kept(start):
    from elastic_ring.controller.hvdrun import _DRIVERS

    def start_worker(self, slot_info):
        if self not in _DRIVERS:
            _DRIVERS.append(self)  # (a joiner that never forms its ring ends the job: hvdrun.Spare.keep_joining)
        self.__dict__.setdefault("_er_running", {})[(slot_info.hostname, slot_info.local_rank)] = slot_info
        return start(self, slot_info)

    return start_worker


def _assignments_retiring(update):
    def update_assignments(self, current_hosts):
        before = _slots(self)
        pending = update(self, current_hosts)
        running, retired = self.__dict__.setdefault("_er_running", {}), self.__dict__.setdefault("_er_retired", {})
        for key in before - _slots(self):
            w = running.pop(key, None)
            if w is not None:
                retired[id(w)] = w  # (kept: its id stays its own until its exit is handled)
        return pending

    return update_assignments


def _exit_of_retired_ignored(handle):
    def handle_exit(self, slot_info, exit_code, timestamp):
        retired = self.__dict__.get("_er_retired", {})
        if retired.get(id(slot_info)) is slot_info:
            del retired[id(slot_info)]
            return None  # its slot was removed after it started: not the slot's failure
        return handle(self, slot_info, exit_code, timestamp)

    return handle_exit


# ---- --survive's (the controller's horovodrun) ----

def _resume_reads_hosts(resume):
    def resume_with_hosts_read(self):
        with self._wait_hosts_cond:
            self._host_manager.update_available_hosts()
        resume(self)

    return resume_with_hosts_read


def _no_blacklist(blacklist):
    def no_blacklist(self, host):
        return None

    return no_blacklist


def _warm_joiner(make):
    """The driver's next worker for a slot is a warm spare when one waits (``hvdrun.Spare``);
    otherwise the cold worker as before. A joiner that exits before its ring formed is started
    again, and after the last try the job ends (``Spare.keep_joining``). The spare is a process
    on this machine: a slot on another host (in place over discovered or listed hosts) always
    gets the cold worker, which the driver starts there."""
    from horovod.runner import gloo_run

    from elastic_ring.controller.hvdrun import _DRIVERS, _SPARES, Spare, is_slot_host
    from elastic_ring.hosts.slurm import is_this_host

    def create_fn(exec_command, run_command, env, event):
        cold = make(exec_command, run_command, env, event)
        spare = Spare(run_command, env)
        _SPARES.append(spare)
        spare.start_when_training(event)

        def create_worker(slot_info, events):
            if not (is_slot_host(slot_info.hostname) or is_this_host(slot_info.hostname)):
                return cold(slot_info, events)  # another machine's slot: no spare of ours there
            every = [event, *(events or [])]
            slot_env = gloo_run.create_slot_env_vars(slot_info)
            first = [spare.trained_since(spare.born)]  # a joiner's first start: a pending spare is started for it

            def start():
                taken = spare.claim(every, start_pending=first[0])
                first[0] = False  # (a start again takes a spare only when one was started)
                if taken is not None:
                    return spare.join(taken, slot_env, every)
                return cold(slot_info, events)

            def stop(line):
                for driver in _DRIVERS:
                    driver.stop(error_message=line)

            return spare.keep_joining(start, slot_env, every, stop)

        return create_worker

    return create_fn


def _slot_hosts_local(resolve):
    from elastic_ring.controller.hvdrun import is_slot_host

    def resolve_slot(host_name):
        return "127.0.0.1" if is_slot_host(host_name) else resolve(host_name)

    return resolve_slot


# ---- the worker's (a Horovod Elastic script's names, served by elastic_ring.worker.hvd_elastic) ----

def _hvd_elastic(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def make(original):
        from elastic_ring.worker import hvd_elastic

        return getattr(hvd_elastic, name)

    return make


# ---- the wait for a collective (every CPU worker on Horovod) ----

WAIT_FIRST_S = 50e-6  # the first sleep between two polls of a collective not done yet
WAIT_MAX_S = 0.5e-3  # the longest: a wait ends at most this much after its collective
CROWDED_LOAD = 1.5  # the machine's load (1-min average) per core above which a worker waits asleep
CROWDED_EVERY_S = 1.0  # how often the load is read again
LOST_CHECK_S = 0.5  # in a wait this long, and every as long after, whether Horovod's loop has shut down


class HorovodCollectiveLost(Exception):
    """A collective whose wait would never end: Horovod's background loop shut down (a peer lost)
    with it still queued, so it was never finished. Horovod 0.28.1 reads its shut-down flag at the
    enqueue without a lock and adds the entry to its queue after; the loop, on a failure, sets the
    flag and then finishes every queued entry with the error. An entry added between the two is
    never finished, and it stays in the queue across ``hvd.shutdown()`` + ``hvd.init()``, so the
    process cannot go on in Horovod (not :class:`HorovodInternalError`: neither Horovod Elastic's
    reset nor our survivors take it). Its message counts as a peer's loss
    (:data:`elastic_ring.protocol.PEER_LOSS_TYPES`): the rank is a victim."""


def _horovod_lost() -> Callable[[], bool]:
    """Whether Horovod's background loop has shut down its global process set while Horovod still
    counts as initialized (after a peer's loss, before ``hvd.shutdown()``): process set 0's ranks
    then read as not initialized. False where Horovod lacks these functions."""
    import ctypes

    try:
        from horovod.torch import mpi_ops

        lib = mpi_ops._basics.MPI_LIB_CTYPES
        size, ranks, initialized = lib.horovod_size, lib.horovod_process_set_ranks, lib.horovod_is_initialized
    except Exception:  # noqa: BLE001 - another Horovod: no check
        return lambda: False

    def lost() -> bool:
        if not initialized():
            return False
        buf = (ctypes.c_int * max(1, int(size())))()
        return int(ranks(ctypes.c_int(0), buf)) < 0

    return lost


def _wait_polling(real, poll=None, load=None, cores: int | None = None, sleep=None, clock=None, lost=None):
    """Horovod 0.28's ``synchronize`` waits in ``WaitAndClear``, a loop on ``sched_yield``: the
    waiting thread stays runnable and takes its full share of a core until the collective is done.
    On a machine with more runnable threads than cores (CPU workers of several jobs, or a test
    suite) that is CPU taken from the work being waited for: the other workers' steps and the
    Horovod threads that run the collective. There (the load, a 1-min average, above
    :data:`CROWDED_LOAD` per core, read at most once a second) the collective is polled instead,
    asleep between polls (50 us, doubling up to 0.5 ms); Horovod's own call then finds it done and
    releases the handle, its errors raised as before. Elsewhere Horovod's wait runs as it was
    (it answers sooner when the cores are free). ``poll``, ``load``, ``cores``, ``sleep`` and
    ``clock`` are Horovod's poll, ``os.getloadavg``, this process's cores, ``time.sleep`` and
    ``time.monotonic`` unless given (tests).

    A polled wait also asks, after :data:`LOST_CHECK_S` and every as long after, whether Horovod's
    background loop has shut down (``lost``: :func:`_horovod_lost` with Horovod's poll, else never,
    unless given): the loop finishes
    every queued collective before it says so, so a collective still not done then never will be
    (:class:`HorovodCollectiveLost`, raised instead of waiting forever: the worker ends and the
    job restarts from its checkpoint)."""
    import os
    import time

    if poll is None:  # Horovod's own: its poll, and its loop's state
        from horovod.torch import mpi_lib_v2

        poll = mpi_lib_v2.horovod_torch_poll
        lost = lost or _horovod_lost()
    lost = lost or (lambda: False)  # (a stand-in poll without a loop)
    load = load or os.getloadavg
    sleep, clock = sleep or time.sleep, clock or time.monotonic
    if cores is None:
        from elastic_ring.protocol import usable_cores

        cores = usable_cores()
    crowded = [False, None]  # the last answer, when it was read

    def wait_and_clear(handle):
        now = clock()
        if crowded[1] is None or now - crowded[1] >= CROWDED_EVERY_S:
            try:
                crowded[0] = load()[0] > CROWDED_LOAD * cores
            except OSError:
                crowded[0] = False
            crowded[1] = now
        if crowded[0] and not poll(handle):
            delay, check_at = WAIT_FIRST_S, now + LOST_CHECK_S
            while not poll(handle):
                sleep(delay)
                delay = min(2 * delay, WAIT_MAX_S)
                t = clock()
                if t >= check_at:
                    check_at = t + LOST_CHECK_S
                    if lost() and not poll(handle):
                        raise HorovodCollectiveLost(
                            f"Horovod's background loop shut down (a peer lost) with collective {handle} still "
                            f"queued, so its wait would never end (a Horovod 0.28 race); this worker ends")
        return real(handle)

    return wait_and_clear


_DRIVER = "horovod.runner.elastic.driver:ElasticDriver"
_STATE = "horovod.common.elastic:State"
_SLOT = "horovod.runner.common.util.hosts:SlotInfo"

PATCHES: tuple[Patch, ...] = (
    Patch("gloo_built", "launcher", "horovod.runner.launch:gloo_built",
          "horovodrun's build check forks a torch import (1.7 s of every launch): a yes is remembered per install",
          _gloo_built_cached, ("verbose=",)),
    Patch("middleman", "launcher", "horovod.runner.common.util.safe_shell_exec:execute",
          "each command's middleman process is forked from a server that imported Horovod's runner once, not spawned",
          _middleman_forked, ("command", "env=", "stdout=", "stderr=", "index=", "events=",
                              "prefix_output_with_timestamp="),
          ("horovod.runner.common.util.safe_shell_exec:multiprocessing",
           "horovod.runner.common.util.safe_shell_exec:_exec_middleman")),
    Patch("discovery", "launcher", "horovod.runner.elastic.discovery:HostDiscoveryScript._execute_discovery_script",
          "the driver reads the controller's host list itself every 0.05 s, not by a script once a second",
          _hosts_read_directly, ("self",),
          ("horovod.runner.elastic.discovery:HostDiscoveryScript._discovery_script",
           "horovod.runner.elastic.driver:DISCOVER_HOSTS_FREQUENCY_SECS")),
    Patch("start_worker", "launcher", f"{_DRIVER}._start_worker_process",
          "each started worker is kept by its slot (for worker_exit)",
          _start_worker_kept, ("self", "slot_info"),
          (f"{_SLOT}.hostname", f"{_SLOT}.local_rank")),
    Patch("update_assignments", "launcher", f"{_DRIVER}._update_host_assignments",
          "a worker whose slot an assignment removes is retired (for worker_exit)",
          _assignments_retiring, ("self", "current_hosts"), (f"{_DRIVER}._host_assignments",)),
    Patch("worker_exit", "launcher", f"{_DRIVER}._handle_worker_exit",
          "a retired worker's late exit is not a failure of its slot's next worker: no blacklist, no job end",
          _exit_of_retired_ignored, ("self", "slot_info", "exit_code", "timestamp")),
    Patch("resume", "survive", f"{_DRIVER}.resume",
          "the driver reads the host list again before it assigns the ranks of a re-formed ring",
          _resume_reads_hosts, ("self",),
          (f"{_DRIVER}._wait_hosts_cond", f"{_DRIVER}._host_manager",
           "horovod.runner.elastic.discovery:HostManager.update_available_hosts")),
    Patch("blacklist", "survive", "horovod.runner.elastic.discovery:HostManager.blacklist",
          "a failed worker's host is kept: on one host a blacklist would end the job",
          _no_blacklist, ("self", "host")),
    Patch("warm_joiner", "survive", "horovod.runner.gloo_run:_create_elastic_worker_fn",
          "the driver hands the next slot to a warm spare worker instead of a cold start",
          _warm_joiner, ("exec_command", "run_command", "env", "event"),
          ("horovod.runner.gloo_run:create_slot_env_vars",)),
    Patch("slot_hosts", "slot-hosts", "horovod.runner.util.network:resolve_host_address",
          "the slot hosts (slotN.elastic-ring.invalid) are this machine: no ssh, not remote",
          _slot_hosts_local, ("host_name",)),
    Patch("init", "worker", "horovod.torch:init",
          "the script's hvd.init() starts the worker library; later calls reach Horovod's",
          _hvd_elastic("_init"), (), ("horovod.torch:is_initialized",)),
    Patch("elastic_run", "worker", "horovod.torch.elastic:run",
          "@hvd.elastic.run runs the function under elastic-ring (restore, stop points, re-forms)",
          _hvd_elastic("run"), ("func",),
          (f"{_STATE}.sync", f"{_STATE}.restore", f"{_STATE}.on_reset",
           "horovod.common.elastic:ObjectState._saved_state",
           "horovod.common.elastic:ObjectState._set_attrs", "horovod.torch.elastic.state:TorchState._handlers")),
    Patch("commit", "worker", f"{_STATE}.commit",
          "state.commit() saves as Horovod does and is elastic-ring's stop point",
          _hvd_elastic("_commit"), ("self",), (f"{_STATE}.save",)),
    Patch("check_host_updates", "worker", f"{_STATE}.check_host_updates",
          "a host change never interrupts: it is taken at the next commit",
          _hvd_elastic("_check_host_updates"), ("self",)),
    Patch("record_batch", "worker", "horovod.torch.elastic.sampler:ElasticSampler.record_batch",
          "the sampler's batches also count this rank's samples for the throughput",
          _hvd_elastic("_record_batch"), ("self", "batch_idx", "batch_size")),
    Patch("wait_polling", "wait", "horovod.torch.mpi_lib_v2:horovod_torch_wait_and_clear",
          "on a crowded machine a CPU worker waits for a collective asleep between polls, not spinning on sched_yield",
          _wait_polling, ("handle",), ("horovod.torch.mpi_lib_v2:horovod_torch_poll",)),
)

_ORIGINALS: dict[str, Callable[..., Any]] = {}  # patch name -> Horovod's own function it replaced


def patches(*names: str) -> list[Patch]:
    """The records of ``names``, each a group or one patch's name (all of them without any)."""
    unknown = set(names) - set(GROUPS) - {p.name for p in PATCHES}
    if unknown:
        raise ValueError(f"unknown patch group(s) or name(s) {sorted(unknown)}; groups: {GROUPS}")
    return [p for p in PATCHES if not names or p.group in names or p.name in names]


def wait_asleep(device: str) -> bool:
    """In a worker on Horovod, before its first collective: install the ``wait`` patch where the
    worker trains on CPU (``device``) and ``ELASTIC_RING_HOROVOD_WAIT`` is not ``spin``. A GPU
    worker keeps Horovod's wait (its latency, a host core per worker). Whether it is installed; a
    Horovod without the internals leaves Horovod's wait (nothing fails for it)."""
    from elastic_ring import env

    if device != "cpu" or env.horovod_wait() == "spin":
        return False
    if all(_installed(p) for p in patches("wait")):  # (a ring re-formed: installed at the first)
        return True
    try:
        apply("wait")
    except Exception:  # noqa: BLE001 - a Horovod without it (changed, or a stand-in) waits as it does
        return False
    return True


def _owner(p: Patch, imported_only: bool = False) -> tuple[Any, str]:
    """(the object holding ``p``'s target, the target's attribute name); with ``imported_only``
    nothing is imported (the owner is None where its module is not imported yet)."""
    module, qual = p.target.split(":")
    *path, name = qual.split(".")
    owner: Any = sys.modules.get(module) if imported_only else importlib.import_module(module)
    for part in path:
        owner = getattr(owner, part, None)
    return owner, name


def _installed(p: Patch) -> bool:
    """Whether ``p``'s replacement is in place (its module imported already; nothing imported here)."""
    owner, name = _owner(p, imported_only=True)
    return bool(getattr(getattr(owner, name, None), MARK, False))


def original(name: str) -> Callable[..., Any]:
    """Horovod's own function behind patch ``name`` (installed by :func:`apply`)."""
    return _ORIGINALS[name]


def horovod_version() -> str:
    try:
        import horovod

        return str(horovod.__version__)
    except Exception:  # noqa: BLE001 - named in the error line only
        return "?"


def _changed(what: str, p: Patch) -> HorovodChanged:
    v = horovod_version()
    made_for = " or ".join(WRITTEN_FOR)
    return HorovodChanged(f"--collective horovod: Horovod {v} {what}: elastic-ring's patch '{p.name}' needs it "
                          f"({p.why}); the patches were written for Horovod {made_for}: install that "
                          f"(scripts/setup.sh) or run with --collective torch")


def _resolve(ref: str, by_shape: bool = True) -> Any:
    """The object ``"module:Qual.name"`` names; raises LookupError naming what is missing. A
    name that is no attribute of its class is taken for an instance attribute where the class's
    code sets it (``by_shape``), or without looking (a version the patches were written for)."""
    module, qual = ref.split(":")
    try:
        obj: Any = importlib.import_module(module)
    except ImportError as e:
        raise LookupError(f"has no module {module} ({e})") from None
    parts = qual.split(".")
    for i, part in enumerate(parts):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            if inspect.isclass(obj) and i == len(parts) - 1 and (not by_shape or _sets_on_instances(obj, part)):
                return None  # an instance attribute: the class's code sets it
            raise LookupError(f"has no {module}.{'.'.join(parts[:i + 1])}") from None
    return obj


def _sets_on_instances(cls: type, name: str) -> bool:
    """Whether ``cls`` (or a base of it) gives its instances attribute ``name``: a dataclass
    field, an annotation or a ``self.name = ...`` in its code (a check by shape)."""
    target = rf"self\.{re.escape(name)}"
    assigned = re.compile(rf"^\s*(?:[\w.]+\s*,\s*)*{target}\s*(?:,\s*[\w.]+\s*)*(?::[^=\n]+)?=(?!=)", re.M)
    for c in inspect.getmro(cls):
        if name in getattr(c, "__annotations__", {}):
            return True
        try:
            source = inspect.getsource(c)
        except (OSError, TypeError):
            continue
        if assigned.search(source):
            return True
    return False


def _signature_problem(fn: Callable[..., Any], params: tuple[str, ...]) -> str | None:
    """Why Horovod's ``fn`` does not take the call the patch makes (``params``), or None."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None  # a builtin without a signature: callable is all that can be seen
    positional = [p for p in params if not p.endswith("=")]
    keywords = {p[:-1]: None for p in params if p.endswith("=")}
    names = [*positional, *keywords]
    wanted = f"it takes {sig} where the patch calls it with ({', '.join(names)})"
    try:
        sig.bind(*[None] * len(positional), **keywords)
    except TypeError:
        return wanted
    kinds = {p.kind for p in sig.parameters.values()}
    if not kinds & {inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD}:
        if list(sig.parameters) != names:
            return wanted
    return None


def check(selected: list[Patch] | None = None) -> None:
    """Every target of ``selected`` (default: every patch) and every name it uses is there, a
    function taking the parameters the patch relies on. Imports the target modules. With a
    version the patches were not written for, the instance attributes they use are looked for in
    their classes' code too (a check by shape).

    Raises:
        HorovodChanged: one line naming the first missing or changed internal and the version.
    """
    by_shape = horovod_version() not in WRITTEN_FOR
    for p in PATCHES if selected is None else selected:
        try:
            fn = _resolve(p.target)
        except LookupError as e:
            raise _changed(str(e), p) from None
        fn = getattr(fn, ORIGINAL, fn)  # replaced already: Horovod's own is checked
        if not callable(fn):
            raise _changed(f"changed {p.module}.{p.attr}: it is a {type(fn).__name__}, not a function", p)
        problem = _signature_problem(fn, p.params)
        if problem:
            raise _changed(f"changed {p.module}.{p.attr}: {problem}", p)
        for ref in p.uses:
            try:
                _resolve(ref, by_shape)
            except LookupError as e:
                raise _changed(str(e), p) from None


def apply(*groups: str) -> None:
    """Check, then install the patches of ``groups`` (all without any; a patch's name selects that
    one) on the imported Horovod; idempotent (a target that is our replacement already is left as
    it is).

    Raises:
        HorovodChanged: a target is missing or changed (nothing of that call is installed then).
    """
    selected = patches(*groups)
    check(selected)
    for p in selected:
        owner, name = _owner(p)
        current = getattr(owner, name)
        if getattr(current, MARK, False):
            continue
        new = p.make(current)
        setattr(new, MARK, True)
        setattr(new, ORIGINAL, current)
        _ORIGINALS[p.name] = current
        setattr(owner, name, new)


# ---- the check at the controller's start ----

def _source_key(selected: list[Patch]) -> str | None:
    """What a yes of :func:`check` depends on, read without importing Horovod: this Python, the
    version, each patched module's source file (path, size, time) and the records themselves."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("horovod")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0]).parent
    parts = [sys.executable, horovod_version()]
    modules = sorted({r.split(":")[0] for p in selected for r in (p.target, *p.uses)})
    for m in modules:
        base = root.joinpath(*m.split("."))
        for f in (base.with_suffix(".py"), base / "__init__.py"):
            try:
                st = f.stat()
            except OSError:
                continue
            parts.append(f"{f}:{st.st_size}:{st.st_mtime_ns}")
            break
        else:
            parts.append(f"{m}:missing")
    records = repr([(p.name, p.target, p.params, p.uses) for p in selected]) + repr(WRITTEN_FOR)
    parts.append(hashlib.sha256(records.encode()).hexdigest()[:16])
    return "|".join(parts)


def _check_in_child(groups: tuple[str, ...]) -> tuple[int, str]:
    """Run :func:`check` of ``groups`` in a fresh Python (its imports, torch's for the worker
    group, stay out of the controller): (exit status, its last stderr line)."""
    import subprocess

    try:
        p = subprocess.run([sys.executable, "-m", "elastic_ring.hvd_patches", *groups],
                           capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        return 1, f"{type(e).__name__}: {e}"
    lines = p.stderr.strip().splitlines()
    return p.returncode, lines[-1] if lines else ""


def check_installed(*groups: str, cache: Path | None = None, run_check=None) -> None:
    """Before anything launches: the installed Horovod has what the patches of ``groups`` rely
    on. A yes is remembered per install (``cache``, default ``$ELASTIC_RING_CACHE/horovod-patches.json``);
    otherwise :func:`check` runs in a child process (``run_check``: that runner, for tests).

    Raises:
        HorovodChanged: the child's one line (a missing or changed internal, the version).
    """
    from elastic_ring.protocol import read_json, write_json_atomic

    if cache is None:
        from elastic_ring.data.check import machine_cache_root

        cache = machine_cache_root() / CACHE_FILE
    groups = tuple(sorted(set(groups)))
    key = _source_key(patches(*groups))
    known = read_json(cache) if key else None
    if isinstance(known, dict) and known.get(key) is True:
        return
    rc, line = (run_check or _check_in_child)(groups)
    if rc == 2 and line:
        raise HorovodChanged(line)
    if rc != 0:
        raise HorovodChanged(f"--collective horovod: checking Horovod {horovod_version()}'s internals that "
                             f"elastic-ring patches failed (status {rc}): {line or 'no output'}")
    if key:
        try:
            data = known if isinstance(known, dict) else {}
            write_json_atomic(cache, {**data, key: True})
        except OSError:
            pass  # a read-only home: checked every time


def main(argv: list[str] | None = None) -> int:
    """``python -m elastic_ring.hvd_patches [GROUP...]``: :func:`check`; one line and status 2 if
    Horovod changed."""
    groups = tuple(sys.argv[1:] if argv is None else argv)
    try:
        check(patches(*groups))
    except HorovodChanged as e:
        print(e, file=sys.stderr, flush=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
