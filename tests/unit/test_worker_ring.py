"""The worker's ring (how a launch forms and re-forms it) and the epoch loop resized in place, with
fakes for Horovod (no processes).

The ring is chosen once from the launch; the Ray backend's ring takes the environment the controller
names and retires a worker left out; Horovod Elastic's acts on a resize only once its driver has
reported the hosts; an action written ahead is taken at its step only. An epoch-loop script whose
segment stops for an in-place resize checkpoints, re-forms the ring and runs again in the same
process, and the run is the unresized run's (the same batches, LRs, tests and weights).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from elastic_ring import protocol
from elastic_ring.events import read_events
from elastic_ring.seam import Action, action_file, taken_action_file
from elastic_ring.worker import api, ring
from elastic_ring.worker.hooked import Rejoin
from tests.unit.test_worker_epochs import _current, _run_script, _segment, distributed  # noqa: F401 - a fixture
from tests.unit.test_worker_library import FakeHvd, make_job


def _resize(d):
    """A resize action as a worker reads it (its file's keys)."""
    return Action.from_json({"action": "resize", **d})


def _env(monkeypatch, rank=0, size=1, mode=None) -> None:
    for k, v in (("HOROVOD_RANK", rank), ("HOROVOD_SIZE", size), ("HOROVOD_LOCAL_RANK", rank),
                 ("HOROVOD_LOCAL_SIZE", size)):
        monkeypatch.setenv(k, str(v))
    if mode is None:
        monkeypatch.delenv(ring.INPLACE_ENV, raising=False)
    else:
        monkeypatch.setenv(ring.INPLACE_ENV, mode)


class RingHvd(FakeHvd):
    """A Horovod whose rank and size are what the environment says at ``init()``."""

    def __init__(self, monkeypatch) -> None:
        super().__init__()
        self.env = monkeypatch

    def shutdown(self):
        self.calls.append("shutdown")

    def init(self):
        self.calls.append("init")

    def rank(self):
        import os
        return int(os.environ["HOROVOD_RANK"])

    def size(self):
        import os
        return int(os.environ["HOROVOD_SIZE"])

    local_rank, local_size = rank, size


def test_the_launch_chooses_the_ring_once(monkeypatch):
    for mode, kind, in_place in ((None, ring.RelaunchRing, False), ("1", ring.ElasticRing, True),
                                 (ring.RING_BY_CONTROLLER, ring.ControllerRing, True)):
        _env(monkeypatch, 1, 2, mode)
        r = ring.ring_from_env()
        assert type(r) is kind and r.in_place is in_place and (r.rank, r.size) == (1, 2)


def test_controller_ring_takes_the_members_environment_and_retires_the_others(monkeypatch):
    _env(monkeypatch, 0, 1, ring.RING_BY_CONTROLLER)
    monkeypatch.setenv(ring.MEMBER_ENV, "w1")
    r = ring.ring_from_env()
    r.hvd = RingHvd(monkeypatch)
    r.reform(_resize({"segment": 1, "members": {"w1": {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2",
                                                       "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2"}}}))
    assert (r.rank, r.size) == (1, 2) and r.hvd.calls == ["shutdown", "init"] and not r.alone()
    with pytest.raises(ring.Retired):
        r.reform(_resize({"segment": 2, "members": {"w9": {}}}))
    assert r.hvd.calls[-1] == "shutdown"  # it left the ring: no init


def test_slot_hosts_of_one_host_share_its_cores_as_one_ring(monkeypatch):
    """Under ``--relaunch inplace --survive`` on CPUs each worker slot is a host name of its own, so
    Horovod says local rank 0 of 1 to every worker; the ring's local rank and size are its rank and
    size (all on this host), at the start and after a re-form, and the threads the share of them."""
    from elastic_ring import protocol

    class SlotHvd(RingHvd):
        def local_rank(self):
            return 0

        def local_size(self):
            return 1

    _env(monkeypatch, 1, 2, "1")
    monkeypatch.setenv("HOROVOD_LOCAL_RANK", "0")
    monkeypatch.setenv("HOROVOD_LOCAL_SIZE", "1")
    assert (ring.ring_from_env().local_rank, ring.ring_from_env().local_size) == (0, 1)  # without: Horovod's
    monkeypatch.setenv(protocol.SLOT_HOSTS_ENV, "1")
    r = ring.ring_from_env()
    assert (r.local_rank, r.local_size) == (1, 2)
    r.hvd = SlotHvd(monkeypatch)
    monkeypatch.setenv("HOROVOD_RANK", "0")
    monkeypatch.setenv("HOROVOD_SIZE", "3")
    r.reform(_resize({"segment": 1}))
    assert (r.rank, r.size, r.local_rank, r.local_size) == (0, 3, 0, 3)
    assert r.threads == protocol.cpu_threads(3)


def test_in_place_rings_initialise_horovod_without_a_fixed_cycle_time(monkeypatch):
    """Horovod 0.28's re-initialisation gives a process whose earlier init fixed the cycle time a
    1 MB fusion threshold (a new worker has 128 MB): rings re-formed in place leave it unset, at
    their first init and at every re-init; a ring that is relaunched keeps it."""
    import os
    import sys

    import horovod

    seen = []

    class Hvd(RingHvd):
        def is_initialized(self):
            return False

        def init(self):
            seen.append(os.environ.get("HOROVOD_CYCLE_TIME"))

    for mode, kept in ((None, "5"), ("1", None), (ring.RING_BY_CONTROLLER, None)):
        _env(monkeypatch, 0, 1, mode)
        monkeypatch.setenv("HOROVOD_CYCLE_TIME", "5")
        fake = Hvd(monkeypatch)
        monkeypatch.setitem(sys.modules, "horovod.torch", fake)
        monkeypatch.setattr(horovod, "torch", fake, raising=False)
        r = ring.ring_from_env()
        r.warms_compile = False
        r.init_horovod()
        assert seen[-1] == kept, mode
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "5")  # (put back by another part of the process)
    r.reform(_resize({"segment": 1, "members": {"": {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "1"}}}))
    elastic = ring.ElasticRing()
    elastic.hvd = fake
    monkeypatch.setenv("HOROVOD_CYCLE_TIME", "5")
    elastic.reform(_resize({"segment": 2}))
    assert seen[-2:] == [None, None]


def test_who_may_act_on_an_action_and_when(tmp_path, monkeypatch):
    _env(monkeypatch, 0, 1, "1")
    he = ring.ring_from_env()
    he.hvd = FakeHvd()
    act = Action.from_json({"action": "resize", "to": 2, "segment": 1, "stop_at": 9, "hosts_written": 100.0})
    assert not he.takes(act)  # Horovod's driver has not reported the hosts yet
    he.on_hosts_updated(99.5, None)
    assert he.takes(act)
    _env(monkeypatch, 0, 1, ring.RING_BY_CONTROLLER)
    by_controller = ring.ring_from_env()
    by_controller.hvd = FakeHvd()
    assert by_controller.takes(act)
    # an action written ahead: taken (renamed) at a scheduled stop at its step only
    path = action_file(tmp_path, 0)
    path.parent.mkdir(parents=True)
    protocol.write_json_atomic(path, dict(act.to_json(), at_step=5))
    got = by_controller.await_action(tmp_path, 0, step=5, scheduled=True)
    assert got.at_step == 5 and taken_action_file(tmp_path, 0).exists() and not path.exists()


def _in_place_job(tmp_path, monkeypatch, segment, stop_at, r=None, rejoined=False):
    """A job on a Ray-backend ring of one (fake Horovod), as the entry point would make it."""
    job = make_job(tmp_path, monkeypatch, size=1, segment=segment, stop_at=stop_at, total=10**9)
    if r is None:
        monkeypatch.setenv(ring.INPLACE_ENV, ring.RING_BY_CONTROLLER)
        monkeypatch.setenv(ring.MEMBER_ENV, "w1")
        r = ring.ring_from_env()
        r.hvd, r.connected = RingHvd(monkeypatch), True
    info = dataclasses.replace(job.info, segment=segment, stop_at=stop_at)
    job = api.Job(info, lazy=True, ring=r, rejoined=rejoined)
    _current(monkeypatch, job)
    return job


def test_epoch_loop_resized_in_place_runs_again_in_the_process_as_if_never_stopped(tmp_path, monkeypatch,
                                                                                    distributed):  # noqa: F811
    ref: list = []
    _, ref_model = _segment(tmp_path / "ref", monkeypatch, 0, 10**9, ref)
    run = tmp_path / "run"
    job = _in_place_job(run, monkeypatch, 0, 4)
    path = action_file(run, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    env = {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "1", "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "1"}
    protocol.write_json_atomic(path, {"action": "resize", "to": 1, "segment": 1, "stop_at": 10**9,
                                      "members": {"w1": env}})
    trace: list = []
    with pytest.raises(Rejoin) as stopped:
        _run_script(job, trace)
    r = stopped.value
    assert (r.segment, r.stop_at, r.ring) == (1, 10**9, job.ring) and job.ring.hvd.calls[-2:] == ["shutdown", "init"]
    assert (run / "checkpoints" / "ckpt-00000004.pt").exists()
    ends = read_events(run / protocol.WORKER_EVENTS, kind="segment_end")
    assert [(e["step"], e["reason"]) for e in ends] == [(4, "scheduled")]  # told once, at the pause
    again = _in_place_job(run, monkeypatch, r.segment, r.stop_at, r=r.ring, rejoined=True)
    model = _run_script(again, trace)
    assert again.finished and again.step == 18 and trace == ref
    for a, b in zip(model.state_dict().values(), ref_model.state_dict().values()):
        assert torch.equal(a, b)
