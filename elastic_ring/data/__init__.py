"""Datasets (CIFAR-10, synthetic, offline digits) and the exact-resume sample stream."""

from elastic_ring.data.datasets import ArrayDataset, load_dataset, load_digits, check_dataset, make_batch, materialize
from elastic_ring.data.stream import SampleStream

__all__ = ["ArrayDataset", "load_dataset", "load_digits", "check_dataset", "make_batch", "materialize", "SampleStream"]
