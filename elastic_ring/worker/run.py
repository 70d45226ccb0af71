"""The entry point horovodrun (or, with ``--collective torch``, the local launcher) executes for
every worker: ``python -m elastic_ring.worker.run``.

    python -m elastic_ring.worker.run --run-dir DIR --segment N --stop-at S --owner ID \\
        [--go-file F] [--controller-pid P --controller-host H] [--inplace] -- TARGET [SCRIPT ARGS...]

TARGET is a script path (run as ``__main__``, as ``python SCRIPT`` would) or a module name. The
entry point:

- hands the launch settings to the worker library in this process (``worker.session``: a
  :class:`~elastic_ring.protocol.LaunchInfo` of its launch, the :class:`~elastic_ring.seam.Start` its
  arguments carry, and the ``worker`` entry of ``DIR/run.json``; the run's settings also as
  ``ELASTIC_RING_*`` variables, for :mod:`elastic_ring.env`), and changes to the folder `train` was
  run in (its ``cwd``): the script's relative paths are the user's;
- runs a script written for Horovod Elastic (``@hvd.elastic.run``) unchanged, with elastic-ring
  behind those names (:mod:`elastic_ring.worker.hvd_elastic`);
- runs a script of torchrun's contract unchanged, as ``python SCRIPT`` would, with no library in it
  (:mod:`elastic_ring.worker.torchrun`: the launcher says so; no ``init()`` is waited for);
- runs an epoch-loop script again in this process for each segment it joins in a ring re-formed
  in place (:class:`~elastic_ring.worker.hooked.Rejoin`);
- watches, in a thread, that the script calls ``elastic_ring.worker.init()`` (a script that calls
  ``hvd.init()`` itself, or not at all within ``init_timeout_s``, fails with a clear error) and
  that its controller is alive and still owns the folder (otherwise the worker exits with status
  75 within seconds: a killed controller leaves no orphan training on);
- writes any uncaught exception to ``DIR/logs/error-rank<r>.json`` (the controller names the rank
  and the cause), and skips the interpreter's slow teardown once everything is on disk.
"""

from __future__ import annotations

import argparse
import os
import runpy
import socket
import sys
import threading
import time
import traceback
from pathlib import Path

from elastic_ring import env, protocol, seam
from elastic_ring.protocol import RETIRED, LaunchInfo  # RETIRED: main(in_process=True) after an in-place shrink


class ScriptError(RuntimeError):
    """The script broke the library's contract (no init, returned early, exited non-zero)."""


def _rank() -> int | None:
    return env.launcher_rank()


def process_name(run_dir: Path, rank: int | None) -> str:
    """``er<rank>:<run folder>``, cut to Linux's 15 characters of a process name."""
    return f"er{'' if rank is None else rank}:{Path(run_dir).name}"[:15]


def name_process(run_dir: Path, rank: int | None) -> str:
    """Name this process after its run and rank (``er<rank>:<run folder>``, Linux's 15 characters)
    for ``ps -e``, ``top`` and ``pstree``: a worker forked from the fork server otherwise has the
    fork server's name and command line. (``ps -f`` / ``ps aux`` still show the command line, which
    a process cannot rewrite from Python.) Returns the name; nothing happens off Linux."""
    name = process_name(run_dir, rank)
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, ctypes.c_char_p(name.encode(errors="replace")), 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass
    return name


_LIB_DIR = str(Path(__file__).resolve().parents[1])  # the elastic_ring package
_T_ENTRY = time.time()  # the worker command runs (its start-up phases: elastic_ring.worker.api.startup_marks)
_ARG_ERROR: list[str] = []  # the message of the script's argparse error, if it rejected its arguments


def _where(exc: BaseException) -> str | None:
    """``file:line`` of the script's own code where ``exc`` was raised: the innermost frame outside
    the Python installation, site-packages and this package (a ``SyntaxError``: its own place)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    frames = traceback.extract_tb(exc.__traceback__)
    skip = (_LIB_DIR, sys.base_prefix, sys.prefix, "<frozen")
    own = [f for f in frames if not f.filename.startswith(skip) and "site-packages" not in f.filename]
    f = (own or frames or [None])[-1]
    return f"{f.filename}:{f.lineno}" if f is not None else None


def _kind(exc: BaseException, step: int | None) -> str | None:
    """What makes a failure deterministic, for the controller's restart rule
    (:mod:`elastic_ring.controller.restart_rule`); None: it may be transient."""
    from elastic_ring.worker.errors import ContractError

    if isinstance(exc, SyntaxError):
        return "syntax"
    if isinstance(exc, ImportError):
        return "import"
    if isinstance(exc, ScriptError) and _ARG_ERROR:
        return "usage"
    if isinstance(exc, (ScriptError, ContractError)):
        return "contract"
    if type(exc).__name__ == "PicklingError" or "pickle" in str(exc).lower():
        return "pickling"
    # a file or folder that is not there (or not allowed) stays so: not one of the OS errors that may pass
    missing = (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)
    transient = isinstance(exc, (OSError, MemoryError, TimeoutError)) and not isinstance(exc, missing)
    in_horovod = any("horovod" in f.filename for f in traceback.extract_tb(exc.__traceback__))
    if step is None and not transient and not in_horovod \
            and type(exc).__name__ not in protocol.PEER_LOSS_TYPES:
        return "setup"  # the script's own code failed before its first step
    return None


def _die(info: LaunchInfo, exc: BaseException, status: int = 1) -> None:
    from elastic_ring.worker import session, torchrun
    from elastic_ring.worker.checks import explain_port_clash

    exc = explain_port_clash(exc)  # a process group of the script's own, on the launcher's port
    seg = getattr(session.current(), "seg", None)  # the plain job has none
    step = seg.current if seg is not None else (torchrun.steps_done() or None)
    kind = _kind(exc, step)
    where = None if isinstance(exc, ScriptError) else _where(exc)
    text = exc.msg if isinstance(exc, SyntaxError) else str(exc)
    last = f"{type(exc).__name__}: {text}" if text else type(exc).__name__  # no module path
    message = f"{last} ({where})" if where else last
    protocol.write_error_record(info.run_dir, exc, _rank(), segment=info.segment, step=step,
                                fatal=kind in ("contract", "usage"), kind=kind, where=where,
                                message=message)
    print(f"elastic-ring worker rank {_rank()}: {message}", file=sys.stderr, flush=True)
    os._exit(status)


def _watchdog(info: LaunchInfo, init_timeout_s: float, stop: threading.Event) -> None:
    from elastic_ring.worker import session

    t0 = last_change = time.time()
    last_seq = None
    hb_path = protocol.control_dir(info.run_dir) / protocol.HEARTBEAT_FILE
    local = info.controller_host == socket.gethostname()
    while not stop.wait(0.5):
        now = time.time()
        if not session.init_called():
            hvd = sys.modules.get("horovod.torch")
            try:
                own_init = hvd is not None and hvd.is_initialized()
            except Exception:  # noqa: BLE001
                own_init = False
            if own_init:
                _die(info, ScriptError("the script called hvd.init() itself: call "
                                       "elastic_ring.worker.init() instead (it initialises Horovod)"))
            if now - t0 > init_timeout_s:
                _die(info, ScriptError(f"the script did not call elastic_ring.worker.init() within "
                                       f"{init_timeout_s:.0f} s"))
        if not info.owner:
            continue
        hb = protocol.read_json(hb_path)
        if isinstance(hb, dict):
            if hb.get("owner") not in (None, info.owner):
                print("elastic-ring worker: another controller owns the run folder now: exiting",
                      file=sys.stderr, flush=True)
                os._exit(protocol.EXIT_ORPHANED)
            if hb.get("seq") != last_seq:
                last_seq, last_change = hb.get("seq"), now
        gone = local and info.controller_pid and not protocol.pid_alive(info.controller_pid)
        if gone or now - last_change > protocol.HEARTBEAT_TIMEOUT_S:
            print("elastic-ring worker: the controller is gone: exiting (the last checkpoint is kept)",
                  file=sys.stderr, flush=True)
            os._exit(protocol.EXIT_ORPHANED)


def _run_target(target: str, args: list[str]) -> None:
    sys.argv = [target, *args]
    error = argparse.ArgumentParser.error

    def remember(parser, message):  # the script's own argparse rejecting its arguments
        _ARG_ERROR.append(message)
        error(parser, message)

    if not getattr(error, "remembers", False):  # once: the script may run again in this process
        remember.remembers = True
        argparse.ArgumentParser.error = remember
    if target.endswith(".py") or os.path.sep in target or Path(target).is_file():
        path = Path(target)
        sys.path.insert(0, str(path.resolve().parent))
        runpy.run_path(str(path), run_name="__main__")
    else:
        runpy.run_module(target, run_name="__main__", alter_sys=True)


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    cut = argv.index("--")
    own, rest = argv[:cut], argv[cut + 1:]
    p = argparse.ArgumentParser(prog="python -m elastic_ring.worker.run",
                                description="elastic-ring worker entry point (launched by horovodrun)")
    p.add_argument("--run-dir", required=True, type=Path)
    seam.Start.add_arguments(p)  # --segment, --stop-at, --owner, --go-file, --controller-pid, --controller-host
    p.add_argument("--inplace", action="store_true",
                   help="run under Horovod Elastic: resizes re-form the ring in this process")
    p.add_argument("--ring-by-controller", action="store_true",
                   help="resizes re-form the ring in this process, with the Horovod environment the "
                        "controller names (the Ray backend)")
    a = p.parse_args(own)
    if not rest:
        p.error("no TARGET after --")
    try:
        a.start = seam.Start.from_args(a)
    except seam.SeamError as e:
        p.error(str(e))
    return a, rest


def _launch_info(a: argparse.Namespace) -> tuple[LaunchInfo, float]:
    """The launch settings (the launch the arguments carry, and the ``worker`` entry of
    ``run.json``), handed to the worker library; and the script's allowance to call init."""
    from elastic_ring.worker import session
    from elastic_ring.worker.ring import INPLACE_ENV, RING_BY_CONTROLLER

    run_info = protocol.read_run_json(a.run_dir) or {}
    ws = dict(run_info.get("worker") or {})
    init_timeout_s = float(ws.pop("init_timeout_s", 120.0))
    start: seam.Start = a.start
    info = LaunchInfo(run_dir=a.run_dir, segment=start.segment, stop_at=start.stop_at, owner=start.owner,
                      go_file=start.go_file, controller_pid=start.controller_pid,
                      controller_host=start.controller_host,
                      **{k: v for k, v in ws.items() if k in LaunchInfo.__dataclass_fields__})
    os.environ.update(info.to_env())  # the run's settings (elastic_ring.env reads them)
    session.launched(info)
    _enter(info.cwd)
    from elastic_ring.worker.collective import torchrun_env_from_horovodrun

    torchrun_env_from_horovodrun()  # --collective torch on several hosts: launched by horovodrun
    if a.inplace or a.ring_by_controller:  # the ring's kind (worker.ring.ring_from_env)
        os.environ[INPLACE_ENV] = RING_BY_CONTROLLER if a.ring_by_controller else "1"
    return info, init_timeout_s


def _enter(cwd: str) -> None:
    """Run the script in ``cwd``, the folder `elastic-ring train` was run in, whatever folder the
    launcher started this process in: its relative paths mean what they mean under ``python
    SCRIPT`` there. A host without that folder (another machine) stays where it was, and says so."""
    if not cwd:
        return
    try:
        os.chdir(cwd)
    except OSError as e:
        print(f"elastic-ring worker: cannot run in {cwd} ({e.strerror}): running in {os.getcwd()}",
              file=sys.stderr, flush=True)


def _run_script(target: str, args: list[str]) -> None:
    """Run the script; again in this process for each segment it joins in a ring re-formed in
    place (an epoch loop's :class:`~elastic_ring.worker.hooked.Rejoin`)."""
    from elastic_ring.worker import session, survive
    from elastic_ring.worker.hooked import Rejoin
    from elastic_ring.worker.segment import StopReason

    while True:
        try:
            _run_target(target, args)
        except Rejoin as r:
            session.start_over(r.ring, r.segment, r.stop_at, r.start)
            continue
        except Exception as e:  # a peer lost: the survivors may go on from their copy in memory
            carried = survive.survived(e)
            if carried is None:
                raise
            session.start_over(*carried)
            continue
        job = session.current()
        if job is not None and job.elastic and job.form == "optimizer" and job.hooked.count \
                and not job.hooked.ended:
            job.hooked.end(StopReason.FINISHED)  # an epoch loop without job.epochs(): the script's end ends the run
        return


def _check_ended(info: LaunchInfo) -> None:
    """The script ended: it must have run its loop to the segment's end."""
    from elastic_ring.worker import session

    job = session.current()
    if not session.init_called():
        _die(info, ScriptError("the script ended without calling elastic_ring.worker.init()"))
    if job is not None and job.elastic and job.stop_reason is None:
        if job.form == "steps":
            _die(info, ScriptError("the script ended before its job.steps() loop did (break or return "
                                   "inside the loop?): no checkpoint was written for this segment"))
        _die(info, ScriptError("the script ended without a step of its registered optimizer (no "
                               "job.steps() or job.epochs() loop?)"))


def main(argv: list[str] | None = None, in_process: bool = False) -> int:
    """Run the worker. ``in_process`` (a Ray actor): return 0 when the script is done, and
    :data:`RETIRED` when an in-place shrink removed this worker, instead of ending the process
    (a failure still ends it, after its crash record is written)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: python -m elastic_ring.worker.run OPTIONS -- TARGET [ARGS...]", file=sys.stderr)
        return 2
    a, rest = _parse(argv)
    info, init_timeout_s = _launch_info(a)
    if not in_process:  # a Ray actor's process is Ray's to name, and started before this segment
        name_process(info.run_dir, _rank())
        os.environ.setdefault(protocol.PROCESS_START_ENV, repr(_T_ENTRY))  # forked: the command's, kept
    from elastic_ring.telemetry.gpu import apply_host_devices
    from elastic_ring.worker import torchrun

    apply_host_devices()  # cluster jobs on several hosts: this host's GPUs, before CUDA starts
    own_group = torchrun.in_use()  # torchrun's contract: the script alone, no init() to wait for
    if own_group:
        init_timeout_s = float("inf")
        started = env.process_start()
        torchrun.watch(info.run_dir, info.segment, _rank(), env.world_size(),
                       started if started is not None else _T_ENTRY)
    if not own_group and not in_process:  # under host discovery, a SIGTERM is a notice (worker.notice)
        from elastic_ring.worker import notice

        notice.install(info.run_dir, info.segment)
    stop = threading.Event()
    threading.Thread(target=_watchdog, args=(info, init_timeout_s, stop), daemon=True,
                     name="elastic-ring-watchdog").start()
    from elastic_ring.worker import hvd_elastic
    from elastic_ring.worker.hooked import StopSegment
    from elastic_ring.worker.ring import Retired

    if hvd_elastic.uses_horovod_elastic(rest[0]):
        hvd_elastic.install()  # a Horovod Elastic script: its hvd.init() and @hvd.elastic.run are ours
    try:
        _run_script(rest[0], rest[1:])
    except Retired:
        stop.set()
        return RETIRED
    except StopSegment:
        pass  # the segment stopped at an agreed step of the script's own loop (checkpoint written)
    except hvd_elastic.SegmentDone:
        pass  # its segment ended at a commit, checkpointed: the worker leaves
    except SystemExit as e:
        if e.code not in (None, 0):
            if e.code == 2 and _ARG_ERROR:
                _die(info, ScriptError(f"the script rejected its arguments: {_ARG_ERROR[-1]}"))
            _die(info, ScriptError(f"the script exited with status {e.code}"))
    except BaseException as e:  # noqa: BLE001 - every failure must reach the controller
        traceback.print_exc()
        _die(info, e)
    if not own_group:
        _check_ended(info)
    stop.set()
    sys.stdout.flush()
    sys.stderr.flush()
    if in_process:
        return 0
    # Everything is on disk (checkpoint fsynced, events written): skip the interpreter's slow
    # teardown of torch and Horovod, which only delays the relaunch.
    os._exit(0)


if __name__ == "__main__":
    from elastic_ring.worker import zygote

    if len(sys.argv) >= 3 and sys.argv[1] == "--zygote":  # the fork server (zygote.py), not a worker
        sys.exit(zygote.serve(sys.argv[2], int(sys.argv[4]) if len(sys.argv) >= 5 else None))
    zygote.hand_over("elastic_ring.worker.run", sys.argv[1:])  # returns where no zygote answers
    sys.exit(main())
