"""The module that ``mpirun`` executes for ``elastic-ring ps``: rank 0 is the parameter
server, ranks 1..K are the workers.

Usage (the CLI builds this; by hand only for debugging)::

    mpirun --allow-run-as-root --oversubscribe --bind-to none -np K+1 \\
        python -m elastic_ring.ps.mpi_main RUN_DIR [RUN_DIR ...]

``RUN_DIR/ps_config.json`` holds the :class:`~elastic_ring.ps.api.PSConfig`; the server writes
``RUN_DIR/events.jsonl``. Several run folders (all with K workers) run one after the other in the
same processes, which saves the start-up of K + 1 Python processes per run (the experiment does
this; every run builds its model, data and optimizer afresh). A rank that raises writes its crash
record, in the format of ``train`` (:func:`elastic_ring.protocol.write_error_record`:
``RUN_DIR/logs/error-rank<R>.json`` with rank, exception type, message, traceback), and aborts the
whole MPI job, so no rank waits forever; the CLI reads the record back and reports the first
failure in one line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    if not argv:
        sys.stderr.write("usage: python -m elastic_ring.ps.mpi_main RUN_DIR [RUN_DIR ...]\n")
        sys.exit(2)
    from mpi4py import MPI

    from elastic_ring.protocol import write_error_record

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    run_dir = Path(argv[0])
    try:
        from elastic_ring.ps.api import config_from_dict

        for arg in argv:
            run_dir = Path(arg)
            cfg = config_from_dict(json.loads((run_dir / "ps_config.json").read_text()), source="ps_config.json")
            if comm.Get_size() != cfg.workers + 1:
                raise RuntimeError(f"MPI world size {comm.Get_size()} != 1 server + {cfg.workers} workers")
            if rank == 0:
                from elastic_ring.ps.server import run_server
                run_server(cfg, run_dir, comm)
            else:
                from elastic_ring.ps.worker import run_worker
                run_worker(cfg, rank, comm)
            comm.Barrier()
    except BaseException as e:  # noqa: BLE001 - every failure must reach the CLI and end the job
        write_error_record(run_dir, e, rank)
        sys.stderr.write(f"rank {rank}: {type(e).__name__}: {e}\n")
        sys.stderr.flush()
        comm.Abort(1)


if __name__ == "__main__":
    main(sys.argv[1:])
