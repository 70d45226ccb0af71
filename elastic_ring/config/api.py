"""Training configuration: one frozen model, validated on construction.

Settings come from a YAML file; the package carries two in ``elastic_ring/configs/`` (``paper.yaml``: ResNet-110 / CIFAR-10 at the
scale of He et al. 2016 on an 8-GPU node; ``cpu_small.yaml``: a small ResNet on the offline digits
set that finishes in minutes on two CPU cores), then from ``--set key=value`` and the dedicated
flags of the CLI. An unknown key is an error, as is a value of the wrong type or range; the
loading, the value types and the one-line error are those of every config
(:mod:`elastic_ring.config.base`).

The learning-rate recipe of He et al.: ``lr`` per ``lr_reference_batch`` images, scaled linearly
with the global batch ``batch_size * workers``; decays by ``decay_factor`` at the fractions
``decay_at`` of ``total_steps``; optional linear warm-up over ``warmup_steps``.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Sequence, get_args

from pydantic import AfterValidator, Field, field_validator, model_validator

from elastic_ring.config.base import Bool, ConfigModel, Float, FloatTuple, Int, Str, load

DEFAULT_CONFIGS = {"cuda": "paper.yaml", "cpu": "cpu_small.yaml"}

Dataset = Literal["cifar10", "synthetic", "digits"]
DATASETS = get_args(Dataset)


def _depth(d: int) -> int:
    if d < 8 or (d - 2) % 6:
        raise ValueError(f"must be 6n+2 with n >= 1 (8, 14, 20, 32, 44, 56, 110, ...), got {d}")
    return d


ResNetDepth = Annotated[Int, AfterValidator(_depth)]
"""A CIFAR ResNet depth 6n+2 (He et al.: 20, 32, 44, 56, 110); shared with the ps config."""


class TrainConfig(ConfigModel):
    """Everything a worker needs to train, and nothing about where it runs.

    Attributes:
        depth: ResNet depth, 6n+2 (20, 32, 44, 56, 110; small test depths such as 8 allowed).
        width: channels of the first stage (16 in He et al.; smaller for tests).
        dataset: ``cifar10``, ``synthetic`` (CIFAR-shaped random tensors) or ``digits``
            (scikit-learn's 8x8 digits, upsampled to 32x32x3; real and offline).
        data_dir: where CIFAR-10 lives (its archive or its extracted folder; nothing is downloaded).
        batch_size: per-worker minibatch.
        lr: learning rate per ``lr_reference_batch`` images of global batch.
        total_steps: length of the schedule in optimizer steps, whatever the world size.
        decay_at: fractions of ``total_steps`` at which the LR is multiplied by ``decay_factor``.
        warmup_steps: linear warm-up from ``lr / workers`` at the start of training (0: none).
        resize_warmup_steps: after a resize, ramp linearly from the old LR to the Eq. 7 LR over
            this many steps (0: jump at once, as Eq. 7 says).
        lr_scaling: rule applied at a resize: ``linear`` (Eq. 7), ``sqrt``, ``none``, or
            ``constant-batch``: the global batch stays ``global_batch`` at every world size (each
            worker accumulates gradients over micro-batches of ``batch_size``:
            :mod:`elastic_ring.worker.accumulate`) and the LR is not rescaled.
        global_batch: samples per step under ``constant-batch``, a multiple of ``batch_size``
            (0: ``batch_size`` x the run's initial workers, fixed when the run is created).
        augment: pad-4 random crop + horizontal flip on the training set.
        synthetic_size: number of distinct samples in the synthetic set.
        synthetic_side: the synthetic set's image side in pixels (32: CIFAR's shape; at least 8,
            the built-in ResNet's two halvings then leave 2x2). A smaller side is a cheaper step
            (the test suite's tiny runs whose length is set in steps use 16); the other datasets
            are 32x32 whatever it says.
        throughput_window: steps per throughput event.
        control_every: the fewest steps between two checks, agreed by all ranks, for a live stop
            request (the stop vote); its period adapts above this to the step time.
        stop_latency_ms: the longest a live stop request waits for the next check (the vote's
            period is chosen so that it costs at most 1% of a step, within this); 0: a check
            every ``control_every`` steps exactly.
        eval_batch_size: per-worker batch at test time.
        seed: seed of the sample order, the augmentation and the initial weights.
        trace_samples: write every rank's sample indices per step (for tests of exact resume).
        max_test_samples: evaluate on at most this many test samples (0: all).
        eval_every: also evaluate on the test set every this many steps (0: only at the end);
            the evaluation time is left out of the throughput windows.
        shard: shard the model over the workers with FSDP2's ``fully_shard`` (each residual
            block, then the model) instead of replicating it (DDP): sharded checkpoints
            (:mod:`elastic_ring.worker.sharded`). Needs ``--collective torch``; not with
            ``constant-batch`` (its micro-batches count on DDP's deferred gradient sync).
        min_step_s: each step of the built-in trainer lasts at least this many seconds: it sleeps
            what is left after the step's work (0: no floor). The work and the result are
            unchanged; a step whose work takes longer is not slowed further. For demos and tests
            whose pace a clock should set, not the machine (``examples/paced.py`` does this for
            a script).
    """

    depth: ResNetDepth = 20
    width: Int = Field(16, ge=1)
    dataset: Dataset = "digits"
    data_dir: Str = "data"
    batch_size: Int = Field(128, ge=1)
    lr: Float = Field(0.1, gt=0)
    lr_reference_batch: Int = Field(128, ge=1)
    momentum: Float = Field(0.9, ge=0, lt=1)
    weight_decay: Float = Field(1e-4, ge=0)
    total_steps: Int = Field(200, ge=1)
    decay_at: FloatTuple = (0.5, 0.75)
    decay_factor: Float = Field(0.1, gt=0, le=1)
    warmup_steps: Int = Field(0, ge=0)
    resize_warmup_steps: Int = Field(0, ge=0)
    lr_scaling: Literal["linear", "sqrt", "none", "constant-batch"] = "linear"
    global_batch: Int = Field(0, ge=0)
    augment: Bool = True
    synthetic_size: Int = Field(4096, ge=1)
    synthetic_side: Int = Field(32, ge=8)
    throughput_window: Int = Field(20, ge=1)
    control_every: Int = Field(1, ge=1)
    stop_latency_ms: Int = Field(100, ge=0)
    eval_batch_size: Int = Field(256, ge=1)
    seed: Int = 0
    trace_samples: Bool = False
    max_test_samples: Int = Field(0, ge=0)
    eval_every: Int = Field(0, ge=0)
    num_classes: Int = 10
    shard: Bool = False
    min_step_s: Float = Field(0.0, ge=0)

    @field_validator("decay_at")
    @classmethod
    def _increasing_fractions(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if any(not 0 < f < 1 for f in v) or list(v) != sorted(v):
            raise ValueError(f"must be increasing fractions in (0, 1), got {list(v)}")
        return v

    @model_validator(mode="after")
    def _global_batch_rule(self) -> "TrainConfig":
        if self.global_batch and self.lr_scaling != "constant-batch":
            raise ValueError(f"global_batch {self.global_batch} needs lr_scaling constant-batch "
                             f"(the other rules scale the batch with the workers)")
        if self.shard and self.lr_scaling == "constant-batch":
            raise ValueError("shard=true does not go with lr_scaling constant-batch (its micro-batches "
                             "defer the gradient sync as DDP does; a sharded model syncs every backward pass)")
        if self.global_batch % self.batch_size:
            raise ValueError(f"global_batch {self.global_batch} is not a multiple of batch_size "
                             f"{self.batch_size} (the micro-batch)")
        return self

    @property
    def decay_steps(self) -> tuple[int, ...]:
        """Steps after which the LR decays (the decay applies from the next step on)."""
        return tuple(int(round(f * self.total_steps)) for f in self.decay_at)


def config_to_dict(cfg: TrainConfig) -> dict[str, Any]:
    """``cfg.to_dict()``: what ``RUN_DIR/config.yaml`` holds (tuples as lists)."""
    return cfg.to_dict()


def packaged_config(name: str) -> Path:
    """A config file the package carries (``elastic_ring/configs/NAME``, installed with it as
    package data), so that the defaults need no checkout of the repository."""
    return Path(str(resources.files("elastic_ring") / "configs" / name))


def load_config(path: str | Path | None = None,
                overrides: Sequence[str] | Mapping[str, Any] = (), device: str = "cpu") -> TrainConfig:
    """:func:`~elastic_ring.config.base.load` of a :class:`TrainConfig`; with no ``path``, the
    packaged default for ``device`` (``paper.yaml`` on cuda, ``cpu_small.yaml`` else; :func:`packaged_config`).

    Raises:
        ConfigError: unreadable file, invalid YAML, unknown key, wrong type or invalid value.
    """
    if path is None:
        path = packaged_config(DEFAULT_CONFIGS["cuda" if device == "cuda" else "cpu"])
    return load(TrainConfig, path, overrides or ())
