"""A joiner that exits before its ring formed is started again (``hvdrun.Spare.keep_joining``):
Horovod Elastic's driver once told the warm joiner of a grow, a step after a shrink of the same
slot, that its slot had been removed; it aborted inside ``hvd.init()`` and rank 0 waited in its own
for a rank 1 that never came (the run hung). Only a joiner is started again (the ring trained
before it started), only while the ring has not trained since (it never took part), and after the
last try the job ends instead of waiting."""

from __future__ import annotations

import os
import threading
import time

from elastic_ring.controller.hvdrun import JOINER_TRIES, Spare
from elastic_ring.protocol import read_error_records


def _spare(tmp_path, trained: bool) -> Spare:
    s = Spare.__new__(Spare)  # (its command line parsed by __init__ is not what this tests)
    s.run_dir = tmp_path
    (tmp_path / "control").mkdir()
    s.born = time.time() - 10
    if trained:  # the ring trained after the driver's start: a worker started now joins it
        _progress(tmp_path, s.born + 1)
    return s


def _progress(run_dir, t: float) -> None:
    p = run_dir / "control" / "progress.json"
    p.write_text("{}")
    os.utime(p, (t, t))


def _starts(results: list[int], during=None):
    """A ``start`` that returns the next exit status (``during(n)`` runs inside the n-th start)."""
    calls = []

    def start():
        calls.append(len(calls))
        if during is not None:
            during(len(calls))
        return results[len(calls) - 1], time.time()

    return start, calls


def test_a_joiner_that_exits_before_its_ring_formed_is_started_again(tmp_path, capsys):
    spare = _spare(tmp_path, trained=True)
    start, calls = _starts([-6, 0])
    stops = []
    assert spare.keep_joining(start, {"HOROVOD_RANK": "1"}, [], stops.append)[0] == 0
    assert len(calls) == 2 and not stops
    assert f"the joiner for rank 1 exited (status -6) before its ring formed: starting it again (2 of {JOINER_TRIES})" \
        in capsys.readouterr().out


def test_after_the_last_try_the_job_ends_instead_of_waiting(tmp_path, capsys):
    spare = _spare(tmp_path, trained=True)
    start, calls = _starts([134] * JOINER_TRIES)
    stops = []
    assert spare.keep_joining(start, {"HOROVOD_RANK": "1"}, [], stops.append)[0] == 134
    assert len(calls) == JOINER_TRIES and len(stops) == 1
    assert f"before its ring formed, {JOINER_TRIES} times: ending the job" in stops[0]
    assert stops[0] in capsys.readouterr().out
    (rec,) = read_error_records(tmp_path)  # what the controller's restart names as the failure
    assert rec["rank"] == 1 and not rec["peer_loss"] and "the joiner for rank 1 exited (status 134)" in rec["message"]


def test_a_worker_of_the_first_ring_is_not_started_again(tmp_path):
    spare = _spare(tmp_path, trained=False)  # (a script's error at its start: once, as before)
    start, calls = _starts([1, 0])
    stops = []
    assert spare.keep_joining(start, {"HOROVOD_RANK": "1"}, [], stops.append)[0] == 1
    assert len(calls) == 1 and not stops


def test_a_joiner_that_trained_and_then_failed_is_a_failure_as_before(tmp_path):
    spare = _spare(tmp_path, trained=True)
    start, calls = _starts([-9, 0], during=lambda n: _progress(tmp_path, time.time() + 1))  # a step with it
    stops = []
    assert spare.keep_joining(start, {"HOROVOD_RANK": "1"}, [], stops.append)[0] == -9
    assert len(calls) == 1 and not stops


def test_a_joiner_ended_with_the_job_is_not_started_again(tmp_path):
    spare = _spare(tmp_path, trained=True)
    ended = threading.Event()
    start, calls = _starts([-9, 0], during=lambda n: ended.set())  # the driver's shutdown, or its host's end
    assert spare.keep_joining(start, {"HOROVOD_RANK": "1"}, [ended], lambda line: None)[0] == -9
    assert len(calls) == 1
