"""`elastic-ring report DIR`: Markdown tables and PNG plots for a results folder."""

from __future__ import annotations

import click


@click.command(context_settings={"max_content_width": 100})
@click.argument("directory", type=click.Path(file_okay=False))
def report(directory):
    """Write DIR/report.md and PNG plots for a profile, experiment or run folder.

    \b
    elastic-ring report results/profile_cpu   # Table 1, Eq. 5 fit + residuals, throughput.png
    elastic-ring report results/table2_cpu    # Table 2, Eq. 1 fits, loss/accuracy vs wall time
    elastic-ring report runs/20240101-120000  # one training run: loss vs wall time, Eq. 1 fit

    Profile: throughput against workers with the fitted f(w) of Eq. 5. Experiment: training loss
    and final test accuracy against wall time for the baselines and the resized runs, each resize
    marked, and Eq. 1 fitted on each run's loss curve (with an out-of-sample check).
    """
    from elastic_ring.report.api import write_report

    md, pngs = write_report(directory)
    click.echo(md.read_text())
    click.echo(f"wrote {md}" + "".join(f"\nwrote {p}" for p in pngs))
