"""The stop vote's period (issue 50): rank 0's choice of K (:func:`choose_every`), its agreement
through the vote itself (several ranks over a fake collective that sums what they started, in
order) and a stop landing at one step on every rank within K + 1 steps of a request; where the
epoch loop takes the RNG state.
"""

from __future__ import annotations

import types

import pytest

from elastic_ring import protocol
from elastic_ring.worker import segment
from elastic_ring.worker.segment import MAX_EVERY, Segment, StopReason, StopVote, choose_every


# ---------------------------------------------------------------------- rank 0's choice of K
def test_no_adaptation_without_a_latency_or_a_step_time():
    assert choose_every(0.003, 1e-4, 1, 0.0) == 1  # stop_latency_ms 0: every control_every steps
    assert choose_every(0.003, 1e-4, 4, 0.0) == 4
    assert choose_every(0.0, 1e-4, 2, 0.1) == 2  # nothing timed yet


def test_the_vote_is_one_percent_of_the_steps_it_covers():
    # 3 ms steps: a vote counted 0.5 ms (its floor) needs 17 steps to be <= 1% of them
    assert choose_every(0.003, 1e-4, 1, 0.1) == 17
    # a dearer vote (2 ms on the training thread): 67 steps wanted, but a live stop may wait at
    # most 100 ms, 33 steps of 3 ms
    assert choose_every(0.003, 2e-3, 1, 0.1) == 33
    # the paper's 50 ms steps: a vote every step is 1% already
    assert choose_every(0.05, 1e-4, 1, 0.1) == 1
    assert choose_every(0.05, 1e-4, 3, 0.1) == 3  # control_every is a lower bound
    assert choose_every(1e-7, 1e-4, 1, 1e6) == MAX_EVERY


@pytest.mark.parametrize("step_ms", [0.2, 1, 2.9, 7.2, 20, 49, 51, 200])
@pytest.mark.parametrize("vote_ms", [0.05, 0.5, 1.5])
def test_choice_holds_both_bounds(step_ms, vote_ms):
    step_s, vote_s, latency_s = step_ms / 1e3, vote_ms / 1e3, 0.1
    k = choose_every(step_s, vote_s, 1, latency_s)
    assert k >= 1
    assert k == 1 or k * step_s <= latency_s + 1e-12  # a live stop waits at most the latency
    cost = max(vote_s, segment.VOTE_COST_FLOOR_S)
    assert k * step_s >= latency_s - step_s or cost / (k * step_s) <= segment.VOTE_SHARE + 1e-12
    if k > 1:  # the fewest steps that do: one fewer would cost more than 1%
        assert cost / ((k - 1) * step_s) > segment.VOTE_SHARE


# ---------------------------------------------------------------------- the agreement
class SumOfRanks:
    """A collective over ``n`` ranks run in lockstep by the test: the i-th allreduce a rank starts is
    summed with the i-th of every other rank (as Horovod's names and gloo's order pair them);
    reading one that some rank has not started fails, as it would hang."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.started: list[list] = [[] for _ in range(n)]  # per rank: (name, tensor) in order

    def for_rank(self, r: int):
        coll = self

        class Rank:
            shared = coll

            def allreduce_async(self, t, name=""):
                coll.started[r].append((name, t.clone()))
                return len(coll.started[r]) - 1

            def wait(self, i):
                got = [s[i] for s in coll.started if len(s) > i]
                assert len(got) == coll.n, f"allreduce {i} read before every rank started it"
                assert len({name for name, _ in got}) == 1, got
                return sum(t for _, t in got)

        return Rank()


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _ranks(tmp_path, monkeypatch, n=2, floor=1, latency_s=0.1, step_s=0.003):
    clock = Clock()
    monkeypatch.setattr(segment.time, "perf_counter", clock)
    coll = SumOfRanks(n)
    votes = []
    for r in range(n):
        ring = types.SimpleNamespace(rank=r, coll=coll.for_rank(r))
        votes.append(StopVote(tmp_path, ring, Segment(0, 10_000, 10_000), floor, latency_s))
    return votes, clock


def _run(votes, clock, steps, step_s=0.003, stop_file_at=None, finish_at=None, tmp_path=None):
    """The flat loop's vote logic on every rank in lockstep; per rank the step after which it
    stopped (None: ran out) and the vote steps it read."""
    handles = [None] * len(votes)
    stopped = [None] * len(votes)
    reads: list[list[tuple[int, int]]] = [[] for _ in votes]
    for step in range(1, steps + 1):
        clock.t += step_s
        if step == stop_file_at:
            protocol.stop_file(tmp_path, 0).parent.mkdir(parents=True, exist_ok=True)
            protocol.stop_file(tmp_path, 0).write_text("{}")
        for r, v in enumerate(votes):
            if stopped[r] is not None:
                continue
            v.seg.step = step
            if step == finish_at and r == len(votes) - 1:
                v.finish_requested = True  # job.finish() on the last rank only
            if handles[r] is not None:
                stop, early = v.result(handles[r])
                handles[r] = None
                reads[r].append((step, v.every))
                if stop or early:
                    stopped[r] = step
                    continue
            if v.due(step):
                handles[r] = v.start(step)
    return stopped, reads


def test_every_rank_reads_the_same_period_and_votes_at_the_same_steps(tmp_path, monkeypatch):
    votes, clock = _ranks(tmp_path, monkeypatch, n=3)
    stopped, reads = _run(votes, clock, 400)
    assert stopped == [None, None, None]
    assert reads[0] == reads[1] == reads[2]
    periods = [k for _, k in reads[0]]
    assert periods[0] == 1 and max(periods) == 17  # 3 ms steps: 17 (see the choice's test)
    # a vote started after step s is read after s + 1; the next one starts K (read with it) later
    for (a, k), (b, _) in zip(reads[0], reads[0][1:]):
        assert b - a == k
    started = votes[0].ring.coll.shared.started
    assert len(started[0]) == len(started[1]) == len(started[2])
    assert len(reads[0]) <= len(started[0]) <= len(reads[0]) + 1  # (the last one may be in flight)
    assert len(reads[0]) < 400 / 10  # a vote per 17 steps once timed, not per step


def test_only_rank_0_proposes_a_period(tmp_path, monkeypatch):
    votes, clock = _ranks(tmp_path, monkeypatch, n=2)
    calls = []
    votes[1].propose = lambda step, now: calls.append(step) or 999
    stopped, reads = _run(votes, clock, 200)
    assert calls == []  # rank 1 adds 0: the period read is rank 0's
    assert reads[0] == reads[1] and max(k for _, k in reads[1]) == 17


@pytest.mark.parametrize("at", [30, 31, 37, 100, 151])
def test_a_live_stop_lands_on_all_ranks_at_one_step_within_k_plus_one(tmp_path, monkeypatch, at):
    votes, clock = _ranks(tmp_path, monkeypatch, n=2)
    stopped, reads = _run(votes, clock, 400, stop_file_at=at, tmp_path=tmp_path)
    assert stopped[0] == stopped[1] is not None
    k = max(k for _, k in reads[0])
    assert k > 1
    # rank 0 reads the stop file when it starts a vote (after a step >= at) and all ranks read
    # that vote after the next step
    assert at < stopped[0] <= at + k + 1


def test_finish_on_one_rank_stops_every_rank_at_one_step(tmp_path, monkeypatch):
    votes, clock = _ranks(tmp_path, monkeypatch, n=3)
    stopped, reads = _run(votes, clock, 400, finish_at=90)
    assert stopped[0] == stopped[1] == stopped[2] is not None
    assert 90 < stopped[0] <= 90 + 17 + 1


def test_without_a_latency_the_vote_is_every_control_every_steps(tmp_path, monkeypatch):
    votes, clock = _ranks(tmp_path, monkeypatch, n=2, floor=3, latency_s=0.0)
    stopped, reads = _run(votes, clock, 30)
    # a vote after the segment's first step, then every 3 steps; each read a step later
    assert [s for s, _ in reads[0]] == list(range(2, 31, 3))
    assert {k for _, k in reads[0]} == {3}


def test_a_new_segment_votes_at_its_first_step_and_times_again(tmp_path, monkeypatch):
    votes, clock = _ranks(tmp_path, monkeypatch, n=1)
    _run(votes, clock, 100)
    assert votes[0].every == 17
    votes[0].begin()
    assert votes[0].every == 1 and votes[0].due(votes[0].seg.step)


# ---------------------------------------------------------------------- the epoch loop's RNG capture
def _hooked(rank=0, due=False, pos=5, copy=None):
    from elastic_ring.worker.hooked import HookedSteps

    job = types.SimpleNamespace(rank=rank, seg=Segment(0, 100, 100),
                                checkpoints=types.SimpleNamespace(due=lambda step, stop_at: due,
                                                                  writes=lambda r: r == 0),
                                _epoch_data=types.SimpleNamespace(position=types.SimpleNamespace(pos=pos)),
                                boundary=types.SimpleNamespace(handle=None, copy=copy))  # the step boundary's
    return HookedSteps(job)


def test_the_epoch_loop_takes_the_rng_only_where_it_may_be_saved():
    sampler = types.SimpleNamespace(dataset=range(10))
    assert not _hooked()._rng_wanted(3, sampler)  # rank 0, nothing due: not taken (tens of µs)
    h = _hooked()
    h.pending = StopReason.REQUESTED
    assert h._rng_wanted(3, sampler)  # a stop at the next point: its checkpoint holds it
    h = _hooked()
    h.boundary.handle = object()
    # a vote started after this step is read at the next step's post-hook: a stop it brings is
    # pending there (and the RNG taken there), not here (issue 50: one capture a vote saved)
    assert not h._rng_wanted(3, sampler)
    assert _hooked(due=True)._rng_wanted(3, sampler)  # the periodic checkpoint
    assert _hooked(pos=10)._rng_wanted(3, sampler)  # the epoch's data used up: its end
    assert _hooked()._rng_wanted(3, None)  # not our sampler: where an epoch ends is not known
    assert not _hooked(rank=1, due=True, pos=10)._rng_wanted(3, None)  # only rank 0 checkpoints
    assert _hooked(rank=1, copy=object())._rng_wanted(3, sampler)  # --survive's copies: every step


# ---------------------------------------------------------------------- ELASTIC_RING_STEP_COST's meter
def test_step_cost_meter_times_parts_and_the_loop_but_not_its_start_and_end(tmp_path, monkeypatch):
    import json
    import time

    from elastic_ring.worker import stepcost

    monkeypatch.delenv(stepcost.ENV, raising=False)
    assert not stepcost.enabled()
    m = stepcost.Meter()
    obj = types.SimpleNamespace(part=lambda x: x * 2)
    m.wrap(obj, "part", "part")
    assert [obj.part(i) for i in range(3)] == [0, 2, 4]

    def loop():
        time.sleep(0.05)  # the segment's start: not a step's cost
        for i in range(4):
            yield i
            time.sleep(0.002)
        time.sleep(0.05)  # its end (checkpoint, barrier)

    assert list(m.iterate(loop(), "boundary")) == [0, 1, 2, 3]
    m.write(tmp_path, 0, 1, steps=4, form="steps")
    rep = json.loads((tmp_path / "stepcost" / "seg000-rank1.json").read_text())
    assert rep["steps"] == 4 and rep["form"] == "steps"
    assert rep["parts"]["part"]["calls"] == 3
    b = rep["parts"]["boundary"]
    assert b["calls"] == 3 and 6_000 * 0.9 <= b["total_us"] < 50_000  # three 2 ms gaps, not the 50 ms ends
    assert not m.ns and not m.calls  # the next segment counts afresh


# ---------------------------------------------------------------------- the window in the vote
def test_a_ballot_packs_into_one_vector_of_fixed_length_and_sums_over_ranks():
    """Issue 50: the throughput window's loss rides in the stop vote. One job's votes are one vector
    of one length (a window riding or not: one negotiated shape; the slots the job has); the ranks'
    sum reads back as the agreement and the window's summed loss, its slot read only where one rode."""
    Ballot = segment.Ballot
    a = Ballot(asked=True, every=17, window=1.5)
    b = Ballot(finish=True, checkpoint=True, window=2.25)
    none = Ballot(every=3)
    for ck in (False, True):
        assert len(a.pack(ck, True)) == len(none.pack(ck, True)) == 4 + ck
        assert none.pack(ck, True)[-1] == 0.0
        summed = [x + y for x, y in zip(a.pack(ck, True), b.pack(ck, True))]
        got = Ballot.unpack(summed, ck, True, window=True)
        assert got == Ballot(asked=True, finish=True, every=17, checkpoint=ck, window=3.75)
        assert Ballot.unpack(summed, ck, True, window=False).window is None
    assert none.pack() == [0.0, 0.0, 3.0]  # a job without either slot: the vote as before
    assert Ballot.unpack(Ballot(checkpoint=True).pack(True), True).checkpoint
    assert not Ballot.unpack(Ballot(checkpoint=True).pack(True), False, True).checkpoint  # (that slot: a window's)
    with pytest.raises(ValueError):
        a.pack()  # a window without its slot would be lost
    with pytest.raises(ValueError):
        Ballot.unpack([0.0, 0.0, 1.0], window_slot=True)


def test_a_window_set_to_ride_is_summed_over_the_ranks_by_the_next_vote(tmp_path, monkeypatch):
    votes, clock = _ranks(tmp_path, monkeypatch, n=3)
    handles = []
    for r, v in enumerate(votes):
        v.windows = True  # (the step boundary's form closes windows at vote steps)
        v.ride = 0.5 * (r + 1)  # this rank's window loss
        handles.append(v.start(1))
        assert v.ride is None  # taken by the vote
    for v, h in zip(votes, handles):
        assert v.result(h) == (False, False)
        assert v.rode == pytest.approx(3.0)
    shapes = {t.shape for s in votes[0].ring.coll.shared.started for _, t in s}
    # the next vote carries no window: the same vector, its read has none
    handles = [v.start(2) for v in votes]
    for v, h in zip(votes, handles):
        v.result(h)
        assert v.rode is None
    shapes |= {t.shape for s in votes[0].ring.coll.shared.started for _, t in s}
    assert shapes == {(4,)}
