"""The arithmetic of a constant global batch (:mod:`elastic_ring.worker.accumulate`): the layout of
a step's micro-batches over any world size, the weighting that makes the ranks' averaged, accumulated
gradients the global batch's, the backward passes' contexts, and the sampler's micro-batches."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from elastic_ring.worker.accumulate import Layout, layout_problem, passes, valid_worlds
from elastic_ring.worker.errors import ContractError
from elastic_ring.worker.lr import RULES
from elastic_ring.worker.sampler import Sampler


@pytest.mark.parametrize("m", range(1, 10))
def test_shares_cover_every_micro_batch_once_contiguously_and_evenly(m):
    for w in valid_worlds(8 * m, 8):
        lay = Layout(8 * m, 8, w)
        shares = [lay.share(r) for r in range(w)]
        assert [i for s in shares for i in s] == list(range(m))  # rank order = stream order
        assert all(len(s) >= 1 for s in shares)
        assert max(map(len, shares)) - min(map(len, shares)) <= 1
        assert lay.loss_weight == w / m


def _global_batch_gradient(model, x, y):
    """The gradient of the global batch's mean loss, on one process."""
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


def _ranks_averaged(model, x, y, lay: Layout, weighted: bool = True):
    """What the ranks end up with: each rank sums its micro-batches' gradients (each loss weighted
    by the layout's loss_weight), then a fake collective averages over the ranks (Horovod's
    Average, DDP's mean)."""
    b, per_rank = lay.micro_batch, []
    for r in range(lay.world):
        model.zero_grad()
        for m in lay.share(r):
            loss = torch.nn.functional.cross_entropy(model(x[m * b:(m + 1) * b]), y[m * b:(m + 1) * b])
            (loss * (lay.loss_weight if weighted else 1.0 / len(lay.share(r)))).backward()
        per_rank.append([p.grad.clone() for p in model.parameters()])
    return [sum(gs) / lay.world for gs in zip(*per_rank)]  # the collective's average


@pytest.mark.parametrize("m,w", [(4, 1), (4, 2), (4, 4), (3, 2), (5, 3), (7, 4), (6, 6)])
def test_accumulated_and_averaged_gradient_is_the_global_batch_gradient(m, w):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3)).double()
    b = 4
    x, y = torch.randn(m * b, 5, dtype=torch.float64), torch.randint(0, 3, (m * b,))
    want = _global_batch_gradient(model, x, y)
    got = _ranks_averaged(model, x, y, Layout(m * b, b, w))
    for g, h in zip(got, want):
        assert torch.allclose(g, h, rtol=1e-12, atol=1e-14)
    if m % w:  # uneven shares: each rank's plain mean would weight the micro-batches unequally
        naive = _ranks_averaged(model, x, y, Layout(m * b, b, w), weighted=False)
        assert any(not torch.allclose(g, h, rtol=1e-6) for g, h in zip(naive, want))


def test_refused_layouts_name_the_valid_worker_counts():
    assert layout_problem(32, 8, (1, 2, 3, 4)) is None
    why = layout_problem(32, 8, (1, 8, 5))
    assert why is not None and "5, 8 worker(s) cannot share" in why and "valid worker counts: 1-4" in why
    assert "not a multiple" in (layout_problem(30, 8) or "")
    with pytest.raises(ContractError, match="valid worker counts: 1-2"):
        Layout(16, 8, 3)


def test_describe_and_samples_count():
    assert Layout(32, 8, 2).describe() == "global batch 32 = 2 worker(s) x 2 micro-batch(es) of 8"
    assert Layout(24, 8, 2).describe() == "global batch 24 = 1 worker(s) x 2 + 1 worker(s) x 1 micro-batch(es) of 8"
    lay = Layout(24, 4, 5)  # 6 micro-batches over 5 ranks: 2 + 1 + 1 + 1 + 1
    assert [lay.samples_at(s) for s in range(1, 6)] == [4, 5, 5, 5, 5]  # 24 = 4.8 per rank and step
    assert sum(lay.samples_at(s) for s in range(1, 11)) * 5 == 10 * 24


def test_constant_batch_rule_keeps_the_lr():
    assert RULES["constant-batch"].scale(0.4, 1, 4) == 0.4
    assert RULES["linear"].scale(0.4, 1, 4) == pytest.approx(1.6)


class _FakeHorovodOptimizer:
    def __init__(self):
        self.backward_passes_per_step, self.set_to = 1, []

    def set_backward_passes_per_step(self, n):
        self.backward_passes_per_step = n
        self.set_to.append(n)


class _FakeDDP:
    def __init__(self):
        self.inside, self.active = 0, False

    @contextlib.contextmanager
    def no_sync(self):
        self.inside += 1
        self.active = True
        yield
        self.active = False


def test_passes_horovod_allreduces_after_this_ranks_last_pass_and_ddp_skips_all_but_the_last():
    opt = _FakeHorovodOptimizer()
    assert len(passes(None, opt, 3)) == 3 and opt.set_to == [3]
    passes(None, opt, 3)
    assert opt.set_to == [3]  # set again only when the count changes (a resize)
    passes(None, opt, 1)
    assert opt.set_to == [3, 1]
    net = _FakeDDP()
    ctxs = passes(net, object(), 3)
    for c in ctxs:
        with c:
            pass
    assert net.inside == 2  # the third pass runs DDP's allreduce
    with pytest.raises(ContractError):
        passes(net, object(), 0)


def _sampler(rank: int, world: int, global_batch: int = 24) -> Sampler:
    job = SimpleNamespace(rank=rank, size=world, restored=True, elastic=False)
    return Sampler(job, size=20, batch_size=4, seed=3, global_batch=global_batch)


@pytest.mark.parametrize("world", [1, 2, 4, 5, 6])
def test_sampler_micro_batches_are_the_same_positions_at_every_world_size(world):
    one = _sampler(0, 1)
    for step in range(3):  # 24 positions per step over a 20-sample epoch: batches straddle epochs
        want = one.stream.take(one.cursor, 24)
        cursor = one.cursor
        got = []
        samplers = [_sampler(r, world) for r in range(world)]
        for s in samplers:
            s.cursor = cursor
            parts = s.next_micro_batches()
            assert all(len(idx) == 4 for _, idx in parts)
            assert [start for start, _ in parts] == [cursor + 4 * m for m in s.layout().share(s.job.rank)]
            got += [i for _, idx in parts for i in idx.tolist()]
            assert s.cursor == cursor + 24
        assert got == want.tolist()
        one.next_micro_batches()
    assert one.epoch == (2 * 24) // 20


def test_sampler_of_a_constant_batch_refuses_next_batch_and_a_loader():
    s = _sampler(0, 2)
    with pytest.raises(ContractError, match="next_micro_batches"):
        s.next_batch()
    with pytest.raises(ContractError, match="next_micro_batches"):
        iter(s).__next__()
    with pytest.raises(ContractError, match="valid worker counts: 1-6"):
        _sampler(0, 7).next_micro_batches()


def test_resize_request_and_resize_line_of_a_constant_batch(tmp_path):
    import yaml

    from elastic_ring.config.api import config_to_dict, load_config
    from elastic_ring.controller.display import Display
    from elastic_ring.controller.requests import _check_constant_batch
    from elastic_ring.errors import UserError

    cfg = load_config(None, ["lr_scaling=constant-batch", "batch_size=8", "global_batch=24"])
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config_to_dict(cfg)))
    _check_constant_batch(tmp_path, 3)
    with pytest.raises(UserError, match="--to 4: .*valid worker counts: 1-3"):
        _check_constant_batch(tmp_path, 4)
    lines: list[str] = []
    Display(lines.append, 100, bar=False).resized(1, 2, 10, 0.05, 0.05, layout=Layout(24, 8, 2).describe())
    assert lines == ["resize 1 -> 2 after step 10: LR 0.05 unchanged (constant-batch: global batch 24 = "
                     "1 worker(s) x 2 + 1 worker(s) x 1 micro-batch(es) of 8)"]


def test_micro_batches_run_the_body_inside_each_pass_context_and_fall_back_to_the_batch():
    from elastic_ring.worker.accumulate import micro_batches

    net = _FakeDDP()
    seen = []
    for mb in micro_batches(_sampler(1, 2), net, object()):  # rank 1 of 2: micro-batches 3, 4, 5
        seen.append((mb.start, len(mb.indices), mb.weight, net.active))
    assert seen == [(12, 4, 2 / 6, True), (16, 4, 2 / 6, True), (20, 4, 2 / 6, False)]  # the last syncs
    assert net.inside == 2 and not net.active
    plain = _sampler(1, 2, global_batch=None)
    (only,) = list(micro_batches(plain, net, object()))
    assert (only.start, len(only.indices), only.weight) == (4, 4, 1.0) and plain.cursor == 8


def test_experiment_counts_a_constant_global_batch_at_every_world_size():
    from elastic_ring.experiment.resize import run_metrics

    ev = [{"kind": "launch", "segment": 0, "world_size": 1, "start_step": 1, "stop_step": 60},
          {"kind": "segment_end", "segment": 0, "world_size": 1, "step": 60, "reason": "scheduled"},
          {"kind": "launch", "segment": 1, "world_size": 2, "start_step": 61, "stop_step": 200},
          {"kind": "segment_end", "segment": 1, "world_size": 2, "step": 200, "reason": "finished"},
          {"kind": "finished", "wall_s": 10.0}]
    assert run_metrics(ev, 32, 1000)["samples"] == 60 * 32 + 140 * 64  # the per-worker batch: Eq. 7's
    assert run_metrics(ev, 32, 1000, global_batch=64)["samples"] == 200 * 64


class _FakeHorovodWrapper:
    """What EpochAccumulation uses of a hvd.DistributedOptimizer, counting the calls."""

    def __init__(self, params):
        self.param_groups = [{"params": params}]
        self.backward_passes_per_step, self.calls = 1, []

    def set_backward_passes_per_step(self, n):
        self.backward_passes_per_step = n
        self.calls.append(("passes", n))

    def synchronize(self):
        self.calls.append(("synchronize", [float(p.grad) for p in self.param_groups[0]["params"]]))

    @contextlib.contextmanager
    def skip_synchronize(self):
        yield

    def step(self):
        self.calls.append(("step", [float(p.grad) for p in self.param_groups[0]["params"]]))

    def zero_grad(self):
        self.calls.append(("zero_grad",))


def test_epoch_loop_optimizer_acts_once_per_global_batch_with_the_weight():
    from elastic_ring.worker.accumulate import EpochAccumulation

    lay = Layout(24, 8, 2)  # 3 micro-batches: rank 0 takes 2, rank 1 takes 1
    sampler = SimpleNamespace(_layout=lambda: lay)
    p = torch.zeros(1, requires_grad=True)
    for rank, n in ((0, 2), (1, 1)):
        opt = _FakeHorovodWrapper([p])
        job = SimpleNamespace(rank=rank, state=SimpleNamespace(syncing=False),
                              _epoch_data=SimpleNamespace(training_sampler=lambda: sampler))
        EpochAccumulation(job, opt).passes()  # as elastic.DistributedSampler's __iter__ does
        for _step in range(2):
            for _micro in range(n):  # the script's loop body, unchanged
                opt.zero_grad()
                p.grad = (p.grad if p.grad is not None else torch.zeros(1)) + 3.0  # a backward pass
                opt.step()
            p.grad = None  # (the real zero_grad is a fake: clear here, before the next step's first)
        kinds = [c[0] for c in opt.calls]
        set_passes = [("passes", n)] if n != 1 else []  # Horovod's default is 1 pass
        assert kinds == [c[0] for c in set_passes] + ["zero_grad", "synchronize", "step"] * 2  # once per step
        assert opt.calls[:len(set_passes)] == set_passes
        sync, step = opt.calls[len(set_passes) + 1:len(set_passes) + 3]
        assert sync == ("synchronize", [3.0 * n])  # this rank's passes summed
        assert step == ("step", [3.0 * n * 2 / 3])  # x w / M, after the allreduce


def test_epoch_sampler_splits_whole_global_batches_into_contiguous_micro_batches():
    from elastic_ring.worker.data import _micro_batch_share, _whole

    order = list(range(100, 110))  # an epoch of 10, global batch 4 in micro-batches of 2
    whole = _whole(order, 4, drop_last=False)
    assert whole == order + [100, 101]  # padded with the epoch's first indices to 3 steps
    assert _whole(order, 4, drop_last=True) == order[:8]
    lay = Layout(4, 2, 2)
    assert list(_micro_batch_share(whole, lay, 0)) == [100, 101, 104, 105, 108, 109]
    assert list(_micro_batch_share(whole[4:], lay, 1)) == [106, 107, 100, 101]  # resumed after step 1
    three = Layout(6, 2, 2)  # 3 micro-batches over 2 ranks: 2 + 1
    assert list(_micro_batch_share(list(range(12)), three, 0)) == [0, 1, 2, 3, 6, 7, 8, 9]
    assert list(_micro_batch_share(list(range(12)), three, 1)) == [4, 5, 10, 11]


class _Sum:
    """A fake collective whose allreduce returns the ranks' sum, computed beforehand."""

    def __init__(self, total):
        self.total, self.calls = total, 0

    def allreduce(self, tensor, op="sum", name=""):
        assert op == "sum" and tensor.shape == self.total.shape
        self.calls += 1
        return self.total.clone()


def _bn_model(momentum, twice: bool = False):
    torch.manual_seed(1)
    layers = [torch.nn.Linear(5, 6), torch.nn.BatchNorm1d(6, momentum=momentum), torch.nn.ReLU(),
              torch.nn.Linear(6, 4), torch.nn.BatchNorm1d(4, momentum=momentum)]
    model = torch.nn.Sequential(*layers).double().train()
    if twice:  # every micro-batch runs the second BatchNorm layer twice
        bn = layers[4]
        model = torch.nn.Sequential(*layers[:4], bn, torch.nn.Linear(4, 4).double(), bn)
    for i, bn in enumerate(m for m in model.modules() if isinstance(m, torch.nn.BatchNorm1d)):
        bn.num_batches_tracked.fill_(3 + i)  # a step that is not the run's first
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    return model


def _buffers(model):
    return {k: v.clone() for k, v in model.state_dict().items() if "running" in k or "num_batches" in k}


@pytest.mark.parametrize("momentum,twice", [(0.1, False), (0.3, True), (None, False), (None, True)])
@pytest.mark.parametrize("m,w", [(4, 1), (4, 2), (4, 4), (5, 2), (5, 3), (7, 4), (6, 5)])
def test_batchnorm_running_stats_combined_over_ranks_are_the_sequential_ones(momentum, twice, m, w):
    """Each rank runs its share of the step's micro-batches from the same buffers; the combined
    buffers are those of one worker running all ``m`` in order (uneven shares, momentum or the
    cumulative average, a layer run twice per micro-batch)."""
    import copy

    from elastic_ring.worker.accumulate import running_stats

    b = 3
    x = torch.randn(m * b, 5, dtype=torch.float64)
    model = _bn_model(momentum, twice)
    ranks = [copy.deepcopy(model) for _ in range(w)]
    for k in range(m):  # the sequential run
        model(x[k * b:(k + 1) * b])
    want = _buffers(model)
    lay = Layout(m * b, b, w)
    stats, ends = [], []
    for r, net in enumerate(ranks):
        st = running_stats(net, SimpleNamespace(segment=0, step=5, rank=r))
        for k in lay.share(r):
            net(x[k * b:(k + 1) * b])
        held = st.hold()  # the buffers back at r0, as a stop at this step saves them
        assert all(torch.equal(v, ranks[0].state_dict()[k]) or r for k, v in _buffers(ranks[r]).items())
        stats.append(st)
        ends.append(held)
    for st in stats:
        for layer, (mean0, var0, _) in zip(st.layers, st.start):
            assert torch.equal(layer.running_mean, mean0) and torch.equal(layer.running_var, var0)
    total = sum(st.contribution(lay, r, e) for r, (st, e) in enumerate(zip(stats, ends))) if w > 1 else None
    for r, (st, e) in enumerate(zip(stats, ends)):
        coll = _Sum(total) if total is not None else None
        st.combine(lay, r, coll, e)
        assert coll is None or coll.calls == 1  # one allreduce per step; none at one worker
        got = _buffers(ranks[r])
        for k in want:
            assert torch.allclose(got[k].double(), want[k].double(), rtol=1e-12, atol=1e-12), (r, k)
        assert st.start is None


def test_batchnorm_running_stats_not_combined_naively():
    """Rank 0's own buffers (what each rank kept before) are not the sequential ones: the test above
    can fail."""
    from elastic_ring.worker.accumulate import running_stats

    model = _bn_model(0.1)
    x = torch.randn(12, 5, dtype=torch.float64)
    import copy

    rank0 = copy.deepcopy(model)
    for k in range(4):
        model(x[k * 3:(k + 1) * 3])
    running_stats(rank0, SimpleNamespace(segment=0, step=0, rank=0))
    for k in Layout(12, 3, 2).share(0):
        rank0(x[k * 3:(k + 1) * 3])
    a, b = _buffers(rank0), _buffers(model)
    assert any(not torch.allclose(a[k].double(), b[k].double(), rtol=1e-3) for k in a)


def test_batchnorm_passes_must_match_the_micro_batches():
    from elastic_ring.worker.accumulate import running_stats

    model = _bn_model(0.1)
    st = running_stats(model, SimpleNamespace(segment=0, step=0, rank=0))
    model(torch.randn(3, 5, dtype=torch.float64))  # 1 pass over a share of 2 micro-batches
    with pytest.raises(ContractError, match="ran 1 training forward pass"):
        st.combine(Layout(12, 3, 2), 0, _Sum(torch.zeros(1)))
    model.eval()
    model(torch.randn(3, 5, dtype=torch.float64))  # eval passes: not counted, no step begun
    assert st.start is None
    assert running_stats(torch.nn.Linear(2, 2), SimpleNamespace()) is None


class _ThreadRing:
    """``w`` ranks in threads of one process: each rank's allreduce returns the ranks' sum once all
    have given theirs (what the collective does across processes)."""

    def __init__(self, w):
        import threading

        self.w, self.parts, self.calls = w, {}, 0
        self.barrier = threading.Barrier(w, timeout=30)

    def member(self, rank):
        def allreduce(tensor, op="sum", name=""):
            assert op == "sum"
            self.parts[rank] = tensor.clone()
            self.barrier.wait()
            total = sum(self.parts[r] for r in range(self.w))
            self.barrier.wait()
            self.calls += rank == 0
            return total

        return SimpleNamespace(allreduce=allreduce)


def _micro_batch_step(nets, x, step, world, m, b, segment=0):
    """Step ``step`` (1-based) of a constant global batch of ``m`` micro-batches of ``b``, trained
    through :func:`~elastic_ring.worker.accumulate.micro_batches` by ``world`` ranks (``nets``: one
    model each, the ranks in threads); returns the allreduces the step made."""
    import threading

    from elastic_ring.worker.accumulate import micro_batches

    ring = _ThreadRing(world)
    errors = []

    def rank(r):
        try:
            job = SimpleNamespace(rank=r, size=world, segment=segment, step=step - 1, restored=True, elastic=False,
                                  collective=ring.member(r))
            data = Sampler(job, size=len(x), batch_size=b, seed=3, global_batch=m * b)
            data.cursor = (step - 1) * m * b
            for mb in micro_batches(data, nets[r], None):
                nets[r](x[mb.indices])
        except BaseException as e:  # noqa: BLE001 (re-raised below, in the test's thread)
            errors.append(e)
            ring.barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(1, world)]
    for t in threads:
        t.start()
    rank(0)
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return ring.calls


def _sequential_step(model, x, step, m, b):
    """The unresized run's step: the ``m`` micro-batches in stream order on one model, no bookkeeping."""
    stream = Sampler(SimpleNamespace(rank=0, size=1), size=len(x), batch_size=b, seed=3, global_batch=m * b).stream
    for k in range(m):
        model(x[stream.take((step - 1) * m * b + k * b, b)])


def test_batchnorm_bookkeeping_is_nothing_at_one_worker(monkeypatch):
    """A ``job.steps()`` loop over ``job.micro_batches`` at one worker takes no copy of the
    BatchNorm buffers, runs no hook and does not walk the model (nothing to reconcile): from its
    first step, and in the same process right after a shrink from two workers; at two workers it
    does (the counts can fail)."""
    from elastic_ring.worker import accumulate

    copies = []
    for name in ("begin", "_ends"):
        real = getattr(accumulate.RunningStats, name)
        monkeypatch.setattr(accumulate.RunningStats, name,
                            lambda self, _real=real, _name=name: (copies.append(_name), _real(self))[1])
    walk = accumulate.running_stats  # (the model's modules walked to find its layers)
    monkeypatch.setattr(accumulate, "running_stats", lambda *a: (copies.append("walk"), walk(*a))[1])
    m, b = 4, 3
    x = torch.randn(40, 5, dtype=torch.float64)
    rank0, rank1 = _bn_model(0.1), _bn_model(0.1)
    layers = [mod for mod in rank0.modules() if isinstance(mod, torch.nn.BatchNorm1d)]
    for step, world in enumerate([1, 1, 2, 2, 1, 1], start=1):
        if world == 2:
            rank1.load_state_dict(rank0.state_dict())
        del copies[:]
        calls = _micro_batch_step([rank0, rank1][:world], x, step, world, m, b)
        if world == 1:
            assert copies == [] and calls == 0, step
            assert all(not layer._forward_pre_hooks for layer in layers), step
        else:
            assert copies.count("begin") == 2 and copies.count("walk") == 2 and calls == 1, step  # r0, one allreduce
            assert all(layer._forward_pre_hooks for layer in layers), step


@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize("kept", [True, False])
def test_batchnorm_statistics_across_resizes_are_the_unresized_runs(momentum, kept):
    """Real BatchNorm layers (momentum 0.1, or ``None``: the cumulative average) trained through
    ``job.micro_batches`` by ranks in threads, resized 1 -> 2 -> 1 -> 4 -> 3 -> 1 between steps
    (``kept``: rank 0's process kept, as re-formed in place, else every rank a fresh model loaded
    from rank 0's state, as relaunched): after every step every rank's running statistics and
    ``num_batches_tracked`` are those of one worker running the same micro-batches in order, with
    no bookkeeping at all (float64: equal to 1e-12)."""
    m, b = 4, 3
    x = torch.randn(40, 5, dtype=torch.float64) * 2 + 1
    ref = _bn_model(momentum)
    nets = [_bn_model(momentum)]
    worlds = [1, 1, 2, 2, 1, 4, 3, 3, 1, 1]
    for step, world in enumerate(worlds, start=1):
        if step == 1 or world != worlds[step - 2]:  # a resize: the ranks start from rank 0's state
            state = nets[0].state_dict()
            nets = ([nets[0]] if kept else []) + [_bn_model(momentum) for _ in range(world - kept)]
            for net in nets:
                net.load_state_dict(state)
        _micro_batch_step(nets, x, step, world, m, b)
        _sequential_step(ref, x, step, m, b)
        want = _buffers(ref)
        for r, net in enumerate(nets):
            got = _buffers(net)
            for k in want:
                assert torch.allclose(got[k].double(), want[k].double(), rtol=1e-12, atol=1e-12), (step, world, r, k)
    assert int(want["1.num_batches_tracked"]) == 3 + len(worlds) * m


class _FakeDDPModule(torch.nn.Module):
    """What EpochAccumulation uses of DDP: the flag its forward pass reads, recorded per pass."""

    def __init__(self, p):
        super().__init__()
        self.p, self.require_backward_grad_sync, self.synced = p, True, []

    def forward(self):
        self.synced.append(self.require_backward_grad_sync)
        return self.p * 3.0


def test_ddp_epoch_loop_syncs_only_each_steps_last_micro_batch_and_steps_once():
    from elastic_ring.worker.accumulate import EpochAccumulation

    lay = Layout(24, 8, 2)  # 3 micro-batches: rank 0 takes 2, rank 1 takes 1
    sampler = SimpleNamespace(_layout=lambda: lay)
    for rank, n in ((0, 2), (1, 1)):
        p = torch.zeros(1, requires_grad=True)
        opt = torch.optim.SGD([p], lr=1.0)
        ddp = _FakeDDPModule(p)
        job = SimpleNamespace(rank=rank, state=SimpleNamespace(syncing=False),
                              _epoch_data=SimpleNamespace(training_sampler=lambda: sampler))
        EpochAccumulation(job, opt, ddp)
        for _step in range(2):
            for _micro in range(n):  # the script's loop body, unchanged
                opt.zero_grad()
                ddp().sum().backward()
                opt.step()
            with torch.no_grad():
                ddp.eval()
                ddp()  # a test pass: no backward, the flag left as it was
                ddp.train()
        assert ddp.synced == ([False] * (n - 1) + [True, True]) * 2
        assert float(p.detach()) == pytest.approx(-2 * 3.0 * n * 2 / 3)  # 2 updates of the summed passes x w / M


def test_an_epoch_loop_without_an_allreduce_to_hold_is_refused():
    from elastic_ring.worker.accumulate import EpochAccumulation

    with pytest.raises(ContractError, match="job.parallel"):
        EpochAccumulation(SimpleNamespace(state=SimpleNamespace(model=None)), torch.optim.SGD([torch.zeros(1)], lr=1))


def test_epoch_loop_throughput_counts_the_global_batch_per_step():
    """The epoch loop's throughput (rank 0's samples x the world) counts the samples each step
    trained, the global batch, not one micro-batch per worker."""
    from elastic_ring.worker.data import DistributedSampler

    def samples(sampler, step):  # (the post-hook's call, the position left alone)
        return DistributedSampler.stepped(sampler, step, 1, False)

    for w in (1, 2, 3, 4):
        lay = Layout(128, 32, w)
        sampler = SimpleNamespace(_layout=lambda lay=lay: lay, batch_size=None, _loader_batch=32)
        assert sum(samples(sampler, s) for s in range(1, 13)) * w == 12 * 128
        assert abs(samples(sampler, 5) * w - 128) < w  # each step's share: G / w, rounded
    plain = SimpleNamespace(_layout=lambda: None, batch_size=None, _loader_batch=32)
    assert samples(plain, 1) == 32  # other rules: the loader's batch

    # no training sampler of elastic-ring's (the script's own loader): the post-hook counts none
    from elastic_ring.worker.hooked import HookedSteps
    from elastic_ring.worker.segment import Segment

    counted = []
    boundary = SimpleNamespace(handle=None, copy=None, after_step=lambda step, n: counted.append((step, n)))
    job = SimpleNamespace(rank=1, elastic=True, seg=Segment(0, 100, 100), boundary=boundary,
                          state=SimpleNamespace(optimizer=None), progress=SimpleNamespace(evaluation_due=lambda s: False),
                          checkpoints=SimpleNamespace(due=lambda step, stop_at: False, writes=lambda r: r == 0),
                          _epoch_data=SimpleNamespace(training_sampler=lambda: None))
    HookedSteps(job).after_step()
    assert counted == [(1, 0)]
