"""The sample stream that makes a resume exact across a change of world size.

The training order is one endless stream: epoch e is a permutation of the dataset drawn from
``(seed, e)``, and the stream is epoch 0's permutation, then epoch 1's, and so on. A step with
``w`` workers of batch ``b`` consumes the next ``w * b`` positions of the stream; rank r takes the
r-th contiguous share. The only state is the cursor (positions consumed so far), which the
checkpoint stores; the epoch is ``cursor // N`` and the position inside it ``cursor % N``. Hence,
whatever the world size before and after a resize, every sample of every epoch is seen exactly
once, and a batch may straddle the end of an epoch rather than drop or repeat samples.
"""

from __future__ import annotations

import torch


class SampleStream:
    def __init__(self, size: int, seed: int) -> None:
        if size < 1:
            raise ValueError("empty dataset")
        self.size = size
        self.seed = seed
        self._cache: dict[int, torch.Tensor] = {}

    def permutation(self, epoch: int) -> torch.Tensor:
        perm = self._cache.get(epoch)
        if perm is None:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            perm = torch.randperm(self.size, generator=g)
            self._cache = {epoch: perm}  # keep the current epoch only
        return perm

    def take(self, cursor: int, count: int) -> torch.Tensor:
        """Dataset indices at stream positions ``[cursor, cursor + count)``."""
        parts = []
        while count > 0:
            epoch, pos = divmod(cursor, self.size)
            n = min(count, self.size - pos)
            parts.append(self.permutation(epoch)[pos:pos + n])
            cursor += n
            count -= n
        return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)

    def epoch_of(self, cursor: int) -> tuple[int, int]:
        """(epoch, position inside the epoch) of a cursor."""
        return divmod(cursor, self.size)
