"""The dataset check the controller makes before any worker starts: torch-free for the offline
digits and the synthetic set (the controller's process then never imports torch)."""

from __future__ import annotations

from elastic_ring.errors import DatasetError


def check_dataset(name: str, data_dir: str = "data") -> None:
    """Fail fast, before any worker starts, when the dataset cannot be loaded.

    For CIFAR-10 this unpacks its archive when only the archive is there (once, in the controller),
    so the workers never race to do it. Raises :class:`DatasetError`.
    """
    if name == "cifar10":
        from elastic_ring.data.datasets import _cifar10

        _cifar10(data_dir, train=True)
        _cifar10(data_dir, train=False)
    elif name not in ("digits", "synthetic"):
        raise DatasetError(f"unknown dataset {name!r} (choose cifar10, synthetic or digits)")
