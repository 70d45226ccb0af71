"""Real mpirun jobs (1 server + 2 workers) for every paradigm; the staleness bounds hold.

The five virtual-clock runs go through one mpirun, one after the other in the same processes
(:func:`elastic_ring.ps.runner.run_batch`, as `ps experiment` runs a seed's jobs, with the configs
that `elastic-ring ps`'s own :func:`build_config` makes of the same flags): one start-up of three
Python processes (torch, MPI) instead of five. The `elastic-ring ps` command itself runs the
wall-clock BSP case and the failed rank.

Bounds checked (K = 2 workers, one update per push, see docs/ps.md):
- gap at release (t_p - t_min when a worker is sent OK): BSP 0, SSP s, dssp-exact hi;
  none for ASP and the paper's DSSP (the refill), which are only recorded.
- staleness (server version at apply - version pulled): BSP <= K - 1, SSP <= (K - 1)(2s + 1).
"""

from __future__ import annotations

import json

import pytest

from elastic_ring.events.api import read_events
from elastic_ring.protocol import error_file
from tests.conftest import run_cli, tool

pytestmark = pytest.mark.integration

WALL = ["--workers", "2", "--slowdown", "1.0,3.0", "--depth", "8", "--width", "4", "--base-step", "0.02",
        "--max-pushes", "60", "--time-budget", "40", "--set", "eval_every_updates=30", "--set", "eval_every_s=0"]
# The virtual clock makes the 1:3 speeds exact whatever the machine's load (on the wall clock a
# loaded CPU stretches the compute past the 0.02 s base step and evens the speeds out, and then
# neither ASP's lead nor a DSSP controller decision is guaranteed).
COMMON = WALL + ["--set", "clock=virtual"]

CASES = {
    "bsp": (["--sync", "bsp"], 0),
    "bsp-wall": (["--sync", "bsp"], 0),
    "asp": (["--sync", "asp"], None),
    "ssp": (["--sync", "ssp", "--staleness", "3"], 3),
    "dssp": (["--sync", "dssp", "--staleness", "2:5"], None),
    "dssp-exact": (["--sync", "dssp-exact", "--staleness", "2:5"], 5),
}


def release_gaps(ev):
    gaps = [e["gap"] for e in ev if e["kind"] == "ps_push" and e["action"] != "hold"]
    return gaps + [e["gap"] for e in ev if e["kind"] == "ps_release"]


def _config(args: list[str]):
    """The PSConfig that `elastic-ring ps ARGS` runs: its own option parsing and build_config."""
    from elastic_ring.cli.ps import ps
    from elastic_ring.ps.api import build_config

    params = dict(ps.make_context("ps", list(args)).params)
    params.pop("run_dir")
    return build_config(params.pop("config"), params.pop("sets"), **params)


def _check(name: str, ev: list[dict]) -> None:
    """The events of one run of paradigm ``name``: its bounds, its stop, its workers."""
    _, bound = CASES[name]
    kinds = {e["kind"] for e in ev}
    assert {"ps_launch", "ps_push", "ps_accuracy", "ps_worker_summary", "ps_finished"} <= kinds, name
    fin = [e for e in ev if e["kind"] == "ps_finished"][-1]
    pushes = [e for e in ev if e["kind"] == "ps_push"]
    assert fin["reason"] == "max_pushes" and fin["version"] == len(pushes) == 60, name
    assert sum(fin["pushes"].values()) == 60, name
    for e in pushes:
        assert e["staleness"] == e["version_applied"] - e["version_pulled"] >= 0, (name, e)
    gaps = release_gaps(ev)
    assert max(gaps) == fin["max_release_gap"], name
    stale = max(e["staleness"] for e in pushes)
    if bound is not None:
        assert fin["release_bound"] == bound, name
        assert max(gaps) <= bound, (name, max(gaps))
    else:
        assert fin["release_bound"] is None, name
    assert fin["clock"] == ("wall" if name.endswith("-wall") else "virtual"), name
    if name.startswith("bsp"):
        assert fin["max_push_gap"] <= 1 and stale <= 1, name
        assert abs(fin["pushes"]["1"] - fin["pushes"]["2"]) <= 1, name
    if name == "ssp":
        assert stale <= 1 * (2 * 3 + 1)
    if name == "asp":  # the fast worker is never held and runs far ahead
        assert not [e for e in ev if e["kind"] == "ps_hold"]
        assert fin["max_push_gap"] > 5
    if name.startswith("dssp"):
        ctl = [e for e in ev if e["kind"] == "ps_controller"]
        assert ctl and all(0 <= c["r"] <= c["r_cap"] for c in ctl), name
        assert {c["controller"] for c in ctl} == {"paper" if name == "dssp" else "exact"}, name
    summ = [e for e in ev if e["kind"] == "ps_worker_summary"]
    assert sorted(s["worker"] for s in summ) == [1, 2], name


def test_paradigms_on_the_virtual_clock_in_one_mpirun_and_bounds_hold(tmp_path):
    tool("mpirun")
    from elastic_ring.ps.runner import run_batch

    names = [n for n in CASES if not n.endswith("-wall")]
    jobs = [(_config([*CASES[n][0], *COMMON]), tmp_path / n) for n in names]
    assert all(cfg.clock == "virtual" and cfg.max_pushes == 60 for cfg, _ in jobs)
    results = run_batch(jobs)
    for n, (_, run_dir), res in zip(names, jobs, results):
        assert not isinstance(res, Exception), (n, res, (jobs[0][1] / "mpirun.log").read_text()[-3000:])
        assert res.finished == [e for e in read_events(run_dir / "events.jsonl") if e["kind"] == "ps_finished"][-1]
        _check(n, read_events(run_dir / "events.jsonl"))


def test_bsp_on_the_wall_clock_through_the_ps_command(tmp_path):
    tool("mpirun")
    name = "bsp-wall"
    run_dir = tmp_path / name
    r = run_cli("ps", *CASES[name][0], *WALL, "--run-dir", str(run_dir), timeout=300)
    assert r.returncode == 0, (r.stdout, r.stderr, (run_dir / "mpirun.log").read_text())
    _check(name, read_events(run_dir / "events.jsonl"))
    assert "largest push gap at a release:" in r.stdout


def test_rank_failure_is_reported_in_one_line(tmp_path):
    tool("mpirun")
    run_dir = tmp_path / "fail"
    r = run_cli("ps", "--sync", "ssp", *COMMON, "--run-dir", str(run_dir), timeout=300,
                env={"ELASTIC_RING_PS_FAIL": "2:3"})
    assert r.returncode == 1, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "rank 2 failed" in lines[0] and "injected failure" in lines[0], r.stderr
    rec = json.loads(error_file(run_dir, 2).read_text())  # the crash record of `train`
    assert rec["rank"] == 2 and rec["type"] == "RuntimeError" and "injected failure" in rec["traceback"]
    assert not (run_dir / "errors").exists()
    assert read_events(run_dir / "events.jsonl", "error")
