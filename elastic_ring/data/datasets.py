"""In-memory image datasets as uint8 tensors, with batch-level augmentation.

- ``cifar10``: torchvision's CIFAR-10 in ``data_dir``: its extracted ``cifar-10-batches-py/``
  folder, or the ``cifar-10-python.tar.gz`` archive (checked and unpacked there once). Nothing is
  downloaded: a missing set is a :class:`DatasetError` at once saying where to put the files
  (a download from the run's start-up would hang on a machine without network, and leave an
  empty folder behind). torchvision checks the files' md5 sums, so a corrupt copy is reported as
  such.
- ``synthetic``: CIFAR-shaped random images and labels (for benchmarks and tests; nothing to learn),
  32x32x3 unless a smaller side is asked (``synthetic_side``: a cheaper step for tests and demos).
- ``digits``: scikit-learn's 1,797 handwritten 8x8 digits (real data, shipped with scikit-learn,
  works offline), upsampled x4 (nearest) to 32x32 and repeated over 3 channels. A fixed split,
  independent of the training seed: 1,437 train / 360 test.

The whole set is held in memory (CIFAR-10: 150 MB as uint8); augmentation (pad-4 random crop,
horizontal flip) runs on a batch at once with an explicit generator, so a resumed run draws the
same augmentation as an uninterrupted one.
"""

from __future__ import annotations

import importlib.util
import io
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from elastic_ring.errors import DatasetError

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)
DIGITS_SPLIT_SEED = 1234
DIGITS_TEST = 360
SYNTHETIC_TEST = 512


@dataclass
class ArrayDataset:
    images: torch.Tensor  # uint8 [N, 3, 32, 32]
    labels: torch.Tensor  # int64 [N]
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    name: str

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def to(self, device) -> "ArrayDataset":
        """The same data on ``device`` (CIFAR-10's 50,000 training images are 150 MB as uint8)."""
        return ArrayDataset(self.images.to(device), self.labels.to(device), self.mean, self.std, self.name)


CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar.html"


def _cifar10(data_dir: str, train: bool, unpack: bool = True) -> ArrayDataset:
    """CIFAR-10 from ``data_dir`` (``unpack``: a ``cifar-10-python.tar.gz`` there is checked and
    unpacked first when the folder is missing).

    Raises:
        DatasetError: missing (saying where to put the files) or corrupt.
    """
    import torchvision  # heavy; imported only when CIFAR is used
    from torchvision.datasets.utils import check_integrity, extract_archive

    root = Path(data_dir)
    folder = root / "cifar-10-batches-py"
    cls = torchvision.datasets.CIFAR10
    archive = root / cls.filename
    if not folder.exists() and unpack and archive.is_file():
        if not check_integrity(str(archive), cls.tgz_md5):
            raise DatasetError(f"{archive} is corrupt or incomplete (md5 check failed): put a fresh copy "
                               f"(from {CIFAR_URL}) there")
        try:
            extract_archive(str(archive), str(root))
        except Exception as e:  # noqa: BLE001 - a damaged archive or a full disk: one line
            raise DatasetError(f"cannot unpack {archive}: {e}") from None
    if not folder.exists():
        raise DatasetError(
            f"CIFAR-10 not found in {root}: put cifar-10-python.tar.gz (from {CIFAR_URL}) or its "
            f"extracted cifar-10-batches-py/ folder into {root} (or point --data-dir at them); "
            f"nothing is downloaded")
    try:
        ds = cls(str(root), train=train, download=False)
    except RuntimeError:
        raise DatasetError(
            f"CIFAR-10 in {folder} is corrupt or incomplete (md5 check failed): "
            f"delete it and put a fresh cifar-10-python.tar.gz into {root}") from None
    images = torch.from_numpy(np.ascontiguousarray(ds.data.transpose(0, 3, 1, 2)))
    labels = torch.as_tensor(ds.targets, dtype=torch.int64)
    return ArrayDataset(images, labels, CIFAR_MEAN, CIFAR_STD, "cifar10")


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1,797 handwritten digits as ``(x, y)``: ``x`` float64 [1797, 64] (pixel values
    0-16), ``y`` int64 [1797]: the values ``sklearn.datasets.load_digits(return_X_y=True)`` returns,
    read from the file scikit-learn ships without importing it (that import costs a worker process
    about 1.7 s of CPU at every start; reading the file, about 20 ms)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise DatasetError("the digits dataset comes with scikit-learn, which is not installed")
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
    if not path.exists():
        raise DatasetError(f"scikit-learn's digits file is missing: {path}")
    data = np.loadtxt(path, delimiter=",")
    return np.ascontiguousarray(data[:, :-1]), data[:, -1].astype(np.int64)


def _digits(train: bool) -> ArrayDataset:
    flat, target = load_digits()
    x = torch.from_numpy((flat.reshape(-1, 8, 8) * (255.0 / 16.0)).round().astype(np.uint8))  # [N, 8, 8]
    y = torch.from_numpy(target)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(DIGITS_SPLIT_SEED))
    idx = order[DIGITS_TEST:] if train else order[:DIGITS_TEST]
    x = x[idx].repeat_interleave(4, dim=1).repeat_interleave(4, dim=2)  # 32x32 nearest
    x = x.unsqueeze(1).expand(-1, 3, -1, -1).contiguous()
    m = float(x.float().mean() / 255.0)
    s = float(x.float().std() / 255.0)
    return ArrayDataset(x, y[idx], (m, m, m), (s, s, s), "digits")


def _synthetic(size: int, seed: int, train: bool, side: int = 32) -> ArrayDataset:
    n = size if train else SYNTHETIC_TEST
    g = torch.Generator().manual_seed(seed * 2 + (0 if train else 1))
    images = torch.randint(0, 256, (n, 3, side, side), generator=g, dtype=torch.uint8)
    labels = torch.randint(0, 10, (n,), generator=g)
    return ArrayDataset(images, labels, (0.5, 0.5, 0.5), (0.29, 0.29, 0.29), "synthetic")


def _cache_file(cache_dir: str | Path, name: str, train: bool, synthetic_size: int, seed: int,
                synthetic_side: int = 32) -> Path:
    tag = f"{name}-{'train' if train else 'test'}"
    if name == "synthetic":
        tag += f"-n{synthetic_size}-s{seed}" + (f"-px{synthetic_side}" if synthetic_side != 32 else "")
    return Path(cache_dir) / f"{tag}.pt"


def materialize(name: str, cache_dir: str | Path, data_dir: str = "data", synthetic_size: int = 4096,
                seed: int = 0, synthetic_side: int = 32) -> None:
    """Write the train and test sets as uint8 tensors into ``cache_dir`` (once per run).

    Workers then load them in milliseconds instead of parsing CIFAR's pickles or importing
    scikit-learn at every (re)launch: that is part of the resize cost.
    """
    for train in (True, False):
        path = _cache_file(cache_dir, name, train, synthetic_size, seed, synthetic_side)
        if path.exists():
            continue
        ds = load_dataset(name, train, data_dir, synthetic_size, seed, synthetic_side=synthetic_side)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        buf = io.BytesIO()  # serialised in memory: a full disk is then an OSError naming its cause
        torch.save({"images": ds.images, "labels": ds.labels, "mean": ds.mean, "std": ds.std,
                    "name": ds.name}, buf)
        try:
            tmp.write_bytes(buf.getvalue())
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise


def load_dataset(name: str, train: bool, data_dir: str = "data", synthetic_size: int = 4096,
                 seed: int = 0, download: bool = True, cache_dir: str | Path | None = None,
                 synthetic_side: int = 32) -> ArrayDataset:
    """Load a dataset into memory (from ``cache_dir`` when :func:`materialize` filled it).

    ``download``: whether CIFAR-10's archive in ``data_dir`` may be unpacked there (the controller
    does it once; workers read the run's cache). Nothing is fetched from the network.
    ``synthetic_side``: the synthetic set's image side in pixels (the other sets are 32x32).

    Raises:
        DatasetError: unknown name, or CIFAR-10 missing or corrupt.
    """
    if cache_dir is not None:
        path = _cache_file(cache_dir, name, train, synthetic_size, seed, synthetic_side)
        if path.exists():
            d = torch.load(path, weights_only=False)
            return ArrayDataset(d["images"], d["labels"], tuple(d["mean"]), tuple(d["std"]), d["name"])
    if name == "cifar10":
        return _cifar10(data_dir, train, unpack=download)
    if name == "digits":
        return _digits(train)
    if name == "synthetic":
        return _synthetic(synthetic_size, seed, train, synthetic_side)
    raise DatasetError(f"unknown dataset {name!r} (choose cifar10, synthetic or digits)")


def make_batch(ds: ArrayDataset, indices: torch.Tensor, augment: bool,
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Gather ``indices``, augment (pad-4 random crop + horizontal flip) and normalise, on the device
    that holds ``ds`` (``ds.to("cuda")``: the batch is made on the GPU, off the host's critical path).

    The random crops and flips are drawn on the CPU from ``generator`` whatever the device, so a
    batch is the same on the CPU and on a GPU; they travel with the indices in one small copy.
    """
    dev = ds.images.device
    n = len(indices)
    if augment and n > 0:
        g = generator if generator is not None else torch.Generator().manual_seed(0)
        ox = torch.randint(0, 9, (n,), generator=g)
        oy = torch.randint(0, 9, (n,), generator=g)
        flip = torch.rand(n, generator=g) < 0.5
        packed = torch.stack([indices.long(), ox, oy, flip.long()]).to(dev, non_blocking=True)
        idx, ox, oy, flip = packed[0], packed[1], packed[2], packed[3].bool()
    else:
        idx = indices.to(dev, non_blocking=True)
    x = ds.images[idx].float().div_(255.0)
    y = ds.labels[idx]
    if augment and n > 0:
        padded = F.pad(x, (4, 4, 4, 4))
        ar = torch.arange(x.shape[-1], device=dev)  # the side (32 but for a smaller synthetic set)
        rows = (oy[:, None] + ar[None, :])  # [n, side]
        cols = (ox[:, None] + ar[None, :])
        cols = torch.where(flip[:, None], cols.flip(1), cols)
        x = padded[torch.arange(n, device=dev)[:, None, None, None], torch.arange(3, device=dev)[None, :, None, None],
                   rows[:, None, :, None], cols[:, None, None, :]]
    mean = torch.tensor(ds.mean, device=dev).view(1, 3, 1, 1)
    std = torch.tensor(ds.std, device=dev).view(1, 3, 1, 1)
    return (x - mean) / std, y
