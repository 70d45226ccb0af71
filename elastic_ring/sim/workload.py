"""Workload profiles: a true speed curve (Eq. 5) per kind of job, and the job stream of a run.

A workload is a ``profile.json`` — the file ``elastic-ring profile`` writes — or one of the
built-in JSON files under ``elastic_ring/sim/workloads/``, each labelled with its ``source``
(which numbers come from a paper and which are assumed). Built-ins are addressed by file stem
(``resnet110-cifar10``); anything else is read as a path.

Job stream (:func:`make_jobs`): Poisson arrivals at :attr:`SimConfig.arrival_rate`; each job's
run time alone on 8 GPUs is log-uniform in [min_hours_at_8, max_hours_at_8]; its workload is drawn
uniformly from the configured ones; its work in samples is that time times the workload's speed
at 8 GPUs (samples/s). Same seed -> same jobs for every strategy (common random numbers).

Batch rule: a workload's jobs keep Eq. 7's fixed per-worker batch by default; a profile with
``"scaling": "constant-batch"`` and ``"global_batch": N`` (samples, a multiple of its per-worker
batch), or :func:`with_rule`, makes them keep the global batch N at every GPU count: their speed
is then the accumulated step's (:class:`~elastic_ring.perfmodel.accumulated.AccumulatedModel`).
A job's size is its hours at 8 GPUs under the per-worker batch's curve either way, so the same
seed gives the same jobs (the same work in samples) under both rules.

Loss curves (for the Eq. 1 prediction of remaining work), drawn from a second stream so the
arrivals and sizes above do not change: Eq. 1 in samples s, ``l(s) = 1/(b0·s + b1) + b2`` with
initial loss l(0) = 2.3 (ln 10, ten classes), floor b2 uniform in [0.02, 0.3], and the target (the
loss at the job's work W) at a fraction r of the initial gap above the floor, r log-uniform in
[0.03, 0.2]. These ranges are assumed (they cover our CPU curves' shapes, not measured per job).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from elastic_ring.errors import ConfigError
from elastic_ring.perfmodel.speed import SpeedModel, load_profile
from elastic_ring.sim.api import JobSpec, SimConfig

WORKLOAD_DIR = Path(__file__).resolve().parent / "workloads"


@dataclass(frozen=True)
class Workload:
    name: str
    model: SpeedModel  # or a NodeSteppedModel (a profile with a "multi_node" block), or an AccumulatedModel
    source: str
    path: str
    scaling: str = "linear"  # the batch rule: "linear" (Eq. 7) or "constant-batch"
    global_batch: float = 0.0  # constant-batch: the global batch in samples (0 under linear)


def with_rule(wl: Workload, scaling: str, global_batch: float = 0.0) -> Workload:
    """``wl`` with its jobs under the batch rule ``scaling``: ``linear`` (Eq. 7, the per-worker
    batch's curve) or ``constant-batch`` with ``global_batch`` samples (0: the per-worker batch x 8,
    the paper's 8-GPU job).

    Raises:
        ConfigError: an unknown rule, or a global batch that is not a multiple of the per-worker batch.
    """
    from elastic_ring.perfmodel.accumulated import RULES, AccumulatedModel, accumulated

    if scaling not in RULES:
        raise ConfigError(f"workload {wl.name}: scaling must be one of {', '.join(RULES)}, got {scaling!r}")
    plain = wl.model.base if isinstance(wl.model, AccumulatedModel) else wl.model
    if scaling == "linear":
        return Workload(wl.name, plain, wl.source, wl.path)
    g = float(global_batch) if global_batch else 8.0 * float(plain.m)
    return Workload(wl.name, accumulated(plain, g), wl.source, wl.path, scaling, g)


def sizing_model(model):
    """The curve a job's size is drawn with: the per-worker batch's (Eq. 7's) one."""
    from elastic_ring.perfmodel.accumulated import AccumulatedModel

    return model.base if isinstance(model, AccumulatedModel) else model


def builtin_workloads() -> dict[str, Path]:
    """Built-in workload name -> file."""
    return {p.stem: p for p in sorted(WORKLOAD_DIR.glob("*.json"))}


def load_workload(name_or_path: str) -> Workload:
    """A built-in workload by name, or a ``profile.json`` by path.

    Raises:
        ConfigError: neither a built-in name nor a readable profile.
    """
    builtins = builtin_workloads()
    if name_or_path in builtins:
        path = builtins[name_or_path]
        name = name_or_path
    else:
        path = Path(name_or_path)
        if not path.exists():
            raise ConfigError(f"unknown workload {name_or_path!r}: not a built-in "
                              f"({', '.join(builtins)}) and no such file")
        name = str(path)
    model, d = load_profile(path)
    if isinstance(d.get("multi_node"), dict):  # a curve that steps at the node boundary
        from elastic_ring.sim.multinode import NodeSteppedModel

        model = NodeSteppedModel.from_dict(model, d["multi_node"])
    if model.m <= 0 or not np.isfinite(model.samples_per_s(8)) or model.samples_per_s(1) <= 0:
        raise ConfigError(f"workload {name}: speed model gives no finite positive speed")
    wl = Workload(name=name, model=model, source=str(d.get("source", "unknown")), path=str(path))
    if "scaling" in d or "global_batch" in d:
        try:
            g = float(d.get("global_batch") or 0.0)
        except (TypeError, ValueError):
            raise ConfigError(f"workload {name}: global_batch must be a number of samples, "
                              f"got {d.get('global_batch')!r}") from None
        wl = with_rule(wl, str(d.get("scaling", "constant-batch")), g)
    return wl


def make_jobs(config: SimConfig, models: dict[str, SpeedModel]) -> list[JobSpec]:
    """The seeded job stream of one run (see the module docstring)."""
    rng = np.random.default_rng(config.seed)
    n = config.jobs
    gaps = rng.exponential(1.0 / config.arrival_rate, size=n)
    arrivals = np.cumsum(gaps)
    lo, hi = np.log(config.min_hours_at_8), np.log(config.max_hours_at_8)
    hours = np.exp(rng.uniform(lo, hi, size=n))
    names = list(config.workloads)
    which = rng.integers(0, len(names), size=n)
    crng = np.random.default_rng([config.seed, 2])
    floors = crng.uniform(0.02, 0.3, size=n)
    ratios = np.exp(crng.uniform(np.log(0.03), np.log(0.2), size=n))
    out = []
    for i in range(n):
        wl = names[int(which[i])]
        work = float(hours[i] * 3600.0 * sizing_model(models[wl]).samples_per_s(8))
        curve, target = loss_curve(work, float(floors[i]), float(ratios[i]))
        out.append(JobSpec(id=i, arrival=float(arrivals[i]), work=work, workload=wl, curve=curve,
                           target_loss=target))
    return out


INITIAL_LOSS = 2.3


def loss_curve(work: float, floor: float, ratio: float) -> tuple[tuple[float, float, float], float]:
    """Eq. 1 coefficients (b0, b1, b2) in samples, and the target loss, of a job of ``work``
    samples whose loss falls from :data:`INITIAL_LOSS` to ``floor + ratio·(INITIAL_LOSS - floor)``."""
    gap0 = INITIAL_LOSS - floor
    b1 = 1.0 / gap0
    b0 = (1.0 / (ratio * gap0) - b1) / work
    return (b0, b1, floor), floor + ratio * gap0
