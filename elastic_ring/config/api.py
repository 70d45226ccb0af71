"""Training configuration: one frozen dataclass, validated on construction.

Settings come from a YAML file under ``configs/`` (``paper.yaml``: ResNet-110 / CIFAR-10 at the
scale of He et al. 2016 on an 8-GPU node; ``cpu_small.yaml``: a small ResNet on the offline digits
set that finishes in minutes on two CPU cores), then from ``--set key=value`` and the dedicated
flags of the CLI. An unknown key is an error, as is a value of the wrong type or range.

The learning-rate recipe of He et al.: ``lr`` per ``lr_reference_batch`` images, scaled linearly
with the global batch ``batch_size * workers``; decays by ``decay_factor`` at the fractions
``decay_at`` of ``total_steps``; optional linear warm-up over ``warmup_steps``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from elastic_ring.errors import ConfigError

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
DEFAULT_CONFIGS = {"cuda": "paper.yaml", "cpu": "cpu_small.yaml"}

DATASETS = ("cifar10", "synthetic", "digits")
LR_SCALINGS = ("linear", "sqrt", "none")


@dataclass(frozen=True)
class TrainConfig:
    """Everything a worker needs to train, and nothing about where it runs.

    Attributes:
        depth: ResNet depth, 6n+2 (20, 32, 44, 56, 110; small test depths such as 8 allowed).
        width: channels of the first stage (16 in He et al.; smaller for tests).
        dataset: ``cifar10``, ``synthetic`` (CIFAR-shaped random tensors) or ``digits``
            (scikit-learn's 8x8 digits, upsampled to 32x32x3; real and offline).
        data_dir: where CIFAR-10 lives or is downloaded to.
        batch_size: per-worker minibatch.
        lr: learning rate per ``lr_reference_batch`` images of global batch.
        total_steps: length of the schedule in optimizer steps, whatever the world size.
        decay_at: fractions of ``total_steps`` at which the LR is multiplied by ``decay_factor``.
        warmup_steps: linear warm-up from ``lr / workers`` at the start of training (0: none).
        resize_warmup_steps: after a resize, ramp linearly from the old LR to the Eq. 7 LR over
            this many steps (0: jump at once, as Eq. 7 says).
        lr_scaling: rule applied at a resize: ``linear`` (Eq. 7), ``sqrt`` or ``none``.
        augment: pad-4 random crop + horizontal flip on the training set.
        synthetic_size: number of distinct samples in the synthetic set.
        throughput_window: steps per throughput event.
        control_every: steps between the checks, agreed by all ranks, for a live stop request.
        eval_batch_size: per-worker batch at test time.
        seed: seed of the sample order, the augmentation and the initial weights.
        trace_samples: write every rank's sample indices per step (for tests of exact resume).
        max_test_samples: evaluate on at most this many test samples (0: all).
        eval_every: also evaluate on the test set every this many steps (0: only at the end);
            the evaluation time is left out of the throughput windows.
    """

    depth: int = 20
    width: int = 16
    dataset: str = "digits"
    data_dir: str = "data"
    batch_size: int = 128
    lr: float = 0.1
    lr_reference_batch: int = 128
    momentum: float = 0.9
    weight_decay: float = 1e-4
    total_steps: int = 200
    decay_at: tuple[float, ...] = (0.5, 0.75)
    decay_factor: float = 0.1
    warmup_steps: int = 0
    resize_warmup_steps: int = 0
    lr_scaling: str = "linear"
    augment: bool = True
    synthetic_size: int = 4096
    throughput_window: int = 20
    control_every: int = 1
    eval_batch_size: int = 256
    seed: int = 0
    trace_samples: bool = False
    max_test_samples: int = 0
    eval_every: int = 0
    num_classes: int = field(default=10)

    def __post_init__(self) -> None:
        def bad(msg: str) -> None:
            raise ConfigError(f"invalid config: {msg}")

        if self.depth < 8 or (self.depth - 2) % 6 != 0:
            bad(f"depth must be 6n+2 with n >= 1 (20, 32, 44, 56, 110), got {self.depth}")
        if self.width < 1:
            bad(f"width must be >= 1, got {self.width}")
        if self.dataset not in DATASETS:
            bad(f"dataset must be one of {', '.join(DATASETS)}, got {self.dataset!r}")
        if self.lr_scaling not in LR_SCALINGS:
            bad(f"lr_scaling must be one of {', '.join(LR_SCALINGS)}, got {self.lr_scaling!r}")
        for name in ("batch_size", "total_steps", "lr_reference_batch", "throughput_window",
                     "control_every", "eval_batch_size", "synthetic_size"):
            if getattr(self, name) < 1:
                bad(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "resize_warmup_steps", "max_test_samples", "eval_every"):
            if getattr(self, name) < 0:
                bad(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.lr <= 0:
            bad(f"lr must be > 0, got {self.lr}")
        if not 0 <= self.momentum < 1:
            bad(f"momentum must be in [0, 1), got {self.momentum}")
        if self.weight_decay < 0:
            bad(f"weight_decay must be >= 0, got {self.weight_decay}")
        if not 0 < self.decay_factor <= 1:
            bad(f"decay_factor must be in (0, 1], got {self.decay_factor}")
        if any(not 0 < f < 1 for f in self.decay_at) or list(self.decay_at) != sorted(self.decay_at):
            bad(f"decay_at must be increasing fractions in (0, 1), got {list(self.decay_at)}")

    @property
    def decay_steps(self) -> tuple[int, ...]:
        """Steps after which the LR decays (the decay applies from the next step on)."""
        return tuple(int(round(f * self.total_steps)) for f in self.decay_at)

    def replace(self, **changes: Any) -> "TrainConfig":
        return _build(config_to_dict(self) | changes, source="overrides")


_FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}


def config_to_dict(cfg: TrainConfig) -> dict[str, Any]:
    d = dataclasses.asdict(cfg)
    d["decay_at"] = list(cfg.decay_at)
    return d


def coerce_scalar(default: Any, value: Any) -> Any:
    """Read ``value`` as the type of ``default`` (bool, int, float or str); ValueError if it is not.

    Shared by every config of the project (train, ps) so a YAML value or a ``--set`` string is
    read the same way everywhere.
    """
    if isinstance(default, bool):
        if isinstance(value, str):
            if value.lower() in ("1", "true", "yes", "on"):
                return True
            if value.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if not isinstance(value, bool):
            raise ValueError(value)
        return value
    if isinstance(default, int):
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError(value)
        return int(value)
    if isinstance(default, float):
        if isinstance(value, bool):
            raise ValueError(value)
        return float(value)
    return str(value)


def _coerce(name: str, value: Any, source: str) -> Any:
    default = _FIELDS[name].default
    try:
        if isinstance(default, tuple):
            if isinstance(value, str):
                value = [v for v in value.replace("[", "").replace("]", "").split(",") if v.strip()]
            return tuple(float(v) for v in value)
        return coerce_scalar(default, value)
    except (TypeError, ValueError):
        raise ConfigError(f"{source}: {name} has the wrong type: {value!r}") from None


def _build(values: Mapping[str, Any], source: str) -> TrainConfig:
    unknown = sorted(set(values) - set(_FIELDS))
    if unknown:
        raise ConfigError(f"{source}: unknown config key(s): {', '.join(unknown)}")
    return TrainConfig(**{k: _coerce(k, v, source) for k, v in values.items()})


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping, raising :class:`ConfigError` with one line on any problem."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read config {p}: {e.strerror or e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        raise ConfigError(f"config {p} is not valid YAML{line}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config {p} must be a mapping of keys to values")
    return data


def parse_overrides(pairs: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Parse ``key=value`` strings; values are read as YAML scalars."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value, got {pair!r}")
        try:
            out[key.strip()] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            out[key.strip()] = raw
    return out


def load_config(path: str | Path | None = None, overrides: Mapping[str, Any] | None = None,
                device: str = "cpu") -> TrainConfig:
    """Load a config file (default: the one for ``device``) and apply overrides.

    Raises:
        ConfigError: unreadable file, invalid YAML, unknown key, wrong type or invalid value.
    """
    if path is None:
        path = CONFIG_DIR / DEFAULT_CONFIGS["cuda" if device == "cuda" else "cpu"]
    values = read_yaml(path)
    source = str(path)
    cfg_values = dict(values)
    if overrides:
        cfg_values.update({k: v for k, v in overrides.items() if v is not None})
        source = f"{path} + overrides"
    return _build(cfg_values, source)
