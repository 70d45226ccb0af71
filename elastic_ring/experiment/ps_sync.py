"""The Table I experiment of arXiv 1908.11848 at CPU scale, designed to answer its question: on a
heterogeneous cluster, which paradigm reaches the target accuracy first, and by how much?

The design (``configs/dssp_table1.yaml``)::

    out: results/ps_table1
    seeds: [0, 1, ..., 9]          # paired: a seed gives every paradigm the same weights, data, noise
    targets: [0.90, 0.95]          # the first is the primary target (ratios, verdicts)
    references: ["SSP s=3", ASP]   # every paradigm's time is divided by these, seed by seed
    parallel: 2                    # jobs at a time (honest only if the compute stays under the base step)
    base: {PSConfig keys shared by every run; base_step_s well above the compute}
    heterogeneity: [{name: "1:2", slowdown: [1, 1, 2, 2], time_budget_s: 30}, ...]
    paradigms: [{name: BSP, sync: bsp}, {name: "SSP s=3", sync: ssp, staleness: 3}, ...]

Unknown keys are errors (:class:`DesignSpec`, read like every config: :mod:`elastic_ring.config.base`);
``--set KEY=VALUE`` changes a design key, ``--set base.KEY=VALUE`` a ps setting of every run.

Every step of worker i lasts ``base_step_s * slowdown[i] * (1 + noise * z)`` (the compute is padded
by sleeping, see :mod:`elastic_ring.ps.worker`), so the speeds do not depend on the machine's load
as long as the compute stays under that target; each run records the compute/base ratio and the
steps where it did not (overruns). With ``eval_deferred`` the server never pauses to evaluate.

Statistics (pure functions, unit-tested): time to a target is the server time of the first
evaluation at or above it; a run that never got there is *censored* at its budget (its true time is
longer). The ratio of paradigm X to reference R is taken seed by seed (paired), summarised by the
geometric mean, with a 95% percentile bootstrap interval over seeds. A paper comparison is read
from the paper's ratio: below ``1/margin`` it claims "faster", above ``margin`` "slower", otherwise
"about as fast"; we *reproduce* it when the whole interval lies in that region, *contradict* it when
the interval lies wholly outside, and *cannot tell* otherwise.

Outputs in ``out``: ``runs/<heterogeneity>/<paradigm>-seed<k>/`` (events.jsonl, meta.json: load
average and wall time), ``table1.json``, ``table1.md``, ``accuracy_vs_time.png``. A run whose
events hold ``ps_finished`` is reused, so an interrupted experiment resumes.

This module runs the jobs (:func:`run_experiment`); the design is :mod:`.ps_design`, the statistics
:mod:`.ps_stats`, the markdown table and the plot :mod:`.ps_report`.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from elastic_ring.errors import ConfigError, ElasticRingError
from elastic_ring.events.api import read_events
from elastic_ring.experiment.ps_design import Design
from elastic_ring.experiment.ps_report import _f, markdown, plot
from elastic_ring.experiment.ps_stats import aggregate, summarise_run
from elastic_ring.ps.events import PSFinished


def _reusable(design: Design, h: str, p: str, s: int) -> bool:
    """A finished run of exactly this cell's config (a changed design reruns its runs)."""
    rdir = design.run_dir(h, p, s)
    try:
        saved = json.loads((rdir / "ps_config.json").read_text())
    except (OSError, ValueError):
        return False
    want = json.loads(json.dumps(design.cell(h, p).cfg.replace(seed=s).to_dict()))
    return saved == want and bool(read_events(rdir / "events.jsonl", PSFinished))


def _run_batch(design: Design, group: list[tuple[str, str, int]], run_job: Callable | None,
               echo: Callable[[str], None], failed: list[str]) -> None:
    """Run the jobs of one seed (one mpirun or process for all); a failed job goes to ``failed``."""
    from elastic_ring.ps.runner import run_batch

    specs = []
    for h, p, s in group:
        rdir = design.run_dir(h, p, s)
        if (rdir / "events.jsonl").exists():
            (rdir / "events.jsonl").unlink()
        rdir.mkdir(parents=True, exist_ok=True)
        cfg = design.cell(h, p).cfg.replace(seed=s)
        (rdir / "ps_config.json").write_text(json.dumps(cfg.to_dict(), indent=1))  # what reuse compares
        specs.append((cfg, rdir))
    load0, t0, u0 = os.getloadavg()[0], time.monotonic(), time.time()
    if run_job is None:
        results = run_batch(specs, engine=design.engine)
    else:
        results = []
        for cfg, rdir in specs:
            try:
                results.append(run_job(cfg, rdir))
            except ElasticRingError as e:
                results.append(e)
    share = (time.monotonic() - t0) / len(group)
    for (h, p, s), (cfg, rdir), res in zip(group, specs, results):
        if isinstance(res, Exception):
            failed.append(f"{h} {p} seed {s}: {res}")
            echo(f"  FAILED {h} {p} seed {s}: {res}")
            continue
        (rdir / "meta.json").write_text(json.dumps({"load_start": load0, "load_end": os.getloadavg()[0],
                                                    "job_wall_s": share, "start_unix": u0,
                                                    "end_unix": time.time()}))
        r = summarise_run(read_events(rdir / "events.jsonl"), design.targets)
        tt = ", ".join(f"{k}: {'never' if v is None else f'{v:.1f}s'}" for k, v in r["time_to"].items())
        echo(f"  {h} {p} seed {s}: {tt}; {r['updates']} updates; compute/base p99 "
             f"{_f(r['compute_base']['p99'], 2)}; max gap {r['max_release_gap']}; real {_f(r['real_s'], 0)} s")


def _finished_runs(design: Design, jobs: list[tuple[str, str, int]]
                   ) -> tuple[dict[tuple[str, str], dict[int, dict]], dict[str, Any]]:
    """The summaries of the finished runs per cell and seed, and the timing of the runs."""
    runs: dict[tuple[str, str], dict[int, dict]] = {}
    loads, walls, spans = [], [], []
    for h, p, s in jobs:
        rdir = design.run_dir(h, p, s)
        if _reusable(design, h, p, s):
            runs.setdefault((h, p), {})[s] = summarise_run(read_events(rdir / "events.jsonl"), design.targets)
            if (rdir / "meta.json").exists():
                m = json.loads((rdir / "meta.json").read_text())
                loads.append(m["load_start"])
                walls.append(m["job_wall_s"])
                spans += [m["start_unix"], m["end_unix"]]
    timing = {"runs": sum(len(v) for v in runs.values()), "parallel": design.parallel,
              "runs_wall_s": float(sum(walls)), "span_s": (max(spans) - min(spans)) if spans else 0.0,
              "load_min": min(loads, default=0.0), "load_max": max(loads, default=0.0)}
    return runs, timing


def run_experiment(design: Design, run: bool = True, echo: Callable[[str], None] = print,
                   run_job: Callable | None = None) -> dict[str, Any]:
    """Run (or reuse) every job, then write table1.json, table1.md and accuracy_vs_time.png.

    The jobs of one seed run one after the other in one mpirun or process (saving the processes'
    start-up), ``design.parallel`` such batches at a time. ``run_job(cfg, run_dir)``
    replaces the launcher (tests); a failed job is reported and left out (its seed drops from the
    pairs)."""
    design.out.mkdir(parents=True, exist_ok=True)
    # Seed-major order: every cell of seed 0, then of seed 1, ...
    jobs = [(h, p, s) for s in design.seeds for h in design.hets for p in design.paradigms]
    todo = [j for j in jobs if not _reusable(design, *j)]
    groups: dict[int, list[tuple[str, str, int]]] = {}
    for h, p, s in todo:  # one batch per seed: the processes start once for all its runs
        groups.setdefault(s, []).append((h, p, s))
    failed: list[str] = []
    if run and todo:
        echo(f"running {len(todo)} of {len(jobs)} jobs in {len(groups)} batches, {design.parallel} at a time "
             f"-> {design.out / 'runs'}")
        with ThreadPoolExecutor(max_workers=design.parallel) as pool:
            list(pool.map(lambda g: _run_batch(design, g, run_job, echo, failed), groups.values()))
    runs, timing = _finished_runs(design, jobs)
    if not runs:
        raise ConfigError(f"no finished runs in {design.out / 'runs'}")
    table = aggregate(design, runs)
    table["timing"] = timing
    table["failed"] = failed
    table["runs"] = {f"{h} | {p}": {str(s): {k: v for k, v in r.items() if k != "accuracy_curve"} for s, r in per.items()}
                     for (h, p), per in runs.items()}
    md = markdown(table, design)
    (design.out / "table1.json").write_text(json.dumps(table, indent=1, default=str))
    (design.out / "table1.md").write_text(md)
    plot(design, runs, design.out / "accuracy_vs_time.png")
    return {"table": table, "markdown": md}
