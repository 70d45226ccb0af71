"""Throughput profiling (Table 1 of arXiv 1908.08082) and the Eq. 5 fit of the measurements.

* :mod:`.api` — pure logic: warm-up exclusion, medians and spread, Table 1, ``profile.json``.
* :mod:`.profiler` — runs the configured model at each worker count (real horovodrun runs).

The speed model itself lives in :mod:`elastic_ring.perfmodel` (one module for every user).
"""

from elastic_ring.profile.api import (ProfilePoint, build_profile, fit_profile, measure_point,
                                      parse_worker_counts, render_fit, render_table1, steady_windows,
                                      table1_rows)

__all__ = ["ProfilePoint", "build_profile", "fit_profile", "measure_point", "parse_worker_counts",
           "render_fit", "render_table1", "steady_windows", "table1_rows"]
