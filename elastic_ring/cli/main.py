"""``elastic-ring``: elastic Horovod training, profiling, scheduling, simulation, parameter server.

Subcommands are imported lazily (so ``elastic-ring --help`` is fast and one subsystem's imports
never slow another). Every user mistake — a bad flag, bad value, missing dataset, corrupt
checkpoint — is printed as a single ``elastic-ring: error: ...`` line with exit status 2, as is a
command whose pip extra is not installed (:mod:`elastic_ring.extras`: which one to install).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

import click

from elastic_ring import extras
from elastic_ring.errors import ElasticRingError, EXIT_USER_ERROR, Interrupted

# name -> (module, attribute, one-line help shown in `elastic-ring --help`)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "train": ("elastic_ring.cli.train", "train", "Train on Horovod or torch.distributed workers; resize them live."),
    "resize": ("elastic_ring.cli.train", "resize", "Ask a running `train` to resize now."),
    "drain": ("elastic_ring.cli.train", "drain", "Ask a running `train` to leave a host (with notice)."),
    "status": ("elastic_ring.cli.train", "status", "Show the summary table of a running or finished run."),
    "runs": ("elastic_ring.cli.runs", "runs", "List the runs under a folder with their state and last step."),
    "logs": ("elastic_ring.cli.runs", "logs", "Print (or follow) a run's worker log."),
    "profile": ("elastic_ring.cli.profile", "profile", "Measure throughput per worker count (Table 1), fit Eq. 5."),
    "experiment": ("elastic_ring.cli.experiment", "experiment", "Run experiment designs (Table 2)."),
    "report": ("elastic_ring.cli.report", "report", "Write Markdown tables and PNG plots for a results folder."),
    "simulate": ("elastic_ring.cli.simulate", "simulate", "Simulate a GPU cluster under scheduling policies (Table 3)."),
    "ps": ("elastic_ring.cli.ps", "ps", "Parameter-server training with BSP/ASP/SSP/DSSP over MPI."),
    "cluster": ("elastic_ring.cli.cluster", "cluster", "Run the scheduler on this node: cluster up / down / web."),
    "submit": ("elastic_ring.cli.cluster", "submit", "Queue a job (script or config) on a cluster."),
    "jobs": ("elastic_ring.cli.cluster", "jobs", "The cluster's jobs: state, workers, progress, JCT."),
    "cancel": ("elastic_ring.cli.cluster", "cancel", "Cancel a cluster job."),
    "export": ("elastic_ring.cli.export", "export", "Write a run's model weights as a plain torch.save file."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return [n for n, (mod, _, _) in COMMANDS.items() if importlib.util.find_spec(mod) is not None]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        mod, attr, _ = COMMANDS[name]
        extras.require_for_command(name)  # its extra missing: one line naming it
        try:
            return getattr(importlib.import_module(mod), attr)
        except ModuleNotFoundError as e:
            if e.name == mod:
                return None
            raise extras.from_import_error(f"elastic-ring {name}", e) or e

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except ModuleNotFoundError as e:  # an option's lazy import (train --backend ray: Ray)
            what = f"elastic-ring {ctx.invoked_subcommand}" if ctx.invoked_subcommand else "elastic-ring"
            raise extras.from_import_error(what, e) or e

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(n, COMMANDS[n][2]) for n in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="elastic-ring")
def cli() -> None:
    """Elastic ring-allreduce training.

    A controller launches Horovod or torch.distributed workers (on this host, over hosts, or as Ray
    actors); when the number of workers a job should use changes (a schedule, a command, the
    scheduler, hosts that come and go, a failure), the workers agree on a step, keep their state in
    their processes or checkpoint it, and go on at the new count with the learning rate rescaled
    (Eq. 7, or a constant global batch), and the cost of the resize is measured.

    Run `elastic-ring COMMAND --help` for each command's options.
    """


def _one_line(msg: str) -> str:
    return " ".join(str(msg).split())


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: one-line errors with exit status 2 for bad input."""

    try:
        rv = cli.main(args=argv, prog_name="elastic-ring", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("elastic-ring: aborted", err=True)
        sys.exit(130)
    except click.UsageError as e:
        cmd = e.ctx.command_path if e.ctx is not None else "elastic-ring"
        click.echo(f"{cmd}: error: {_one_line(e.format_message())} (see --help)", err=True)
        sys.exit(EXIT_USER_ERROR)
    except click.ClickException as e:
        click.echo(f"elastic-ring: error: {_one_line(e.format_message())}", err=True)
        sys.exit(EXIT_USER_ERROR)
    except Interrupted as e:
        click.echo(f"elastic-ring: {_one_line(str(e))}", err=True)
        sys.exit(e.exit_code)
    except ElasticRingError as e:
        click.echo(f"elastic-ring: error: {_one_line(str(e))}", err=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("elastic-ring: interrupted", err=True)
        sys.exit(130)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
