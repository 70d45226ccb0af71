"""An offline stand-in for MNIST, to run a script written for torchvision's MNIST with no download:
scikit-learn's 1,797 handwritten 8x8 digits, upscaled to 28x28, written as MNIST's four idx files
(1,440 to train, 357 to test), where ``torchvision.datasets.MNIST(DIR, download=True)`` finds them
and downloads nothing.

    python scripts/mnist_standin.py DIR

Used to check Horovod's own ``examples/pytorch/pytorch_mnist.py`` adapted to the worker library
(docs/worker.md): ``elastic-ring train --script pytorch_mnist.py ... -- --data-dir DIR``.
"""

from __future__ import annotations

import argparse
import struct
from pathlib import Path


def write(folder: Path, train: int = 1440) -> Path:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from elastic_ring.data import load_digits  # scikit-learn's digits, read without importing it

    x, y = load_digits()
    img = F.interpolate(torch.tensor(x, dtype=torch.float32).reshape(-1, 1, 8, 8), size=(28, 28),
                        mode="bilinear")
    img = (img / 16.0 * 255).clamp(0, 255).round().to(torch.uint8).reshape(-1, 28, 28).numpy()
    raw = folder / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for name, part in (("train", slice(0, train)), ("t10k", slice(train, None))):
        im, lb = img[part], y[part].astype(np.uint8)
        (raw / f"{name}-images-idx3-ubyte").write_bytes(struct.pack(">IIII", 2051, len(im), 28, 28) + im.tobytes())
        (raw / f"{name}-labels-idx1-ubyte").write_bytes(struct.pack(">II", 2049, len(lb)) + lb.tobytes())
    return raw


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", type=Path, help="the data folder the script reads (its --data-dir)")
    a = p.parse_args()
    print(f"MNIST stand-in written to {write(a.dir)}")


if __name__ == "__main__":
    main()
