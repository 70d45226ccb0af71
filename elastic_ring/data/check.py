"""The dataset check the controller makes before any worker starts: torch-free for the offline
digits and the synthetic set (the controller's process then never imports torch)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
from pathlib import Path

from elastic_ring.errors import DatasetError

DIGITS_FILES = ("digits-train.pt", "digits-test.pt")
DIGITS_FORMAT = 1  # bump when the digits' tensors change (split, upsampling, normalisation)


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


def machine_cache_root() -> Path:
    """The machine's cache folder: ``$ELASTIC_RING_CACHE``, else ``~/.cache/elastic-ring``."""
    from elastic_ring import env

    return Path(env.cache_dir())


def _digits_key() -> str | None:
    """What the digits' tensors depend on: scikit-learn's file (path, size, mtime), torch's
    version (its file format) and :data:`DIGITS_FORMAT`; None without scikit-learn."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        return None
    src = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
    try:
        st = src.stat()
        torch_version = importlib.metadata.version("torch")
    except (OSError, importlib.metadata.PackageNotFoundError):
        return None
    raw = f"{src}:{st.st_size}:{st.st_mtime_ns}|torch {torch_version}|format {DIGITS_FORMAT}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def copy_machine_digits(cache_dir: Path) -> bool:
    """Fill a run's ``cache_dir`` with the digits' two tensor files from the machine's cache, by a
    file copy: the controller then never imports torch (about 2 s of CPU at each run's start).
    False when the machine has no such copy yet (or it cannot be read)."""
    key = _digits_key()
    if key is None:
        return False
    src = machine_cache_root() / "datasets" / f"digits-{key}"
    if not all((src / f).is_file() for f in DIGITS_FILES):
        return False
    cache_dir.mkdir(parents=True, exist_ok=True)
    for f in DIGITS_FILES:
        tmp = cache_dir / f".{f}.tmp-{os.getpid()}"
        try:
            shutil.copyfile(src / f, tmp)
        except OSError:
            tmp.unlink(missing_ok=True)
            return False
        os.replace(tmp, cache_dir / f)
    return True


def keep_machine_digits(cache_dir: Path) -> None:
    """Keep the digits' tensor files just written into a run's ``cache_dir`` in the machine's
    cache for the next runs (all or nothing: a folder renamed into place). A cache that cannot be
    written (read-only home, full disk) is skipped silently: it only saves time."""
    key = _digits_key()
    if key is None:
        return
    root = machine_cache_root() / "datasets"
    dest = root / f"digits-{key}"
    if dest.is_dir():
        return
    tmp = root / f".digits-{key}.tmp-{os.getpid()}"
    try:
        tmp.mkdir(parents=True, exist_ok=True)
        for f in DIGITS_FILES:
            shutil.copyfile(cache_dir / f, tmp / f)
        os.rename(tmp, dest)
    except OSError:  # another run kept it first, or the cache is not writable
        shutil.rmtree(tmp, ignore_errors=True)
