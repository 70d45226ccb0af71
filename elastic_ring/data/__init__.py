"""Datasets (CIFAR-10, synthetic, offline digits) and the exact-resume sample stream.

The names load on first use (PEP 562), so that ``from elastic_ring.data import check_dataset`` in the
controller does not import torch."""

from __future__ import annotations

import importlib

_WHERE = {"ArrayDataset": "datasets", "load_dataset": "datasets", "load_digits": "datasets",
          "make_batch": "datasets", "materialize": "datasets", "check_dataset": "check",
          "SampleStream": "stream"}

__all__ = list(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value
