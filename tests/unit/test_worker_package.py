"""``elastic_ring.worker``'s names are imported at their first use: the entry point every worker
command runs (``python -m elastic_ring.worker.run``, a stand-in that hands the worker over to the
fork server) starts without the worker API, and a script's imports of the package work as before."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _run(code: str) -> str:
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def test_the_entry_point_starts_without_the_worker_api():
    out = _run("import sys, elastic_ring.worker.run\n"
               "print(sorted(m for m in ('elastic_ring.worker.api', 'elastic_ring.worker.data', 'torch') "
               "if m in sys.modules))")
    assert out == "[]"


def test_a_scripts_imports_of_the_package_work_as_before():
    import elastic_ring.worker as elastic
    from elastic_ring.worker import DistributedSampler, Job, NotLaunchedError, Sampler, StopReason, init
    from elastic_ring.worker import api, data

    assert (init, Job, NotLaunchedError, Sampler, StopReason) == (api.init, api.Job, api.NotLaunchedError,
                                                                  api.Sampler, api.StopReason)
    assert DistributedSampler is data.DistributedSampler and elastic.init is api.init
    assert set(elastic.__all__) <= set(dir(elastic))
    with pytest.raises(AttributeError, match="has no attribute 'nothing_here'"):
        elastic.nothing_here  # noqa: B018
