"""Atomic, checksummed checkpoints; the previous one is always kept."""

from elastic_ring.ckpt.store import CheckpointStore, save_atomic, load_verified

__all__ = ["CheckpointStore", "save_atomic", "load_verified"]
