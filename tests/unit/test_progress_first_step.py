"""The progress file and a segment's first step: rank 0 writes it at most twice a second, but a
segment's first step always (hvdrun's check that a warm joiner's ring formed is that the file is
newer than the joiner's start: a joiner stalled a few tenths of a second after its ring's first
step was otherwise taken for one that never joined, and started again while the survivor waited
to shrink without it; a fresh-clone CI run hung so in test_inplace_survive)."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

from elastic_ring import protocol
from elastic_ring.worker.progress import Progress, StartUp
from elastic_ring.worker.segment import Segment


def _progress(tmp_path) -> Progress:
    ring = SimpleNamespace(rank=0, size=2, local_size=2, threads=None)
    return Progress(tmp_path, ring, Segment(number=2, stop_at=100, total_steps=100), StartUp(t_start=time.time()),
                    window_steps=5, eval_every=0, current_lr=lambda: 0.1)


def _written(tmp_path, p: Progress) -> dict:
    p.flush_progress()
    return json.loads((protocol.control_dir(tmp_path) / protocol.PROGRESS_FILE).read_text())


def test_a_segments_first_step_is_written_even_within_half_a_second_of_the_last(tmp_path):
    protocol.control_dir(tmp_path).mkdir(parents=True, exist_ok=True)
    p = _progress(tmp_path)
    now = time.time()
    p.write_progress(3, now)
    assert _written(tmp_path, p)["step"] == 3
    p.write_progress(4, now + 0.1)  # (the half-second rule: not written)
    assert _written(tmp_path, p)["step"] == 3
    p.first_step(4, now + 0.2)  # a new segment's first step (an in-place re-form's) ...
    p.write_progress(4, now + 0.2)
    assert _written(tmp_path, p)["step"] == 4  # ... is written at once
    p.write_progress(5, now + 0.3)
    assert _written(tmp_path, p)["step"] == 4  # and the rule holds again after it
