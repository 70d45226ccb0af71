"""The fork server (elastic_ring.worker.zygote): a real zygote, real commands handed to it. The
child runs with the command's arguments, environment, folder and streams; the command ends as the
child ended (status, or the same signal); signals to the command reach the child; the child ends
when the command is killed; without a zygote the command runs by itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from elastic_ring.worker import zygote
from tests.conftest import ROOT, ended, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", autouse=True)
def _own_zygote():
    """This module tests the controller's own zygote (zygote.ensure starting one), not the one the
    test session shares with its runs (tests/conftest.py)."""
    from elastic_ring import env as envvars

    shared = os.environ.pop(envvars.ZYGOTE_SHARED, None)
    yield
    if shared is not None:
        os.environ[envvars.ZYGOTE_SHARED] = shared


@pytest.fixture(scope="module")
def name():
    n = zygote.ensure()
    assert n is not None, "the zygote did not start"
    yield n
    zygote.stop()


def _probe(env_name: str | None, *args: str, cwd=ROOT) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != zygote.ENV}
    env["PROBE"] = "seen"
    if env_name is not None:
        env[zygote.ENV] = env_name
    return subprocess.Popen([sys.executable, "-m", "tests.integration.zygote_probe", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _first_line(p: subprocess.Popen) -> dict:
    return json.loads(p.stdout.readline())


def test_the_child_runs_the_command_and_the_command_ends_with_its_status(name, tmp_path):
    p = _probe(name, "exit", "3", cwd=ROOT)
    seen = _first_line(p)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 3, err
    assert seen["torch"] is True  # forked from the zygote, which imported torch: not a fresh interpreter
    assert seen["dynamo"] is False  # and not torch._dynamo, unless asked (below)
    assert seen["pid"] != p.pid and seen["argv"] == ["exit", "3"] and seen["probe"] == "seen"
    assert seen["cwd"] == str(ROOT) and seen["zygote_env"] is False  # its workers start no zygote of theirs
    assert err.strip().endswith("to stderr")  # the command's own stderr


def test_kill_9_of_the_child_ends_the_command_by_the_same_signal(name):
    p = _probe(name, "sleep")
    child = _first_line(p)["pid"]
    os.kill(child, signal.SIGKILL)
    p.wait(timeout=30)
    assert p.returncode == -signal.SIGKILL


def test_sigterm_to_the_command_reaches_the_child(name):
    p = _probe(name, "sleep")
    child = _first_line(p)["pid"]
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=30)
    assert p.returncode == -signal.SIGTERM
    wait_for(lambda: ended(child), 10, "the child's end")


def test_kill_9_of_the_command_ends_the_child(name):
    p = _probe(name, "sleep")
    child = _first_line(p)["pid"]
    p.kill()
    p.wait(timeout=30)
    wait_for(lambda: ended(child), 10, "the child's end after its command was killed")


def test_kill_9_of_the_command_ends_a_stopped_child_too(name):
    """A child that cannot run (SIGSTOP: a worker stopped past its controller's grace) cannot end
    itself when its command is killed: the zygote ends it (such children once outlived every run
    of test_notice's Slurm test, stopped)."""
    p = _probe(name, "sleep")
    child = _first_line(p)["pid"]
    os.kill(child, signal.SIGSTOP)
    try:
        p.kill()
        p.wait(timeout=30)
        wait_for(lambda: ended(child), 10, "the stopped child's end after its command was killed")
    finally:
        if not ended(child):
            os.kill(child, signal.SIGKILL)


def test_a_zygote_asked_to_import_torch_dynamo_forks_children_that_have_it():
    """ensure(compile_=True), as the controller asks for a script's run: the children start with
    torch._dynamo imported (a script's optimizer and DDP import it); the zygote's own variable is
    not in their environment."""
    from elastic_ring import env as envvars

    kept = list(zygote._RUNNING)  # the module's zygote, put back after: a second one of this process
    zygote._RUNNING.clear()
    try:
        n = zygote.ensure(compile_=True)
        assert n is not None and (not kept or n != kept[0][1]), "the zygote did not start"
        p = _probe(n, "exit", "0")
        seen = _first_line(p)
        p.communicate(timeout=60)
        assert p.returncode == 0 and seen["pid"] != p.pid and seen["dynamo"] is True
        assert envvars.ZYGOTE_COMPILE not in os.environ
    finally:
        zygote.stop()
        zygote._RUNNING[:] = kept


def test_without_an_answering_zygote_the_command_runs_by_itself():
    p = _probe("no-such-zygote", "exit", "4")
    seen = _first_line(p)
    p.communicate(timeout=60)
    assert p.returncode == 4 and seen["pid"] == p.pid and seen["torch"] is False


def test_a_zygote_that_closes_before_it_forks_leaves_the_command_to_run_by_itself():
    import socket
    import threading

    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind("\0elastic-ring-zygote-closing-test")
    srv.listen(1)

    def close_one():
        conn, _ = srv.accept()
        conn.settimeout(1.0)
        try:
            while conn.recv(65536):  # the whole request read (a close with unread data would be a reset)
                pass
        except OSError:
            pass
        conn.close()

    t = threading.Thread(target=close_one, daemon=True)
    t.start()
    try:
        p = _probe("closing-test", "exit", "5")
        seen = _first_line(p)
        _, err = p.communicate(timeout=60)
    finally:
        srv.close()
    assert p.returncode == 5 and seen["pid"] == p.pid and seen["torch"] is False, err
    assert "Traceback" not in err


def test_a_store_forked_by_the_zygote_serves_a_client_and_ends_with_its_handle(name):
    """serve_store with a zygote running (the controller of a CPU torch job): the TCPStore runs in a
    process the zygote forked, not in this one (a client here sets and reads a key through it), and
    it ends when the controller's handle is dropped."""
    import subprocess as sp

    from elastic_ring.controller.backends.torch_ring import serve_store

    handle, port = serve_store("127.0.0.1")
    assert isinstance(handle, zygote.Served) and handle.pid != os.getpid() and port > 0
    client = ("import datetime, sys, torch.distributed as d; s = d.TCPStore('127.0.0.1', int(sys.argv[1]), "
              "is_master=False, timeout=datetime.timedelta(seconds=20)); s.set('k', 'v'); print(s.get('k').decode())")
    r = sp.run([sys.executable, "-c", client, str(port)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "v", r.stderr
    pid = handle.pid
    handle.close()
    wait_for(lambda: ended(pid), 10, "the store's end after its handle closed")


def test_serve_forked_without_a_zygote_or_a_line_gives_none(name):
    assert zygote.serve_forked("no-such-zygote", "tests.integration.zygote_probe", ["exit", "0"]) is None
    # a module that prints nothing within the wait: its child is ended, None returned
    got = zygote.serve_forked(name, "tests.integration.zygote_silent", [], timeout=2.0)
    assert got is None
