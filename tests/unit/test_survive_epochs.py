"""``--survive`` for an epoch-loop script (``job.epochs()``), in-process with a fake Horovod: the copy
of each completed step is kept before the next step starts (at the training sampler's next batch,
before the forward whose backward starts the step's allreduces), with the data position inside the
epoch; a survivor whose next forward meets a peer's loss rolls back to it and runs the script again
in its process, and the run is the one that never failed (the same batches, LRs, tests, weights)."""

from __future__ import annotations

import pytest
import torch

from elastic_ring import protocol
from elastic_ring.worker import survive
from elastic_ring.seam import action_file
from tests.unit.test_worker_epochs import Net, _run_script, _segment, distributed  # noqa: F401 - a fixture
from tests.unit.test_worker_ring import _in_place_job


class HorovodInternalError(RuntimeError):
    """What Horovod raises on a rank whose peer died (told by its name: protocol.is_peer_loss)."""


@pytest.fixture
def survive_on(monkeypatch):
    monkeypatch.setenv(survive.SURVIVE_ENV, "1")
    survive.reset()
    yield
    survive.reset()


def test_no_copy_without_survive(tmp_path, monkeypatch, distributed):  # noqa: F811
    survive.reset()
    job = _in_place_job(tmp_path, monkeypatch, 0, 10**9)
    monkeypatch.delenv(survive.SURVIVE_ENV, raising=False)
    _run_script(job, [])
    assert job.finished and survive._P.copy is None and job._epoch_data.before_batch is None


# 6 steps an epoch (24 samples, 4 a batch, one worker); a failure in the forward of step FAIL. (Not
# after step 8 or 14: the script's test after them draws its loader's seed from the RNG, which a
# resume from that step, from the disk or from memory, does not draw again: test_worker_epochs.)
@pytest.mark.parametrize("fail, epoch, pos", [(10, 2, 12), (13, 3, 0), (1, 1, 0)],
                         ids=["inside-an-epoch", "first-of-an-epoch", "first-step"])
def test_epoch_loop_survivor_rolls_back_to_the_step_kept_before_the_next_batch(
        tmp_path, monkeypatch, distributed, survive_on, fail, epoch, pos):  # noqa: F811
    ref: list = []
    _, ref_model = _segment(tmp_path / "ref", monkeypatch, 0, 10**9, ref)
    run = tmp_path / "run"
    job = _in_place_job(run, monkeypatch, 0, 10**9)
    env = {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "1", "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "1"}
    path = action_file(run, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    protocol.write_json_atomic(path, {"action": "resize", "to": 1, "segment": 1, "stop_at": 10**9,
                                      "rollback_to": fail - 1, "members": {"w1": env}})
    forward, failed = Net.forward, []

    def failing_forward(self, x):  # the peer is gone before this step's backward starts its allreduces
        if self.training and not failed and job.step == fail - 1:
            failed.append(job.step)
            raise HorovodInternalError("gloo: Connection closed by peer")
        return forward(self, x)

    monkeypatch.setattr(Net, "forward", failing_forward)
    trace: list = []
    with pytest.raises(HorovodInternalError) as lost:
        _run_script(job, trace)
    copy = survive._P.copy
    assert copy.held() == [s for s in (fail - 2, fail - 1) if s >= 0]  # the step before the failed one
    kept = copy.copies[fail - 1]
    assert kept["step"] == fail - 1 and kept["data_position"]["epoch"] == epoch
    assert kept["data_position"]["pos"] == pos  # the copy of an epoch's last step: the next epoch's start
    assert kept["schedulers"][0]["last_epoch"] == epoch - 1  # stepped after each epoch
    carried = survive.survived(lost.value)  # the controller's word (written above): roll back to FAIL - 1
    assert carried is not None
    ring, segment, stop_at, start = carried
    again = _in_place_job(run, monkeypatch, segment, stop_at, r=ring, rejoined=True)
    model = _run_script(again, trace)
    assert again.finished and again.step == 18
    assert trace == ref  # every batch, LR and test once, as in the run that never failed
    for a, b in zip(model.state_dict().values(), ref_model.state_dict().values()):
        assert torch.equal(a, b)  # momentum and dropout's RNG as in the run that never failed
