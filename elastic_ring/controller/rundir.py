"""Creating a run folder: one function for `train`, `profile` and `experiment`.

A new run's folder holds the resolved ``config.yaml`` (the built-in ResNet worker's recipe; none
for a user's ``--script``), the request in ``run.json`` (with the workers' settings under
``worker``) and, for the built-in worker, the dataset materialised under ``cache/`` (so no worker
of any segment parses CIFAR's pickles or imports scikit-learn: that is part of every relaunch's
cost).
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import yaml

from elastic_ring import env, protocol
from elastic_ring.config.api import TrainConfig, config_to_dict
from elastic_ring.controller.api import RunSpec
from elastic_ring.errors import UserError


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """Turn a failed write under ``path`` (disk full, read-only, permission) into one line naming
    the file and the OS's reason (exit status 2), instead of a traceback."""
    try:
        yield
    except OSError as e:
        where = e.filename or path
        raise UserError(f"cannot write the run folder: {where}: {e.strerror or e}") from None


def stop_latency_ms(cfg: TrainConfig | None) -> int:
    """The run's ``stop_latency_ms``: ``ELASTIC_RING_STOP_LATENCY_MS`` where set (a script run has
    no config), else the config's, else the default."""
    try:
        value = env.stop_latency_ms()
    except ValueError as e:
        raise UserError(str(e)) from None
    if value is not None:
        return value
    return cfg.stop_latency_ms if cfg else protocol.STOP_LATENCY_MS


def worker_settings(spec: RunSpec, cfg: TrainConfig | None) -> dict[str, Any]:
    """What every worker reads from ``run.json`` (see ``protocol.LaunchInfo``)."""
    return {
        "total_steps": spec.total_steps, "device": spec.device,
        "checkpoint_every": spec.checkpoint_every, "checkpoint_every_s": spec.checkpoint_every_s,
        "keep": spec.keep, "collective": spec.collective,
        "lr_scaling": cfg.lr_scaling if cfg else (spec.lr_scaling or "linear"),
        "global_batch": cfg.global_batch if cfg else spec.global_batch,
        "control_every": cfg.control_every if cfg else 1,
        "stop_latency_ms": stop_latency_ms(cfg),
        "throughput_window": cfg.throughput_window if cfg else 20,
        "eval_every": cfg.eval_every if cfg else 0,
        "cwd": spec.cwd,
    }


def create_run_dir(spec: RunSpec, cfg: TrainConfig | None, **extra: Any) -> None:
    """Write ``config.yaml`` and ``run.json`` into ``spec.run_dir`` and fill its dataset cache."""
    rd = spec.run_dir
    settings = worker_settings(spec, cfg)  # (a bad setting is told before anything is written)
    with writing(rd):
        rd.mkdir(parents=True, exist_ok=True)
        if cfg is not None:
            _write(rd / "config.yaml", yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
        _write(rd / "run.json", json.dumps({
            "workers": spec.workers, "schedule": [[r.step, r.to] for r in spec.schedule],
            "slots": spec.slots, "device": spec.device, "hosts": spec.hosts, "hostfile": spec.hostfile,
            "total_steps": spec.total_steps, "script": spec.script, "script_args": list(spec.script_args),
            "worker": settings,
            "created": time.time(), "argv": sys.argv[1:], **extra}, indent=2))
    if cfg is not None:
        ensure_dataset_cache(spec.run_dir, cfg)


def _write(path: Path, text: str) -> None:
    """Write and flush to the disk, so that a full disk fails here and names ``path``."""
    try:
        with open(path, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        if e.filename is None:
            e.filename = str(path)
        raise


def update_worker_settings(run_dir: Path, **changes: Any) -> None:
    """Change workers' settings of an existing run (e.g. checkpoint flags given at --resume)."""
    info = protocol.run_info(run_dir)
    info.setdefault("worker", {}).update({k: v for k, v in changes.items() if v is not None})
    _replace_run_info(Path(run_dir), info)


def update_run_info(run_dir: Path, **changes: Any) -> None:
    """Change the controller's settings kept in ``run.json`` (e.g. ``--stall-timeout`` given at
    --resume, which later resumes keep)."""
    info = protocol.run_info(run_dir)
    info.update(changes)
    _replace_run_info(Path(run_dir), info)


def _replace_run_info(run_dir: Path, info: dict[str, Any]) -> None:
    path = run_dir / protocol.RUN_FILE
    tmp = path.with_name(".run.json.tmp")
    tmp.write_text(json.dumps(info, indent=2))
    tmp.replace(path)
    protocol.remember_run_info(run_dir, info)  # this process reads it again from memory


def ensure_dataset_cache(run_dir: Path, cfg: TrainConfig) -> None:
    if cfg.dataset == "synthetic":  # made by each worker from its seed in milliseconds, the same tensors
        return  # (no cache to write, so this controller never imports torch)
    from elastic_ring.data.check import copy_machine_digits, keep_machine_digits

    cache = run_dir / "cache"
    with writing(cache):
        if cfg.dataset == "digits" and copy_machine_digits(cache):
            return  # the machine's copy: no torch in this process
        from elastic_ring.data import materialize  # imports torch

        materialize(cfg.dataset, cache, cfg.data_dir, cfg.synthetic_size, cfg.seed, cfg.synthetic_side)
        if cfg.dataset == "digits":
            keep_machine_digits(cache)
