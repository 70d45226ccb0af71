"""Run the configured model at each worker count and build ``profile.json`` (Table 1, Eq. 5).

Each count is one ordinary ``elastic-ring train`` run (no resize) in ``OUT/runs/w<N>/``, driven
in-process through :class:`~elastic_ring.controller.controller.Controller`, so its events,
telemetry and logs are those of any run. The measurement itself is in :mod:`.api`.

:func:`start_run` is also what ``elastic-ring experiment`` uses to run each row of Table 2.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import yaml

from elastic_ring.config.api import TrainConfig, config_to_dict
from elastic_ring.errors import UserError
from elastic_ring.events.api import Finished, Throughput, read_events
from elastic_ring.profile.api import ProfilePoint, build_profile, measure_point


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def count_params(cfg: TrainConfig) -> int:
    from elastic_ring.nn import resnet
    from elastic_ring.nn.resnet import count_parameters

    return int(count_parameters(resnet(cfg.depth, cfg.width, cfg.num_classes)))


def train_set_size(cfg: TrainConfig) -> int:
    """Samples in the training set (CIFAR-10 is not loaded: 50,000)."""
    if cfg.dataset == "cifar10":
        return 50_000
    from elastic_ring.data import load_dataset

    return len(load_dataset(cfg.dataset, True, cfg.data_dir, cfg.synthetic_size, cfg.seed, download=False))


def run_finished(run_dir: Path) -> bool:
    return bool(read_events(run_dir / "events.jsonl", Finished))


def start_run(run_dir: Path, cfg: TrainConfig, workers: int, schedule: tuple = (), slots: int = 1,
              device: str = "cpu", out: Callable[[str], None] = say,
              show_progress: bool | None = None, relaunch: str = "prelaunch") -> dict[str, Any]:
    """One training run, as `elastic-ring train --gpus workers [--schedule ...] --relaunch R` would do it.

    Returns the run's summary. A run folder already there (an unfinished attempt, or a run
    being redone) is cleared first.

    Raises:
        UserError: the folder exists and holds something that is not an elastic-ring run.
        WorkerFailedError: a worker failed.
    """
    from elastic_ring.controller.api import RunState
    from elastic_ring.controller.runs import RunRequest, start_or_resume

    req = RunRequest(config=cfg, workers=workers, resizes=tuple(schedule), slots=slots, device=device,
                     relaunch=relaunch, run_dir=str(run_dir), replace=True, checkpoint_every_s=0.0)
    summary = start_or_resume(req, out, out=out, show_progress=show_progress)
    if summary.get("state") == RunState.STOPPED.value:
        raise KeyboardInterrupt
    return summary


def run_profile(cfg: TrainConfig, counts: list[int], out_dir: Path, slots: int, device: str,
                warmup_windows: int = 1, meta: dict[str, Any] | None = None,
                reuse: bool = True, out: Callable[[str], None] = say,
                show_progress: bool | None = None) -> dict[str, Any]:
    """Measure every count in turn and write ``OUT/profile.json``; returns the profile dict.

    A count whose run already finished in ``OUT/runs/w<N>`` (same config) is reused when ``reuse``.
    """
    points: list[ProfilePoint] = []
    t0 = time.time()
    for i, w in enumerate(counts):
        rd = out_dir / "runs" / f"w{w}"
        same = False
        if reuse and run_finished(rd):
            try:
                same = yaml.safe_load((rd / "config.yaml").read_text()) == config_to_dict(cfg)
            except (OSError, yaml.YAMLError):
                same = False
        over = f" (oversubscribed: {w} workers on {os.cpu_count()} cores)" \
            if device == "cpu" and w > (os.cpu_count() or 1) else ""
        if same:
            out(f"profile [{i + 1}/{len(counts)}]: {w} worker(s): reusing the finished run in {rd}")
        else:
            out(f"profile [{i + 1}/{len(counts)}]: {w} worker(s), {cfg.total_steps} steps{over}; "
                f"run folder {rd}")
            start_run(rd, cfg, w, (), max(slots, w), device, out=out, show_progress=show_progress)
        pt = measure_point(w, read_events(rd / "events.jsonl", Throughput), warmup_windows,
                           cfg.throughput_window)
        out(f"profile [{i + 1}/{len(counts)}]: {w} worker(s): {pt.images_per_s:.1f} images/s, "
            f"{pt.steps_per_s:.3f} steps/s (IQR {pt.steps_per_s_spread:.3f}, "
            f"{len(pt.windows)} steady window(s), {time.time() - t0:.0f} s so far)")
        points.append(pt)
    info = {
        "model": f"resnet{cfg.depth}", "width": cfg.width, "dataset": cfg.dataset, "device": device,
        "steps_per_count": cfg.total_steps, "throughput_window": cfg.throughput_window,
        "warmup_windows": warmup_windows, "cpu_count": os.cpu_count(),
        "source": (f"MEASURED by elastic-ring profile on this machine ({device}, {os.cpu_count()} CPU "
                   f"cores): steps/s per worker count = the steady throughput windows' steps / their seconds"),
        "config": config_to_dict(cfg), **(meta or {}),
    }
    prof = build_profile(points, cfg.batch_size, count_params(cfg), info)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / ".profile.json.tmp"
    tmp.write_text(json.dumps(prof, indent=2))
    os.replace(tmp, out_dir / "profile.json")
    return prof
