"""A plain Horovod script's epoch loop on the worker library, with a fake in-process Horovod.

``elastic.DistributedSampler`` against torch's own sampler; the data position of an epoch across a
resize inside it (every sample once); the stop points at the registered optimizer's steps, inside
an epoch and at its last step, against an unresized run (the same batches, LRs, weights, RNG); the
flat loop's per-epoch scheduler recipe across a stop at the step that completes an epoch; the
plain job outside the tool; the edges (threads, Adasum, ``job.evaluating()``).
"""

from __future__ import annotations

import math
import sys
import types

import pytest
import torch

from elastic_ring.ckpt import CheckpointStore
from elastic_ring.worker import api, session, sync
from elastic_ring.worker.data import DataPosition, DistributedSampler, EpochData
from elastic_ring.worker.hooked import StopSegment
from tests.unit.test_worker_library import FakeHvd, make_job


class StubJob:
    """What the drop-in sampler reads of a job: rank, size, the data position."""

    def __init__(self, rank: int, size: int, elastic: bool = True, position: DataPosition | None = None):
        self.rank, self.size, self.elastic = rank, size, elastic
        self._epoch_data = EpochData(position=position or DataPosition())
        self._position = self._epoch_data.position


def _current(monkeypatch, job) -> None:
    """``job`` is this process's job (what elastic.init() returned)."""
    monkeypatch.setattr(session, "_PROCESS", session._Process(job=job, init_called=True))


def _sampler(monkeypatch, job, n, **kw) -> DistributedSampler:
    _current(monkeypatch, job)
    return DistributedSampler(list(range(n)), **kw)


@pytest.mark.parametrize("n,world,drop_last,shuffle", [(23, 1, False, True), (23, 2, False, True),
                                                       (23, 3, False, False), (23, 3, True, True),
                                                       (24, 4, False, True)])
def test_drop_in_gives_torchs_order_and_len(monkeypatch, n, world, drop_last, shuffle):
    from torch.utils.data.distributed import DistributedSampler as TorchSampler

    for elastic in (True, False):
        for rank in range(world):
            ours = _sampler(monkeypatch, StubJob(rank, world, elastic), n, num_replicas=world, rank=rank,
                            shuffle=shuffle, seed=5, drop_last=drop_last)
            theirs = TorchSampler(list(range(n)), num_replicas=world, rank=rank, shuffle=shuffle, seed=5,
                                  drop_last=drop_last)
            for epoch in (0, 3):
                ours.set_epoch(epoch)
                theirs.set_epoch(epoch)
                assert list(ours) == list(theirs) and len(ours) == len(theirs)


def test_wrong_rank_is_an_error(monkeypatch):
    with pytest.raises(api.ContractError, match="rank 0 of 2"):
        _sampler(monkeypatch, StubJob(0, 2), 10, num_replicas=3, rank=0)


def _steps(monkeypatch, jobs, n, batch, epoch, k=None):
    """The ranks of ``jobs`` iterate their loaders in lockstep for ``k`` steps (None: the rest of
    the epoch); the training sampler of each moves at each step. Returns each step's global block
    (the ranks' batches interleaved, as the positions of the epoch's permutation are)."""
    loaders = []
    for job in jobs:
        s = _sampler(monkeypatch, job, n, num_replicas=job.size, rank=job.rank)
        s.set_epoch(epoch)
        loaders.append((job, s, iter(torch.utils.data.DataLoader(list(range(n)), batch_size=batch, sampler=s))))
    blocks = []
    while k is None or len(blocks) < k:
        try:
            parts = [next(it).tolist() for _, _, it in loaders]
        except StopIteration:
            break
        for job, s, _ in loaders:
            s.advance()
        w = len(jobs)
        blocks.append([parts[i % w][i // w] for i in range(sum(map(len, parts)))])
    return blocks, [j._position for j in jobs]


def test_epoch_position_across_resizes_uses_every_sample_once(monkeypatch):
    n, batch, epoch = 40, 3, 7
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(epoch)).tolist()
    one = StubJob(0, 1)
    blocks, (pos,) = _steps(monkeypatch, [one], n, batch, epoch, k=4)  # 12 positions at 1 worker
    assert pos.pos == 12 and pos.sampler_epoch == epoch and pos.sampler_index is not None
    saved = pos.state()
    twos = [StubJob(r, 2, position=DataPosition()) for r in (0, 1)]
    for j in twos:
        j._position.load(saved)
    more, positions = _steps(monkeypatch, twos, n, batch, epoch, k=2)  # 2 x 6 positions at 2
    assert [p.pos for p in positions] == [24, 24]
    three = [StubJob(r, 4, position=DataPosition()) for r in range(4)]
    for j in three:
        j._position.load(positions[0].state())
    rest, last = _steps(monkeypatch, three, n, batch, epoch)  # the 16 left at 4 workers: 12 + 4
    assert [len(b) for b in rest] == [12, 4] and last[0].pos == n
    flat = [i for b in blocks + more + rest for i in b]
    assert flat == perm  # every sample of the epoch once, in the order of its permutation
    # len(): the indices left to this rank in the epoch (after the resize: of the rest only)
    resumed = StubJob(0, 2)
    resumed._position.load(saved)
    s = _sampler(monkeypatch, resumed, n, num_replicas=2, rank=0)
    s.set_epoch(epoch)
    assert len(s) == (n - 12) // 2
    s.set_epoch(epoch + 1)  # the next epoch: a full one again
    assert len(s) == n // 2


def test_test_sampler_is_not_the_training_one(monkeypatch):
    job = StubJob(0, 1)
    train = _sampler(monkeypatch, job, 30)
    test = _sampler(monkeypatch, job, 10, shuffle=False)
    list(test)  # a test before training: no optimizer step follows it
    it = iter(torch.utils.data.DataLoader(list(range(30)), batch_size=4, sampler=train))
    next(it)
    job._epoch_data.iterated.advance()
    assert job._position.sampler_index == train.index and job._position.pos == 4
    assert list(test) == list(range(10))  # the test set from its start, whatever the position


# ---------------------------------------------------------------------- the epoch loop on a Job
N, B = 24, 4  # 6 steps per epoch at one worker


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)
        self.drop = torch.nn.Dropout(0.5)  # uses the RNG: the resume must restore it exactly

    def forward(self, x):
        return self.fc(self.drop(x))


def _run_script(job, trace: list, epochs: int = 3):
    """A plain Horovod epoch script, adapted: drop-in sampler, register + restore, job.epochs."""
    torch.manual_seed(1)
    x = torch.linspace(-1, 1, N * 3).reshape(N, 3)
    data = torch.utils.data.TensorDataset(torch.arange(N), x)
    sampler = DistributedSampler(data)
    loader = torch.utils.data.DataLoader(data, batch_size=B, sampler=sampler)
    test_loader = torch.utils.data.DataLoader(x[:5], batch_size=2, sampler=DistributedSampler(x[:5]))
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    job.register(model=model, optimizer=opt, scheduler=sched)  # before the wrap, as a plain script broadcasts
    job.restore()
    opt = FakeDistributed(opt)
    for epoch in job.epochs(1, epochs + 1):
        sampler.set_epoch(epoch)
        per_rank = math.ceil((N - job._epoch_data.position.pos) / job.size)  # the rest of the epoch at this size
        assert len(sampler) == per_rank and len(loader) == math.ceil(per_rank / B)
        for ids, xb in loader:
            assert len(sampler) == per_rank  # stable while the epoch runs (a progress print's total)
            opt.zero_grad()
            model(xb).pow(2).mean().backward()
            lr = opt.param_groups[0]["lr"]
            opt.step()
            trace.append(("step", job.step, epoch, ids.tolist(), lr))
            if job.step % 6 == 2:  # a test inside the epoch, over a drop-in sampler of its own
                model.eval()
                with torch.no_grad(), job.evaluating():
                    trace.append(("inline", [model(xt).sum().item() for xt in test_loader]))
                model.train()
        trace.append(("test", epoch, job.step))
        sched.step()
    return model


class FakeDistributed(torch.optim.SGD):
    """Stands for ``hvd.DistributedOptimizer``: a new optimizer over the wrapped one's groups (found
    by the ``distributed`` fixture, not by the library's search for Horovod's class, so that no
    other test sees one)."""

    def __init__(self, opt) -> None:
        super().__init__(opt.param_groups)

    def step(self, closure=None):  # as Horovod's: its own step (hooked) runs the hooked SGD.step
        return super().step(closure)


@pytest.fixture
def distributed(monkeypatch):
    live: list = []
    orig = FakeDistributed.__init__

    def init(self, opt):
        orig(self, opt)
        live.append(self)

    monkeypatch.setattr(FakeDistributed, "__init__", init)
    monkeypatch.setattr(sync, "_distributed_optimizers", lambda: live)
    return live


def _segment(tmp_path, monkeypatch, segment, stop_at, trace):
    job = make_job(tmp_path, monkeypatch, size=1, segment=segment, stop_at=stop_at, total=10**9)
    _current(monkeypatch, job)
    try:
        model = _run_script(job, trace)
    except StopSegment:
        return job, None
    return job, model


@pytest.mark.parametrize("stops", [[4], [6], [4, 6, 13]], ids=["inside", "epoch-end", "three"])
def test_epoch_loop_stops_and_resumes_as_if_never_stopped(tmp_path, monkeypatch, distributed, stops):
    ref: list = []
    job, ref_model = _segment(tmp_path / "ref", monkeypatch, 0, 10**9, ref)
    assert job.finished and job.stop_reason == "finished" and job.step == 18
    trace: list = []
    for seg, stop in enumerate(stops + [10**9]):
        job, model = _segment(tmp_path / "run", monkeypatch, seg, stop, trace)
        if model is None:
            assert job.step == stop and job.stop_reason == "scheduled"
            ck = CheckpointStore(tmp_path / "run" / "checkpoints").load_latest()
            at_end = stop % (N // B) == 0
            assert ck["step"] == stop and ck["data_position"]["pos"] == (0 if at_end else stop % 6 * B)
            assert ck["data_position"]["epoch"] == 1 + stop // 6
            # a stop at an epoch's last step comes after its test and its scheduler step
            assert ck["schedulers"][0]["last_epoch"] == stop // 6
    assert trace == ref  # the same batches, LRs and tests, each once
    for a, b in zip(model.state_dict().values(), ref_model.state_dict().values()):
        assert torch.equal(a, b)  # momentum and dropout's RNG restored exactly


def test_epoch_loop_resize_rescales_and_splits_the_rest(tmp_path, monkeypatch, distributed):
    trace: list = []
    _segment(tmp_path, monkeypatch, 0, 3, trace)
    job = make_job(tmp_path, monkeypatch, rank=0, size=2, segment=1, stop_at=10**9, total=10**9)
    _current(monkeypatch, job)
    _run_script(job, trace)
    steps = [t for t in trace if t[0] == "step"]
    assert [len(t[3]) for t in steps[:3]] == [4] * 3
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(1)).tolist()
    # rank 0 of 2 takes every other index of the rest of epoch 1: 12 left, 6 for it, 2 steps
    assert [i for t in steps[3:5] for i in t[3]] == perm[12::2]
    assert steps[3][4] == pytest.approx(2 * steps[0][4])  # Eq. 7 from the first step at 2
    assert steps[5][2] == 2 and steps[5][4] == pytest.approx(2 * 0.1 * 0.5)


def test_flat_recipe_per_epoch_scheduler_exact_across_resizes_at_an_epochs_last_step(tmp_path, monkeypatch):
    """``while sched.last_epoch < data.epoch: sched.step()`` after taking the step's batch, with
    ``next_batch()`` and with a DataLoader, resized 1 -> 2 -> 1 at the steps that complete epochs
    0 and 1 (16 samples, 4 per worker: 4 steps an epoch at 1 worker, 2 at 2)."""
    total, plan = 14, [(4, 1), (6, 2), (14, 1)]  # (stop, world) per segment
    world = {s: 1 if s <= 4 or s > 6 else 2 for s in range(1, total + 1)}
    epoch = {s: 0 if s <= 4 else 1 if s <= 6 else 2 + (s - 7) // 4 for s in world}
    for loader in (False, True):
        lrs, epochs = {}, {}
        for seg, (stop, w) in enumerate(plan):
            job = make_job(tmp_path / str(loader), monkeypatch, size=w, segment=seg, stop_at=stop, total=total)
            model = torch.nn.Linear(1, 1)
            opt = torch.optim.SGD(model.parameters(), lr=1.0)
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
            data = job.sampler(16, batch_size=4, seed=0)
            job.register(model=model, optimizer=opt, scheduler=sched)
            job.restore()
            batches = iter(torch.utils.data.DataLoader(list(range(16)), batch_sampler=data)) if loader else None
            for step in job.steps():
                idx = next(batches) if loader else data.next_batch()
                epochs[step] = data.epoch  # the epoch of the batch being trained
                while sched.last_epoch < data.epoch:
                    sched.step()
                lrs[step] = opt.param_groups[0]["lr"]
                opt.step()
                assert len(idx) == 4
        assert epochs == epoch
        assert lrs == pytest.approx({s: world[s] * 0.5 ** epoch[s] for s in world}, rel=1e-12)  # Eq. 7


# ---------------------------------------------------------------------- outside the tool, edges
def test_plain_job_is_plain_horovod(monkeypatch):
    calls: list = []
    fake = types.SimpleNamespace(
        is_initialized=lambda: False, init=lambda: calls.append("init"), rank=lambda: 1, size=lambda: 2,
        local_rank=lambda: 1, local_size=lambda: 2, Average="avg",
        broadcast_parameters=lambda p, root_rank: calls.append("params"),
        broadcast_optimizer_state=lambda o, root_rank: calls.append("opt"))
    monkeypatch.setitem(sys.modules, "horovod.torch", fake)
    monkeypatch.setitem(sys.modules, "horovod", types.SimpleNamespace(torch=fake))
    monkeypatch.delenv("ELASTIC_RING_RUN_DIR", raising=False)
    monkeypatch.setattr(session, "_PROCESS", session._Process())
    job = api.init()
    assert not job.elastic and (job.rank, job.size) == (1, 2) and calls == ["init"]
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    job.register(model=model, optimizer=opt)
    assert job.restore() is False and calls == ["init", "params", "opt"]  # the broadcasts it replaced
    assert list(job.epochs(1, 4)) == [1, 2, 3] and job.finished
    s = DistributedSampler(list(range(9)))
    from torch.utils.data.distributed import DistributedSampler as TorchSampler
    assert list(s) == list(TorchSampler(list(range(9)), num_replicas=2, rank=1))
    opt.step()
    assert job.step == 1
    with pytest.raises(api.NotLaunchedError, match="ELASTIC_RING_STEPS"):
        next(iter(job.steps()))
    with job.evaluating():
        pass


@pytest.mark.parametrize("env,modules,want", [
    ({"ELASTIC_RING_COLLECTIVE": "torch", "HOROVOD_RANK": "0"}, {"horovod.torch": 1}, "torch"),  # named
    ({"ELASTIC_RING_COLLECTIVE": "horovod"}, {}, "horovod"),
    ({"HOROVOD_RANK": "1", "RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, {}, "horovod"),
    ({"OMPI_COMM_WORLD_RANK": "0"}, {}, "horovod"),  # mpirun
    ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, {"horovod.torch": 1}, "torch"),
    ({}, {"horovod.torch": 1}, "horovod"),  # one process: the script imported Horovod
    ({}, {}, "torch"),
])
def test_plain_collective_is_the_launchers_or_the_scripts(env, modules, want):
    from elastic_ring.worker.plain import plain_collective

    assert plain_collective(env, modules) == want


def test_plain_collective_named_wrong_is_an_error():
    from elastic_ring.worker.plain import plain_collective

    with pytest.raises(api.ContractError, match="ELASTIC_RING_COLLECTIVE=mpi: must be one of horovod, torch"):
        plain_collective({"ELASTIC_RING_COLLECTIVE": "mpi"}, {})


def test_plain_job_on_torch_in_one_process_is_a_group_of_one(monkeypatch):
    """``python script.py`` of a torch-path script: a real gloo group of this process alone, so that
    the script's ``DistributedDataParallel`` and ``dist.get_rank()`` work; the drop-ins are plain."""
    import torch.distributed as dist

    for k in ("ELASTIC_RING_RUN_DIR", "ELASTIC_RING_COLLECTIVE", "RANK", "WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.delitem(sys.modules, "horovod.torch", raising=False)
    monkeypatch.setattr(session, "_PROCESS", session._Process())
    assert not dist.is_initialized()
    try:
        job = api.init()
        assert not job.elastic and job.collective.name == "torch" and job.hvd is None
        assert (job.rank, job.size, job.local_rank, job.local_size) == (0, 1, 0, 1)
        assert (dist.get_rank(), dist.get_world_size()) == (0, 1)
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        net, same = job.parallel(model, opt)
        assert isinstance(net, torch.nn.parallel.DistributedDataParallel) and same is opt
        with pytest.raises(api.ContractError, match="Horovod's"):
            job.distributed_optimizer(opt, model)
        job.register(model=model, optimizer=opt)
        assert job.restore() is False
        s = DistributedSampler(list(range(9)))
        assert sorted(s) == list(range(9))
        for epoch in job.epochs(1, 3):
            net(torch.ones(4, 2)).sum().backward()
            opt.step()
        assert epoch == 2 and job.step == 2 and job.finished
        assert job.collective.allreduce(torch.tensor([3.0])).item() == 3.0
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_thread_override_warned_once(tmp_path, monkeypatch, capsys):
    job = make_job(tmp_path, monkeypatch)
    before = torch.get_num_threads()
    try:
        job.progress.check_threads()
        assert capsys.readouterr().err == ""
        torch.set_num_threads(before + 1)
        job.progress.check_threads()
        job.progress.check_threads()
        err = capsys.readouterr().err
        assert err.count("set torch's threads to") == 1, err
        # which count applies: the script's, per worker, not the library's
        assert f"threads to {before + 1}: its {before + 1} per worker apply, not the library's " in err, err
    finally:
        torch.set_num_threads(before)


def test_adasum_gets_no_eq7(tmp_path, monkeypatch, capsys):
    job = make_job(tmp_path, monkeypatch)
    job.ring.hvd.Adasum = "adasum"
    opt = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)
    opt.op = "adasum"
    job.register(optimizer=opt)
    job.state.rescale(1, 2)
    assert opt.param_groups[0]["lr"] == 0.1 and job.lr_factor == 1.0
    assert "Adasum" in capsys.readouterr().err
    opt.op = "average"
    job.state.rescale(1, 2)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.2)


def test_adasum_wrapper_after_restore_takes_eq7_back(tmp_path, monkeypatch, distributed):
    """A plain script registers and restores its optimizer before ``hvd.DistributedOptimizer(...,
    op=hvd.Adasum)`` wraps it: the Eq. 7 applied at the restore is taken back when the wrapper is
    adopted."""
    job = make_job(tmp_path, monkeypatch)
    job.ring.hvd.Adasum = "adasum"
    opt = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)
    job.register(optimizer=opt)
    job.state.rescale(1, 2)  # what restore() does on a checkpoint of another size
    assert opt.param_groups[0]["lr"] == pytest.approx(0.2)
    wrapper = FakeDistributed(opt)
    wrapper.op = "adasum"
    job.state.adopt_distributed_optimizer()
    assert job.state.optimizer is wrapper and wrapper.param_groups[0]["lr"] == pytest.approx(0.1)
    assert job.lr_factor == 1.0


def test_evaluating_is_kept_out_of_the_throughput_window(tmp_path, monkeypatch):
    import time

    job = make_job(tmp_path, monkeypatch)
    from elastic_ring.worker.progress import _Window

    job.progress.window = _Window(t0=100.0)
    with job.evaluating():
        time.sleep(0.05)
    assert job.progress.window.t0 >= 100.04


def test_epoch_loop_stop_requested_cap_and_finish(tmp_path, monkeypatch, distributed):
    from elastic_ring import protocol

    # a stop asked by the controller (live resize, Ctrl-C): voted after step 1, read after step 2
    # (at its post-hook: Horovod has negotiated the vote with step 2's gradients), agreed at step
    # 3's pre-hook, so the segment ends after step 2
    job = make_job(tmp_path / "a", monkeypatch, size=1, stop_at=10**9, total=10**9)
    _current(monkeypatch, job)
    protocol.stop_file(job.run_dir, 0).parent.mkdir(parents=True, exist_ok=True)
    protocol.stop_file(job.run_dir, 0).touch()
    with pytest.raises(StopSegment):
        _run_script(job, [])
    assert (job.step, job.stop_reason, job.finished) == (2, "requested", False)
    # --steps as a cap: the run ends at that step, inside an epoch
    job = make_job(tmp_path / "b", monkeypatch, size=1, stop_at=8, total=8)
    _current(monkeypatch, job)
    with pytest.raises(StopSegment):
        _run_script(job, [])
    assert (job.step, job.stop_reason, job.finished) == (8, "finished", True)
    # job.steps() needs a length, and does not mix with an epoch loop
    with pytest.raises(api.ContractError, match="one of them"):
        next(iter(job.steps()))
    job = make_job(tmp_path / "c", monkeypatch, size=1, stop_at=10**9, total=protocol.NO_STEP_LIMIT)
    with pytest.raises(api.ContractError, match="--steps"):
        next(iter(job.steps()))


def test_epoch_loop_windows_name_their_epoch_and_leave_out_the_scripts_end_of_epoch_code(
        tmp_path, monkeypatch, distributed):
    """Throughput windows of an epoch loop say the epoch they end in (not always 0), and the script's
    own end-of-epoch code (its test, a checkpoint of its own: here a sleep) is no step's time: a
    window across an epoch's end measures its steps only (it made 1 -> 2 workers "1010%" efficient
    when the 1-worker windows held the test's seconds)."""
    import dataclasses
    import time

    from elastic_ring import protocol
    from elastic_ring.events import read_events

    END_OF_EPOCH_S = 0.8
    job = make_job(tmp_path, monkeypatch, size=1, stop_at=10**9, total=10**9)
    job.info = dataclasses.replace(job.info, throughput_window=4)
    _current(monkeypatch, job)
    data = torch.utils.data.TensorDataset(torch.linspace(-1, 1, N * 3).reshape(N, 3))
    sampler = DistributedSampler(data)
    loader = torch.utils.data.DataLoader(data, batch_size=B, sampler=sampler)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    job.register(model=model, optimizer=opt)
    job.restore()
    opt = FakeDistributed(opt)
    for epoch in job.epochs(1, 4):  # 6 steps an epoch
        sampler.set_epoch(epoch)
        for (xb,) in loader:
            opt.zero_grad()
            model(xb).pow(2).mean().backward()
            opt.step()
        time.sleep(END_OF_EPOCH_S)  # the script's own end-of-epoch work
    wins = read_events(tmp_path / protocol.WORKER_EVENTS, kind="throughput")
    # step 1 opens the first window; then every 4 steps: 2-5, 6-9 (over epoch 1's end), 10-13, 14-17
    assert [(w["step"], w["epoch"]) for w in wins] == [(5, 1), (9, 2), (13, 3), (17, 3)], wins
    # a window that held the script's end-of-epoch work would last at least END_OF_EPOCH_S; four tiny
    # steps stay far below it even on a loaded machine (a bound of 0.3 s under a 0.4 s sleep failed
    # at a load of 11 on 2 cores with 0.307 s of steps)
    assert max(w["seconds"] for w in wins) < END_OF_EPOCH_S, wins


def test_restored_weights_overwritten_only_by_other_values():
    """The check behind the one-line stop of a script that loads its own checkpoint after restore():
    an in-place write of equal values (a broadcast from rank 0) is not an overwrite, other values
    are, a fresh start (nothing restored) is never checked, and the answer is given once."""
    st = sync.StateSync(ring=None, seg=None, lr_rule="linear")
    model = torch.nn.Linear(3, 2)
    st.model = model
    st.remember_restored_weights()  # not resumed: nothing kept
    with torch.no_grad():
        model.weight.add_(1.0)
    assert not st.restored_weights_overwritten()
    st.resumed = True
    st.remember_restored_weights()
    with torch.no_grad():
        model.weight.copy_(model.weight.clone())  # a broadcast of the same weights bumps the version only
    assert not st.restored_weights_overwritten()
    st.remember_restored_weights()
    other = torch.nn.Linear(3, 2).state_dict()
    model.load_state_dict(other)
    assert st.restored_weights_overwritten()
    assert not st.restored_weights_overwritten()  # once


@pytest.mark.parametrize("copies", [False, True])
def test_indices_pulled_without_a_loader_move_the_position_with_or_without_copies(monkeypatch, copies):
    """With no loader and no ``batch_size`` a step uses the indices pulled since the last one: read
    off the list iterator where no survivors' copy is kept, counted one by one (with the copy's call
    at a batch's first index) where one may be."""
    from elastic_ring.worker import survive

    job = StubJob(1, 2)
    job.ring = types.SimpleNamespace(in_place=copies)
    monkeypatch.setattr(survive, "enabled", lambda: copies)
    s = _sampler(monkeypatch, job, 20, num_replicas=2, rank=1)
    s.set_epoch(3)
    calls = []
    job._epoch_data.before_batch = lambda: calls.append(s._pulled)
    it = iter(s)
    assert (s._listed is None) == copies
    first = [next(it) for _ in range(3)]
    s.advance()
    assert job._position.pos == 6
    rest = list(it)
    s.advance()
    assert job._position.pos == 20 and calls == ([0, 3] if copies else [])
    assert first + rest == list(s)[:10]  # (a new pass over the epoch: the same order)
