"""The stop vote's period and read lag (issue 50): rank 0's choice of K (:func:`choose_every`)
and L (:func:`choose_lag`), their agreement through the votes themselves (several ranks over a fake
collective that sums what they started, in order), each vote read L steps after its start (off the
training thread's critical path: done by then), one in flight at a time, and a stop landing at one
step on every rank within K + L steps of a request; where the epoch loop takes the RNG state.
"""

from __future__ import annotations

import types

import pytest

from elastic_ring import protocol
from elastic_ring.worker import segment
from elastic_ring.worker.segment import MAX_EVERY, READ_LAG_S, Segment, StopReason, StopVote, choose_every, choose_lag


# ---------------------------------------------------------------------- rank 0's choice of K
def test_no_adaptation_without_a_latency_or_a_step_time():
    assert choose_every(0.003, 1e-4, 1, 0.0) == 1  # stop_latency_ms 0: every control_every steps
    assert choose_every(0.003, 1e-4, 4, 0.0) == 4
    assert choose_every(0.0, 1e-4, 2, 0.1) == 2  # nothing timed yet


def test_the_vote_is_half_a_percent_of_the_steps_it_covers():
    # 3 ms steps: a vote counted 0.5 ms (its floor) needs 34 steps to be <= 0.5% of them, but a
    # live stop may wait at most 100 ms and one step: 33 steps to the next vote, read after one
    assert choose_every(0.003, 1e-4, 1, 0.1) == 33
    assert choose_every(0.006, 1e-4, 1, 1.0) == 17  # 6 ms steps, a latency of 1 s: 17 (<= 0.5%)
    assert choose_every(0.003, 1e-4, 1, 0.1, lag=7) == 27  # read 7 steps after it starts: 27
    # a dearer vote (2 ms on the training thread): 134 steps wanted, but a live stop may wait at
    # most 100 ms and one step, 33 steps of 3 ms and the read's
    assert choose_every(0.003, 2e-3, 1, 0.1) == 33
    # the paper's 50 ms steps: a vote every 2 steps is 0.5%, read after the next: a live stop
    # within 3 steps, 100 ms and one step
    assert choose_every(0.05, 1e-4, 1, 0.1) == 2
    assert choose_every(0.06, 1e-4, 1, 0.1) == 1  # 60 ms: 2 + 1 steps would be more
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


def test_the_read_lag_covers_the_collective_s_time_within_half_a_stop_s_steps():
    assert choose_lag(0.003, 0.0) == 1 and choose_lag(0.0, 0.1) == 1  # no adaptation: the next step
    assert choose_lag(0.003, 0.1) == 7  # 20 ms of 3 ms steps
    assert choose_lag(0.008, 0.1) == 3
    assert choose_lag(0.042, 0.1) == 1  # the built-in's steps: read after the next step, as before
    assert choose_lag(0.0002, 0.1) == 100
    assert choose_lag(0.004, 0.02) == 3  # at most half the 6 steps a stop may take (20 ms and one step)


@pytest.mark.parametrize("step_ms", [0.2, 1, 2.9, 7.2, 20, 42, 49, 51, 200])
@pytest.mark.parametrize("vote_ms", [0.05, 0.5, 1.5])
def test_period_and_lag_keep_a_live_stop_within_the_latency_and_one_step(step_ms, vote_ms):
    """A stop asked just after a vote started is carried by the next one, K steps later, and read L
    steps after that: K + L steps are at most the latency and one step (where K = L = 1 does not
    fit, the least there is); L covers READ_LAG_S unless that would leave K too few steps."""
    step_s, vote_s, latency_s = step_ms / 1e3, vote_ms / 1e3, 0.1
    lag = choose_lag(step_s, latency_s)
    k = choose_every(step_s, vote_s, 1, latency_s, lag)
    assert k >= 1 and lag >= 1
    lag = min(lag, k)  # (as rank 0 proposes them)
    assert (k + lag) * step_s <= latency_s + step_s + 1e-12 or k == lag == 1
    allowed = int(latency_s / step_s) + 1
    assert lag * step_s >= READ_LAG_S - 1e-12 or lag == max(1, allowed // 2) or lag == k
    cost = max(vote_s, segment.VOTE_COST_FLOOR_S)
    assert k + lag >= allowed or cost / (k * step_s) <= segment.VOTE_SHARE + 1e-12


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
    """The step boundary's vote logic on every rank in lockstep (:meth:`StepBoundary.decide`): the
    vote in flight read once its agreed lag is over, the next started when due and none is in
    flight. Per rank the step after which it stopped (None: ran out), the reads (step, the period
    and lag read) and the starts (step, the step it is to be read after)."""
    handles = [None] * len(votes)
    stopped = [None] * len(votes)
    reads: list[list[tuple[int, int, int]]] = [[] for _ in votes]
    starts: list[list[tuple[int, int]]] = [[] for _ in votes]
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
                if not v.readable(step):
                    continue
                stop, early = v.result(handles[r])
                handles[r] = None
                reads[r].append((step, v.every, v.lag))
                if stop or early:
                    stopped[r] = step
                    continue
            if v.due(step):
                handles[r] = v.start(step)
                starts[r].append((step, v.read_at))
    return stopped, reads, starts


def test_every_rank_reads_the_same_period_and_lag_and_votes_at_the_same_steps(tmp_path, monkeypatch):
    votes, clock = _ranks(tmp_path, monkeypatch, n=3)
    stopped, reads, starts = _run(votes, clock, 400)
    assert stopped == [None, None, None]
    assert reads[0] == reads[1] == reads[2] and starts[0] == starts[1] == starts[2]
    periods, lags = [k for _, k, _ in reads[0]], [g for _, _, g in reads[0]]
    assert periods[0] == 1 and max(periods) == 27  # 3 ms steps, read 7 steps later: 27 (see the choice's test)
    assert lags[0] == 1 and max(lags) == 7  # 20 ms of 3 ms steps
    # each vote is read exactly at the step agreed at its start (the lag read at the vote before;
    # the segment's first: after the next step), and the next starts the period read after it
    assert [s for s, _ in starts[0][:len(reads[0])]] == [s for s, _ in starts[0]][:len(reads[0])]
    assert [at for _, at in starts[0][:len(reads[0])]] == [s for s, _, _ in reads[0]]
    assert starts[0][0][1] - starts[0][0][0] == 1
    for (s0, _), (s1, at1), (_, k, lag) in zip(starts[0], starts[0][1:], reads[0]):
        assert s1 - s0 == k and at1 - s1 == lag
    started = votes[0].ring.coll.shared.started
    assert len(started[0]) == len(started[1]) == len(started[2])
    assert len(reads[0]) <= len(started[0]) <= len(reads[0]) + 1  # one in flight at most
    assert len(reads[0]) < 400 / 20  # a vote per 27 steps once timed, not per step


def test_only_rank_0_proposes_a_period(tmp_path, monkeypatch):
    votes, clock = _ranks(tmp_path, monkeypatch, n=2)
    calls = []
    votes[1].propose = lambda step, now: calls.append(step) or (999, 99)
    stopped, reads, _ = _run(votes, clock, 200)
    assert calls == []  # rank 1 adds 0: the period and the lag read are rank 0's
    assert reads[0] == reads[1] and max(k for _, k, _ in reads[1]) == 27 and max(g for *_, g in reads[1]) == 7


class Background(SumOfRanks):
    """:class:`SumOfRanks` whose allreduces are done in the background ``steps`` steps after the
    last rank started one (``now()``: the step under way); a read before that is a wait on the
    training thread, counted."""

    def __init__(self, n: int, steps: int, now) -> None:
        super().__init__(n)
        self.steps, self.now, self.waits = steps, now, 0
        self.at: list[list[int]] = [[] for _ in range(n)]  # per rank: the step each one started at

    def for_rank(self, r: int):
        rank, coll = super().for_rank(r), self
        start, wait = rank.allreduce_async, rank.wait

        def started(t, name=""):
            coll.at[r].append(coll.now())
            return start(t, name)

        def read(i):
            coll.waits += coll.now() < max(at[i] for at in coll.at) + coll.steps
            return wait(i)

        rank.allreduce_async, rank.wait = started, read
        return rank


def test_a_vote_is_read_once_done_in_the_background_not_after_the_next_step(tmp_path, monkeypatch):
    """Issue 50: a vote read after the next step waited for its collective (Horovod's next
    negotiation round): now it is read L steps after its start, L agreed in the vote before and
    covering 20 ms: once the period is timed, no read waits for a collective that takes 3 steps
    (9 ms) in the background; only the segment's first votes (read after the next step) do."""
    clock = Clock()
    monkeypatch.setattr(segment.time, "perf_counter", clock)
    seg = Segment(0, 10_000, 10_000)
    coll = Background(2, 3, now=lambda: seg.step)
    votes = [StopVote(tmp_path, types.SimpleNamespace(rank=r, coll=coll.for_rank(r)),
                      seg if r == 0 else Segment(0, 10_000, 10_000), 1, 0.1) for r in range(2)]
    stopped, reads, _ = _run(votes, clock, 300)
    assert stopped == [None, None] and len(reads[0]) > 10
    assert 0 < coll.waits <= 2 * 2  # the first two votes' reads (lag 1, before the timing), on each rank
    # (the same collective read after the next step each time: every read waits)
    coll.waits = 0
    for v in votes:
        v.latency_s = 0.0
        v.begin()
    stopped, reads, _ = _run(votes, clock, 30)
    assert coll.waits == 2 * len(reads[0]) > 0


@pytest.mark.parametrize("at", [30, 31, 37, 100, 151])
def test_a_live_stop_lands_on_all_ranks_at_one_step_within_k_plus_lag(tmp_path, monkeypatch, at):
    votes, clock = _ranks(tmp_path, monkeypatch, n=2)
    stopped, reads, starts = _run(votes, clock, 400, stop_file_at=at, tmp_path=tmp_path)
    assert stopped[0] == stopped[1] is not None
    k = max(k for _, k, _ in reads[0])
    lag = max(g for *_, g in reads[0])
    assert k > 1 and lag > 1
    # rank 0 reads the stop file when it starts a vote (after a step >= at: within K steps) and
    # all ranks read that vote L steps later: K + L steps of 3 ms, at most 100 ms and one step
    assert at < stopped[0] <= at + k + lag
    assert (k + lag) * 0.003 <= 0.1 + 0.003
    assert stopped[0] == starts[0][-1][1]  # at the step the carrying vote was agreed to be read


def test_finish_on_one_rank_stops_every_rank_at_one_step(tmp_path, monkeypatch):
    votes, clock = _ranks(tmp_path, monkeypatch, n=3)
    stopped, reads, _ = _run(votes, clock, 400, finish_at=90)
    assert stopped[0] == stopped[1] == stopped[2] is not None
    assert 90 < stopped[0] <= 90 + 27 + 7


def test_without_a_latency_the_vote_is_every_control_every_steps(tmp_path, monkeypatch):
    votes, clock = _ranks(tmp_path, monkeypatch, n=2, floor=3, latency_s=0.0)
    stopped, reads, _ = _run(votes, clock, 30)
    # a vote after the segment's first step, then every 3 steps; each read a step later
    assert [s for s, _, _ in reads[0]] == list(range(2, 31, 3))
    assert {k for _, k, _ in reads[0]} == {3} and {g for *_, g in reads[0]} == {1}


def test_a_new_segment_votes_at_its_first_step_and_times_again(tmp_path, monkeypatch):
    votes, clock = _ranks(tmp_path, monkeypatch, n=1)
    _run(votes, clock, 100)
    assert votes[0].every == 27 and votes[0].lag == 7
    votes[0].begin()
    assert votes[0].every == 1 and votes[0].lag == 1 and votes[0].due(votes[0].seg.step)


# ---------------------------------------------------------------------- the epoch loop's RNG capture
def _hooked(rank=0, due=False, pos=5, copy=None, epoch=None):
    from elastic_ring.worker.hooked import HookedSteps

    job = types.SimpleNamespace(rank=rank, seg=Segment(0, 100, 100),
                                checkpoints=types.SimpleNamespace(due=lambda step, stop_at: due,
                                                                  writes=lambda r: r == 0),
                                _epoch_data=types.SimpleNamespace(position=types.SimpleNamespace(pos=pos, epoch=epoch)),
                                boundary=types.SimpleNamespace(handle=None, copy=copy))  # the step boundary's
    return HookedSteps(job)


def test_the_epoch_loop_takes_the_rng_only_where_it_may_be_saved():
    sampler = types.SimpleNamespace(dataset=range(10), size=lambda: 10)
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


def test_under_job_epochs_only_the_last_epochs_end_takes_the_rng():
    """job.epochs(1, 4): the run ends after epoch 3's end-of-epoch code, so its end takes the RNG
    (the final checkpoint holds it); the end of epoch 1 or 2 does not (issue 50: about 0.2 ms an
    epoch on rank 0), unless a checkpoint is due there or a stop is pending."""
    sampler = types.SimpleNamespace(dataset=range(10), size=lambda: 10)
    for epoch, wanted in ((1, False), (2, False), (3, True)):
        h = _hooked(pos=10, epoch=epoch)
        h.last_epoch = 3
        assert h._rng_wanted(3, sampler) is wanted, epoch
    h = _hooked(pos=10, epoch=1, due=True)
    h.last_epoch = 3
    assert h._rng_wanted(3, sampler)  # the periodic checkpoint at an earlier epoch's end
    h = _hooked(pos=10, epoch=2)
    h.last_epoch, h.pending = 3, StopReason.REQUESTED
    assert h._rng_wanted(3, sampler)  # a stop there
    h = _hooked(pos=5, epoch=3)
    h.last_epoch = 3
    assert not h._rng_wanted(3, sampler)  # inside the last epoch: not its end


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
    a = Ballot(asked=True, every=17, lag=7, window=1.5)
    b = Ballot(finish=True, checkpoint=True, window=2.25)
    none = Ballot(every=3, lag=2)
    for ck in (False, True):
        assert len(a.pack(ck, True)) == len(none.pack(ck, True)) == 5 + ck
        assert none.pack(ck, True)[-1] == 0.0
        summed = [x + y for x, y in zip(a.pack(ck, True), b.pack(ck, True))]
        got = Ballot.unpack(summed, ck, True, window=True)
        assert got == Ballot(asked=True, finish=True, every=17, lag=7, checkpoint=ck, window=3.75)
        assert Ballot.unpack(summed, ck, True, window=False).window is None
    assert none.pack() == [0.0, 0.0, 3.0, 2.0]  # a job without either slot: the flags, period and lag
    assert Ballot.unpack(Ballot(checkpoint=True).pack(True), True).checkpoint
    assert not Ballot.unpack(Ballot(checkpoint=True).pack(True), False, True).checkpoint  # (that slot: a window's)
    with pytest.raises(ValueError):
        a.pack()  # a window without its slot would be lost
    with pytest.raises(ValueError):
        Ballot.unpack([0.0, 0.0, 1.0, 1.0], window_slot=True)


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
    assert shapes == {(5,)}


# ---------------------------------------------------------------------- what `status` says
@pytest.mark.parametrize("every,lag,line", [
    (12, None, "a live resize lands within 13 steps (a stop vote every 12 steps)"),  # (a progress file before the lag)
    (12, 1, "a live resize lands within 13 steps (a stop vote every 12 steps)"),
    (17, 7, "a live resize lands within 24 steps (a stop vote every 17 steps, read 7 steps after it starts)"),
    (1, 1, None)])
def test_status_says_a_live_resize_lands_within_the_period_and_the_read_lag(tmp_path, every, lag, line):
    from elastic_ring.controller.api import RunState
    from elastic_ring.controller.status import RunStatus

    st = RunStatus(run_dir=tmp_path, phase=RunState.RUNNING, step=40, total_steps=100, world_size=2,
                   vote_every=every, vote_lag=lag)
    assert st.stop_latency_line() == line
