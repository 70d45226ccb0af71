"""scripts/suite_timeline.py: a real pytest run timed per test and worker, and the summary's sums."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "suite_timeline.py"
sys.path.insert(0, str(ROOT / "scripts"))
import suite_timeline  # noqa: E402


def _stat(t: float, busy_ticks: int, idle_ticks: int, load: float = 1.0) -> str:
    # /proc/stat's first line: user nice system idle iowait irq softirq steal guest guest_nice
    return f"{t:.3f} cpu {busy_ticks} 0 0 {idle_ticks} 0 0 0 0 0 0 {load}\n"


def test_the_idle_of_each_second_is_split_among_the_tests_running_in_it(tmp_path):
    tick = os.sysconf("SC_CLK_TCK")
    (tmp_path / "machine.json").write_text(json.dumps({"cores": 2}))
    # three seconds: 1 core-s idle in the first (tests a and b running), 2 in the second (b alone),
    # none in the third (nothing running after b's end counts as no test)
    (tmp_path / "stat.txt").write_text(
        _stat(100, 0, 0) + _stat(101, tick, tick) + _stat(102, tick, 3 * tick) + _stat(103, 3 * tick, 3 * tick))
    (tmp_path / "tests-gw0.jsonl").write_text("".join(json.dumps(e) + "\n" for e in [
        {"id": "tests/unit/test_x.py::a", "ev": "start", "t": 100.2},
        {"id": "tests/unit/test_x.py::a", "ev": "end", "t": 100.9}]))
    (tmp_path / "tests-gw1.jsonl").write_text("".join(json.dumps(e) + "\n" for e in [
        {"id": "tests/integration/test_y.py::b", "ev": "start", "t": 100.5},
        {"id": "tests/integration/test_y.py::b", "ev": "end", "t": 101.8}]))
    res = suite_timeline.summary(tmp_path, top=5)
    assert res["cores"] == 2 and res["busy_cpu_s"] == 3.0 and res["span_s"] == 3.0
    assert res["busy_share"] == 0.5 and res["idle_core_s"] == 3.0
    assert res["first_test_after_s"] == 0.2
    idle = {r["test"]: r["idle_core_s"] for r in res["idle_by_test"]}
    assert idle == {"tests/integration/test_y.py::b": 2.5, "tests/unit/test_x.py::a": 0.5}
    gw1 = res["processes"]["gw1"]
    assert gw1["tests"] == 1 and gw1["last_end_s"] == 1.8
    assert gw1["durations_s"] == {"integration": {"tests": 1, "sum_s": 1.3}}


def test_a_real_run_is_timed_per_worker_and_a_bad_folder_is_one_line(tmp_path):
    tests = tmp_path / "t"
    tests.mkdir()
    (tests / "test_two.py").write_text(
        "import time\n\ndef test_sleeps():\n    time.sleep(0.3)\n\ndef test_quick():\n    pass\n")
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, str(SCRIPT), "run", str(out), "--", "-n", "2", "-p", "no:cacheprovider",
                        str(tests)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout, r.stderr, (out / "suite.log").read_text())
    assert "2 passed" in (out / "suite.log").read_text()
    # one file per xdist worker, none from the controller that only relays their reports
    files = sorted(p.name for p in out.glob("tests-*.jsonl"))
    assert files and all(f.startswith("tests-gw") for f in files), files
    res = suite_timeline.summary(out)
    assert sum(p["tests"] for p in res["processes"].values()) == 2
    assert res["span_s"] > 0.3 and 0 < res["busy_share"] <= 1
    ran = res["pytest"]["suite.log"]
    assert ran["result"].startswith("2 passed") and 0.3 < ran["seconds"] < res["span_s"] + 1
    took = [json.loads(ln) for f in out.glob("tests-*.jsonl") for ln in f.read_text().splitlines()]
    start = {e["id"]: e["t"] for e in took if e["ev"] == "start"}
    end = {e["id"]: e["t"] for e in took if e["ev"] == "end"}
    sleeps = next(k for k in start if k.endswith("test_sleeps"))
    assert end[sleeps] - start[sleeps] >= 0.3

    bad = subprocess.run([sys.executable, str(SCRIPT), "summary", str(tmp_path / "nowhere")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.count("\n") == 1 and "cannot read" in bad.stderr


if __name__ == "__main__":
    pytest.main([__file__])
