"""Host discovery in place over several hosts (docs/hosts.md): with `--relaunch inplace` and a
discovery script that lists two hosts (`localhost` and `127.0.0.1`, the two-host tests' way of
having two hosts on one machine), a host dropped from the script's output, drained with
`elastic-ring drain` or whose worker gets a SIGTERM (a preemption's notice) leaves the ring in
place: the other host's worker goes on in its process (one horovodrun, no checkpoint written or
read back), nothing is redone, and the run finishes; a host listed again is grown back onto in place.

Real horovodrun (gloo) runs of the tiny built-in ResNet, the script catting a file the test rewrites
(as tests/integration/test_discovery.py)."""

from __future__ import annotations

import os
from unittest.mock import ANY

import pytest

from elastic_ring import protocol
from tests.conftest import ended, run_cli, wait_for
from tests.integration.test_discovery import TINY, _discovery, _events, _start, _trace, list_hosts
from tests.integration.two_hosts import status_lines, stop_once_grown

pytestmark = pytest.mark.integration

TWO = "localhost:1\n127.0.0.1:1\n"


def _by_host(run) -> dict[str, int]:
    """host -> pid of the worker the ring's first segment started there (its process record)."""
    recs = [protocol.read_json(protocol.pid_dir(run) / f"seg000-rank{r}.json") for r in (0, 1)]
    return {rec["launch_host"]: int(rec["pid"]) for rec in recs if isinstance(rec, dict)}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _two_hosts(tmp_path, steps: int):
    script, listed, _ = _discovery(tmp_path, TWO)
    run = tmp_path / "run"
    proc = _start(["--steps", str(steps), *TINY, "--relaunch", "inplace", "--host-discovery-script", str(script),
                   "--discovery-interval", "0.2", "--run-dir", str(run)])
    return proc, run, listed


def _pids_at_two(run) -> dict[str, int]:
    wait_for(lambda: [t for t in _events(run, "throughput") if t["world_size"] == 2], 120, "a window at 2")
    wait_for(lambda: len(_by_host(run)) == 2, 30, "both workers' records")
    pids = _by_host(run)
    assert set(pids) == {"localhost", "127.0.0.1"}, pids  # one worker on each host
    return pids


def _started(run) -> dict[str, tuple[str, int]]:
    """The workers' process records (a worker process started for a segment writes one; a survivor
    writes none again; the warm joiner's, waiting, is under segment -1): file -> (host, pid)."""
    recs = {f.name: protocol.read_json(f) for f in protocol.pid_dir(run).glob("seg[0-9]*-rank*.json")}
    return {name: (rec["launch_host"], int(rec["pid"])) for name, rec in recs.items() if isinstance(rec, dict)}


def _in_place(run, err, changes, last, widths, restarts: int = 0, killed_at: int | None = None) -> None:
    """One horovodrun for the run, its ring re-formed in place at each change; every step up to
    ``last`` (the run's end: stopped once the events were in, :func:`.two_hosts.stop_once_grown`)
    trained once at the width ``widths`` says for it; ``restarts``: failures taken in memory (else none).
    ``killed_at``: the step a kill -9 was agreed at (the survivors' last step): the killed worker
    took part in its collective but may have died before writing that step's trace line, so that
    one step may show the survivors' samples only."""
    launches = _events(run, "launch")
    assert [(e["world_size"], e["start_step"]) for e in launches] == [
        (2, 1), *[(c["members_after"], c["step"] + 1) for c in changes]]
    assert len({tuple(e["command"]) for e in launches}) == 1 and "--inplace" in launches[0]["command"]
    assert [e["returncode"] for e in _events(run, "workers_exited")] == [0]
    assert len(_events(run, "restart")) == restarts and all(r["path"] == "memory" for r in _events(run, "restart"))
    assert all(o["checkpoint_s"] == 0 for o in _events(run, "resize_overhead"))  # no checkpoint for any
    trained = _trace(run)  # (a step traced twice by a rank is an assertion there)
    assert sorted(trained) == list(range(1, last + 1))  # every step once: nothing redone
    ends = [c["step"] for c in changes] + [last]
    first = 1
    for end, width in zip(ends, widths):
        lost = {killed_at} if killed_at is not None and first <= killed_at <= end else set()
        assert {trained[s] for s in range(first, end + 1) if s not in lost} == {8 * width}, (first, end, width)
        assert all(trained[s] in (8 * width, 8 * (width - 1)) for s in lost), (killed_at, trained[killed_at])
        first = end + 1
    assert "Traceback" not in err


def test_a_host_dropped_from_discovery_leaves_the_ring_in_place_and_grows_back(tmp_path):
    steps = 400  # the grow lands by step ~150 (~80 at load 5); stopped (Ctrl-C) once the grown ring did a step
    proc, run, listed = _two_hosts(tmp_path, steps)
    try:
        pids = _pids_at_two(run)
        before = _started(run)
        list_hosts(listed, "localhost:1\n")  # 127.0.0.1 dropped
        wait_for(lambda: _events(run, "membership_change"), 120, "the shrink")
        assert _alive(pids["localhost"]) and _started(run) == before  # no worker started for it
        wait_for(lambda: not _alive(pids["127.0.0.1"]), 30, "the dropped host's worker to end")
        list_hosts(listed, TWO)  # and back
        wait_for(lambda: len(_events(run, "membership_change")) >= 2, 120, "the grow")
        out, err, end = stop_once_grown(proc, run, world=2, launches=3)
    finally:
        if proc.poll() is None:
            proc.kill()
    changes = _events(run, "membership_change")
    assert [(c["cause"], c["members_before"], c["members_after"], c["state_source"]) for c in changes] == [
        ("hosts", 2, 1, "memory"), ("hosts", 1, 2, "peer")]  # in place: nothing read back
    _in_place(run, err, changes, end, [2, 1, 2])
    assert [(h["hosts"], h["target"]) for h in _events(run, "hosts_changed")] == [
        ("localhost:1,127.0.0.1:1", 2), ("localhost:1", 1), ("localhost:1,127.0.0.1:1", 2)]
    # the grow started one worker, on 127.0.0.1 (its record replaces its rank's); localhost's went on
    assert [hp for hp in _started(run).values() if hp not in before.values()] == [("127.0.0.1", ANY)]


@pytest.mark.parametrize("how", ["drain", "sigterm"])
def test_a_drained_host_leaves_the_ring_in_place_rank_0s_too(tmp_path, how):
    """`elastic-ring drain` of rank 0's host, or a SIGTERM to rank 0's worker (its notice drains its
    host). The run is stopped (Ctrl-C) once the shrunk ring has done a step."""
    import signal

    steps = 400
    proc, run, listed = _two_hosts(tmp_path, steps)
    try:
        pids = _pids_at_two(run)
        # the host of rank 0 (Horovod's driver orders the hosts it starts on)
        gone = protocol.read_json(protocol.pid_dir(run) / "seg000-rank0.json")["launch_host"]
        (stays,) = set(pids) - {gone}
        before = _started(run)
        if how == "drain":
            r = run_cli("drain", str(run), gone, "--deadline", "60")
            assert r.returncode == 0, r.stderr
            assert r.stdout.startswith(f"drain of {gone} requested for {run}"), r.stdout
        else:
            os.kill(pids[gone], signal.SIGTERM)  # how Kubernetes and spot reclaims preempt
        wait_for(lambda: _events(run, "membership_change"), 120, "the shrink")
        assert _alive(pids[stays]) and _started(run) == before  # no worker started for it
        out, err, end = stop_once_grown(proc, run, world=1, launches=2)
    finally:
        if proc.poll() is None:
            proc.kill()
    changes = _events(run, "membership_change")
    cause, why = ("drained", "elastic-ring drain") if how == "drain" else ("preempted", "SIGTERM to rank 0")
    assert [(c["cause"], c["members_before"], c["members_after"], c["state_source"]) for c in changes] == [
        (cause, 2, 1, "memory")]
    _in_place(run, err, changes, end, [2, 1])
    assert not _alive(pids[gone])  # the driver ended the worker on the drained host
    notes = [n["message"] for n in _events(run, "notice")]
    assert (f"drained {gone} ({why}) at step {changes[0]['step']}: 2 -> 1 workers, no step redone"
            in notes), notes
    assert [(h["hosts"], h["target"]) for h in _events(run, "hosts_changed")][-1] == (f"{stays}:1", 1)


def test_a_failed_host_is_left_out_for_its_cooldown_in_place_then_grown_back_onto(tmp_path):
    """kill -9 of the worker on 127.0.0.1: its host is excluded for its cooldown (2 s), the worker
    on localhost goes on in its process from the step it holds in memory (no relaunch, nothing read
    back), and after the cooldown the ring grows back onto 127.0.0.1 in place."""
    import signal

    steps = 600  # the grow back lands ~3 s after the kill (by step ~400 unloaded); stopped (Ctrl-C) once the
    # grown ring did a step
    script, _, _ = _discovery(tmp_path, TWO)
    run = tmp_path / "run"
    proc = _start(["--steps", str(steps), *TINY, "--relaunch", "inplace", "--host-discovery-script", str(script),
                   "--discovery-interval", "0.2", "--blacklist-cooldown-range", "2:4", "--survive",
                   "--run-dir", str(run)])
    try:
        pids = _pids_at_two(run)
        victim = next(protocol.read_json(f) for f in protocol.pid_dir(run).glob("seg000-rank*.json")
                      if protocol.read_json(f)["launch_host"] == "127.0.0.1")
        before = _started(run)
        os.kill(pids["127.0.0.1"], signal.SIGKILL)
        line = wait_for(lambda: next((ln for ln in status_lines(run) if "excluded: 127.0.0.1 until" in ln), None), 30,
                        "status naming the host", poll=0.1)
        assert line.startswith("hosts: localhost:1 (1 slot); excluded: 127.0.0.1 until "), line
        # the survivor goes on in its process (renumbered, it may write its record again); nothing started
        assert _alive(pids["localhost"]) and set(_started(run).values()) == set(before.values())
        wait_for(lambda: len(_events(run, "membership_change")) >= 2, 120, "the grow back onto 127.0.0.1")
        assert _alive(pids["localhost"])
        out, err, end = stop_once_grown(proc, run, world=2, launches=3)
    finally:
        if proc.poll() is None:
            proc.kill()
    (restart,) = _events(run, "restart")
    assert (restart["path"], restart["rank"], restart["node"], restart["gave_up"]) == (
        "memory", victim["rank"], "127.0.0.1", False), restart
    changes = _events(run, "membership_change")
    assert [(c["cause"], c["members_before"], c["members_after"], c["state_source"]) for c in changes] == [
        ("failure", 2, 1, "memory"), ("hosts", 1, 2, "peer")]
    _in_place(run, err, changes, end, [2, 1, 2], restarts=1, killed_at=changes[0]["step"])
    both, one = "localhost:1,127.0.0.1:1", "localhost:1"
    hc = _events(run, "hosts_changed")
    assert [(h["diff"], h["hosts"], h["target"]) for h in hc] == [
        ("+localhost:1 +127.0.0.1:1", both, 2), ("-127.0.0.1:1", one, 1), ("+127.0.0.1:1", both, 2)]
    assert hc[2]["time"] - hc[1]["time"] >= 1.5  # back after its 2 s cooldown, not before
    notes = [n["message"] for n in _events(run, "notice")]
    excluded = [n for n in notes if n.startswith(f"host 127.0.0.1 (rank {victim['rank']}) excluded until ")]
    assert len(excluded) == 1 and excluded[0].endswith("after 1 failure (cooldown 2 s)"), notes
    assert "host 127.0.0.1 back from its cooldown" in notes
    # the grow back started one worker, on 127.0.0.1; localhost's went on in its process throughout
    assert [hp for hp in _started(run).values() if hp not in before.values()] == [("127.0.0.1", ANY)]


def test_a_one_host_start_grows_in_place_on_this_machine_and_says_why_another_is_not_used(tmp_path):
    """Started on `localhost:1` (this host only), the script later lists `127.0.0.1:1` (this machine
    too) and 10.9.9.9 (another machine): the ring grows to 2 in place on this host, and one line
    (a notice and the log) says that 10.9.9.9 is not used, and why. The run is stopped (Ctrl-C)
    once the grown ring has done a step."""
    steps = 400
    script, listed, _ = _discovery(tmp_path, "localhost:1\n")
    run = tmp_path / "run"
    proc = _start(["--steps", str(steps), *TINY, "--relaunch", "inplace", "--host-discovery-script", str(script),
                   "--discovery-interval", "0.2", "--run-dir", str(run)])
    try:
        wait_for(lambda: _events(run, "throughput"), 120, "a window at 1")
        list_hosts(listed, "localhost:1\n127.0.0.1:1\n10.9.9.9:1\n")
        wait_for(lambda: _events(run, "membership_change"), 120, "the grow")
        out, err, end = stop_once_grown(proc, run, world=2, launches=2)
    finally:
        if proc.poll() is None:
            proc.kill()
    changes = _events(run, "membership_change")
    assert [(c["cause"], c["members_before"], c["members_after"], c["state_source"]) for c in changes] == [
        ("hosts", 1, 2, "peer")]
    assert [(h["hosts"], h["target"]) for h in _events(run, "hosts_changed")] == [
        ("localhost:1", 1), ("localhost:2", 2)]
    line = ("discovery script discover.sh lists 10.9.9.9, another machine: not used (this run's ring is in place on "
            "this host only, its first answer listed this host alone; to train over several machines in place, start "
            "with them listed, or use another --relaunch mode); using localhost:2")
    assert [n["message"] for n in _events(run, "notice")].count(line) == 1
    assert err.count(line) == 1 and "host discovery failed" not in err and "Traceback" not in err
    assert len(_events(run, "launch")) == 2 and not _events(run, "restart")  # in place: one horovodrun
    assert sorted(_trace(run)) == list(range(1, end + 1)) and changes[0]["step"] < end <= steps


def _gone_within(pids: list[int], seconds: float) -> bool:
    import time

    t0 = time.time()
    while not all(ended(p) for p in pids) and time.time() - t0 < seconds:
        time.sleep(0.1)
    return all(ended(p) for p in pids)


def test_hvdrun_ends_its_workers_and_exits_when_its_controller_is_killed(tmp_path):
    """Our horovodrun (a session of its own) started by a process it is told is its controller
    (the workers' `--controller-pid`): a kill -9 of that process ends the worker (here one that
    would sleep 300 s and watches nothing) and the launcher within seconds, with one line."""
    import signal
    import subprocess
    import sys

    from tests.conftest import ROOT

    log = tmp_path / "hvdrun.log"
    parent = subprocess.Popen([sys.executable, "-c", f"""
import os, subprocess, sys
cmd = [sys.executable, "-m", "elastic_ring.controller.hvdrun", "-np", "1", "-H", "localhost:1", "--gloo",
       "--network-interface", "lo", sys.executable, "-c",
       "import os, time; print('worker', os.getpid(), flush=True); time.sleep(300)",
       "--controller-pid", str(os.getpid())]
p = subprocess.Popen(cmd, stdout=open({str(log)!r}, "w"), stderr=subprocess.STDOUT, start_new_session=True)
print(p.pid, flush=True)
p.wait()
"""], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        hvdrun = int(parent.stdout.readline())
        worker = int(wait_for(lambda: next((ln.split()[-1] for ln in log.read_text().splitlines()
                                            if "worker " in ln), None), 60, "the worker"))
        assert _alive(worker) and _alive(hvdrun)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        assert _gone_within([hvdrun, worker], 15), log.read_text()[-2000:]
    finally:
        for pid in (locals().get("hvdrun"), locals().get("worker")):
            if pid and _alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert f"elastic-ring hvdrun: its controller (pid {parent.pid}) is gone: ending the job and its workers" \
        in log.read_text()


def test_kill_9_of_the_controller_in_place_over_hosts_leaves_no_hvdrun_and_no_worker(tmp_path):
    """The controller's whole process group killed (as scripts/bench_discovery.py ends a run): the
    horovodrun in its own session notices (its line in the segment's log) and it and the workers
    stop within seconds (once, a Horovod Elastic driver restarting joiners outlived it for an hour)."""
    import signal
    import subprocess
    import sys

    import psutil

    from tests.conftest import BIN, ROOT

    script, _, _ = _discovery(tmp_path, TWO)
    run = tmp_path / "run"
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "elastic_ring.cli.main", "train", "--steps", "5000", *TINY,
                             "--relaunch", "inplace", "--host-discovery-script", str(script), "--discovery-interval",
                             "0.2", "--survive", "--run-dir", str(run)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        pids = _pids_at_two(run)
        def cmdline(p) -> str:  # a child that just exited (a discovery script's run, every 0.2 s) has none
            try:
                return " ".join(p.cmdline())
            except (psutil.ZombieProcess, psutil.NoSuchProcess):
                return ""
        (launcher,) = [p.pid for p in psutil.Process(proc.pid).children() if "elastic_ring.controller.hvdrun" in
                       cmdline(p)]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert _gone_within([launcher, *pids.values()], 20), "an orphaned horovodrun or worker still runs"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    log = (run / "logs" / "segment-000-w2.log").read_text()  # it noticed (the workers may have exited first)
    assert f"elastic-ring hvdrun: its controller (pid {proc.pid}) is gone: ending the job and its workers" in log
