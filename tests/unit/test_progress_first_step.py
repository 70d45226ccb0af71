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


def test_a_rank_other_than_0_does_not_import_the_events_module_for_its_first_step_or_a_window(tmp_path):
    """Only rank 0 writes events: another rank's first step and throughput window make none, so
    they do not import ``elastic_ring.events.api`` (12-14 ms in a fresh process, on the first
    step's path: the other ranks then waited for it at the next collective). Rank 0 still writes
    both. In a fresh interpreter: this process has the module already."""
    code = f"""
import sys, time, json
from pathlib import Path
from types import SimpleNamespace
from elastic_ring import protocol
from elastic_ring.worker.progress import Progress, StartUp
from elastic_ring.worker.segment import Segment

out = {{}}
for rank in (1, 0):
    d = Path({str(tmp_path)!r}) / f"rank{{rank}}"
    protocol.control_dir(d).mkdir(parents=True)
    ring = SimpleNamespace(rank=rank, size=2, local_size=2, threads=None)
    p = Progress(d, ring, Segment(number=0, stop_at=100, total_steps=100), StartUp(t_start=time.time()),
                 window_steps=5, eval_every=0, current_lr=lambda: 0.1)
    p.first_step(1, time.time())
    p._emit_window(3.0, 2, dict(segment=0, world_size=2, step=5, steps=5, seconds=1.0, images_per_s=1.0,
                                steps_per_s=5.0, lr=0.1, epoch=0))
    p.flush_progress()
    out[rank] = {{"imported": "elastic_ring.events.api" in sys.modules, "loss": p.last_loss,
                  "events": (d / protocol.WORKER_EVENTS).read_text() if (d / protocol.WORKER_EVENTS).exists() else ""}}
print(json.dumps(out))
"""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    one, zero = out["1"], out["0"]
    assert not one["imported"] and one["events"] == "", one  # rank 1: nothing made, nothing imported
    assert one["loss"] == zero["loss"] == 1.5  # the window's mean loss is every rank's
    kinds = [json.loads(line)["kind"] for line in zero["events"].splitlines()]
    assert kinds == ["first_step", "throughput"], kinds  # rank 0 writes both
