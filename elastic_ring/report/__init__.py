"""Reports: Markdown tables and matplotlib (Agg) PNG plots for profile, experiment and run folders."""

from elastic_ring.report.api import convergence_summary, write_report

__all__ = ["convergence_summary", "write_report"]
