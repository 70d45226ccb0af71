"""The stop vote launched off the training thread (issue 50): the ``torch.distributed``
collective's vote thread (:class:`~elastic_ring.worker.collective.VoteThread`).

The training thread hands the vote's values over and returns before the allreduce is launched;
the read waits for the launch only where it is not done and returns the ranks' sum; a launch's
failure is raised at the read, on the training thread; a collective the training thread starts on
the control group after a vote goes after that vote's launch on every rank (gloo pairs a group's
operations in order); the thread ends at the segment's stop and before the group is destroyed at an
in-place re-form, and the next segment's first vote starts another; the ranks still agree on one
stop step with their votes launched by their threads.
"""

from __future__ import annotations

import threading
import time
import types

import pytest
import torch

from elastic_ring.worker import collective as coll_mod
from elastic_ring.worker import segment
from elastic_ring.worker.collective import TorchCollective, VoteThread
from elastic_ring.worker.segment import Segment, StopVote
from tests.unit.test_stop_vote import Clock, SumOfRanks, _run


class GatedDist:
    """A fake ``torch.distributed`` of two ranks (the other rank's values in ``other``) whose
    launches are recorded in order (group, values) with the thread that made them; a launch of the
    vote thread waits for ``gate``."""

    class ReduceOp:
        SUM = "sum"

    def __init__(self, other: float = 1.0) -> None:
        self.other = other
        self.gate = threading.Event()
        self.launched: list[tuple[str, list[float], str]] = []

    def get_world_size(self) -> int:
        return 2

    def all_reduce(self, t, op=None, group=None, async_op=False):
        on_vote_thread = threading.current_thread().name == "elastic-ring-vote"
        if on_vote_thread:
            assert self.gate.wait(5.0)
        self.launched.append((group, t.tolist(), threading.current_thread().name))
        t.add_(self.other)
        return types.SimpleNamespace(wait=lambda: None) if async_op else None

    def broadcast_object_list(self, box, src=0, group=None, device=None):
        self.launched.append((group, ["object"], threading.current_thread().name))


def _vote_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "elastic-ring-vote"]


def test_the_training_thread_returns_before_the_launch_and_the_read_waits_for_it():
    dist = GatedDist(other=2.0)
    coll = TorchCollective(dist, torch.device("cpu"), control="control")
    t0 = time.perf_counter()
    handle = coll.vote_async([1.0, 0.0, 3.0], name="stop_flag")
    assert time.perf_counter() - t0 < 1.0 and dist.launched == []  # handed over, not launched
    threading.Timer(0.2, dist.gate.set).start()
    got = coll.wait(handle)  # waits for the launch (0.2 s later), then for the collective
    assert got.tolist() == [3.0, 2.0, 5.0] and got.dtype == torch.float32
    assert dist.launched == [("control", [1.0, 0.0, 3.0], "elastic-ring-vote")]
    coll.close()
    assert _vote_threads() == []


def test_a_read_of_a_launched_vote_does_not_wait_for_the_thread():
    dist = GatedDist()
    dist.gate.set()
    coll = TorchCollective(dist, torch.device("cpu"), control="control")
    handle = coll.vote_async([1.0], name="stop_flag")
    deadline = time.time() + 5
    while (not handle.done or handle.lock.locked()) and time.time() < deadline:
        time.sleep(0.01)
    assert handle.done and not handle.lock.locked()  # (launched: the read does not wait for the thread)
    assert coll.wait(handle).tolist() == [2.0]
    coll.close()


def test_a_collective_on_the_control_group_after_a_vote_goes_after_its_launch():
    """Without the fence the window's allreduce and the barrier, made at once on the training
    thread, would reach gloo before the vote its thread launches 0.2 s later: rank 0 and rank 1
    would pair a vote with a window."""
    dist = GatedDist()
    coll = TorchCollective(dist, torch.device("cpu"), control="control")
    handle = coll.vote_async([1.0, 0.0], name="stop_flag")
    threading.Timer(0.2, dist.gate.set).start()
    coll.allreduce(torch.tensor([5.0]), "mean", name="window_loss")
    coll.broadcast_object({"step": 3})
    assert [(vals, who) for _, vals, who in dist.launched] == [
        ([1.0, 0.0], "elastic-ring-vote"), ([5.0], "MainThread"), (["object"], "MainThread")]
    assert coll.wait(handle).tolist() == [2.0, 1.0]
    coll.close()


def test_a_failed_launch_is_raised_at_the_read_on_the_training_thread():
    def launch(values, name):
        raise RuntimeError("gloo: connection closed by peer")

    votes = VoteThread(launch)
    handle = votes.submit([1.0], "stop_flag")
    with pytest.raises(RuntimeError, match="connection closed"):
        handle.launched()
    votes.close()


def test_the_thread_ends_at_close_and_the_next_vote_starts_another():
    launched = []
    votes = VoteThread(lambda values, name: launched.append(values) or values)
    assert _vote_threads() == []  # (none before the first vote)
    h1 = votes.submit([1.0], "stop_flag")
    assert h1.launched() == [1.0] and len(_vote_threads()) == 1
    votes.close()
    assert _vote_threads() == []
    votes.close()  # (twice: nothing to end)
    h2 = votes.submit([2.0], "stop_flag")
    assert h2.launched() == [2.0] and len(_vote_threads()) == 1
    votes.close()
    assert _vote_threads() == [] and launched == [[1.0], [2.0]]


def test_close_launches_what_was_handed_over_before_ending():
    gate = threading.Event()
    launched = []

    def launch(values, name):
        gate.wait(5.0)
        launched.append(values)
        return values

    votes = VoteThread(launch)
    h = votes.submit([7.0], "stop_flag")
    threading.Timer(0.1, gate.set).start()
    votes.close()  # joins after the launch: no vote is launched after the group is gone
    assert launched == [[7.0]] and h.done and _vote_threads() == []


def test_the_segment_s_stop_ends_the_vote_thread(tmp_path):
    dist = GatedDist(other=0.0)
    dist.gate.set()
    coll = TorchCollective(dist, torch.device("cpu"), control="control")
    ring = types.SimpleNamespace(rank=1, coll=coll, _coll=coll)
    vote = StopVote(tmp_path, ring, Segment(0, 100, 100), 1, 0.1)
    h = vote.start(1)
    assert len(_vote_threads()) == 1
    assert vote.result(h) == (False, False)
    vote.close()  # (StepBoundary.stopped: no vote follows in this segment)
    assert _vote_threads() == []


def test_a_re_form_in_place_ends_the_vote_thread_before_the_group_is_destroyed(monkeypatch):
    from elastic_ring.worker import ring as ring_mod
    from elastic_ring.worker.ring import Retired, TorchControllerRing

    dist = GatedDist()
    dist.gate.set()
    coll = TorchCollective(dist, torch.device("cpu"), control="control")
    coll.wait(coll.vote_async([1.0], "stop_flag"))
    assert len(_vote_threads()) == 1
    seen = []
    import torch.distributed as tdist

    monkeypatch.setattr(tdist, "destroy_process_group", lambda *a: seen.append(len(_vote_threads())))
    ring = TorchControllerRing.__new__(TorchControllerRing)
    ring._coll = coll
    monkeypatch.setattr(ring_mod.env, "member", lambda default="": "w9")
    action = types.SimpleNamespace(member_env=lambda member: None, segment=2)
    with pytest.raises(Retired):  # (left out of the new ring: after the destroy)
        ring.reform(action)
    assert seen == [0] and ring._coll is None


class Threaded(SumOfRanks):
    """:class:`SumOfRanks` whose ranks launch their votes on vote threads (``vote_async``); a read
    waits, as the collective would, for every rank's launch of the same vote."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.threads: list[VoteThread] = []

    def for_rank(self, r: int):
        rank = super().for_rank(r)
        start, wait = rank.allreduce_async, rank.wait
        votes = VoteThread(lambda values, name: start(torch.tensor(values), name))
        self.threads.append(votes)
        rank.vote_async = lambda values, name="": votes.submit(values, name)
        def read(h):
            i = h.launched() if isinstance(h, coll_mod.Launched) else h
            deadline = time.time() + 5
            while any(len(s) <= i for s in self.started) and time.time() < deadline:
                time.sleep(0.001)
            return wait(i)

        rank.wait = read
        return rank


def test_every_rank_stops_at_one_step_with_votes_launched_by_their_threads(tmp_path, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(segment.time, "perf_counter", clock)
    coll = Threaded(3)
    votes = [StopVote(tmp_path, types.SimpleNamespace(rank=r, coll=coll.for_rank(r)), Segment(0, 10_000, 10_000),
                      1, 0.1) for r in range(3)]
    stopped, reads, starts = _run(votes, clock, 300, stop_file_at=151, tmp_path=tmp_path)
    assert stopped[0] == stopped[1] == stopped[2] is not None
    assert reads[0] == reads[1] == reads[2] and starts[0] == starts[1] == starts[2]
    k, lag = max(k for _, k, _ in reads[0]), max(g for *_, g in reads[0])
    assert 151 < stopped[0] <= 151 + k + lag and (k, lag) == (27, 7)
    for t in coll.threads:
        t.close()
    assert _vote_threads() == []
