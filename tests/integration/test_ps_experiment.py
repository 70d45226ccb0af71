"""A tiny Table I design through `elastic-ring ps experiment` with real mpirun jobs (1 server + 2
workers, two paradigms, two paired seeds, 4 emulated seconds each) on the virtual clock: every step
lasts exactly its drawn length whatever the machine's load, the seeds are paired, the report
carries the ratios and the compute/base ratio. The full design runs outside CI (docs/reports/ps.md
says how long it took)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from elastic_ring.events.api import read_events
from elastic_ring.ps.api import PSConfig
from elastic_ring.ps.worker import step_plan
from tests.conftest import run_cli, tool

pytestmark = pytest.mark.integration

BASE_STEP = 0.08
BUDGET = 4.0
TINY = f"""
seeds: [0, 1]
targets: [0.3, 0.5]
references: [ASP]
parallel: 2
bootstrap: 200
base: {{workers: 2, base_step_s: {BASE_STEP}, noise: 0.1, model: mlp, width: 16, batch_size: 16, lr: 0.002,
        clock: virtual, eval_every_s: 0.25, time_budget_s: {BUDGET}}}
heterogeneity:
  - {{name: "1:2", slowdown: [1, 2]}}
paradigms:
  - {{name: ASP, sync: asp}}
  - {{name: "SSP s=1", sync: ssp, staleness: 1}}
"""


def test_tiny_design_end_to_end(tmp_path):
    tool("mpirun")
    design = tmp_path / "tiny.yaml"
    design.write_text(TINY)
    out = tmp_path / "out"
    r = run_cli("ps", "experiment", "--config", str(design), "--out", str(out), timeout=900)
    assert r.returncode == 0, (r.stdout, r.stderr)
    table = json.loads((out / "table1.json").read_text())
    assert (out / "table1.md").read_text() in r.stdout
    assert (out / "accuracy_vs_time.png").exists()
    runs = {p: {s: read_events(out / "runs" / "1-2" / f"{p}-seed{s}" / "events.jsonl") for s in (0, 1)}
            for p in ("asp", "ssp-s-1")}

    for s in (0, 1):
        ev = runs["asp"][s]
        fin = [e for e in ev if e["kind"] == "ps_finished"][-1]
        assert fin["clock"] == "virtual" and fin["wall_s"] == BUDGET and fin["real_s"] > 0
        # ASP never holds, so worker w's i-th push comes exactly at the sum of its first i drawn
        # step lengths (the same seeded draws as step_plan's): the speeds are the design's, exactly
        cfg = PSConfig(workers=2, slowdown=(1.0, 2.0), base_step_s=BASE_STEP, noise=0.1, seed=s)
        for w, slow in ((1, 1.0), (2, 2.0)):
            rng = np.random.default_rng(s * 7919 + w)
            got = [e["t"] for e in ev if e["kind"] == "ps_push" and e["worker"] == w]
            expect = np.cumsum([step_plan(0.0, cfg, slow, rng)[1] for _ in got])
            assert len(got) > 10 and np.allclose(got, expect), (w, got[:5], expect[:5])
            assert expect[-1] <= BUDGET < expect[-1] + 2 * slow * BASE_STEP
        # evaluations on the 0.25 s grid of emulated time, in order
        acc = [e for e in ev if e["kind"] == "ps_accuracy"]
        assert [a["t"] for a in acc] == pytest.approx(list(np.arange(0, BUDGET + 1e-9, 0.25)))
        # SSP s=1 holds the fast worker: fewer of its pushes than in ASP, gap never above 1
        ssp = runs["ssp-s-1"][s]
        ssp_fin = [e for e in ssp if e["kind"] == "ps_finished"][-1]
        assert ssp_fin["max_release_gap"] <= 1 and ssp_fin["pushes"]["1"] < fin["pushes"]["1"]
        assert ssp_fin["pushes"]["1"] - ssp_fin["pushes"]["2"] <= 2

    def first_loss(ev):
        return next(e["loss"] for e in ev if e["kind"] == "ps_push" and e["worker"] == 1)

    # paired: the same seed gives both paradigms the same weights and first minibatch; seeds differ
    assert first_loss(runs["asp"][0]) == pytest.approx(first_loss(runs["ssp-s-1"][0]), abs=1e-6)
    assert first_loss(runs["asp"][1]) == pytest.approx(first_loss(runs["ssp-s-1"][1]), abs=1e-6)
    assert first_loss(runs["asp"][0]) != pytest.approx(first_loss(runs["asp"][1]), abs=1e-6)

    het = table["hets"][0]
    rows = {row["paradigm"]: row for row in het["rows"]}
    assert het["paired_seeds"] == [0, 1]
    assert rows["ASP"]["compute_base_p99"] > 0 and rows["ASP"]["overruns"] == 0
    own = rows["ASP"]["ratio_to"]["ASP"]["0.3"]
    if own["n"]:
        assert own["geomean"] == pytest.approx(1.0) and own["lo"] == pytest.approx(1.0)
    assert table["timing"]["runs"] == 4 and table["timing"]["span_s"] > 0

    # the in-process engine writes the same events as the MPI job, push for push
    from elastic_ring.ps.api import config_from_dict
    from elastic_ring.ps.inprocess import run_inprocess

    for name, s in (("ssp-s-1", 1),):
        src = out / "runs" / "1-2" / f"{name}-seed{s}"
        dst = tmp_path / "inprocess" / name
        dst.mkdir(parents=True)
        run_inprocess(config_from_dict(json.loads((src / "ps_config.json").read_text())), dst)
        keys = ("kind", "t", "worker", "push", "gap", "action", "version_pulled", "staleness", "loss",
                "test_accuracy", "held_s")

        def trace(ev):
            return [tuple(e.get(k) for k in keys) for e in ev
                    if e["kind"] in ("ps_push", "ps_hold", "ps_release", "ps_accuracy")]

        mine, theirs = trace(read_events(dst / "events.jsonl")), trace(runs[name][s])
        assert len(mine) > 40 and mine == theirs
