"""The Table I experiment without processes: padding, pairing, paired bootstrap ratios, verdicts,
and the whole report built from synthetic runs through a fake job launcher."""

from __future__ import annotations

import math

import numpy as np
import pytest

from elastic_ring.events.api import EventLog
from elastic_ring.experiment import ps_design, ps_stats, ps_sync as ex
from elastic_ring.ps.api import PSConfig
from elastic_ring.ps.events import PSAccuracy, PSFinished, PSLaunch, PSPush, PSWorkerSummary
from elastic_ring.ps.worker import step_plan

# ------------------------------------------------------------------------------------ padding


def test_padding_makes_the_step_its_target_whatever_the_compute():
    cfg = PSConfig(base_step_s=0.1, noise=0.1, workers=2, slowdown=(1.0, 2.0))
    targets = {}
    for compute in (0.001, 0.02, 0.05):  # an idle and a loaded machine
        rng = np.random.default_rng(7)
        plans = [step_plan(compute, cfg, 2.0, rng) for _ in range(50)]
        assert all(not over and dur == pytest.approx(tgt) for dur, tgt, over in plans)
        targets[compute] = [t for _, t, _ in plans]
    # the same seeded draws whatever the load: paired runs get the same step lengths
    assert targets[0.001] == targets[0.02] == targets[0.05]
    assert np.mean(targets[0.02]) == pytest.approx(0.2, rel=0.05) and np.std(targets[0.02]) > 0.01


def test_a_compute_longer_than_its_target_is_an_overrun():
    cfg = PSConfig(base_step_s=0.1, workers=1)
    dur, tgt, over = step_plan(0.3, cfg, 1.0, np.random.default_rng(0))
    assert over and tgt == 0.1 and dur == 0.3
    dur, tgt, over = step_plan(0.3, PSConfig(workers=1), 1.0, np.random.default_rng(0))
    assert not over and tgt == 0.0 and dur == 0.3  # no base step: nothing to overrun


# ---------------------------------------------------------------------------------- statistics


def test_bootstrap_ci_brackets_the_geometric_mean_and_narrows_with_agreement():
    g, lo, hi = ps_stats.bootstrap_ci(np.log([0.5] * 10))
    assert g == pytest.approx(0.5) and lo == pytest.approx(0.5) and hi == pytest.approx(0.5)
    rng = np.random.default_rng(1)
    wide = np.log(0.7) + 0.5 * rng.standard_normal(10)
    narrow = np.log(0.7) + 0.05 * rng.standard_normal(10)
    gw, lw, hw = ps_stats.bootstrap_ci(wide)
    gn, ln, hn = ps_stats.bootstrap_ci(narrow)
    assert lw < gw < hw and ln < gn < hn
    assert hn - ln < (hw - lw) / 4
    assert hn < 1  # ten seeds agreeing on 0.7 +- 5 %: faster, significantly
    assert ps_stats.bootstrap_ci(wide, seed=3) == ps_stats.bootstrap_ci(wide, seed=3)


def test_pairing_removes_the_seed_to_seed_spread():
    # the seeds differ by a factor of 8 (as a loaded machine would), but X is always half of R
    ref = [10.0, 80.0, 20.0, 40.0, 15.0, 60.0, 30.0, 12.0, 70.0, 25.0]
    rng = np.random.default_rng(2)
    x = [r * 0.5 * math.exp(0.05 * rng.standard_normal()) for r in ref]
    r = ps_stats.paired_ratio(x, ref, 100, 100)
    assert r["n"] == 10 and r["censored"] == 0
    assert 0.45 < r["lo"] < 0.5 < r["hi"] < 0.55
    # the pairing is what narrows it: the same numbers paired with the wrong seeds (shifted by
    # one) give the same geometric mean but an interval over 10 times as wide
    wrong = ps_stats.paired_ratio(x, ref[1:] + ref[:1], 100, 100)
    assert wrong["geomean"] == pytest.approx(r["geomean"])
    assert wrong["hi"] - wrong["lo"] > 10 * (r["hi"] - r["lo"])


def test_censored_runs_count_as_their_budget_and_double_misses_drop():
    r = ps_stats.paired_ratio([5.0, None, None, 8.0], [10.0, 20.0, None, None], budget_x=40, budget_ref=50)
    assert r["n"] == 3 and r["censored"] == 2
    assert r["per_seed"] == [0.5, 2.0, None, 8.0 / 50]


@pytest.mark.parametrize("lo,hi,paper,expect", [
    (0.4, 0.7, 0.53, "reproduce"),      # the paper: faster; ours: faster, whole CI below 0.8
    (0.7, 0.95, 0.53, "cannot tell"),   # straddles the 0.8 edge of "faster"
    (0.9, 1.1, 0.53, "contradict"),     # about as fast where the paper says twice as fast
    (0.9, 1.1, 1.01, "reproduce"),      # "about as fast" reproduced
    (0.5, 0.7, 1.01, "contradict"),     # ... contradicted
    (0.6, 1.0, 1.01, "cannot tell"),
    (1.5, 2.5, 1.9, "reproduce"),       # "slower"
    (math.nan, math.nan, 0.53, "cannot tell"),
])
def test_verdict(lo, hi, paper, expect):
    assert ps_stats.verdict(lo, hi, paper, 1.25) == expect


# ------------------------------------------------------------------------------- whole report


DESIGN = """
out: {out}
seeds: [0, 1, 2, 3, 4, 5]
targets: [0.8]
references: ["SSP s=3", ASP]
bootstrap: 500
base: {{workers: 2, base_step_s: 0.1, eval_deferred: true, eval_every_s: 0.5, time_budget_s: 20}}
heterogeneity:
  - {{name: "1:2", slowdown: [1, 2]}}
paradigms:
  - {{name: ASP, sync: asp}}
  - {{name: "SSP s=3", sync: ssp, staleness: 3}}
  - {{name: "DSSP [3,15]", sync: dssp, staleness: "3:15"}}
  - {{name: BSP, sync: bsp}}
"""

# seconds to 0.8 per paradigm in the fake runs, times a seed factor: ASP and DSSP at half of SSP;
# BSP never gets there
SPEED = {"asp": 0.5, "ssp": 1.0, "dssp": 0.52, "bsp": None}


def fake_run_job(cfg: PSConfig, run_dir):
    seed_factor = 4.0 + 3.0 * math.sin(cfg.seed)  # seeds differ by up to 7x
    rel = SPEED[cfg.sync]
    t_hit = None if rel is None else rel * seed_factor * (1 + 0.02 * ((cfg.seed * 7) % 3))
    log = EventLog(run_dir / "events.jsonl")
    pol = cfg.policy
    log.write(PSLaunch(sync=cfg.sync, label=pol.label(), lower=pol.lower, upper=pol.upper, controller=pol.controller,
                       workers=2, slowdown=list(cfg.slowdowns), config=cfg.to_dict(), parameters=1000))
    for i in range(40):
        log.write(PSPush(t=0.25 * i, worker=1 + i % 2, push=i // 2 + 1, t_min=i // 2, gap=1, action="ok_within",
                         allowance_left=0, version_pulled=i, version_applied=i, staleness=0, loss=1.0,
                         compute_s=0.02, sleep_s=0.08, target_s=0.1))
    for t in np.round(np.arange(0, cfg.time_budget_s, 0.1), 3):
        acc = 0.9 if t_hit is not None and t >= t_hit else 0.5
        log.write(PSAccuracy(t=float(t), version=int(10 * t), test_accuracy=acc, test_loss=1.0,
                             pushes={"1": 1, "2": 1}, eval_s=0.01))
    for w in (1, 2):
        log.write(PSWorkerSummary(worker=w, slowdown=cfg.slowdowns[w - 1], pushes=20, compute_s=0.4, sleep_s=1.6,
                                  blocked_s=1.0, held_s=0.8, wall_s=cfg.time_budget_s, max_staleness=1,
                                  mean_staleness=0.5, overruns=0, max_compute_s=0.02))
    log.write(PSFinished(reason="time_budget", wall_s=cfg.time_budget_s, version=40, pushes={"1": 20, "2": 20},
                         max_release_gap=1, max_push_gap=1, max_staleness=1, release_bound=None,
                         test_accuracy=0.9, best_accuracy=0.9))


def test_report_from_fake_runs(tmp_path):
    path = tmp_path / "design.yaml"
    path.write_text(DESIGN.format(out=tmp_path / "out"))
    design = ps_design.load_design(path)
    lines = []
    res = ex.run_experiment(design, echo=lines.append, run_job=fake_run_job)
    het = res["table"]["hets"][0]
    rows = {r["paradigm"]: r for r in het["rows"]}
    # times are read at the first evaluation at or above the target (0.1 s grid)
    assert rows["ASP"]["time_to"]["0.8"]["per_seed"][:2] == pytest.approx([2.0, 3.4])
    r = rows["ASP"]["ratio_to"]["SSP s=3"]["0.8"]
    assert r["n"] == 6 and r["hi"] < 0.8
    assert rows["BSP"]["time_to"]["0.8"]["reached"] == 0
    assert rows["BSP"]["ratio_to"]["SSP s=3"]["0.8"]["censored"] == 6
    v = {(x["paradigm"], x["reference"]): x["verdict"] for x in het["verdicts"]}
    assert v[("ASP", "SSP s=3")] == "reproduce"           # paper 0.53, ours ~0.5
    assert v[("DSSP [3,15]", "SSP s=3")] == "reproduce"
    assert v[("DSSP [3,15]", "ASP")] == "reproduce"       # paper 1.01, ours ~1.04
    assert v[("BSP", "SSP s=3")] == "contradict"          # paper 1.08 (as fast); ours >= 20/8
    assert ("SSP s=3", "ASP") not in v                    # the same comparison as ASP / SSP s=3
    md = (tmp_path / "out" / "table1.md").read_text()
    assert "reproduce" in md and "compute/base" in md and "never" in md
    assert (tmp_path / "out" / "accuracy_vs_time.png").stat().st_size > 10_000
    # a second invocation reuses the finished runs
    again = ex.run_experiment(design, echo=lines.append, run_job=lambda *a: pytest.fail("re-ran a finished job"))
    assert again["table"]["hets"][0]["verdicts"] == het["verdicts"]


def test_design_file_is_the_issue_design():
    d = ps_design.load_design("configs/dssp_table1.yaml")
    assert len(d.seeds) >= 10 and d.references == ("SSP s=3", "ASP")
    syncs = sorted((d.cell(d.hets[0], p).cfg.sync, d.cell(d.hets[0], p).cfg.staleness) for p in d.paradigms)
    assert syncs == sorted([("bsp", ""), ("asp", ""), ("ssp", "3"), ("ssp", "6"), ("ssp", "15"),
                            ("dssp", "3:15"), ("dssp-exact", "3:15")])
    ratios = []
    for h in d.hets:
        cfg = d.cell(h, d.paradigms[0]).cfg
        ratios.append(max(cfg.slowdowns) / min(cfg.slowdowns))
        assert cfg.clock == "virtual" and cfg.base_step_s > 0
        assert all(d.cell(h, p).cfg.seed == cfg.seed for p in d.paradigms)
    assert sorted(ratios) == [1.0, 2.0, 4.0]


def test_bad_designs_are_one_line_errors(tmp_path):
    from elastic_ring.errors import ConfigError

    p = tmp_path / "d.yaml"
    p.write_text(DESIGN.format(out=tmp_path).replace('references: ["SSP s=3", ASP]', "references: [SSP]"))
    with pytest.raises(ConfigError, match="reference"):
        ps_design.load_design(p)
    p.write_text(DESIGN.format(out=tmp_path).replace("seeds: [0, 1, 2, 3, 4, 5]", "seeds: [1, 1]"))
    with pytest.raises(ConfigError, match="each once"):
        ps_design.load_design(p)
    p.write_text(DESIGN.format(out=tmp_path).replace("eval_every_s: 0.5", "eval_every_s: 0.5, stop_accuracy: 0.9"))
    with pytest.raises(ConfigError, match="stop_accuracy needs"):
        ps_design.load_design(p)


def test_inprocess_engine_needs_the_virtual_clock(tmp_path):
    from elastic_ring.errors import ConfigError
    from elastic_ring.ps.api import PSInputError
    from elastic_ring.ps.inprocess import InProcessTransport

    with pytest.raises(PSInputError, match="clock: virtual"):
        InProcessTransport(PSConfig(workers=2))
    p = tmp_path / "d.yaml"
    p.write_text(DESIGN.format(out=tmp_path) + "engine: inprocess\n")
    with pytest.raises(ConfigError, match="engine inprocess needs clock: virtual"):
        ps_design.load_design(p)
    p.write_text(DESIGN.format(out=tmp_path) + "engine: gpu\n")
    with pytest.raises(ConfigError, match="engine: must be one of"):
        ps_design.load_design(p)


@pytest.mark.parametrize("lo,hi,paper,expect", [
    (0.6, 0.9, 0.53, "same"),       # faster, but by less than the paper's factor
    (1.1, 1.3, 0.53, "opposite"),
    (0.9, 1.1, 0.53, "unclear"),
    (1.5, 2.5, 1.9, "same"),
    (0.9, 1.1, 1.01, "-"),          # an "as fast" claim has no direction
])
def test_direction(lo, hi, paper, expect):
    assert ps_stats.direction(lo, hi, paper, 1.25) == expect


def test_equal_speeds_are_a_control_without_verdicts(tmp_path):
    path = tmp_path / "design.yaml"
    path.write_text(DESIGN.format(out=tmp_path / "out").replace("slowdown: [1, 2]", "slowdown: [1, 1]"))
    res = ex.run_experiment(ps_design.load_design(path), echo=lambda _: None, run_job=fake_run_job)
    het = res["table"]["hets"][0]
    assert het["control"] and het["verdicts"] == [] and "control" in res["markdown"]
