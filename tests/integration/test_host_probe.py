"""A host that stops answering, found by `--host-probe`, and grown back onto once it answers again
(docs/hosts.md, "A host that stops answering"): over `--hosts localhost:1,127.0.0.1:1` (two hosts
on one machine) a probe command of the test says whether 127.0.0.1 answers. The worker there is
stopped (SIGSTOP: its sockets stay open, the ring waits, as when a machine vanishes) and the probe
says the host is silent: the watchdog blames the rank there (on this one machine by the stopped
process, which it looks at first; on another machine by the host monitor's silent host), the job
restarts on localhost with the host left out for its cooldown, and is grown back onto it after the
cooldown only once it answers again: a host that does not answer is not grown onto.

Real horovodrun (gloo) runs of the tiny built-in ResNet; the helpers are test_discovery's and
two_hosts'."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest

from tests.conftest import run_cli, wait_for
from tests.integration.test_discovery import TINY, _events, _start
from tests.integration.two_hosts import status_lines, window_at_2, worker_on_127

pytestmark = pytest.mark.integration

BOTH, ONE = "localhost:1,127.0.0.1:1", "localhost:1"


def _hosts_of(launch: dict) -> str:
    return launch["command"][launch["command"].index("-H") + 1]


def _probe(tmp_path):
    """A probe command: 127.0.0.1 answers while ``silent`` does not exist; every other host always."""
    silent = tmp_path / "silent"
    probe = tmp_path / "probe.sh"
    probe.write_text(f'#!/bin/sh\nif [ "$1" = 127.0.0.1 ] && [ -e "{silent}" ]; then exit 1; fi\nexit 0\n')
    probe.chmod(0o755)
    return probe, silent


def test_a_silent_host_is_left_out_and_grown_back_onto_only_once_it_answers_again(tmp_path):
    run = tmp_path / "run"
    probe, silent = _probe(tmp_path)
    # the test's events set the run's length (it ends it with a Ctrl-C), not its steps: each step at
    # least 40 ms (min_step_s, a sleep after its work), so that its workers do not train flat out meanwhile
    proc = _start(["--gpus", "2", "--steps", "100000", *TINY, "--set", "min_step_s=0.04", "--hosts", BOTH,
                   "--blacklist-cooldown-range", "2:4", "--host-probe", str(probe), "--run-dir", str(run)])
    victim = None
    try:
        window_at_2(run)
        victim = worker_on_127(run)
        silent.touch()  # the host stops answering ...
        os.kill(int(victim["pid"]), signal.SIGSTOP)  # ... and its worker with it (sockets open: the ring waits)
        (stalled,) = wait_for(lambda: _events(run, "stalled"), 60, "the stall of the silent host's rank")
        wait_for(lambda: len(_events(run, "launch")) >= 2, 60, "the restart on localhost")
        line = wait_for(lambda: next((ln for ln in status_lines(run) if "excluded: 127.0.0.1 until" in ln), None),
                        30, "status naming the host", poll=0.1)
        assert line.startswith("hosts: localhost:1 (1 slot); excluded: 127.0.0.1 until "), line
        # its cooldown (2 s) passes while it is still silent: not grown back onto
        (restart,) = wait_for(lambda: _events(run, "restart"), 30, "the restart event")
        time.sleep(max(0.0, restart["time"] + 2 + 2.5 - time.time()))
        assert len(_events(run, "launch")) == 2, [(e["world_size"], _hosts_of(e)) for e in _events(run, "launch")]
        t_answers = time.time()
        silent.unlink()  # it answers again
        wait_for(lambda: len(_events(run, "launch")) >= 3, 60, "the grow back onto 127.0.0.1")
        wait_for(lambda: [t for t in _events(run, "throughput") if t["segment"] == 2 and t["world_size"] == 2], 60,
                 "a window at 2 workers after the grow back")
        proc.send_signal(signal.SIGINT)  # (the run's length is not the point: stopped with its checkpoint)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        if victim is not None:
            with contextlib.suppress(OSError):
                os.kill(int(victim["pid"]), signal.SIGKILL)
    assert proc.returncode == 130, err
    assert stalled["ranks"] == [victim["rank"]], stalled  # (here the stopped process is the first evidence)
    launches = _events(run, "launch")
    assert [(e["world_size"], _hosts_of(e)) for e in launches] == [(2, BOTH), (1, ONE), (2, BOTH)]
    assert restart["rank"] == victim["rank"] and restart["node"] == "127.0.0.1" and not restart["gave_up"]
    hc = _events(run, "hosts_changed")
    assert [(h["diff"], h["hosts"]) for h in hc] == [("+localhost:1 +127.0.0.1:1", BOTH), ("-127.0.0.1:1", ONE),
                                                    ("+127.0.0.1:1", BOTH)]
    assert hc[-1]["time"] >= t_answers  # back once it answers, not at the end of its cooldown
    notes = [n["message"] for n in _events(run, "notice")]
    assert any(n.startswith(f"host 127.0.0.1 (rank {victim['rank']}) excluded until ") for n in notes), notes
    assert "host 127.0.0.1 answers again" in notes, notes
    assert "Traceback" not in err


def test_host_probe_errors_are_one_line(tmp_path):
    r = run_cli(*["train", "--gpus", "1", "--steps", "5", *TINY, "--hosts", BOTH, "--host-probe", "no-such-probe-cmd",
                 "--run-dir", str(tmp_path / "a")])
    assert r.returncode == 2 and r.stderr.strip() == (
        "elastic-ring: error: --host-probe: 'no-such-probe-cmd' is not an executable found on PATH or at that path"), r.stderr
    r = run_cli(*["train", "--gpus", "1", "--steps", "5", *TINY, "--host-probe", "true", "--run-dir", str(tmp_path / "b")])
    assert r.returncode == 2 and "--host-probe goes with --hosts or --hostfile" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
