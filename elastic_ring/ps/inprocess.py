"""The parameter server on the virtual clock in one process: the same server loop
(:class:`~elastic_ring.ps.server.Server`) with a transport that computes each worker's gradient
itself, from the weights that worker pulled, when its push is due.

On the virtual clock a run's events are a function of its config and seed: each worker's gradient
depends only on the weights it pulled and its own data position, and the server handles pushes in
order of their emulated arrival. So this engine writes the same events as the MPI job, push for
push (``tests/integration/test_ps_experiment.py`` checks it), without K + 1 processes handing
messages to each other; on a loaded machine that hand-off, not the compute, sets the real time.

Usage (the experiment builds this)::

    python -m elastic_ring.ps.inprocess RUN_DIR [RUN_DIR ...]

Each ``RUN_DIR/ps_config.json`` (``clock: virtual``) runs in turn; a failure writes the crash
record of rank 0 (:func:`elastic_ring.protocol.write_error_record`) as the MPI entry does and exits
with status 1.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from elastic_ring.protocol import write_error_record
from elastic_ring.ps.api import PSConfig, PSInputError, config_from_dict


class InProcessTransport:
    """Workers 1..K as :class:`~elastic_ring.ps.worker.WorkerCompute` objects sharing one model."""

    def __init__(self, cfg: PSConfig) -> None:
        from elastic_ring.data import load_dataset
        from elastic_ring.ps.model import build_model
        from elastic_ring.ps.worker import WorkerCompute

        if cfg.clock != "virtual":
            raise PSInputError("the in-process engine needs clock: virtual (on the wall clock the workers must run at once)")
        model = build_model(cfg)
        train = load_dataset(cfg.dataset, True, cfg.data_dir, cfg.synthetic_size, cfg.seed)
        self.work = {w: WorkerCompute(cfg, w, model, train) for w in range(1, cfg.workers + 1)}
        self.pulled: dict[int, tuple] = {}
        self.pushes = {w: 0 for w in self.work}
        self.compute = {w: 0.0 for w in self.work}
        self.max_compute = {w: 0.0 for w in self.work}
        self.start = time.monotonic()

    def barrier(self) -> None:
        self.start = time.monotonic()

    def send_ok(self, w: int, payload: tuple) -> None:
        self.pulled[w] = payload

    def recv_push(self, due: int | None = None) -> tuple[int, dict]:
        if due is None:
            raise RuntimeError("the in-process engine only serves the virtual clock")
        version, weights, buffers = self.pulled.pop(due)
        grad, bufs, loss, compute = self.work[due].gradient(weights, buffers)
        self.pushes[due] += 1
        self.compute[due] += compute
        self.max_compute[due] = max(self.max_compute[due], compute)
        return due, dict(grad=grad, buffers=bufs, version=version, loss=loss, compute_s=compute, sleep_s=0.0,
                         target_s=0.0)

    def stop(self, workers: list[int]) -> dict[int, dict]:
        wall = time.monotonic() - self.start
        return {w: dict(pushes=self.pushes[w], compute_s=self.compute[w], sleep_s=0.0, blocked_s=0.0, wall_s=wall,
                        overruns=0, max_compute_s=self.max_compute[w]) for w in workers}


def run_inprocess(cfg: PSConfig, run_dir: str | Path) -> None:
    import torch

    from elastic_ring.ps.server import Server

    torch.set_num_threads(1)
    Server(cfg, Path(run_dir), InProcessTransport(cfg)).serve()


def main(argv: list[str]) -> int:
    if not argv:
        sys.stderr.write("usage: python -m elastic_ring.ps.inprocess RUN_DIR [RUN_DIR ...]\n")
        return 2
    for arg in argv:
        run_dir = Path(arg)
        try:
            cfg = config_from_dict(json.loads((run_dir / "ps_config.json").read_text()), source="ps_config.json")
            run_inprocess(cfg, run_dir)
        except BaseException as e:  # noqa: BLE001 - every failure must reach the caller as a crash record
            write_error_record(run_dir, e, 0)
            sys.stderr.write(f"{run_dir}: {type(e).__name__}: {e}\n")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
