"""Checkpoints written atomically and verified on load.

File format: the 8-byte magic ``ERCKPT01``, the SHA-256 of the payload (32 bytes), then the
payload (``torch.save`` of a dict). A write goes to a temporary file in the same folder, is
fsynced, renamed over its final name, and the folder is fsynced: a crash leaves either the old
file or the new one, never half of one. ``latest.json`` (also written atomically) names the
current checkpoint and the previous one; older files are deleted only after the new one is in
place, so the previous checkpoint always survives.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from elastic_ring.errors import CheckpointError

MAGIC = b"ERCKPT01"


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def save_atomic(path: str | Path, state: dict[str, Any]) -> int:
    """Serialise ``state`` to ``path`` atomically; returns the file size in bytes."""
    buf = io.BytesIO()
    torch.save(state, buf)
    payload = buf.getvalue()
    data = MAGIC + hashlib.sha256(payload).digest() + payload
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    _write_atomic(p, data)
    return len(data)


def load_verified(path: str | Path) -> dict[str, Any]:
    """Load a checkpoint after checking its magic and checksum.

    Raises:
        CheckpointError: missing, truncated, not a checkpoint, or checksum mismatch.
    """
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {p}: {e.strerror or e}") from None
    if len(data) < len(MAGIC) + 32 or not data.startswith(MAGIC):
        raise CheckpointError(f"checkpoint {p} is corrupt (not an elastic-ring checkpoint or truncated)")
    digest, payload = data[len(MAGIC):len(MAGIC) + 32], data[len(MAGIC) + 32:]
    if hashlib.sha256(payload).digest() != digest:
        raise CheckpointError(f"checkpoint {p} is corrupt (SHA-256 mismatch)")
    try:
        return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=False)
    except Exception as e:  # a payload that passed the checksum but does not unpickle
        raise CheckpointError(f"checkpoint {p} does not load: {type(e).__name__}") from None


class CheckpointStore:
    """A run's checkpoint folder: ``ckpt-<step>.pt`` files and ``latest.json``."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    @property
    def index_path(self) -> Path:
        return self.folder / "latest.json"

    def index(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.index_path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, json.JSONDecodeError):
            raise CheckpointError(f"checkpoint index {self.index_path} is corrupt") from None

    def latest_path(self) -> Path | None:
        idx = self.index()
        return self.folder / idx["current"] if idx else None

    def save(self, state: dict[str, Any]) -> tuple[Path, int, float]:
        """Write a checkpoint for ``state['step']``; returns (path, bytes, seconds)."""
        t0 = time.perf_counter()
        step = int(state["step"])
        path = self.folder / f"ckpt-{step:08d}.pt"
        size = save_atomic(path, state)
        old = self.index() or {}
        previous = old.get("current") if old.get("current") != path.name else old.get("previous")
        idx = {"current": path.name, "previous": previous, "step": step, "time": time.time()}
        _write_atomic(self.index_path, json.dumps(idx).encode())
        keep = {path.name, previous}
        for f in self.folder.glob("ckpt-*.pt"):
            if f.name not in keep:
                f.unlink(missing_ok=True)
        return path, size, time.perf_counter() - t0

    def load_latest(self) -> dict[str, Any] | None:
        """The current checkpoint, verified; None when the run has none yet."""
        path = self.latest_path()
        return None if path is None else load_verified(path)

    def verify_latest(self) -> int | None:
        """Check the current checkpoint without keeping it; returns its step (None: none yet)."""
        state = self.load_latest()
        return None if state is None else int(state["step"])
