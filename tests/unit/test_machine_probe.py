"""scripts/machine_probe.py: a fixed piece of work timed, appended to a results file; its bad input."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys

from tests.conftest import ROOT, load_module

mp = load_module(ROOT / "scripts" / "machine_probe.py")
SCRIPT = str(ROOT / "scripts" / "machine_probe.py")


def test_the_stolen_share_is_the_steal_ticks_over_all_ticks_between_two_readings():
    before = [100, 0, 50, 800, 0, 0, 0, 10, 0, 0]
    after = [160, 0, 70, 900, 0, 0, 0, 30, 0, 0]  # 60 + 20 + 100 + 20 ticks, 20 of them stolen
    assert mp.steal_share(before, after) == 20 / 200
    assert mp.steal_share(None, after) is None and mp.steal_share(before, before) is None
    assert mp.steal_share([1, 2, 3], [4, 5, 6]) is None  # a /proc/stat without the steal column


def test_each_run_appends_its_repeats_and_their_median(tmp_path, monkeypatch, capsys):
    import torch

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))  # (benchlib, as when the script runs)
    out, threads = tmp_path / "probe.json", torch.get_num_threads()
    for label in ("before", "after"):
        assert mp.main(["--steps", "3", "--repeats", "3", "--label", label, "--out", str(out)]) == 0
        said = capsys.readouterr().out
        assert said.startswith("tiny step: ") and " ms of CPU (median of 3: " in said
    assert torch.get_num_threads() == threads  # the caller's threads put back
    runs = json.loads(out.read_text())
    assert [r["label"] for r in runs] == ["before", "after"]
    for r in runs:
        cpu = [x["cpu_ms_per_step"] for x in r["repeats"]]
        assert len(cpu) == 3 and all(c > 0 for c in cpu) and all(x["wall_ms_per_step"] > 0 for x in r["repeats"])
        assert r["median_cpu_ms_per_step"] == round(statistics.median(cpu), 4) and r["steps"] == 3
        assert r["steal_share"] is None or 0 <= r["steal_share"] <= 1


def test_no_steps_is_one_line_and_exit_2(tmp_path):
    p = subprocess.run([sys.executable, SCRIPT, "--repeats", "0", "--out", str(tmp_path / "x.json")],
                       capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().splitlines() == ["machine_probe.py: --steps and --repeats must be at least 1, got 300 and 0"]
    assert not (tmp_path / "x.json").exists()
