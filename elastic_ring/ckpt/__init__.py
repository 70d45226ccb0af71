"""Atomic, checksummed checkpoints: the last K kept, fallback past a corrupt one, background writes."""

from elastic_ring.ckpt.store import (BackgroundWriter, CheckpointStore, load, load_verified, save_atomic,
                                     snapshot)

__all__ = ["BackgroundWriter", "CheckpointStore", "load", "load_verified", "save_atomic", "snapshot"]
