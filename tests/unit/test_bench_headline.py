"""scripts/bench_headline.py: the wording its numbers allow, and the committed report being the
rendering of the committed results file (a figure in the docs is the figure in its file)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import ROOT, load_module

bh = load_module(ROOT / "scripts" / "bench_headline.py")


def _rounds(part, loads, **figs):
    return [{"part": part, "round": i + 1, "load_before": loads[i][0], "load_after": loads[i][1],
             "file": f"results/headline/{part}-round{i + 1}.json",
             "figures": {k: v[i] for k, v in figs.items()}} for i in range(len(loads))]


def test_ratio_claims_follow_the_rounds():
    s = bh.summarise(_rounds("steady", [(0.5, 0.9), (0.8, 1.2), (0.7, 1.0)],
                             **{"w2.ours_over_horovod": [1.1, 1.3, 1.2], "w2.ours_over_ddp": [0.9, 1.1, 1.05]}))
    c = bh.claims(s)
    assert "(quiet)" in c[0] and "load 0.5-1.2" in c[0]
    assert any("plain Horovod per step: 1.20x (rounds 1.10-1.30): faster in every round" in x for x in c)
    assert any("DDP under torchrun" in x and "no winner" in x for x in c)


def test_no_quiet_above_the_load_limit_and_no_winner_when_rounds_overlap():
    s = bh.summarise(_rounds("resize", [(3.8, 4.1), (1.0, 1.2)],
                             **{"ours:inplace.grow_lost_s": [0.5, 1.0], "horovod-elastic.grow_lost_s": [0.8, 1.5],
                                "ours:inplace.shrink_lost_s": [0.1, 0.12],
                                "horovod-elastic.shrink_lost_s": [0.2, 0.3]}))
    c = bh.claims(s)
    assert "not quiet" in c[0] and "(quiet)" not in c[0]
    (grow,) = [x for x in c if x.startswith("grow lost")]
    assert "overlapping rounds: no winner" in grow
    (shrink,) = [x for x in c if x.startswith("shrink lost")]
    assert "ours inplace less in every round" in shrink


def test_the_report_is_the_rendering_of_the_results_file():
    if not bh.OUT.exists():
        pytest.skip("results/bench_headline.json not measured yet")
    data = json.loads(bh.OUT.read_text())
    assert bh.REPORT.read_text() == bh.render(data), "re-render: scripts/bench_headline.py --render"
    assert data["claims"] == bh.claims(data["summary"])
    for part, s in data["summary"].items():  # each round's figure is in its round file as written
        for f in s["files"]:
            assert (ROOT / f).exists(), f
