"""Experiment designs: Table 2 of arXiv 1908.08082 (resize a run mid-training, measure what it saves).

* :mod:`.api` — the design file (:class:`ResizeDesign`, :func:`load_design`) and the table's
  arithmetic from events (:func:`run_metrics`, :func:`table2_rows`, :func:`render_table2`).
* :mod:`.runner` — runs every row and repeat with real horovodrun runs and writes the tables.
"""

from elastic_ring.experiment.api import (ResizeDesign, load_design, mean_sd, render_table2,
                                         run_metrics, table2_rows)

__all__ = ["ResizeDesign", "load_design", "mean_sd", "render_table2", "run_metrics", "table2_rows"]
