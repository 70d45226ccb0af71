"""Creating a run folder: one function for `train`, `profile` and `experiment`.

A new run's folder holds the resolved ``config.yaml``, the request in ``run.json`` and the dataset
materialised under ``cache/`` (so no worker of any segment parses CIFAR's pickles or imports
scikit-learn: that is part of every relaunch's cost).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from elastic_ring.config.api import TrainConfig, config_to_dict
from elastic_ring.controller.api import RunSpec
from elastic_ring.data import materialize


def create_run_dir(spec: RunSpec, cfg: TrainConfig, **extra: Any) -> None:
    """Write ``config.yaml`` and ``run.json`` into ``spec.run_dir`` and fill its dataset cache."""
    rd = spec.run_dir
    rd.mkdir(parents=True, exist_ok=True)
    (rd / "config.yaml").write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
    (rd / "run.json").write_text(json.dumps({
        "workers": spec.workers, "schedule": [[r.step, r.to] for r in spec.schedule],
        "slots": spec.slots, "device": spec.device, "hosts": spec.hosts, "hostfile": spec.hostfile,
        "created": time.time(), "argv": sys.argv[1:], **extra}, indent=2))
    ensure_dataset_cache(spec.run_dir, cfg)


def ensure_dataset_cache(run_dir: Path, cfg: TrainConfig) -> None:
    materialize(cfg.dataset, run_dir / "cache", cfg.data_dir, cfg.synthetic_size, cfg.seed)
