"""A fork server for CPU workers on the controller's host: worker processes that start in
milliseconds instead of seconds.

A worker process spends most of its start importing torch and Horovod (about 2 s of CPU on a
small machine, at every launch, relaunch and restart). The controller of a CPU run starts one
*zygote* (``python -u -m elastic_ring.worker.run --zygote NAME``): it imports them once, then
listens on an abstract Unix socket. Each worker that horovodrun (or the local launcher) starts
runs ``python -u -m elastic_ring.worker.run ...`` as before; that command, before it imports
anything heavy, finds ``$ELASTIC_RING_ZYGOTE`` and hands its arguments, environment, working
folder and standard streams to the zygote, which forks a child that runs the worker
(:func:`elastic_ring.worker.run.main`) with them. The command's process stays as the child's
stand-in for its launcher: it forwards the signals it gets and ends as the child ended (its exit
status, or killed by the same signal), and the child ends itself when its stand-in is gone
(a launcher's kill -9 of its process group). The worker's own pid (its records, its logs) is the
child's.

A process that starts many runs (a test session: tests/conftest.py) may start one zygote for all of
them (:func:`start`) and name it in ``$ELASTIC_RING_ZYGOTE_SHARED``: each controller below it then
hands that one to its workers (when it answers) instead of starting and waiting for its own.

Nothing changes where the zygote does not answer (not started yet, another host, another user:
the socket checks its peer's uid): the command then starts the worker in its own process as
before. GPU runs do not use it (a fork must come before CUDA starts; the controller starts it for
CPU runs only).
"""

from __future__ import annotations

import array
import json
import os
import select
import signal
import socket
import struct
import sys
import threading
import time

from elastic_ring import env as envvars
from elastic_ring import protocol

ENV = envvars.ZYGOTE  # the zygote's abstract socket name, in the workers' environment
_PRELOAD = ("torch", "torch.distributed", "horovod.torch", "elastic_ring.worker.api", "elastic_ring.worker.ring",
            "elastic_ring.worker.hooked", "elastic_ring.worker.hvd_elastic", "elastic_ring.worker.survive",
            "elastic_ring.telemetry.gpu", "elastic_ring.config.api", "elastic_ring.data.datasets",
            "elastic_ring.data.stream", "elastic_ring.nn.resnet", "elastic_ring.train.optim", "elastic_ring.worker.lr")
# (the built-in worker's own imports, not the module itself: runpy runs it as __main__ afresh)
# and, where the run's workers would import it (ensure(compile_=True)), torch._dynamo: a script's
# torch.optim step and DistributedDataParallel import it (seconds of CPU in each worker, warmed while
# its ring forms: worker.ring.warm_imports); forked from here, each relaunch, restart or spare has it
_LEN = struct.Struct("!I")
_STATUS = struct.Struct("!i")


def _address(name: str) -> str:
    return "\0elastic-ring-zygote-" + name


# ------------------------------------------------------------------ the worker command's side
def hand_over(module: str, argv: list[str]) -> None:
    """In ``python -m MODULE ARGV`` (the worker entry), before anything heavy: when a zygote
    answers at ``$ELASTIC_RING_ZYGOTE``, have it fork ``MODULE`` run as ``__main__`` with ``ARGV``,
    stand in for it and end as it ended (this function then never returns). Returns at once when
    there is no zygote to ask."""
    name = envvars.zygote()
    if not name:
        return
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(_address(name))
        env = {k: v for k, v in os.environ.items() if k != ENV}
        env[protocol.PROCESS_START_ENV] = repr(time.time())  # the launched command runs: the child's start
        fds = [0, 1, 2, *_passed_fds(env)]
        pid = _ask(s, module, argv, env, fds, fds)
    except (OSError, struct.error):
        s.close()
        return  # no zygote (or it went away, or could not fork): start the worker here
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda signum, frame: _forward(pid, signum))
    try:
        raw = _recv_exact(s, _STATUS.size)
    except OSError:
        raw = b""
    if len(raw) < _STATUS.size:  # the zygote died first (its controller was killed): wait for the child
        while _alive(pid):
            time.sleep(0.2)
        os._exit(1)
    status = _STATUS.unpack(raw)[0]
    sys.stdout.flush()
    sys.stderr.flush()
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        time.sleep(1)
        os._exit(128 + sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def _ask(s: socket.socket, module: str, argv: list[str], env: dict[str, str], send: list[int],
         places: list[int]) -> int:
    """One request on the zygote's connection ``s``: fork ``module`` as ``__main__`` with ``argv`` and
    ``env`` in this process's working folder, the descriptors ``send`` becoming the child's
    ``places``; the child's pid. OSError when the zygote does not answer it."""
    payload = json.dumps({"module": module, "argv": argv, "env": env, "cwd": os.getcwd(),
                          "fds": places}).encode()
    s.sendmsg([_LEN.pack(len(payload)) + payload],
              [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", send))])
    raw = _recv_exact(s, _STATUS.size)
    if len(raw) < _STATUS.size:
        raise OSError("the zygote did not fork")
    return _STATUS.unpack(raw)[0]


def _passed_fds(env: dict[str, str]) -> list[int]:
    """Descriptors a launcher handed this process besides the standard streams (the local
    launcher's rendezvous socket for rank 0)."""
    v = env.get(protocol.STORE_FD_ENV, "")
    return [int(v)] if v.isdigit() and int(v) > 2 else []


def _forward(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except OSError:
        pass


def _alive(pid: int) -> bool:
    """:func:`elastic_ring.protocol.pid_alive`, and not a zombie (gone, for the stand-in)."""
    if not protocol.pid_alive(pid):
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return buf


# ------------------------------------------------------------------ the zygote's side
def serve(name: str, parent_pid: int | None = None) -> None:
    """The zygote: import what every worker imports, then fork one child per request until the
    controller (``parent_pid``) is gone."""
    import importlib

    for mod in (*_PRELOAD, *(("torch._dynamo",) if envvars.zygote_compile() else ())):
        try:
            importlib.import_module(mod)
        except Exception:  # noqa: BLE001 - a module the run does not need (no Horovod, say)
            pass
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(_address(name))
    srv.listen(64)
    sys.stdout.write("ready\n")  # the controller waits for this line before its first launch
    sys.stdout.flush()
    children: dict[int, socket.socket] = {}
    killed: set[int] = set()
    while parent_pid is None or os.getppid() == parent_pid:  # until the controller is gone
        ready, _, _ = select.select([srv, *children.values()], [], [], 0.05)
        if len(ready) > (srv in ready):
            _end_orphans(children, killed, ready)
        if srv in ready:
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            try:
                request, fds = _read_request(conn)
            except (OSError, ValueError):
                conn.close()
                continue
            if request is None:
                conn.close()
                for fd in fds:
                    os.close(fd)
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            try:
                pid = os.fork()
            except OSError:  # no process to be had: the command starts the worker itself
                conn.close()
                for fd in fds:
                    os.close(fd)
                continue
            if pid == 0:
                srv.close()
                for c in children.values():
                    c.close()
                _child(conn, fds, request)  # never returns
            for fd in fds:
                os.close(fd)
            try:
                conn.sendall(_STATUS.pack(pid))
            except OSError:
                pass
            children[pid] = conn
        _reap(children)
    _end_orphans(children, killed)
    os._exit(0)  # no teardown of torch: nothing of the zygote's own is left to write


def _end_orphans(children: dict[int, socket.socket], killed: set[int], ready: list | None = None) -> None:
    """SIGKILL each child whose stand-in (the launcher's child that asked for it) is gone: its
    connection is at its end (the stand-in never writes to it). The child's own thread does this
    (:func:`_end_with_stand_in`), but not while the child is stopped (SIGSTOP, a debugger): it
    outlived the launcher's kill and its controller."""
    killed.intersection_update(children)  # (reaped ones: a pid may come again)
    if ready is None:
        try:
            ready, _, _ = select.select(list(children.values()), [], [], 0)
        except (OSError, ValueError):
            return
    for pid, conn in list(children.items()):
        if conn not in ready or pid in killed:
            continue
        try:
            at_end = conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            at_end = False
        except OSError:
            at_end = True
        if at_end:
            killed.add(pid)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _read_request(conn: socket.socket) -> tuple[dict | None, list[int]]:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    fds: list[int] = []
    msg, anc, _, _ = conn.recvmsg(1 << 20, socket.CMSG_LEN(8 * array.array("i").itemsize))
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            a = array.array("i")
            a.frombytes(data[:len(data) - len(data) % a.itemsize])
            fds.extend(a)
    if uid != os.getuid() or len(fds) < 3 or len(msg) < _LEN.size:
        return None, fds
    n = _LEN.unpack(msg[:_LEN.size])[0]
    body = msg[_LEN.size:]
    while len(body) < n:
        chunk = conn.recv(n - len(body))
        if not chunk:
            return None, fds
        body += chunk
    request = json.loads(body)
    if len(request.get("fds", ())) != len(fds):
        return None, fds
    return request, fds


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            try:
                conn.sendall(_STATUS.pack(status))
            except OSError:
                pass
            conn.close()


def _child(conn: socket.socket, fds: list[int], request: dict) -> None:
    code = 1
    try:
        env = dict(request["env"])
        for fd, number in zip(fds, request["fds"]):
            if number <= 2:  # the standard streams, in their places
                os.dup2(fd, number)
                os.close(fd)
            else:  # a launcher's socket: here under the number it was received as
                env[protocol.STORE_FD_ENV] = str(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(env)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _fresh_random()
        threads = env.get("OMP_NUM_THREADS", "")
        if threads.isdigit() and int(threads) > 0 and "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(int(threads))  # read at start-up by a fresh process
        threading.Thread(target=_end_with_stand_in, args=(conn,), daemon=True,
                         name="elastic-ring-stand-in").start()
        sys.path[0] = request["cwd"]  # as `python -m` sets it
        sys.argv = [sys.argv[0], *request["argv"]]
        import runpy

        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code if isinstance(code, int) else 1)


def _fresh_random() -> None:
    """What a new interpreter draws from the OS: Python's and NumPy's global generators (torch's
    default generator starts from a fixed seed in every process, as it did in the zygote)."""
    import random

    random.seed()
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()


def _end_with_stand_in(conn: socket.socket) -> None:
    """The command's process (the launcher's child) is gone: end as it would have."""
    try:
        while conn.recv(1):
            pass
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGKILL)


_RUNNING: list = []  # [(Popen, name)] of this process's zygote, once started
_REFUSED: list = []  # a zygote that did not start: not tried again by this process
NO_ZYGOTE_ENV = envvars.NO_ZYGOTE  # set (to anything): workers start in their own processes


def ensure(timeout: float = 60.0, compile_: bool = False) -> str | None:
    """This process's zygote (started at the first call, which waits for its imports: the time
    the first workers would have spent on them): its name, or None when it cannot start.
    ``compile_``: it imports ``torch._dynamo`` too (the first call's choice holds for the process)."""
    if envvars.no_zygote() or _REFUSED:
        return None
    name = running()
    if name is not None:
        return name
    _RUNNING.clear()
    p, name = start(timeout, compile_)
    if p is None:
        _REFUSED.append(name)
        return None
    import atexit

    atexit.register(stop)
    _RUNNING.append((p, name))
    return name


def start(timeout: float = 60.0, compile_: bool = False) -> tuple[subprocess.Popen | None, str]:
    """A new zygote, this process its parent (it ends when this process is gone), once it is
    ready: (its process, its name); (None, its name) when it did not start in ``timeout`` s.
    :func:`ensure` starts this process's own; a test session starts one shared by all its runs
    (``ELASTIC_RING_ZYGOTE_SHARED``: tests/conftest.py)."""
    import subprocess
    import uuid

    name = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
    zenv = {k: v for k, v in os.environ.items() if k not in (envvars.ZYGOTE_COMPILE, envvars.ZYGOTE_SHARED)}
    if compile_:
        zenv[envvars.ZYGOTE_COMPILE] = "1"
    p = subprocess.Popen([sys.executable, "-u", "-m", "elastic_ring.worker.run", "--zygote", name,
                          "--zygote-parent", str(os.getpid())],
                         stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         start_new_session=True, env=zenv)
    ready, _, _ = select.select([p.stdout], [], [], timeout)
    if not ready or p.stdout.readline().strip() != b"ready":
        p.kill()
        p.wait()
        return None, name
    return p, name


def answers(name: str) -> bool:
    """Whether a zygote listens at ``name`` (a connection it reads as an empty request and closes)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(_address(name))
        return True
    except OSError:
        return False
    finally:
        s.close()


def running() -> str | None:
    """The zygote this process would hand its workers now without starting one: the shared one
    (``ELASTIC_RING_ZYGOTE_SHARED``) when it answers, else this process's own while it runs."""
    if envvars.no_zygote():
        return None
    shared = envvars.zygote_shared()
    if shared and answers(shared):
        return shared
    if _RUNNING and _RUNNING[0][0].poll() is None:
        return _RUNNING[0][1]
    return None


class Served:
    """A process a zygote forked for this one (a server of this process's, not a worker): it lives
    while this handle is open; :meth:`close` (or its collection, or this process's end) ends it
    (the zygote kills a child whose connection is at its end)."""

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self.sock: socket.socket | None = sock
        self.pid = pid

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def __del__(self) -> None:
        self.close()


def serve_forked(name: str, module: str, argv: list[str], timeout: float = 30.0) -> tuple[Served, str] | None:
    """Have the zygote at ``name`` fork ``module`` run as ``__main__`` with ``argv``, its standard
    output a pipe to this process and its standard error this process's: (its handle, the first
    line it printed), or None when the zygote does not answer or no line came within ``timeout`` s
    (the child, if any, is ended). For a server whose imports the zygote has made (a torch store)."""
    r, w = os.pipe()
    devnull = os.open(os.devnull, os.O_RDWR)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(_address(name))
        env = {k: v for k, v in os.environ.items() if k != ENV}
        handle = Served(s, _ask(s, module, argv, env, [devnull, w, 2], [0, 1, 2]))
    except OSError:
        s.close()
        os.close(r)
        return None
    finally:
        os.close(w)
        os.close(devnull)
    line = b""
    deadline = time.monotonic() + timeout
    try:
        while not line.endswith(b"\n"):
            ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(r, 256) if ready else b""
            if not chunk:
                break
            line += chunk
    finally:
        os.close(r)
    if not line.endswith(b"\n"):
        handle.close()
        return None
    return handle, line.decode(errors="replace").strip()


def stop() -> None:
    """End this process's zygote (the workers it forked are not its to end)."""
    for p, _ in _RUNNING:
        if p.poll() is None:
            p.kill()
            p.wait()
    _RUNNING.clear()
