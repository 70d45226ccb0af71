"""The worker library's own logic, with a fake in-process Horovod (no horovodrun).

A ``Job`` is built as horovodrun would start it (``HOROVOD_*`` variables, ``ELASTIC_RING_*``
launch settings) and given a fake ``hvd`` whose collectives are those of one rank (identity:
every other rank agrees). Each test fails on one mutation of the library: Eq. 7's direction
swapped, the sampler's cursor moving by ``batch`` instead of ``world * batch``, the optimizer
state or the RNG state not restored, schedulers or extras not restored in place.
"""

from __future__ import annotations

import random
import sys
import types

import numpy as np
import pytest
import torch

from elastic_ring.protocol import LaunchInfo
from elastic_ring.worker import api, session, sync


class FakeHvd:
    """The collectives of a world where every rank holds rank 0's values."""

    Average, Sum, Min, Max = "average", "sum", "min", "max"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def broadcast_object(self, obj, root_rank=0, name=None):
        self.calls.append(f"broadcast_object:{name}")
        return obj

    def broadcast_optimizer_state(self, opt, root_rank=0):
        self.calls.append("broadcast_optimizer_state")

    def broadcast_parameters(self, params, root_rank=0):
        self.calls.append("broadcast_parameters")

    def allreduce(self, t, op=None, name=None):
        return t.clone()

    def allreduce_async(self, t, op=None, name=None):
        return t.clone()

    def allreduce_async_(self, t, op=None, name=None):
        return t  # (in place: every rank holds rank 0's values already)

    def synchronize(self, handle):
        return handle


def make_job(tmp_path, monkeypatch, *, rank=0, size=1, segment=0, stop_at=5, total=20,
             ckpt_every=0) -> api.Job:
    monkeypatch.setenv("HOROVOD_RANK", str(rank))
    monkeypatch.setenv("HOROVOD_SIZE", str(size))
    monkeypatch.setenv("HOROVOD_LOCAL_RANK", str(rank))
    monkeypatch.setenv("HOROVOD_LOCAL_SIZE", str(size))
    info = LaunchInfo(run_dir=tmp_path, segment=segment, stop_at=stop_at, total_steps=total,
                      checkpoint_every=ckpt_every, throughput_window=1000)
    job = api.Job(info, lazy=True)
    job.ring.hvd = FakeHvd()
    job.ring.connected = True
    return job


def build(lr: float, sched_kind: str = "onecycle"):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    if sched_kind == "onecycle":
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr * 3, total_steps=25)
    else:
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    return model, opt, sched


def train(job, model, opt, sched, data=None, lrs=None, batches=None):
    x = torch.linspace(-1, 1, 40).reshape(10, 4)
    for _ in job.steps():
        if lrs is not None:
            lrs.append(opt.param_groups[0]["lr"])
        idx = data.next_batch() if data is not None else torch.arange(4)
        if batches is not None:
            batches.append(idx.tolist())
        loss = model(x[idx % 10]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()


def reference_lrs(lr: float, steps: int) -> list[float]:
    model, opt, sched = build(lr)
    out = []
    for _ in range(steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


def test_resize_1_to_2_restores_everything_and_rescales_by_eq7(tmp_path, monkeypatch):
    # segment 0: one worker, steps 1..5, final checkpoint
    job = make_job(tmp_path, monkeypatch, size=1, stop_at=5)
    model, opt, sched = build(0.1)
    data = job.sampler(1000, batch_size=4, seed=3)
    job.register(model=model, optimizer=opt, scheduler=sched)
    assert job.restore() is False
    lrs: list[float] = []
    train(job, model, opt, sched, data, lrs)
    assert job.stop_reason == "scheduled" and not job.finished
    momentum = {k: v["momentum_buffer"].clone() for k, v in opt.state_dict()["state"].items()}
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    after = (torch.rand(3), np.random.rand(2), random.random())  # RNG right after the checkpoint
    cursor = data.cursor
    assert cursor == 5 * 4

    # segment 1: two workers (this is rank 0), a fresh script with other weights and LR
    torch.manual_seed(123), np.random.seed(123), random.seed(123)
    job2 = make_job(tmp_path, monkeypatch, size=2, segment=1, stop_at=12)
    model2, opt2, sched2 = build(0.7)
    with torch.no_grad():
        model2.weight.add_(1.0)
    data2 = job2.sampler(1000, batch_size=4, seed=3)
    job2.register(model=model2, optimizer=opt2, scheduler=sched2)
    assert job2.restore() is True
    assert (job2.step, job2.previous_world, job2.lr_factor) == (5, 1, 2.0)
    # weights and every momentum buffer restored
    for k, v in model2.state_dict().items():
        assert torch.equal(v, weights[k]), k
    state = opt2.state_dict()["state"]
    assert set(state) == set(momentum)
    for k, buf in momentum.items():
        assert torch.equal(state[k]["momentum_buffer"], buf), k
    # RNG: the draws after the restore are the ones after the checkpoint
    assert torch.equal(torch.rand(3), after[0])
    assert np.array_equal(np.random.rand(2), after[1])
    assert random.random() == after[2]
    # Eq. 7 for every later step: 2x the schedule of the unresized run
    lrs2: list[float] = []
    batches: list[list[int]] = []
    train(job2, model2, opt2, sched2, data2, lrs2, batches)
    ref = reference_lrs(0.1, 12)
    assert lrs == pytest.approx(ref[:5], rel=1e-12)
    assert lrs2 == pytest.approx([2 * r for r in ref[5:12]], rel=1e-12)
    # the data: rank 0 of 2 takes the first half of each step's 2 x 4 positions from the cursor
    stream = data2.stream
    assert batches == [stream.take(cursor + i * 8, 4).tolist() for i in range(7)]
    assert data2.cursor == cursor + 7 * 8


def test_sampler_shares_are_exact_across_world_sizes(tmp_path, monkeypatch):
    """Two ranks of a world of 2 take disjoint shares; with a world of 1 before, every position of
    the stream is used exactly once, in order."""
    job1 = make_job(tmp_path, monkeypatch, size=1)
    s1 = job1.sampler(50, batch_size=3, seed=1)
    seen = [s1.next_batch().tolist() for _ in range(4)]
    ranks = [make_job(tmp_path, monkeypatch, rank=r, size=2) for r in (0, 1)]
    samplers = [j.sampler(50, batch_size=3, seed=1) for j in ranks]
    for s in samplers:
        s.cursor = s1.cursor
    for _ in range(10):
        for s in samplers:
            seen.append(s.next_batch().tolist())
    flat = [i for b in seen for i in b]
    assert flat == s1.stream.take(0, len(flat)).tolist()
    assert samplers[0].cursor == samplers[1].cursor == 12 + 10 * 6
    assert samplers[0].epoch == (12 + 60) // 50


def test_sampler_as_batch_sampler_keeps_prefetched_batches(tmp_path, monkeypatch):
    """A DataLoader prefetches; only the steps done move the cursor, so the next segment's loader
    starts where training stopped, not where prefetching did."""
    job = make_job(tmp_path, monkeypatch, size=1, stop_at=3)
    data = job.sampler(30, batch_size=2, seed=0)
    ds = torch.utils.data.TensorDataset(torch.arange(30))
    with pytest.raises(api.ContractError, match="after job.restore"):
        next(iter(data))
    job.register(model=torch.nn.Linear(1, 1))
    job.restore()
    # one loader process that prefetches 4 batches ahead of the training
    it = iter(torch.utils.data.DataLoader(ds, batch_sampler=data, num_workers=1, prefetch_factor=4))
    got = []
    for _ in job.steps():
        got.append(next(it)[0].tolist())
    assert data.cursor == 3 * 2
    del it
    with pytest.raises(api.ContractError, match="next_batch"):
        data.next_batch()
    job2 = make_job(tmp_path, monkeypatch, size=2, segment=1, stop_at=6)
    data2 = job2.sampler(30, batch_size=2, seed=0)
    job2.register(model=torch.nn.Linear(1, 1))
    job2.restore()
    it2 = iter(torch.utils.data.DataLoader(ds, batch_sampler=data2, num_workers=0))
    for _ in job2.steps():
        got.append(next(it2)[0].tolist())
    stream = data.stream
    assert got[:3] == [stream.take(2 * i, 2).tolist() for i in range(3)]
    assert got[3:] == [stream.take(6 + 4 * i, 2).tolist() for i in range(3)]  # rank 0 of 2
    assert data2.cursor == 6 + 3 * 4


def test_extras_restored_in_place_and_grad_scaler(tmp_path, monkeypatch):
    job = make_job(tmp_path, monkeypatch, stop_at=2)
    counters = {"best": 0.5}
    ema = torch.nn.Linear(2, 2)
    buf = torch.zeros(3)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    job.register(model=torch.nn.Linear(1, 1), counters=counters, ema=ema, buf=buf, scaler=scaler,
                 note="x")
    job.restore()
    for step in job.steps():
        counters["best"] = 0.1 * step
        buf += 1
        with torch.no_grad():
            ema.weight.fill_(float(step))
    scaler_state = scaler.state_dict()

    job2 = make_job(tmp_path, monkeypatch, segment=1, stop_at=3)
    counters2, ema2, buf2 = {"best": 9.0}, torch.nn.Linear(2, 2), torch.zeros(3)
    scaler2 = torch.amp.GradScaler("cpu", init_scale=2.0)
    job2.register(model=torch.nn.Linear(1, 1), counters=counters2, ema=ema2, buf=buf2,
                  scaler=scaler2, note="y")
    job2.restore()
    assert counters2 == {"best": pytest.approx(0.2)} and job2.extras["counters"] is counters2
    assert torch.equal(ema2.weight, torch.full((2, 2), 2.0)) and job2.extras["ema"] is ema2
    assert torch.equal(buf2, torch.full((3,), 2.0)) and job2.extras["buf"] is buf2
    assert scaler2.state_dict() == scaler_state and job2.extras["scaler"] is scaler2
    assert job2.extras["note"] == "x"  # immutable: replaced, read back from job.extras


def test_misuse_fails_at_once(tmp_path, monkeypatch):
    job = make_job(tmp_path, monkeypatch)
    model = torch.nn.Linear(2, 2)
    with pytest.raises(api.ContractError, match="'fn'.*does not pickle"):
        job.register(model=model, fn=lambda x: x)

    class DistSGD(torch.optim.SGD):  # what hvd.DistributedOptimizer's class carries
        def _allreduce_grad_async(self, p):
            return None

    dist = DistSGD(model.parameters(), lr=0.1)
    with pytest.raises(api.ContractError, match="optimizer=.*missing"):
        job.register(model=model)
    other = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    with pytest.raises(api.ContractError, match="another optimizer"):
        job.register(model=model, optimizer=dist,
                     scheduler=torch.optim.lr_scheduler.StepLR(other, 2))
    # a scheduler built on the optimizer before the wrapper: re-pointed at the registered one
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(inner, 2)
    wrapped = DistSGD(inner.param_groups, lr=0.1)
    job.register(model=model, optimizer=wrapped, scheduler=sched)
    assert sched.optimizer is wrapped
    del dist


def test_hvd_init_before_init_is_an_error(monkeypatch):
    fake = types.SimpleNamespace(is_initialized=lambda: True)
    monkeypatch.setitem(sys.modules, "horovod.torch", fake)
    monkeypatch.setattr(session, "_PROCESS", session._Process())  # no job yet in this process
    # under the tool (outside it, hvd.init() first is plain Horovod): the worker entry's launch
    session.launched(LaunchInfo(run_dir="/nonexistent", segment=0, stop_at=1, total_steps=1))
    with pytest.raises(api.ContractError, match="hvd.init\\(\\) before"):
        api.init()


def test_finish_ends_the_loop_at_the_next_agreement(tmp_path, monkeypatch):
    job = make_job(tmp_path, monkeypatch, stop_at=20, total=20)
    # a DistributedOptimizer left alive by another test in this process is not this job's
    monkeypatch.setattr(sync, "_distributed_optimizers", lambda: [])
    job.register(model=torch.nn.Linear(1, 1))
    job.restore()
    done = []
    for step in job.steps():
        done.append(step)
        if step == 4:
            job.finish()
    assert done == [1, 2, 3, 4, 5]  # the vote started after step 4 is read after step 5
    assert job.finished and job.stop_reason == "finished"
    assert (tmp_path / "checkpoints" / "ckpt-00000005.pt").exists()


def test_scheduler_registered_at_save_but_not_at_restore_is_an_error(tmp_path, monkeypatch):
    job = make_job(tmp_path, monkeypatch, stop_at=2)
    model, opt, sched = build(0.1, "step")
    job.register(model=model, optimizer=opt, scheduler=sched)
    job.restore()
    for _ in job.steps():
        pass
    job2 = make_job(tmp_path, monkeypatch, segment=1, stop_at=4)
    model2, opt2, _ = build(0.1, "step")
    job2.register(model=model2, optimizer=opt2)
    with pytest.raises(api.ContractError, match="holds 1 scheduler.*registered 0"):
        job2.restore()


def test_heartbeat_says_sync_once_the_rank_reaches_its_optimizer_step(tmp_path, monkeypatch):
    """The stall watchdog tells a rank hung in its own work from the ranks waiting for it: the
    heartbeat is (last step done, "step") until this rank calls the registered optimizer's step
    (where Horovod waits for the others' gradients), then (last step done, "sync"). The training
    thread only notes them; the heartbeat's thread writes the note (within its period)."""
    from elastic_ring.heartbeat import Beat, read_beats
    from tests.conftest import wait_for

    def on_disk(want):  # the file once the writer thread caught up with the training thread's note
        try:
            return wait_for(lambda: read_beats(tmp_path, 0) == want and want, 5, str(want), poll=0.01)
        except AssertionError:
            return read_beats(tmp_path, 0)

    job = make_job(tmp_path, monkeypatch, rank=1, size=2, stop_at=3)
    model, opt, sched = build(0.1)
    job.register(model=model, optimizer=opt, scheduler=sched)
    job.restore()
    seen = []
    x = torch.ones(4, 4)
    for step in job.steps():
        before = on_disk([Beat(1, step - 1, "step")]) if step > 1 else None
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        seen.append((step, before, on_disk([Beat(1, step - 1, "sync")])))
    assert seen[0][2] == [Beat(1, 0, "sync")]
    for step, before, after in seen[1:]:
        assert before == [Beat(1, step - 1, "step")] and after == [Beat(1, step - 1, "sync")], step


def test_start_up_is_counted_from_the_launch_and_never_negative():
    """A worker forked from the fork server: its phases count from the controller's launch
    (``launcher``: up to the start of the command horovodrun ran) and its ``imports`` (done in the
    fork server long before) is the hand-over to the fork, not -90 s; without the launch time (another
    host's clock, an older controller) they count from the process's start, as before."""
    from elastic_ring import protocol

    env = {protocol.LAUNCHED_AT_ENV: "1000.0", protocol.PROCESS_START_ENV: "1003.0"}
    st = api.startup_marks(own_start=1003.4, t_imported=910.0, env=env)  # forked at 1003.4, imported at 910
    st.marks.update(build=1004.0, hvd_init=1005.0)
    assert st.t_start == 1000.0
    assert st.phases() == {"launcher": 3.0, "imports": pytest.approx(0.4), "build": pytest.approx(0.6),
                           "hvd_init": 1.0}
    st = api.startup_marks(own_start=1003.0, t_imported=1005.5, env={protocol.LAUNCHED_AT_ENV: "1000.0"})
    assert st.t_start == 1000.0 and st.phases() == {"launcher": 3.0, "imports": 2.5}  # not forked
    for env in ({}, {protocol.LAUNCHED_AT_ENV: "-5000.0"}, {protocol.LAUNCHED_AT_ENV: "x"}):
        st = api.startup_marks(own_start=1003.0, t_imported=1005.5, env=env)
        assert st.t_start == 1003.0 and st.phases() == {"imports": 2.5}


def test_next_batch_prepared_ahead_is_the_stream_at_every_step_resize_and_restore():
    """``next_batch()`` hands out batches prepared ``AHEAD`` steps at a time: each is still the
    stream's positions of that step, past the prepared steps' end, an epoch's end, a change of
    world size or rank and a restored cursor; and a batch written into changes no later one."""
    from elastic_ring.worker import sampler as sampler_mod

    job = types.SimpleNamespace(rank=1, size=3)
    s = sampler_mod.Sampler(job, size=101, batch_size=4, seed=7)
    ref = sampler_mod.Sampler(types.SimpleNamespace(rank=0, size=1), size=101, batch_size=4, seed=7).stream

    def expect(n):
        for _ in range(n):
            start = s.cursor + job.rank * 4
            got = s.next_batch()
            assert got.tolist() == ref.take(start, 4).tolist()
            assert s.last_start == start and s.epoch == (s.cursor - 4 * job.size) // 101
            got.fill_(-1)  # (the script's own use of its batch)

    expect(sampler_mod.AHEAD + 5)  # past the first prepared steps, across epochs (101 positions)
    assert s.cursor == (sampler_mod.AHEAD + 5) * 12
    job.size, job.rank = 2, 0  # resized
    expect(3)
    s.cursor = 40  # restored
    expect(2)
    job.rank = 1
    expect(1)
    assert s.stream.take(0, 101).sort().values.tolist() == list(range(101))  # the stream untouched
