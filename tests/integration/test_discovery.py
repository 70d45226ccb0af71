"""`train --host-discovery-script`: the job follows the hosts a script lists (docs/hosts.md).

The script cats a file the test rewrites; `localhost` and `127.0.0.1` are the two hosts (the
two-host tests' way of having two hosts on one machine). Real horovodrun runs of a tiny ResNet."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from elastic_ring.events import read_events
from tests.conftest import BIN, ROOT, one_line_error, run_cli, wait_for
from tests.integration.two_hosts import kill_127_then_grown_back, status_lines, stop_once_grown

pytestmark = pytest.mark.integration

TINY = ["--dataset", "synthetic", "--set", "synthetic_size=40", "--depth", "8", "--set", "width=4",
        "--batch-size", "8", "--device", "cpu", "--set", "trace_samples=true", "--set", "throughput_window=5"]


def list_hosts(listed: Path, hosts: str) -> None:
    """Rewrite the discovery script's file in one step (a file rewritten in place can be read
    empty by the script's ``cat``: an answer of no hosts, a shrink to none)."""
    tmp = listed.with_name(listed.name + ".tmp")
    tmp.write_text(hosts)
    os.replace(tmp, listed)


def _discovery(tmp_path: Path, hosts: str) -> tuple[Path, Path, Path]:
    """A discovery script printing ``hosts.txt``, failing (status 3) while ``fail`` exists."""
    listed, fail = tmp_path / "hosts.txt", tmp_path / "fail"
    listed.write_text(hosts)
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\nif [ -e {fail} ]; then echo 'no inventory' >&2; exit 3; fi\ncat {listed}\n")
    script.chmod(0o755)
    return script, listed, fail


def _start(args: list[str]) -> subprocess.Popen:
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "elastic_ring.cli.main", "train", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _events(run: Path, kind: str) -> list[dict]:
    return read_events(run / "events.jsonl", kind=kind)


def _trace(run: Path) -> dict[int, int]:
    """step -> samples trained at it (all ranks), from the workers' sample traces; a step a rank
    traced twice (in any segments) is one redone: an assertion."""
    rows: dict[int, dict[int, int]] = {}
    for f in sorted((run / "trace").glob("seg*-rank*.jsonl")):
        for line in f.read_text().splitlines():
            r = json.loads(line)
            assert r["rank"] not in rows.setdefault(r["step"], {}), f"step {r['step']} redone"
            rows[r["step"]][r["rank"]] = len(r["indices"])
    return {s: sum(v.values()) for s, v in rows.items()}


def test_the_job_grows_onto_a_discovered_host_and_shrinks_off_it(tmp_path):
    steps = 700  # the shrink comes by step ~150 (load 15); stopped (Ctrl-C) once the shrunk ring did a step
    script, listed, fail = _discovery(tmp_path, "localhost:1\n")
    run = tmp_path / "run"
    proc = _start(["--steps", str(steps), *TINY, "--host-discovery-script", str(script),
                   "--discovery-interval", "0.3", "--min-workers", "1", "--max-workers", "2", "--run-dir", str(run)])
    try:
        wait_for(lambda: _events(run, "throughput"), 120, "a window at 1 worker")
        list_hosts(listed, "localhost:1\n127.0.0.1:1\n")  # a host appears
        wait_for(lambda: [t for t in _events(run, "throughput") if t["world_size"] == 2], 120,
                 "a window at 2 workers")
        assert "hosts: localhost:1,127.0.0.1:1 (2 slots)" in run_cli("status", str(run)).stdout.splitlines()
        fail.touch()  # discovery fails: one line, the job goes on on the last hosts
        wait_for(lambda: [n for n in _events(run, "notice") if "host discovery failed" in n["message"]], 60,
                 "the failure's notice")
        list_hosts(listed, "localhost:1\n")  # and answers again, without 127.0.0.1
        fail.unlink()
        wait_for(lambda: len(_events(run, "launch")) >= 3, 120, "the shrink")
        out, err, end = stop_once_grown(proc, run, world=1, launches=3)
    finally:
        if proc.poll() is None:
            proc.kill()
    # the run followed the hosts: 1 on localhost, 2 on both, 1 on localhost, nothing redone
    launches = _events(run, "launch")
    assert [(e["world_size"], e["command"][e["command"].index("-H") + 1]) for e in launches] == [
        (1, "localhost:1"), (2, "localhost:1,127.0.0.1:1"), (1, "localhost:1")]
    changes = _events(run, "membership_change")
    assert [(c["cause"], c["members_before"], c["members_after"], c["state_source"]) for c in changes] == [
        ("hosts", 1, 2, "checkpoint"), ("hosts", 2, 1, "checkpoint")]
    assert [e["start_step"] for e in launches[1:]] == [c["step"] + 1 for c in changes]
    assert [(h["diff"], h["hosts"], h["target"]) for h in _events(run, "hosts_changed")] == [
        ("+localhost:1", "localhost:1", 1), ("+127.0.0.1:1", "localhost:1,127.0.0.1:1", 2),
        ("-127.0.0.1:1", "localhost:1", 1)]
    trained = _trace(run)
    assert sorted(trained) == list(range(1, end + 1))  # every step once
    grow, shrink = changes[0]["step"], changes[1]["step"]
    assert 0 < grow < shrink < end <= steps
    assert {trained[s] for s in range(grow + 1, shrink + 1)} == {16} and trained[1] == trained[end] == 8
    # the failing script: one line, said once, and no change of members for it
    failed = [ln for ln in err.splitlines() if "host discovery failed" in ln]
    assert failed == ["host discovery failed: discovery script discover.sh exited with status 3: no inventory; "
                      f"keeping the last hosts (localhost:1,127.0.0.1:1, from {failed[0].split('from ')[1]}"], err
    assert "Traceback" not in err
    assert "host discovery answers again" in err
    assert "hosts at step" in out and "2 -> 1 workers, from checkpoint" in out  # the summary's changes


def _history(run: Path) -> tuple[dict[int, int], set[int]]:
    """step -> samples trained at it (all ranks) by the last segment that trained it, and the steps
    trained by more than one segment (redone after a restart from the checkpoint)."""
    rows: dict[int, dict[int, dict[int, int]]] = {}  # step -> segment -> rank -> samples
    for f in sorted((run / "trace").glob("seg*-rank*.jsonl")):
        segment = int(f.name[3:6])  # seg001-rank0.jsonl
        for line in f.read_text().splitlines():
            r = json.loads(line)
            seg = rows.setdefault(r["step"], {}).setdefault(segment, {})
            assert r["rank"] not in seg, f"step {r['step']} traced twice by rank {r['rank']} in one segment"
            seg[r["rank"]] = len(r["indices"])
    return ({s: sum(v[max(v)].values()) for s, v in rows.items()}, {s for s, v in rows.items() if len(v) > 1})


def test_a_failed_host_is_left_out_for_its_cooldown_then_grown_back_onto(tmp_path):
    steps = 700  # the grow back lands at most ~1.5 s of 1-worker steps after the relaunch (2 s cooldown);
    # the run is stopped (Ctrl-C) once the grown ring has done a step
    script, _, _ = _discovery(tmp_path, "localhost:1\n127.0.0.1:1\n")
    run = tmp_path / "cool"
    proc = _start(["--steps", str(steps), *TINY, "--host-discovery-script", str(script),
                   "--discovery-interval", "0.3", "--blacklist-cooldown-range", "2:4", "--run-dir", str(run)])
    victim, out, err, end = kill_127_then_grown_back(proc, run)  # status names 127.0.0.1 excluded meanwhile
    both, one = "localhost:1,127.0.0.1:1", "localhost:1"
    launches = _events(run, "launch")
    assert [(e["world_size"], e["command"][e["command"].index("-H") + 1]) for e in launches] == [
        (2, both), (1, one), (2, both)]
    (restart,) = _events(run, "restart")
    assert restart["rank"] == victim["rank"] and restart["node"] == "127.0.0.1" and not restart["gave_up"]
    changes = _events(run, "membership_change")
    assert [(c["cause"], c["members_before"], c["members_after"]) for c in changes] == [
        ("failure", 2, 2), ("hosts", 2, 1), ("hosts", 1, 2)]
    hc = _events(run, "hosts_changed")
    assert [(h["diff"], h["hosts"], h["target"]) for h in hc] == [
        ("+localhost:1 +127.0.0.1:1", both, 2), ("-127.0.0.1:1", one, 1), ("+127.0.0.1:1", both, 2)]
    assert hc[2]["time"] - hc[1]["time"] >= 1.5  # back after its 2 s cooldown (the poll's time, not before)
    notes = [n["message"] for n in _events(run, "notice")]
    assert any(n.startswith(f"host 127.0.0.1 (rank {victim['rank']}) excluded until ")
               and n.endswith("after 1 failure (cooldown 2 s)") for n in notes), notes
    assert "host 127.0.0.1 back from its cooldown" in notes
    # every step up to the end trained, the last time by one segment; only the steps after the
    # restart's checkpoint up to the failure were trained twice, and at 2 workers after the grow back
    trained, redone = _history(run)
    assert sorted(trained) == list(range(1, end + 1))
    assert all(restart["from_step"] < s <= restart["failed_at_step"] + 1 for s in redone), (redone, restart)
    grow = changes[2]["step"]
    assert launches[2]["start_step"] == grow + 1 and 0 < grow < end <= steps
    assert {trained[s] for s in range(grow + 1, end + 1)} == {16}
    assert {trained[s] for s in range(restart["from_step"] + 1, grow + 1)} == {8}
    assert "Traceback" not in err


def test_below_the_minimum_it_waits_gives_up_then_resumes_on_the_hosts_discovered(tmp_path):
    script, listed, _ = _discovery(tmp_path, "localhost:1\n")
    run = tmp_path / "wait"
    proc = _start(["--steps", "20", *TINY, "--host-discovery-script", str(script), "--discovery-interval", "0.2",
                   "--min-workers", "2", "--min-wait", "4", "--run-dir", str(run)])
    try:  # past "starting" (the controller's first poll of the discovery), within the 4 s it waits
        line = wait_for(lambda: next((ln for ln in status_lines(run)
                                      if ln.startswith("state:") and not ln.startswith("state: starting")), None),
                        60, "status past starting", poll=0.1)
        assert "waiting for hosts (have 1, need 2)" in line, line
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
    assert proc.returncode == 130, err
    assert "gave up waiting for hosts after 4 s (have 1, need 2)" in err and "Traceback" not in err
    assert not _events(run, "launch")  # no worker was started
    # --resume keeps the discovery options (run.json): the second host is there now, it runs at 2
    list_hosts(listed, "localhost:1\n127.0.0.1:1\n")
    r = run_cli("train", "--resume", str(run), timeout=240)
    assert r.returncode == 0, r.stderr
    (launch,) = _events(run, "launch")
    assert launch["world_size"] == 2
    assert launch["command"][launch["command"].index("-H") + 1] == "localhost:1,127.0.0.1:1"
    assert _events(run, "finished")[-1]["step"] == 20


@pytest.mark.parametrize("extra, needle", [
    (["--hosts", "localhost:1"], "--host-discovery-script does not go with --hosts/--hostfile"),
    (["--backend", "ray"], "--host-discovery-script does not go with --backend ray"),
    (["--min-workers", "3", "--max-workers", "2"], "--max-workers 2 is below --min-workers 3"),
    (["--blacklist-cooldown-range", "5:1"], "--blacklist-cooldown-range: the cooldown range needs 0 < LOW <= HIGH"),
])
def test_what_cannot_go_with_discovery_is_one_line(tmp_path, cli_inproc, extra, needle):
    script, _, _ = _discovery(tmp_path, "localhost:1\n")
    r = cli_inproc("train", "--steps", "2", *TINY, "--host-discovery-script", str(script), *extra,
                   "--run-dir", str(tmp_path / "r"))
    one_line_error(r, needle)
    assert not (tmp_path / "r").exists()


def test_bounds_without_a_discovery_script_and_a_missing_script_are_one_line(tmp_path, cli_inproc):
    one_line_error(cli_inproc("train", "--steps", "2", *TINY, "--min-workers", "2"),
                   "--min-workers goes with --host-discovery-script")
    one_line_error(cli_inproc("train", "--steps", "2", *TINY, "--host-discovery-script", str(tmp_path / "nope"),
                              "--run-dir", str(tmp_path / "r")),
                   f"--host-discovery-script {tmp_path / 'nope'} does not exist")
