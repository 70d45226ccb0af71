"""scripts/suite_cpu.py: a process's test folder, and the CPU summed per folder and kind."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.conftest import ROOT, load_module

sc = load_module(ROOT / "scripts" / "suite_cpu.py")


def test_a_process_is_told_by_its_working_folder_or_an_open_file():
    # (not under tmp_path: under pytest-xdist that is itself in a popen-gwN folder)
    with tempfile.TemporaryDirectory(dir="/tmp") as top:
        _told_apart(Path(top) / "popen-gw1")


def _told_apart(gw: Path) -> None:
    (gw / "test_by_cwd0").mkdir(parents=True)
    (gw / "test_by_file0" / "logs").mkdir(parents=True)
    by_cwd = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], cwd=gw / "test_by_cwd0")
    log = gw / "test_by_file0" / "logs" / "rank0.log"
    by_file = subprocess.Popen([sys.executable, "-c", f"f = open({str(log)!r}, 'w'); import time; time.sleep(30)"],
                               cwd="/")
    elsewhere = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], cwd="/")
    try:
        deadline = time.time() + 20  # (the file exists a moment before its descriptor is the process's)
        while sc._where(str(by_file.pid)) == "" and time.time() < deadline:
            time.sleep(0.05)
        assert sc._where(str(by_cwd.pid)) == "test_by_cwd0"
        assert sc._where(str(by_file.pid)) == "test_by_file0"
        assert sc._where(str(elsewhere.pid)) == ""
    finally:
        for p in (by_cwd, by_file, elsewhere):
            p.kill()
            p.wait()
    assert sc._where(str(by_cwd.pid)) == ""  # gone: no folder, no error


def test_folders_are_summed_by_kind_and_a_process_with_none_counts_under_its_test():
    procs = {
        "1": {"cmd": "python -u -m elastic_ring.worker.run --zygote abc", "cpu": 2.0, "test": "t.py::test_a (call)",
              "where": "test_b0"},  # forked by a zygote that test_a started, working for test_b
        "2": {"cmd": "python -m elastic_ring.cli.main train --steps 5", "cpu": 0.5, "test": "t.py::test_b (call)",
              "where": "test_b0"},
        "3": {"cmd": "python -c import sys", "cpu": 1.0, "test": "t.py::test_c (call)", "where": ""},
        "4": {"cmd": "ray::WorkerActor", "cpu": 0.3, "test": "t.py::test_a (setup)", "where": "ray"},
        "5": {"cmd": "python -m elastic_ring.controller.hvdrun -np 2 python -u -m elastic_ring.worker.run --run-dir r",
              "cpu": 0.25, "test": "t.py::test_b (call)", "where": "test_b0"},
        "6": {"cmd": "python -u -m elastic_ring.worker.run --run-dir r --segment 0", "cpu": 0.05,
              "test": "t.py::test_b (call)", "where": "test_b0"},
    }
    rows = sc.by_folder(procs, 10)
    assert [(r["folder"], r["processes"], r["cpu_s"]) for r in rows] == [
        ("test_b0", 4, 2.8), ("test_c", 1, 1.0), ("ray", 1, 0.3)]
    assert rows[0]["by_kind"] == {"zygote (and its forked workers)": 2.0, "train controller": 0.5,
                                  "launchers (hvdrun, horovodrun, their middlemen)": 0.2, "worker command": 0.1}
    assert rows[2]["by_kind"] == {"Ray worker": 0.3}
    assert [r["folder"] for r in sc.by_folder(procs, 1)] == ["test_b0"]


def test_a_file_it_cannot_read_is_one_line_and_exit_status_2(tmp_path):
    cut = tmp_path / "procs.json"
    cut.write_text('{"1": {"cmd"')  # (a sample cut short)
    tests = tmp_path / "tests.jsonl"
    tests.write_text("")
    for procs in (tmp_path / "missing.json", cut):
        r = subprocess.run([sys.executable, str(ROOT / "scripts" / "suite_cpu.py"), "summary", str(procs), str(tests)],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and r.stdout == "", r.stderr
        (line,) = r.stderr.splitlines()
        assert line.startswith(f"suite_cpu: error: cannot read {procs} and {tests}"), line


def test_a_process_is_sampled_under_its_pid_and_start_time(tmp_path):
    """``sample`` keeps a process under its pid and its start time (/proc stat's field 22), so a
    pid used again later in a long run is a record of its own, not the earlier one's overwritten;
    a process without the suite's mark is not kept."""
    import json
    import os
    import threading

    out = tmp_path / "procs.json"
    t = threading.Thread(target=sc.sample, args=(str(out),), daemon=True)
    t.start()
    code = "import time\nwhile time.process_time() < 0.3: pass\ntime.sleep(3)"  # its CPU spent, then seen
    try:
        marked = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ, ERT_SUITE="1"))
        other = subprocess.Popen([sys.executable, "-c", code],
                                 env={k: v for k, v in os.environ.items() if k != "ERT_SUITE"})
        start = open(f"/proc/{marked.pid}/stat").read().rsplit(")", 1)[1].split()[19]
        marked.wait(timeout=120)
        other.wait(timeout=120)
    finally:
        (tmp_path / "procs.json.stop").touch()
    t.join(timeout=120)
    procs = json.loads(out.read_text())
    mine = {k: v for k, v in procs.items() if k.split(":")[0] in (str(marked.pid), str(other.pid))}
    assert list(mine) == [f"{marked.pid}:{start}"], procs.keys()
    assert mine[f"{marked.pid}:{start}"]["cpu"] >= 0.2 and "process_time" in mine[f"{marked.pid}:{start}"]["cmd"]
