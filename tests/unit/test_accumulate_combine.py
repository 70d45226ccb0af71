"""The BatchNorm statistics' combine of a constant global batch (``RunningStats``): all the layers
in one vector (momentum and cumulative layers mixed, a layer that runs no pass, a layout that
changes between steps) and the warm-up of its allreduce at a segment's first step."""

import copy
import threading
from types import SimpleNamespace

import pytest
import torch

from elastic_ring.worker.accumulate import STATS_NAME, Layout, micro_batches, running_stats
from elastic_ring.worker.sampler import Sampler


class _Mixed(torch.nn.Module):
    """A momentum BatchNorm layer, a cumulative one (``momentum=None``), and one never run."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.lin = torch.nn.Linear(5, 6)
        self.bn_m = torch.nn.BatchNorm1d(6, momentum=0.2)
        self.bn_c = torch.nn.BatchNorm1d(6, momentum=None)
        self.unused = torch.nn.BatchNorm1d(6, momentum=0.1)
        self.double().train()
        for i, bn in enumerate((self.bn_m, self.bn_c, self.unused)):
            bn.num_batches_tracked.fill_(4 + 3 * i)
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        return self.bn_c(torch.relu(self.bn_m(self.lin(x))))


def _buffers(model):
    return {k: v.clone() for k, v in model.state_dict().items() if "running" in k or "num_batches" in k}


class _Sum:
    def __init__(self, total):
        self.total = total

    def allreduce(self, tensor, op="sum", name=""):
        assert tensor.shape == self.total.shape
        return self.total.clone()


def _step(nets, x, lay, step):
    """One step of ``lay`` by ranks ``nets`` (rank r runs its share of micro-batches of 3 rows)."""
    b = lay.micro_batch
    stats, ends = [], []
    for r, net in enumerate(nets):
        st = running_stats(net, SimpleNamespace(segment=0, step=step, rank=r))
        st.watch(True)
        st.forget()
        for k in lay.share(r):
            net(x[(step * lay.micro_batches + k) * b:(step * lay.micro_batches + k + 1) * b])
        stats.append(st)
        ends.append(st.hold())
    total = sum(st.contribution(lay, r, e) for r, (st, e) in enumerate(zip(stats, ends)))
    for r, (st, e) in enumerate(zip(stats, ends)):
        st.combine(lay, r, _Sum(total), e)


def test_mixed_layers_and_a_changed_layout_combine_to_the_sequential_statistics():
    """Momentum and cumulative layers in one vector, a layer that ran no pass left as it was, and
    rank 0's stats kept across steps at 2, 3, then 2 workers again (its kept coefficients follow
    the layout): every rank ends each step with one worker's statistics (float64: 1e-12)."""
    m, b = 5, 3
    x = torch.randn(60, 5, dtype=torch.float64) * 2 + 1
    ref = _Mixed()
    nets = [_Mixed()]
    before = _buffers(nets[0])
    for step, world in enumerate([2, 3, 2, 2]):
        nets = nets[:1] + [copy.deepcopy(nets[0]) for _ in range(world - 1)]  # rank 0's state, its stats kept
        _step(nets, x, Layout(m * b, b, world), step)
        for k in range(m):
            ref(x[(step * m + k) * b:(step * m + k + 1) * b])
        want = _buffers(ref)
        for r, net in enumerate(nets):
            got = _buffers(net)
            for key in want:
                assert torch.allclose(got[key], want[key], rtol=1e-12, atol=1e-12), (step, world, r, key)
    unused = {k: v for k, v in _buffers(nets[0]).items() if k.startswith("unused.")}
    assert unused and all(torch.equal(v, before[k]) for k, v in unused.items())
    assert int(_buffers(nets[0])["bn_c.num_batches_tracked"]) == 7 + 4 * m


class _Ring:
    """``w`` ranks in threads with a Horovod-named collective: every call is logged per rank;
    ``allreduce_async`` returns a handle that ``wait`` turns into the ranks' sum."""

    def __init__(self, w, name="horovod"):
        self.w, self.name, self.parts, self.log = w, name, {}, {r: [] for r in range(w)}
        self.barrier = threading.Barrier(w, timeout=30)

    def _sum(self, rank, tensor):
        self.parts[rank] = tensor.clone()
        self.barrier.wait()
        total = sum(self.parts[r] for r in range(self.w))
        self.barrier.wait()
        return total

    def member(self, rank):
        ring = self

        class Member:
            name = ring.name

            def allreduce(self, tensor, op="sum", name=""):
                ring.log[rank].append(("allreduce", name, tensor.dtype, tensor.numel()))
                return ring._sum(rank, tensor)

            def allreduce_async(self, tensor, name=""):
                ring.log[rank].append(("async", name, tensor.dtype, tensor.numel(), bool((tensor == 0).all())))
                return ("handle", rank, len(ring.log[rank]), tensor.clone())

            def wait(self, handle):
                ring.log[rank].append(("wait", handle[2]))
                return ring._sum(rank, handle[3])

        return Member()


def _run(nets, x, ring, step, segment, m, b):
    errors = []

    def rank(r):
        try:
            job = SimpleNamespace(rank=r, size=ring.w, segment=segment, step=step - 1, restored=True, elastic=False,
                                  collective=ring.member(r))
            data = Sampler(job, size=len(x), batch_size=b, seed=3, global_batch=m * b)
            data.cursor = (step - 1) * m * b
            for mb in micro_batches(data, nets[r], None):
                ring.log[r].append(("forward",))
                nets[r](x[mb.indices])
        except BaseException as e:  # noqa: BLE001 (re-raised in the test's thread)
            errors.append(e)
            ring.barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(ring.w)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def test_a_segments_first_step_warms_the_combines_allreduce_before_its_passes():
    """On Horovod, the first step of each segment at 2 workers starts an allreduce of zeros with
    the combine's name, type and size before its forward passes and waits for it before the
    combine's own (Horovod negotiates the new name meanwhile); the later steps of the segment do
    not; the statistics are the sequential run's all along."""
    m, b = 4, 3
    x = torch.randn(60, 5, dtype=torch.float64)
    ref, nets = _Mixed(), [_Mixed(), _Mixed()]
    for step, segment in [(1, 0), (2, 0), (3, 1)]:
        ring = _Ring(2)
        _run(nets, x, ring, step, segment, m, b)
        stream = Sampler(SimpleNamespace(rank=0, size=1), size=len(x), batch_size=b, seed=3, global_batch=m * b).stream
        for k in range(m):
            ref(x[stream.take((step - 1) * m * b + k * b, b)])
        for r in range(2):
            log = ring.log[r]
            real = [e for e in log if e[0] == "allreduce"]
            assert len(real) == 1 and real[0][1] == STATS_NAME and real[0][2] == torch.float64
            warm = [e for e in log if e[0] == "async"]
            if step in (1, 3):  # a segment's first step
                assert warm == [("async", STATS_NAME, torch.float64, real[0][3], True)], (step, log)
                assert log.index(warm[0]) < log.index(("forward",))  # before the passes
                assert [e[0] for e in log][-2:] == ["wait", "allreduce"], (step, log)  # waited first
            else:
                assert warm == [] and not any(e[0] == "wait" for e in log), (step, log)
            want, got = _buffers(ref), _buffers(nets[r])
            for key in want:
                assert torch.allclose(got[key], want[key], rtol=1e-12, atol=1e-12), (step, r, key)


@pytest.mark.parametrize("name", ["torch", None])
def test_no_warm_up_on_another_collective(name):
    """torch.distributed names no tensors (nothing to negotiate), a fake collective has no name:
    one allreduce per step, no other call."""
    m, b = 4, 3
    x = torch.randn(60, 5, dtype=torch.float64)
    nets = [_Mixed(), _Mixed()]
    ring = _Ring(2, name=name)
    _run(nets, x, ring, 1, 0, m, b)
    for r in range(2):
        assert [e[0] for e in ring.log[r] if e[0] != "forward"] == ["allreduce"]


def test_a_warm_up_left_by_an_abandoned_step_is_not_waited_for():
    """A step given up before its combine (an exception in the loop's body): the next step
    starts afresh (forget), so its combine does not wait for the old handle (of a ring that may be
    gone); a new segment warms again."""
    net = _Mixed()
    st = running_stats(net, SimpleNamespace(segment=0, step=0, rank=0))
    calls = []
    coll = SimpleNamespace(name="horovod", allreduce_async=lambda t, name="": calls.append("async") or "h",
                           wait=lambda h: calls.append(("wait", h)))
    st.warm(coll, 0)
    st.forget()  # the next step's start
    st.warm(coll, 0)  # (the segment's warm-up was started already)
    assert calls == ["async"] and st._warming is None
    st.combine(Layout(6, 3, 2), 0, coll)  # no step begun: nothing, and no wait
    assert calls == ["async"]
    st.warm(coll, 1)
    assert calls == ["async", "async"] and st._warming == "h"
