"""The two-host tests' shared sequences (`localhost` and `127.0.0.1`, two hosts on one machine):
the worker launched on 127.0.0.1 gets a signal (kill -9: a failure, its host cooled down and grown
back onto; SIGTERM: a preempted shrink) or its host is drained, and the run is waited for.

Each returns what the tests read afterwards: the victim's pid record (its ``rank`` and ``pid``) and
the run's stdout and stderr. The run's process is killed where a step fails."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
from pathlib import Path
from typing import Callable

from elastic_ring import protocol
from elastic_ring.events import read_events
from tests.conftest import run_cli, wait_for


def _launches(run: Path) -> int:
    return len(read_events(run / "events.jsonl", kind="launch"))


def window_at_2(run: Path, from_step: int = 0) -> list[dict]:
    """Wait for a throughput window of the run at 2 workers (the ring trains on both hosts), of
    step ``from_step`` or later."""
    return wait_for(lambda: [t for t in read_events(run / "events.jsonl", kind="throughput")
                             if t["world_size"] == 2 and t["step"] >= from_step], 120, "a window at 2 workers")


def worker_on_127(run: Path, segment: int = 0) -> dict:
    """The pid record of the worker of ``segment`` launched on 127.0.0.1 (there is one)."""
    recs = [protocol.read_json(f) for f in protocol.pid_dir(run).glob(f"seg{segment:03d}-rank*.json")]
    (victim,) = [r for r in recs if r and r.get("launch_host") == "127.0.0.1"]
    return victim


def status_lines(run: Path) -> list[str]:
    """``elastic-ring status RUN``'s lines on stdout, through the console entry in this process (a
    read of the run's files, as ``tests.conftest.run_inproc``): quick enough to catch a state that
    lasts a few seconds, where a new process's start can take one or two on a loaded machine. As
    of a status process, an error leaves no line on stdout (a run folder not made yet)."""
    from elastic_ring.cli.main import main

    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            main(["status", str(run)])
    except SystemExit:
        pass
    except Exception:  # a process's traceback (on stderr)
        return []
    return out.getvalue().splitlines()


def kill_127_then_grown_back(proc: subprocess.Popen, run: Path, excluded_line: bool = True, from_step: int = 0,
                             grown_back: Callable[[Path], object] | None = None) -> tuple[dict, str, str, int]:
    """A run of 2 workers over both hosts: after a window at 2 (of step ``from_step`` or later),
    kill -9 of the worker on 127.0.0.1; with ``excluded_line``, status names the host left out
    (``hosts: localhost:1 (1 slot); excluded: 127.0.0.1 until ...``) during its cooldown; then the
    grow back onto it (``grown_back(run)`` true: by default the third launch) and, once the grown
    ring has done a step, the run stopped there (:func:`stop_once_grown`). Returns (the victim's
    record, stdout, stderr, the last step trained)."""
    if grown_back is None:
        grown_back = lambda r: _launches(r) >= 3  # noqa: E731
    try:
        window_at_2(run, from_step)
        victim = worker_on_127(run)
        os.kill(int(victim["pid"]), signal.SIGKILL)  # the worker on 127.0.0.1 dies
        if excluded_line:
            line = wait_for(lambda: next((ln for ln in status_lines(run) if "excluded: 127.0.0.1 until" in ln),
                                         None), 30, "status naming the host", poll=0.1)
            assert line.startswith("hosts: localhost:1 (1 slot); excluded: 127.0.0.1 until "), line
        wait_for(lambda: grown_back(run), 120, "the grow back onto 127.0.0.1")
        out, err, end = stop_once_grown(proc, run)
    finally:
        if proc.poll() is None:
            proc.kill()
    return victim, out, err, end


def stop_when(proc: subprocess.Popen, run: Path, ready: Callable[[Path], object], what: str,
              timeout: float = 120) -> tuple[str, str, int]:
    """Ctrl-C (SIGINT to the controller) once ``ready(run)`` holds, and the run's end: the workers
    stop at an agreed step, checkpoint it, and the run ends stopped (exit 130). A test whose events
    are in by then needs no more steps: a run's ``--steps`` only bounds it, with a margin for a
    loaded machine, and the steps after the last event trained on for nothing a test reads (14-24 s
    of both cores in the two-host runs of 400-800 steps). A run that finished first (exit 0) is
    taken as it is. Returns stdout, stderr and the last step trained: the step of the stop (its
    last ``segment_end``, which its checkpoint holds) or of the ``finished`` event."""
    try:
        wait_for(lambda: ready(run) or proc.poll() is not None, timeout, what)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode == 0:
        return out, err, read_events(run / "events.jsonl", kind="finished")[-1]["step"]
    assert proc.returncode == 130, (proc.returncode, err)
    end = read_events(run / "events.jsonl", kind="segment_end")[-1]
    assert end["reason"] == "requested", end
    assert read_events(run / "events.jsonl", kind="checkpoint_written")[-1]["step"] == end["step"]
    assert not read_events(run / "events.jsonl", kind="finished")
    return out, err, end["step"]


def stop_once_grown(proc: subprocess.Popen, run: Path, world: int = 2,
                    launches: int | None = None) -> tuple[str, str, int]:
    """:func:`stop_when` the segment of the run's launch number ``launches`` (by default its last
    launch: a grow's, or a shrink's) has done a step at ``world`` workers (a ``first_step`` or a
    throughput window) past every step a failure lost (each restart's ``failed_at_step`` + 1): the
    steps a failed segment trained are all trained again by then, so that each step's last
    training is the run's (under load a grow back came at step 2 of a restart from step 0 whose
    failed segment had trained to step 20)."""
    def ready(r: Path) -> bool:
        events = read_events(r / "events.jsonl")  # (read once a poll)
        ls = [e for e in events if e["kind"] == "launch"]
        n = launches or len(ls)
        if not len(ls) >= n > 0:
            return False
        lost = max((e["failed_at_step"] + 1 for e in events if e["kind"] == "restart"), default=0)
        return any(e["kind"] in ("first_step", "throughput") and e["segment"] >= ls[n - 1]["segment"]
                   and e["world_size"] == world and e["step"] > lost for e in events)
    return stop_when(proc, run, ready, f"a step at {world} workers after launch {launches or 'the last'}")


def sigterm_127_then_shrunk(proc: subprocess.Popen, run: Path) -> tuple[dict, str, str, int]:
    """A run of 2 workers over both hosts: after a window at 2, SIGTERM to the worker on 127.0.0.1
    (how Kubernetes and spot reclaims preempt); then the second launch (the shrink off it) and,
    once it has done a step, the run stopped there (:func:`stop_once_grown`). Returns (the victim's
    record, stdout, stderr, the last step trained)."""
    try:
        window_at_2(run)
        victim = worker_on_127(run)
        os.kill(int(victim["pid"]), signal.SIGTERM)
        wait_for(lambda: _launches(run) >= 2, 120, "the shrink")
        out, err, end = stop_once_grown(proc, run, world=1, launches=2)
    finally:
        if proc.poll() is None:
            proc.kill()
    return victim, out, err, end


def drain_127_then_shrunk(proc: subprocess.Popen, run: Path, then=None) -> tuple[str, str, int]:
    """A run of 2 workers over both hosts: after a window at 2, ``elastic-ring drain RUN 127.0.0.1
    --deadline 60`` (answered at once); then the second launch (the shrink off it), ``then()``
    (more checks of the running job, where given) and, once the shrunk ring has done a step, the
    run stopped there (:func:`stop_once_grown`). Returns (stdout, stderr, the last step trained)."""
    try:
        window_at_2(run)
        r = run_cli("drain", str(run), "127.0.0.1", "--deadline", "60")
        assert r.returncode == 0 and "drain of 127.0.0.1 requested" in r.stdout, r.stderr
        wait_for(lambda: _launches(run) >= 2, 120, "the shrink")
        if then is not None:
            then()
        return stop_once_grown(proc, run, world=1, launches=2)
    finally:
        if proc.poll() is None:
            proc.kill()
