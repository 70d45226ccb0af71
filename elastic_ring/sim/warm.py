"""Compile the scheduler's and the simulator's numba kernels once, ahead of their first use.

The kernels (:mod:`elastic_ring.sched.kernels`, :mod:`elastic_ring.sim.state`) are compiled on
their first call and kept beside their modules (numba's ``cache=True``); on a fresh install that
first call costs about 20 s of CPU on a 2-core x86 machine, paid by the first ``simulate``, the
first decision of ``cluster up``, or the first test that reaches them. ``scripts/setup.sh`` runs
``python -m elastic_ring.sim.warm`` after it compiles the package's bytecode; later runs load the
kept code (about a second here).

The warm-up is a small simulation under every policy of the registry, its resize-aware wrapper
included, on the array path (``batch_min_jobs=1``): the same argument types as every other
caller, so that each kernel's one compiled signature is the one they load.
"""

from __future__ import annotations

import sys
import time


def warm(names: list[str] | None = None) -> float:
    """Run the warm-up simulations (one per policy of ``names``, default every name of
    :func:`~elastic_ring.sched.registry.policy_names`); returns the seconds it took."""
    from elastic_ring.sched.registry import make_policy, policy_names
    from elastic_ring.sim import SimConfig, builtin_workloads, load_workload, make_jobs, simulate

    t0 = time.perf_counter()
    models = {n: load_workload(n).model for n in builtin_workloads()}
    for name in names or policy_names():
        cfg = SimConfig(gpus=64, contention=0.9, jobs=100, seed=1)
        simulate(cfg, make_policy(name), make_jobs(cfg, models), models, batch_min_jobs=1)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    """``python -m elastic_ring.sim.warm``: one line, the time it took; exit 0. Without numba (an
    install without the ``[sim]`` or ``[cluster]`` extra) there is nothing to compile: one line,
    exit 0."""
    if argv:
        print(f"elastic_ring.sim.warm takes no arguments, got {' '.join(argv)!r}", file=sys.stderr)
        return 2
    try:
        import numba  # noqa: F401
    except ImportError:
        print("numba is not installed: no kernels to compile")
        return 0
    print(f"the scheduler's and the simulator's kernels are compiled ({warm():.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
