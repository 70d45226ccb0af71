"""Validated, frozen training configuration (the blueprint), loaded from YAML with overrides."""

from elastic_ring.config.api import TrainConfig, load_config, config_to_dict, DEFAULT_CONFIGS

__all__ = ["TrainConfig", "load_config", "config_to_dict", "DEFAULT_CONFIGS"]
