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


def test_a_live_resize_below_min_on_fixed_slots_is_one_line(tmp_path, run_cli):
    """The run keeps its ``--workers MIN:MAX`` (run.json): `resize --to N` below MIN is refused in one
    line (exit 2, no request written); MIN itself is asked as before."""
    import json

    from elastic_ring.controller.lock import RunLock
    from elastic_ring.controller.runs import prepare
    from elastic_ring.protocol import REQUEST_FILE

    req = RunRequest(worker_range=(2, 3), slots=8, device="cpu", dataset="synthetic", steps=4,
                     run_dir=str(tmp_path / "r"), collective="torch")
    run = prepare(req, lambda s: None)  # (holds the run's lock, as a running controller does)
    rd = run.spec.run_dir
    try:
        assert json.loads((rd / "run.json").read_text())["worker_range"] == [2, 3]
        (rd / "controller.json").write_text(json.dumps({"state": "running", "phase": "running",
                                                        "world_size": 3, "pid": 1}))
        p = run_cli("resize", str(rd), "--to", "1")
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
        assert "--to 1 is below the run's minimum of 2 workers (--workers 2:3)" in p.stderr, p.stderr
        assert "Traceback" not in p.stderr and not (rd / "control" / REQUEST_FILE).exists()
        p = run_cli("resize", str(rd), "--to", "4")  # above MAX: its slots are MAX (as before)
        assert p.returncode == 2 and "more than the run's 3 slot(s)" in p.stderr, p.stderr
        p = run_cli("resize", str(rd), "--to", "2")
        assert p.returncode == 0 and json.loads((rd / "control" / REQUEST_FILE).read_text())["to"] == 2, p.stderr
    finally:
        RunLock(rd).release()
