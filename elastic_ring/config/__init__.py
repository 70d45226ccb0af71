"""Configuration: validated, frozen blueprints loaded from YAML with ``--set`` overrides.

- :mod:`.base` — the layer every config is built on: :class:`ConfigModel` (pydantic, unknown keys
  refused, frozen), :func:`load` (YAML file + ``--set key=value``), :func:`build`, and the one-line
  :class:`~elastic_ring.errors.ConfigError` format of every config.
- :mod:`.api` — the training config :class:`TrainConfig` and :func:`load_config`.

The other configs live with their subsystems: ``elastic_ring.ps.api.PSConfig``,
``elastic_ring.experiment.resize.ResizeDesign`` and ``elastic_ring.experiment.ps_design.DesignSpec``.
"""

from elastic_ring.config.api import DEFAULT_CONFIGS, TrainConfig, config_to_dict, load_config
from elastic_ring.config.base import ConfigModel, build, load, parse_overrides, read_yaml

__all__ = ["ConfigModel", "build", "load", "parse_overrides", "read_yaml",
           "TrainConfig", "load_config", "config_to_dict", "DEFAULT_CONFIGS"]
