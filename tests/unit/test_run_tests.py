"""scripts/run_tests.py, make test's runner: pytest's summary read back, and real runs of both lanes
on two small test folders (the unit lane at its lower priority, after the integration lane in the
output; a failure in either kept and named; bad options one line, exit 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, load_module

rt = load_module(ROOT / "scripts" / "run_tests.py")


def test_summary_reads_pytests_last_line_and_words_the_counts_as_pytest_does():
    text = "....\n===== 2 failed, 170 passed, 1 skipped, 3 warnings, 1 error in 577.20s (0:09:37) =====\n"
    counts, sec = rt.summary("noise in 1.0s\n" + text)
    assert counts == {"failed": 2, "passed": 170, "skipped": 1, "warning": 3, "error": 1} and sec == 577.2
    assert rt.summary("1675 passed, 4 skipped, 16 warnings in 151.90s (0:02:31)\nrc=0\n") == (
        {"passed": 1675, "skipped": 4, "warning": 16}, 151.9)
    assert rt.summary("collecting ... interrupted\n") == ({}, None)
    assert rt.counts_text({"warning": 16, "skipped": 5, "passed": 1846, "failed": 1}) == (
        "1 failed, 1846 passed, 5 skipped, 16 warnings")
    assert rt.counts_text({"warning": 1, "error": 2}) == "2 errors, 1 warning"
    assert rt.counts_text({}) == "no result"


def _lanes(tmp_path: Path, unit_body: str) -> tuple[Path, Path]:
    unit, integ = tmp_path / "u", tmp_path / "i"
    unit.mkdir()
    integ.mkdir()
    (unit / "test_u.py").write_text(
        "import os\n"
        "def test_nice():\n"
        f"    open({str(tmp_path / 'nice.txt')!r}, 'w').write(str(os.nice(0)))\n"
        f"def test_other():\n    {unit_body}\n")
    (integ / "test_i.py").write_text("def test_a():\n    pass\n\ndef test_b():\n    pass\n")
    return unit, integ


def _run(tmp_path: Path, unit: Path, integ: Path, *more: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "run_tests.py"), "--unit", str(unit),
                           "--integration", str(integ), "--basetemp", str(tmp_path / "bt"), "--durations", "0",
                           *more], capture_output=True, text=True, timeout=120)


def test_both_lanes_pass_the_unit_lane_at_its_niceness_after_the_integration_output(tmp_path):
    unit, integ = _lanes(tmp_path, "assert 1 + 1 == 2")
    p = _run(tmp_path, unit, integ, "--unit-nice", "7")
    assert p.returncode == 0, p.stdout + p.stderr
    assert int((tmp_path / "nice.txt").read_text()) == min(19, os.nice(0) + 7)  # (19 the lowest)
    out = p.stdout
    i_end, u_start = out.index("2 passed"), out.index("---- the unit tests")
    assert i_end < u_start and "2 passed" in out[u_start:]
    last = out.strip().splitlines()[-1]
    assert last.startswith("make test: passed: 4 passed in ") and "on 2 workers, exit 0" in last, last
    assert "at nice 7, exit 0" in last
    assert not (tmp_path / "bt").exists()  # removed when both pass


def test_the_integration_lanes_folder_leaves_the_ray_tests_room(monkeypatch):
    """Each lane's temporary folder under the default one: the Ray tests' cluster folder
    (``<lane>/popen-gwN/ray``) within tests/integration/ray_cluster.py's 40 characters."""
    seen, made = [], []
    mkdtemp = rt.tempfile.mkdtemp
    monkeypatch.setattr(rt.tempfile, "mkdtemp", lambda **kw: made.append(mkdtemp(**kw)) or made[-1])
    monkeypatch.setattr(rt, "_streamed", lambda cmd: (seen.append(cmd), (0, "1 passed in 1.00s"))[1])
    monkeypatch.setattr(rt.subprocess, "Popen", lambda cmd, **kw: seen.append(cmd) or _Done())
    try:
        assert rt.main([]) == 0
    finally:
        for folder in made:
            rt.shutil.rmtree(folder, ignore_errors=True)
    lanes = [a.split("=", 1)[1] for cmd in seen for a in cmd if a.startswith("--basetemp=")]
    assert len(lanes) == 2 and all(len(f"{lane}/popen-gw1/ray") <= 40 for lane in lanes), lanes
    assert made and not Path(made[0]).exists()  # (removed by main: both lanes passed)


class _Done:
    def poll(self):
        return 0

    def wait(self, timeout=None):
        return 0


def test_a_failed_unit_test_fails_the_run_and_keeps_the_files(tmp_path):
    unit, integ = _lanes(tmp_path, "assert 1 + 1 == 3")
    p = _run(tmp_path, unit, integ)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "assert (1 + 1) == 3" in p.stdout or "assert 2 == 3" in p.stdout
    lines = p.stdout.strip().splitlines()
    assert lines[-2].startswith("make test: FAILED: 1 failed, 3 passed in ") and "nice 10, exit 1" in lines[-2]
    assert lines[-1] == f"make test: failed; the tests' files are kept in {tmp_path / 'bt'}"
    assert (tmp_path / "bt" / "unit.log").exists()


def test_bad_options_are_one_line_and_exit_2(tmp_path):
    for args, msg in ((["--unit-nice", "25"], "--unit-nice must be 0-19, got 25"),
                      (["--workers", "0"], "--workers must be at least 1, got 0"),
                      (["--unit", str(tmp_path / "none")], f"no test folder {tmp_path / 'none'}")):
        p = subprocess.run([sys.executable, str(ROOT / "scripts" / "run_tests.py"), *args],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and p.stderr == f"run_tests.py: {msg}\n" and p.stdout == "", (args, p.stderr)


bench = load_module(ROOT / "scripts" / "bench_test_lanes.py")


def test_the_benchmark_reads_the_runners_last_line_and_pairs_its_runs(tmp_path):
    text = "...\nmake test: passed: 1846 passed, 5 skipped in 577.71 s of tests (integration lane ...)\n"
    assert bench.parse_last(text) == ("passed", "1846 passed, 5 skipped", 577.71)
    assert bench.parse_last("make test: failed; the tests' files are kept in /tmp/x\n") is None
    runs = [{"mode": "one_lane", "tests_s": 700.0}, {"mode": "two_lanes", "tests_s": 630.0},
            {"mode": "two_lanes", "tests_s": 560.0}, {"mode": "one_lane", "tests_s": 640.0},
            {"mode": "one_lane", "tests_s": None}]
    s = bench.summarize(runs)
    assert s["one_lane"] == {"runs": 2, "median_s": 670.0, "min_s": 640.0, "max_s": 700.0}
    assert s["two_lanes"]["median_s"] == 595.0
    assert s["pair_ratios_two_over_one"] == [0.9, 0.875] and s["median_ratio"] == 0.887
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    for args, msg in ((["--pairs", "0"], "--pairs must be at least 1, got 0"),
                      (["--out", str(bad)], f"{bad} is not a JSON list")):
        p = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_test_lanes.py"), *args],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and p.stderr == f"bench_test_lanes.py: {msg}\n", p.stderr
