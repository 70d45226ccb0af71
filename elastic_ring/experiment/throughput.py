"""Table 1 of arXiv 1908.08082: steady-state throughput at each worker count, and the Eq. 5 fit.

Each count is one training run in ``OUT/runs/w<N>/`` (:func:`elastic_ring.profile.profiler.run_profile`,
which also writes ``OUT/profile.json``, read by ``elastic-ring simulate --workload``); this module
checks the settings against the config and the device, runs it and writes ``OUT/table1.md``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from elastic_ring.errors import UserError


@dataclass(frozen=True)
class Table1:
    """A profile run: ``profile.json``'s dict and how it was measured."""

    profile: dict[str, Any]
    device: str
    steps: int
    warmup_windows: int
    out: Path

    def text(self) -> str:
        """What ``elastic-ring profile`` prints: the heading, Table 1, the Eq. 5 fit, the files written."""
        from elastic_ring.profile.api import render_fit, render_table1

        p = self.profile
        return "\n".join([
            f"Table 1: {p['model']} (width {p['width']}) on {p['dataset']}, {self.device}, "
            f"batch {p['batch_per_worker']}/worker, {self.steps} steps per count, "
            f"{self.warmup_windows} warm-up window(s) dropped",
            render_table1(p["table1"]), "", render_fit(p), "",
            f"wrote {self.out / 'profile.json'} and {self.out / 'table1.md'}"])


def run_table1(counts: str, steps: int | None = None, warmup_windows: int = 1, config_path: str | None = None,
               overrides: Sequence[str] = (), device: str = "auto", slots: int | None = None,
               out_dir: str | Path = "results/profile", fresh: bool = False,
               note: Callable[[str], None] = print) -> Table1:
    """Measure each worker count of ``counts`` (``"1,2,4,8"``), reusing finished runs with the same
    config unless ``fresh``; ``steps`` default to enough for 6 windows after the warm-up. ``note``
    gets the warnings (a GPU without NCCL, counts above the CPU cores).

    Raises:
        UserError: a setting the config or the device cannot meet (one line naming the flag).
    """
    from elastic_ring.config.api import load_config
    from elastic_ring.config.base import parse_overrides
    from elastic_ring.controller.runs import resolve_device
    from elastic_ring.data import check_dataset
    from elastic_ring.profile.api import parse_worker_counts, render_fit, render_table1
    from elastic_ring.profile.profiler import run_profile

    ws = parse_worker_counts(counts)
    if warmup_windows < 0:
        raise UserError(f"--warmup-windows must be >= 0, got {warmup_windows}")
    device, ngpu, _ = resolve_device(device, note)
    if device == "cuda" and max(ws) > ngpu:
        raise UserError(f"--workers asks for {max(ws)} workers but only {ngpu} GPU(s) are visible")
    cfg = load_config(config_path, parse_overrides(overrides), device=device)
    if steps is None:
        steps = cfg.throughput_window * (warmup_windows + 6) + 1
    if steps < 2:
        raise UserError(f"--steps must be >= 2, got {steps}")
    min_steps = cfg.throughput_window * (warmup_windows + 1) + 1
    if steps < min_steps:
        raise UserError(f"--steps {steps} leaves no throughput window after {warmup_windows} warm-up "
                        f"window(s) of {cfg.throughput_window} steps: use >= {min_steps}")
    cfg = cfg.replace(total_steps=steps)
    check_dataset(cfg.dataset, cfg.data_dir)
    n_slots = slots if slots is not None else (ngpu if device == "cuda" else max(ws))
    if n_slots < max(ws):
        raise UserError(f"--slots {n_slots} is less than the largest count {max(ws)}")
    cores = os.cpu_count() or 1
    if device == "cpu" and max(ws) > cores:
        note(f"elastic-ring: note: {cores} CPU cores; counts above {cores} oversubscribe them "
             f"(workers share cores, so their throughput is not that of separate devices)")
    out = Path(out_dir)
    prof = run_profile(cfg, ws, out, n_slots, device, warmup_windows, reuse=not fresh)
    (out / "table1.md").write_text(
        f"# Table 1: throughput per worker count ({prof['model']}/{prof['width']} on {prof['dataset']}, "
        f"{device})\n\n{render_table1(prof['table1'], markdown=True)}\n\n{render_fit(prof, markdown=True)}\n")
    return Table1(prof, device, steps, warmup_windows, out)
