"""``elastic-ring train --workers MIN:MAX`` (also ``--gpus MIN:MAX``): the start size on fixed slots
(:func:`range_start`), the discovery's bounds (:func:`with_worker_range`), and bad forms as one-line
errors (exit status 2, nothing written), through the console script's entry point in this process."""

from __future__ import annotations

import pytest

from elastic_ring.controller.api import Resize
from elastic_ring.controller.requests import RunRequest, range_start, with_worker_range
from elastic_ring.errors import UserError


@pytest.fixture
def run_cli(cli_inproc):
    return cli_inproc


def test_the_start_is_max_or_every_slot_where_fewer():
    assert range_start((2, 4), 8) == 4
    assert range_start((2, 4), 3) == 3
    assert range_start((2, 4), 2, (Resize(5, 4), Resize(9, 2))) == 2
    with pytest.raises(UserError, match=r"--workers 3:4 needs at least 3 slot\(s\); 2 slots found"):
        range_start((3, 4), 2)
    with pytest.raises(UserError, match="the resize to 5 at step 9 is outside --workers 2:4"):
        range_start((2, 4), 8, (Resize(9, 5),))
    with pytest.raises(UserError, match="the resize to 1 at step 9 is outside --workers 2:4"):
        range_start((2, 4), 8, (Resize(9, 1),))


def test_with_host_discovery_the_range_is_its_bounds():
    req = RunRequest(worker_range=(2, 6), host_discovery_script="discover.sh")
    got = with_worker_range(req)
    assert (got.worker_range, got.min_workers, got.max_workers) == (None, 2, 6)
    plain = RunRequest(worker_range=(2, 6))
    assert with_worker_range(plain) is plain  # fixed slots: range_start applies


@pytest.mark.parametrize("args,needle", [
    (["--workers", "abc"], "--workers expects N or MIN:MAX, got 'abc'"),
    (["--gpus", "1:2:3"], "--workers expects N or MIN:MAX, got '1:2:3'"),
    (["--gpus", "4:2"], "--workers 4:2: MIN 4 is above MAX 2"),
    (["--workers", "0:2"], "--workers expects counts >= 1, got '0:2'"),
    (["--workers", "2:3", "--min-workers", "1"], "--workers 2:3 already gives the bounds"),
    (["--workers", "3:4", "--slots", "2"], "--workers 3:4 needs at least 3 slot(s); 2 slots found"),
    (["--workers", "1:2", "--slots", "4", "--resize-at", "3", "--to", "3"], "the resize to 3 at step 3 is outside"),
    (["--gpus", "1:2", "--resume", "somewhere"], "--resume goes on at the run's size: drop --workers 1:2"),
])
def test_bad_forms_are_one_line(run_cli, tmp_path, args, needle):
    run = tmp_path / "run"
    p = run_cli("train", "--device", "cpu", *args, *([] if "--resume" in args else ["--run-dir", str(run)]))
    assert p.returncode == 2, (p.stdout, p.stderr)
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert needle in lines[0], lines[0]
    assert not run.exists()


@pytest.mark.parametrize("slots, start, said", [(8, 3, "starting at 3 (the maximum); resizes to at most 3"),
                                               (2, 2, "starting at 2 (every slot, fewer than 3)")])
def test_a_new_run_starts_at_max_or_every_slot_and_its_slots_bound_resizes(tmp_path, slots, start, said):
    from elastic_ring.controller.lock import RunLock
    from elastic_ring.controller.runs import describe, prepare

    req = RunRequest(worker_range=(1, 3), slots=slots, device="cpu", dataset="synthetic", steps=4,
                     run_dir=str(tmp_path / "r"), collective="torch")
    run = prepare(req, lambda s: None)
    try:
        assert (run.spec.workers, run.spec.slots) == (start, min(slots, 3))  # a live resize above 3: refused
        assert any(f"--workers 1:3: {said}" in line for line in describe(run))
    finally:
        RunLock(run.spec.run_dir).release()
