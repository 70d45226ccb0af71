"""Horovod Elastic's API served by elastic-ring, the logic without processes: which scripts are
Horovod Elastic's, what a checkpoint holds of their state and how it goes back, and the
``relaunched`` event of a script whose reset callbacks set the LR."""

from __future__ import annotations

import copy

import pytest

from elastic_ring.controller.meter import Meter, PendingResize
from elastic_ring.events import as_event, read_events
from elastic_ring.events.api import EventLog
from elastic_ring.worker.hvd_elastic import _CommittedState, uses_horovod_elastic
from elastic_ring.worker.lr import RULES
from tests.conftest import ROOT


def test_a_horovod_elastic_script_is_told_apart_by_its_source(tmp_path):
    assert uses_horovod_elastic(str(ROOT / "examples" / "hvd_elastic_mlp.py"))
    assert not uses_horovod_elastic(str(ROOT / "examples" / "mlp_digits.py"))
    for text, elastic in (("@hvd.elastic.run\ndef train(state): ...", True),
                          ("from horovod.torch.elastic import TorchState", True),
                          ("import horovod.torch as hvd\nhvd.init()", False),
                          ("# no elastic_run here\nx = 1", False)):
        f = tmp_path / "s.py"
        f.write_text(text)
        assert uses_horovod_elastic(str(f)) is elastic, text
    assert not uses_horovod_elastic(str(tmp_path / "missing.py"))
    assert not uses_horovod_elastic("no_such_module_anywhere")


class _Stateful:
    def __init__(self, v):
        self.v = v

    def state_dict(self):
        return {"v": self.v}

    def load_state_dict(self, d):
        self.v = d["v"]


class _Handler:  # the shape of Horovod's state handlers: the object, and its state as last committed
    def __init__(self, value):
        self.value = value
        self._saved_thing_state = copy.deepcopy(value.state_dict())


class _FakeState:  # the shape of Horovod's ObjectState / TorchState
    def __init__(self, handlers, **attrs):
        self._handlers = handlers
        self._saved_state = dict(attrs)
        self._set_attrs()

    def _set_attrs(self):
        for k, v in self._saved_state.items():
            setattr(self, k, v)


def test_the_committed_state_round_trips_without_the_uncommitted_changes():
    sampler, model = _Stateful(5), _Stateful("weights")
    state = _FakeState({"sampler": _Handler(sampler), "model": _Handler(model)}, epoch=1, batch=3)
    box = _CommittedState(state, skip={"model"})  # the job saves the model itself
    sampler.v, state.epoch = 9, 7  # changed since the last commit: not in a checkpoint
    saved = box.state_dict()
    assert saved == {"objects": {"epoch": 1, "batch": 3}, "handlers": {"sampler": {"v": 5}}}

    other_sampler = _Stateful(0)
    other = _FakeState({"sampler": _Handler(other_sampler), "model": _Handler(_Stateful(None))}, epoch=0, batch=0)
    _CommittedState(other, skip={"model"}).load_state_dict(saved)
    assert other_sampler.v == 5 and (other.epoch, other.batch) == (1, 3)
    assert other._handlers["sampler"]._saved_thing_state == {"v": 5}  # a restore() goes back to it
    assert other._handlers["model"].value.v is None  # the job's own part: untouched here


def _meter(tmp_path, by_script: bool) -> Meter:
    m = Meter(EventLog(tmp_path / "events.jsonl"), RULES["linear"], lr_by_script=by_script)
    m.pending = PendingResize(1, 2, step=10, t_request=100.0, lr_last=0.1, segment=0)
    return m


@pytest.mark.parametrize("by_script", [False, True])
def test_relaunched_reports_the_lr_the_first_step_used_when_the_script_sets_it(tmp_path, by_script):
    m = _meter(tmp_path, by_script)
    m.relaunched(1, t_launch=101.0)
    before = read_events(tmp_path / "events.jsonl", kind="relaunched")
    assert len(before) == (0 if by_script else 1)  # the script's LR is known at its first step only
    first = as_event({"kind": "first_step", "time": 104.0, "world_size": 2, "step": 11, "lr": 0.15})
    m.first_step(1, first, t_launch=101.0, prelaunched=False)
    (rel,) = read_events(tmp_path / "events.jsonl", kind="relaunched")
    assert rel["lr_new"] == pytest.approx(0.15 if by_script else 0.2)  # else Eq. 7: 2 / 1 * 0.1
    assert rel["time"] == 101.0 and rel["step"] == 10
    kinds = [e["kind"] for e in read_events(tmp_path / "events.jsonl")]
    assert kinds.index("relaunched") < kinds.index("first_step_after_resize")


def test_steps_is_optional_for_a_horovod_elastic_script():
    """Its function's return ends the run (a job.steps() loop without --steps is refused by the
    worker library at its first step instead: tests/unit/test_worker_epochs.py)."""
    from elastic_ring.controller.runs import RunRequest, check

    check(RunRequest(script=str(ROOT / "examples" / "hvd_elastic_mlp.py")))
