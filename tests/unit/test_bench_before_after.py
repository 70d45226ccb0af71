"""scripts/bench_before_after.py: the summary of alternating rounds (the runs themselves are the
benchmark's, not the tests')."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_before_after as ba  # noqa: E402


def test_the_summary_pairs_each_round_and_takes_medians():
    rounds = [{"before": {"steady images/s": 100.0, "inplace 1->2 lost s": 1.0},
               "after": {"steady images/s": 110.0, "inplace 1->2 lost s": 0.5}},
              {"before": {"steady images/s": 90.0, "inplace 1->2 lost s": 2.0},
               "after": {"steady images/s": 81.0, "inplace 1->2 lost s": 1.0}},
              {"before": {"steady images/s": 120.0, "inplace 1->2 lost s": 1.0},
               "after": {"steady images/s": 120.0, "inplace 1->2 lost s": 3.0}}]
    s = ba.summarise(rounds)
    assert s["steady images/s"]["paired_after_over_before"] == pytest.approx([1.1, 0.9, 1.0])
    assert s["steady images/s"]["median_ratio"] == pytest.approx(1.0)
    assert s["steady images/s"]["median_before"] == 100.0 and s["steady images/s"]["median_after"] == 110.0
    assert s["inplace 1->2 lost s"]["median_ratio"] == pytest.approx(0.5)
    t = ba.table(s)
    assert "| steady images/s | 100.000 | 110.000 | 1.100, 0.900, 1.000 | 1.000 |" in t


def test_unknown_cases_are_refused_in_one_line(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["bench_before_after.py", "--before", "HEAD", "--cases", "steady,warp"])
    with pytest.raises(SystemExit) as e:
        ba.main()
    assert e.value.code == 2 and "unknown case(s) ['warp']" in capsys.readouterr().err
