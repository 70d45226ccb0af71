"""The one step boundary (:mod:`elastic_ring.worker.boundary`) behind the three loop forms, with the
fake in-process Horovod of the worker-library tests.

``job.steps()``, an epoch loop's optimizer hooks and the Horovod Elastic adapter each call
``StepBoundary.after_step`` once per step and stop for the same :class:`StopReason` (an enum whose
values are the strings ``segment_end`` events hold); a ``job.finish()`` carried by the vote in
flight at a scheduled stop ends the run in every form; ``Job``'s public names are the ones scripts
use, and the plain job (outside the tool) has every one of them.
"""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest
import torch

from elastic_ring import protocol
from elastic_ring.events import read_events
from elastic_ring.worker import api, hvd_elastic, session
from elastic_ring.worker.boundary import StepBoundary
from elastic_ring.worker.data import DistributedSampler
from elastic_ring.worker.hooked import StopSegment
from elastic_ring.worker.segment import StopReason
from tests.unit.test_worker_epochs import FakeDistributed, _current, distributed  # noqa: F401 (a fixture)
from tests.unit.test_worker_library import make_job

X = torch.linspace(-1, 1, 24).reshape(8, 3)


def _model():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def _train_step(model, opt, xb) -> None:
    opt.zero_grad()
    model(xb).pow(2).mean().backward()
    opt.step()


def _steps(job, finish_at: int | None) -> None:
    """``for step in job.steps()``."""
    model, opt = _model()
    job.register(model=model, optimizer=opt)
    job.restore()
    for step in job.steps():
        if step == finish_at:
            job.finish()
        _train_step(model, opt, X[:2])


def _epochs(job, finish_at: int | None) -> None:
    """A plain Horovod epoch loop: the drop-in sampler, ``job.epochs()``, the optimizer's steps."""
    data = torch.utils.data.TensorDataset(X)
    sampler = DistributedSampler(data)
    loader = torch.utils.data.DataLoader(data, batch_size=2, sampler=sampler)
    model, opt = _model()
    job.register(model=model, optimizer=opt)
    job.restore()
    opt = FakeDistributed(opt)
    with pytest.raises(StopSegment):
        for epoch in job.epochs(1, 100):
            sampler.set_epoch(epoch)
            for (xb,) in loader:
                if job.step + 1 == finish_at:
                    job.finish()
                _train_step(model, opt, xb)


class _Handler:  # the shape of Horovod's state handlers
    def __init__(self, value) -> None:
        self.value = value

    def save(self) -> None:
        pass


class _State:  # the shape of Horovod's TorchState, for the adapter
    def __init__(self, model, opt) -> None:
        self._handlers = {"model": _Handler(model), "optimizer": _Handler(opt)}
        self._saved_state: dict = {}

    def save(self) -> None:
        pass

    def sync(self) -> None:
        pass

    def on_reset(self) -> None:
        pass

    def _set_attrs(self) -> None:
        pass


def _commits(job, finish_at: int | None) -> None:
    """A Horovod Elastic script: ``@hvd.elastic.run``, a ``state.commit()`` after every step."""
    model, opt = _model()
    state = _State(model, opt)

    @hvd_elastic.run
    def train(state):
        for step in range(1, 100):
            if step == finish_at:
                job.finish()
            _train_step(model, opt, X[:2])
            hvd_elastic._commit(state)

    with pytest.raises(hvd_elastic.SegmentDone):
        train(state)


FORMS = {"steps": _steps, "epochs": _epochs, "commits": _commits}


def _counted(job) -> list[int]:
    """The steps ``job``'s step boundary is called after (its one call a step)."""
    calls: list[int] = []
    after = job.boundary.after_step

    def counted(step, *args, **kwargs):
        calls.append(step)
        return after(step, *args, **kwargs)

    job.boundary.after_step = counted
    return calls


@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_loop_form_calls_the_one_boundary_once_a_step_and_stops_with_the_enum(
        tmp_path, monkeypatch, distributed, form):  # noqa: F811 (the fixture)
    job = make_job(tmp_path, monkeypatch, stop_at=5, total=20)
    _current(monkeypatch, job)
    assert isinstance(job.boundary, StepBoundary)
    calls = _counted(job)
    FORMS[form](job, finish_at=None)
    assert calls == [1, 2, 3, 4, 5]
    assert job.step == 5 and job.stop_reason is StopReason.SCHEDULED and not job.finished
    (end,) = read_events(tmp_path / protocol.WORKER_EVENTS, kind="segment_end")
    assert end["step"] == 5 and end["reason"] == "scheduled" and type(end["reason"]) is str
    assert (tmp_path / "checkpoints" / "ckpt-00000005.pt").exists()


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_finish_in_the_vote_in_flight_at_a_scheduled_stop_ends_the_run_in_every_form(
        tmp_path, monkeypatch, distributed, form):  # noqa: F811 (the fixture)
    # finish() during step 4: the vote started after step 4 carries it and is still in flight
    # after step 5, the segment's stop step; completed there, it makes the stop the run's end
    job = make_job(tmp_path, monkeypatch, stop_at=5, total=20)
    _current(monkeypatch, job)
    FORMS[form](job, finish_at=4)
    assert job.step == 5 and job.stop_reason is StopReason.FINISHED and job.finished
    (end,) = read_events(tmp_path / protocol.WORKER_EVENTS, kind="segment_end")
    assert (end["step"], end["reason"]) == (5, "finished")


def test_stop_reason_values_are_the_strings_readers_know():
    assert [r.value for r in StopReason] == ["scheduled", "requested", "finished"]
    assert StopReason.FINISHED == "finished" and f"{StopReason.REQUESTED}" == "requested"
    assert StopReason("scheduled") is StopReason.SCHEDULED


def test_the_boundary_decides_the_stop_in_one_place(tmp_path, monkeypatch):
    """The run's length wins over the stop step; a vote started after a step is read only after
    a later one; a stop asked by the controller is a ``requested`` stop at the vote's read."""
    job = make_job(tmp_path, monkeypatch, stop_at=10, total=12)
    b = job.boundary
    b.begin()
    assert b.decide(12) is StopReason.FINISHED and b.decide(10) is StopReason.SCHEDULED
    assert b.decide(3) is None and b.handle is not None and b.vote_step == 3  # a vote started
    assert b.decide(3) is None and b.handle is not None  # not read after the step it started at
    protocol.stop_file(job.run_dir, 0).parent.mkdir(parents=True, exist_ok=True)
    protocol.stop_file(job.run_dir, 0).touch()
    assert b.decide(4) is None  # the vote after step 3 said no; the one after step 4 sees the file
    assert b.decide(5) is StopReason.REQUESTED and b.handle is None


def test_jobs_public_names_are_the_scripts_and_the_plain_job_has_them_all(monkeypatch):
    public = {n for n in dir(api.Job) if not n.startswith("_")}
    internals = {"between_steps", "pause", "reform", "end_segment", "state_dict", "current_lr", "epoch_data",
                 "inplace"}
    assert not public & internals
    assert {"steps", "epochs", "register", "restore", "record", "sampler", "finish", "stop_reason"} <= public
    fake = types.SimpleNamespace(is_initialized=lambda: True, rank=lambda: 0, size=lambda: 1,
                                 local_rank=lambda: 0, local_size=lambda: 1)
    monkeypatch.setitem(sys.modules, "horovod.torch", fake)
    monkeypatch.setitem(sys.modules, "horovod", types.SimpleNamespace(torch=fake))
    monkeypatch.delenv("ELASTIC_RING_RUN_DIR", raising=False)
    monkeypatch.setattr(session, "_PROCESS", session._Process())
    plain = api.init()
    assert not plain.elastic
    # a script that runs under the tool runs without it: every name it may use is there
    assert sorted(n for n in public if not hasattr(plain, n)) == []


@pytest.mark.parametrize("form", sorted(FORMS))
def test_the_step_cost_meter_counts_the_boundary_s_calls_as_the_steps(tmp_path, monkeypatch, distributed,
                                                                      form):  # noqa: F811 (the fixture)
    """``ELASTIC_RING_STEP_COST=parts``: the report of each form counts its steps by the boundary's one
    call a step, and times that call and the between-steps work of the forms that do it."""
    import json

    from elastic_ring.worker import hooked, stepcost

    monkeypatch.setenv(stepcost.ENV, "parts")
    monkeypatch.setattr(stepcost, "_METER", None)
    monkeypatch.setattr(hooked, "_rng_state", hooked._rng_state)  # (install() times it, once a process)
    monkeypatch.setattr(hooked, "_timed_rng", False, raising=False)
    job = make_job(tmp_path, monkeypatch, stop_at=5, total=20)
    _current(monkeypatch, job)
    FORMS[form](job, finish_at=None)
    rep = json.loads((tmp_path / "stepcost" / "seg000-rank0.json").read_text())
    assert rep["steps"] == 5 and rep["parts"]["after_step"]["calls"] == 5
    assert rep["form"] == {"steps": "steps", "epochs": "optimizer", "commits": "commits"}[form]
    if form == "commits":  # its checkpoints at the commits: only the progress file at the step
        assert "between_steps" not in rep["parts"]
    elif form == "epochs":  # only where something is due there; the progress file at the step
        parts = rep["parts"]
        # (a pre-hook after a step with nothing due does not call between at all: hooked.between
        # runs where something is due and at an epoch's end, fewer times than the steps)
        assert 1 <= parts["between_steps"]["calls"] <= parts["hooked.between"]["calls"] < rep["steps"], parts
    else:  # the evaluation, the periodic checkpoint, the progress file
        assert rep["parts"]["between_steps"]["calls"] >= 4


def _collectives(job) -> list[tuple[int, str, int]]:
    """The allreduces the library starts: (the step just done, name, values); a stop vote's when
    the training thread hands it to the vote thread (which launches it a moment later)."""
    started: list[tuple[int, str, int]] = []
    hvd, coll = job.ring.hvd, job.ring.coll
    start, submit = hvd.allreduce_async, coll.vote_async

    def recorded(t, op=None, name=None):
        if name != "stop_flag":  # (a vote: recorded at its hand-over)
            started.append((job.seg.step, name, t.numel()))
        return start(t, op=op, name=name)

    def voted(values, name=""):
        started.append((job.seg.step, name, len(values)))
        return submit(values, name)

    hvd.allreduce_async, coll.vote_async = recorded, voted
    return started


def test_the_window_s_loss_rides_in_the_stop_vote_one_collective_at_a_step(tmp_path, monkeypatch):
    """Issue 50: K = 4 is longer than a window (3 steps): a window that closes makes its step a
    vote step, and its mean loss rides in that vote (read one step later), the next vote K after;
    the window's own allreduce only at the segment's stop step, where no vote starts. At most one
    collective at any step, no two votes more than K apart; the throughput events hold each
    window's steps and mean loss as before."""
    job = make_job(tmp_path, monkeypatch, stop_at=14, total=20)
    job.info = dataclasses.replace(job.info, throughput_window=3)
    job.vote.floor = 4  # (latency 0: a vote every control_every steps at most)
    started = _collectives(job)
    model, opt = _model()
    job.register(model=model, optimizer=opt)
    job.restore()
    for step in job.steps():
        _train_step(model, opt, X[:2])
        job.record(float(step))
    assert job.step == 14 and job.stop_reason is StopReason.SCHEDULED
    steps = [s for s, _, _ in started]
    assert len(steps) == len(set(steps)), started  # never two collectives after one step
    votes = [s for s, name, _ in started if name == "stop_flag"]
    assert [s for s, name, _ in started if name == "window_loss"] == [14]
    assert votes == [1, 4, 7, 10, 13]  # the first step's, then each window's close (3 < K)
    assert all(b - a <= 4 for a, b in zip(votes, votes[1:]))
    assert {n for _, name, n in started if name == "stop_flag"} == {5}  # (one shape: a window rides or not)
    events = read_events(tmp_path / protocol.WORKER_EVENTS, kind="throughput")
    assert [(e["step"], e["steps"], e["loss"]) for e in events] == [
        (4, 3, 3.0), (7, 3, 6.0), (10, 3, 9.0), (13, 3, 12.0), (14, 1, 14.0)]


def test_a_vote_every_k_steps_between_windows_longer_than_k(tmp_path, monkeypatch):
    """Windows of 10 steps, K = 3: votes every 3 steps and no other collective; a closed window
    rides in the next vote (its event read one step after that vote), the last one alone at the
    stop step."""
    job = make_job(tmp_path, monkeypatch, stop_at=30, total=40)
    job.info = dataclasses.replace(job.info, throughput_window=10)
    job.vote.floor = 3
    started = _collectives(job)
    model, opt = _model()
    job.register(model=model, optimizer=opt)
    job.restore()
    for step in job.steps():
        _train_step(model, opt, X[:2])
        job.record(1.0)
    votes = [s for s, name, _ in started if name == "stop_flag"]
    assert votes == [1, 4, 7, 10, 13, 16, 19, 22, 25, 28]  # (windows close at 11 and 21)
    assert all(b - a <= 3 for a, b in zip(votes, votes[1:]))
    assert [s for s, name, _ in started if name == "window_loss"] == [30]
    events = read_events(tmp_path / protocol.WORKER_EVENTS, kind="throughput")
    assert [(e["step"], e["steps"], e["loss"]) for e in events] == [(11, 10, 1.0), (21, 10, 1.0), (30, 9, 1.0)]


def test_a_window_closed_at_a_requested_stop_s_step_still_tells_its_loss(tmp_path, monkeypatch):
    """A vote every step; the controller's stop, asked during step 3, is read after step 4, where a
    window of 3 steps closes: no vote starts there, so the window's loss goes in an allreduce of its
    own at the segment's end, and its event is as every window's."""
    job = make_job(tmp_path, monkeypatch, stop_at=100, total=100)
    job.info = dataclasses.replace(job.info, throughput_window=3)
    started = _collectives(job)
    model, opt = _model()
    job.register(model=model, optimizer=opt)
    job.restore()
    for step in job.steps():
        _train_step(model, opt, X[:2])
        job.record(float(step))
        if step == 3:
            protocol.stop_file(job.run_dir, 0).parent.mkdir(parents=True, exist_ok=True)
            protocol.stop_file(job.run_dir, 0).touch()
    assert job.step == 4 and job.stop_reason is StopReason.REQUESTED
    assert [(s, name) for s, name, _ in started] == [
        (1, "stop_flag"), (2, "stop_flag"), (3, "stop_flag"), (4, "window_loss")]
    events = read_events(tmp_path / protocol.WORKER_EVENTS, kind="throughput")
    assert [(e["step"], e["steps"], e["loss"]) for e in events] == [(4, 3, 3.0)]


def test_a_vote_period_as_long_as_the_window_starts_the_vote_at_its_close(tmp_path, monkeypatch):
    """K = the window's 4 steps: a vote at each window's close carries it (a window left waiting
    would meet the next window's close at the same step); no allreduce of a window's own."""
    job = make_job(tmp_path, monkeypatch, stop_at=13, total=20)
    job.info = dataclasses.replace(job.info, throughput_window=4)
    job.vote.floor = 4
    started = _collectives(job)
    model, opt = _model()
    job.register(model=model, optimizer=opt)
    job.restore()
    for step in job.steps():
        _train_step(model, opt, X[:2])
        job.record(2.0)
    assert [(s, name) for s, name, _ in started] == [
        (1, "stop_flag"), (5, "stop_flag"), (9, "stop_flag"), (13, "window_loss")]
    events = read_events(tmp_path / protocol.WORKER_EVENTS, kind="throughput")
    assert [(e["step"], e["steps"], e["loss"]) for e in events] == [(5, 4, 2.0), (9, 4, 2.0), (13, 4, 2.0)]


def _lagged(job, every: int, lag: int) -> list[int]:
    """Rank 0 proposes ``every`` and ``lag`` at each vote (as from its timing); the steps after
    which the boundary reads a vote."""
    job.vote.propose = lambda step, now: (every, lag)
    reads: list[int] = []
    result = job.vote.result

    def read(handle):
        reads.append(job.seg.step)
        return result(handle)

    job.vote.result = read
    return reads


def _flat(job, touch_at: int | None = None, finish_at: int | None = None) -> None:
    model, opt = _model()
    job.register(model=model, optimizer=opt)
    job.restore()
    for step in job.steps():
        if step == finish_at:
            job.finish()
        _train_step(model, opt, X[:2])
        job.record(1.0)
        if step == touch_at:
            protocol.stop_file(job.run_dir, 0).parent.mkdir(parents=True, exist_ok=True)
            protocol.stop_file(job.run_dir, 0).touch()


def test_a_vote_is_read_its_agreed_lag_after_its_start_and_a_stop_between_votes_lands_there(
        tmp_path, monkeypatch):
    """Issue 50: K = 4 and L = 3 agreed: each vote is read 3 steps after it started (its collective
    done in the background by then, none on the training thread's critical path), one in flight at
    a time; the segment's first vote is read after the next step (no lag agreed yet). A stop asked
    during step 6, between two votes, is carried by the vote after step 9 and agreed after step 12
    (within K + L steps), a ``requested`` stop at that step."""
    job = make_job(tmp_path, monkeypatch, stop_at=100, total=100)
    job.info = dataclasses.replace(job.info, throughput_window=50)
    started = _collectives(job)
    reads = _lagged(job, 4, 3)
    _flat(job, touch_at=6)
    votes = [s for s, name, _ in started if name == "stop_flag"]
    assert votes == [1, 5, 9] and reads == [2, 8, 12]
    assert job.step == 12 and job.stop_reason is StopReason.REQUESTED
    assert 12 - 6 <= 4 + 3
    (end,) = read_events(tmp_path / protocol.WORKER_EVENTS, kind="segment_end")
    assert (end["step"], end["reason"]) == (12, "requested")


@pytest.mark.parametrize("finish_at", [None, 9])
def test_a_scheduled_stop_is_exact_with_a_vote_in_flight(tmp_path, monkeypatch, finish_at):
    """The segment's stop step 10 comes while the vote started after step 9 is in flight (to be
    read after 12): the stop is at step 10 exactly, that vote completed there; a ``job.finish()``
    it carries makes the stop the run's end."""
    job = make_job(tmp_path, monkeypatch, stop_at=10, total=20)
    job.info = dataclasses.replace(job.info, throughput_window=50)
    started = _collectives(job)
    reads = _lagged(job, 4, 3)
    _flat(job, finish_at=finish_at)
    assert [s for s, name, _ in started if name == "stop_flag"] == [1, 5, 9]
    assert reads == [2, 8, 10]  # (the last: completed at the stop)
    assert job.step == 10
    assert job.stop_reason is (StopReason.SCHEDULED if finish_at is None else StopReason.FINISHED)


def test_a_window_closed_while_a_vote_is_in_flight_rides_in_the_next_one_started_at_its_read(
        tmp_path, monkeypatch):
    """K = 4 (not shorter than the 3-step window) and L = 3: a window that closes while a vote is
    in flight waits for that vote's read, where the next vote starts and carries it; never two
    votes in flight, no allreduce of a window's own but at the stop step."""
    job = make_job(tmp_path, monkeypatch, stop_at=14, total=20)
    job.info = dataclasses.replace(job.info, throughput_window=3)
    started = _collectives(job)
    reads = _lagged(job, 4, 3)
    _flat(job)
    votes = [s for s, name, _ in started if name == "stop_flag"]
    # the first vote read after step 2; the window closing at 4 starts one (read at 7, where the
    # window closed at 7 starts the next: read at 10, ...)
    assert votes == [1, 4, 7, 10, 13] and reads[:4] == [2, 7, 10, 13]
    assert all(r > v for v, r in zip(votes, reads))  # one in flight at a time
    assert [s for s, name, _ in started if name == "window_loss"] == [14]
    events = read_events(tmp_path / protocol.WORKER_EVENTS, kind="throughput")
    assert [(e["step"], e["steps"]) for e in events] == [(4, 3), (7, 3), (10, 3), (13, 3), (14, 1)]
