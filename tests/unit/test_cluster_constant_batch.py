"""The live cluster scheduler under ``constant-batch``: a job's rule read from its request, its rate
the accumulated step's (the simulator's :mod:`elastic_ring.perfmodel.accumulated`, from its
profile), and no more workers than micro-batches, with a fake runner."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from elastic_ring.cluster.api import JobRequest
from elastic_ring.cluster.daemon import AccumulatedRate, rate_for
from elastic_ring.cluster.scheduler import Scheduler
from elastic_ring.cluster.store import Store
from elastic_ring.cluster.api import ClusterConfig
from elastic_ring.perfmodel.accumulated import accumulated
from elastic_ring.perfmodel.speed import SpeedModel
from elastic_ring.sched.registry import make_policy
from tests.unit.test_cluster_scheduler import FakeRunner

EQ5 = SpeedModel(t0=1e-3, t1=2e-3, t2=1e-8, t3=5e-3, m=32.0, n=1e6)  # b = 32, a visible allreduce


def _req(**kw):
    return JobRequest(**{"name": "j", "kind": "script", "path": "x.py", "steps": 10, **kw})


def test_the_rule_is_read_from_train_options_and_sets():
    assert _req().batch_rule() == ("", 0, 0)
    assert _req(train_args=("--lr-scaling", "constant-batch", "--global-batch", "128")).batch_rule() == \
        ("constant-batch", 128, 0)
    assert _req(train_args=("--lr-scaling=constant-batch", "--global-batch=96", "--batch-size", "32")).batch_rule() \
        == ("constant-batch", 96, 32)
    assert JobRequest(name="c", kind="config", path="c.yaml", sets=("lr_scaling=constant-batch", "global_batch=64",
                                                                     "batch_size=16")).batch_rule() == \
        ("constant-batch", 64, 16)
    assert _req(train_args=("--lr-scaling", "linear")).batch_rule() == ("linear", 0, 0)


def test_a_constant_batch_jobs_rate_is_the_accumulated_step(tmp_path):
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps({"speed_model": EQ5.to_dict()}))
    rate = rate_for(ClusterConfig(hosts=(("localhost", 8),), profile=str(prof)))
    plain = rate(SimpleNamespace(request=_req()))
    held = rate(SimpleNamespace(request=_req(train_args=("--lr-scaling", "constant-batch", "--global-batch", "128"))))
    want = accumulated(EQ5, 128)  # 4 micro-batches of 32: the simulator's model
    assert isinstance(held, AccumulatedRate) and held.micro_batches == 4
    for w in range(1, 9):
        assert held(w) == float(want.predict(w))
        assert plain(w) == float(EQ5.predict(w))
    assert held(1) < held(2) < held(4) == held(8)  # no speed past one worker per micro-batch
    assert held(4) == plain(4) and held(1) < plain(1)  # 4 workers: the plain step; 1: 4 micro-batches each
    # the profile's own rule (a workload as the simulator reads it), and a batch it does not divide
    prof.write_text(json.dumps({"speed_model": EQ5.to_dict(), "scaling": "constant-batch", "global_batch": 64}))
    assert rate(SimpleNamespace(request=_req())).micro_batches == 2
    odd = rate(SimpleNamespace(request=_req(train_args=("--lr-scaling", "constant-batch", "--global-batch", "100"))))
    assert not isinstance(odd, AccumulatedRate) and odd(3) == float(EQ5.predict(3))


def _sched(tmp_path, prof):
    cfg = ClusterConfig(hosts=(("localhost", 8),), policy="precompute", profile=str(prof))
    store = Store(tmp_path, create=True, clock=lambda: 0.0)
    clock = iter(range(10 ** 6))
    return store, Scheduler(store, cfg, make_policy("precompute"), FakeRunner(2), rate_for=rate_for(cfg),
                            clock=lambda: float(next(clock)))


def test_the_scheduler_gives_a_constant_batch_job_no_more_workers_than_micro_batches(tmp_path):
    """On 8 slots, alone: a linear job's steps/s falls with its workers (the same per-worker batch
    per step, Eq. 5), so it gets 1; a constant-batch job's step is shared, so it gets more: 3 for 3
    micro-batches (what ``train`` accepts: the policy's doubling would give it 4), the limit known
    from its rate (its profile) or from its request's batches (no profile: linear speed-up)."""
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps({"speed_model": EQ5.to_dict()}))
    for name, req, want in (
            ("linear", _req(), 1),
            ("rate", _req(train_args=("--lr-scaling", "constant-batch", "--global-batch", "96")), 3),
            ("request", _req(profile=str(tmp_path / "none.json"),
                             train_args=("--lr-scaling", "constant-batch", "--global-batch", "96",
                                         "--batch-size", "32")), 3)):
        (tmp_path / name).mkdir()
        store, sched = _sched(tmp_path / name, prof)
        jid = store.submit(req)
        assert sched.decide("arrival", jid) == {jid: want}, name
        assert sched._most_workers(store.job(jid)) == (0 if want == 1 else 3)


def test_submit_passes_the_rule_to_train_and_the_scheduler(tmp_path, capsys):
    from elastic_ring.cluster.store import Store
    from tests.conftest import one_line_error, run_inproc

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    Store(tmp_path / "cl", create=True).close()
    r = run_inproc(capsys, "submit", str(script), "--steps", "5", "--lr-scaling", "constant-batch",
                   "--global-batch", "128", "--dir", str(tmp_path / "cl"))
    assert r.returncode in (0, None), r.stderr
    req = Store(tmp_path / "cl").jobs()[0].request
    assert req.train_args == ("--lr-scaling", "constant-batch", "--global-batch", "128")
    assert req.batch_rule() == ("constant-batch", 128, 0)
    r = run_inproc(capsys, "submit", str(script), "--steps", "5", "--global-batch", "128",
                   "--dir", str(tmp_path / "cl"))
    one_line_error(r, "--global-batch 128 needs --lr-scaling constant-batch")


def test_an_exploring_policy_fits_the_plain_steps_behind_a_constant_batch_jobs(tmp_path):
    """``exploratory`` live: a constant-batch job of 3 micro-batches (its request's --global-batch
    96 and --batch-size 32, no profile) is explored at 1 and 2 workers only (3 at most), Eq. 5 is
    fitted to the plain steps behind the accumulated ones (as the simulator does), and its rate is
    the accumulated model's: it reproduces the measurements, plans the job on 3 slots, and a
    restarted scheduler reads the same rate from the stored fit."""
    from elastic_ring.cluster.scheduler import fit_explored_accumulated, live_policy
    from elastic_ring.perfmodel.accumulated import AccumulatedModel
    from tests.unit.test_cluster_explore import _kinds, _tick_until

    true = AccumulatedModel(SpeedModel(t0=0.0, t1=0.0, t2=0.001, t3=0.02, m=1.0, n=1.0), 3)
    store = Store(tmp_path, create=True, clock=lambda: 0.0)
    cfg = ClusterConfig(hosts=(("localhost", 8),), policy="exploratory")
    runner = FakeRunner(2, speed=lambda w: float(true.predict(w)))
    clock = iter(range(10 ** 6))
    sched = Scheduler(store, cfg, live_policy("exploratory", 8), runner, rate_for=lambda j: (lambda w: float(w)),
                      clock=lambda: float(next(clock)))
    a = store.submit(_req(steps=10 ** 6, train_args=("--lr-scaling", "constant-batch", "--global-batch", "96",
                                                      "--batch-size", "32")))
    sched.recover()
    _tick_until(sched, lambda: _kinds(store, a, "explore_fit"))
    assert [e["data"]["to"] for e in _kinds(store, a, "explore_step")] == [1, 2]
    fit = _kinds(store, a, "explore_fit")[0]["data"]
    assert fit["micro_batches"] == 3 and fit["per_worker"] is False
    for w in (1, 2, 3):  # 2 counts: a 2-term Eq. 5 on the plain steps, exact for this curve
        assert sched._rate(store.job(a))(w) == pytest.approx(float(true.predict(w)), rel=1e-6)
    assert store.decisions()[-1]["cause"] == "explored" and store.decisions()[-1]["allocation"] == {a: 3}
    again = Scheduler(store, cfg, live_policy("exploratory", 8), runner, rate_for=lambda j: (lambda w: 1.0))
    assert again._rate(store.job(a))(3) == pytest.approx(float(true.predict(3)), rel=1e-6)
    # the same measurements fitted as any job's (steps/s, or per worker) do not reproduce 3 workers
    from elastic_ring.cluster.scheduler import explored_rate, fit_explored

    model, _, per_worker, _ = fit_explored([1, 2], [float(true.predict(w)) for w in (1, 2)])
    assert explored_rate(model, per_worker)(3) != pytest.approx(float(true.predict(3)), rel=0.05)
    model, _, rmse = fit_explored_accumulated([1, 2], [float(true.predict(w)) for w in (1, 2)], 3)
    assert rmse < 1e-9


def _config(tmp_path, name, text):
    path = tmp_path / name
    path.write_text("depth: 8\nwidth: 4\ndataset: synthetic\n" + text)
    return path


def test_a_config_files_own_rule_is_read(tmp_path, capsys):
    """A config job whose file sets ``lr_scaling: constant-batch`` (no --lr-scaling, no --set) is
    planned as one: its rule, global batch and per-worker batch read from the file (as its
    ``train`` reads it), a --set or a train option over the file's value winning as in ``train``;
    submitted, the scheduler gives it one worker per micro-batch (3), where it gives a linear job 1."""
    from tests.conftest import run_inproc

    cb = _config(tmp_path, "cb.yaml", "lr_scaling: constant-batch\nglobal_batch: 96\nbatch_size: 32\n")
    plain = _config(tmp_path, "plain.yaml", "batch_size: 32\n")
    conf = dict(name="c", kind="config", path=str(cb))
    assert JobRequest(**conf).batch_rule() == ("constant-batch", 96, 32)
    assert JobRequest(**conf, sets=("global_batch=64",)).batch_rule() == ("constant-batch", 64, 32)
    assert JobRequest(**conf, sets=("batch_size=16",), train_args=("--global-batch", "128")).batch_rule() == \
        ("constant-batch", 128, 16)
    assert JobRequest(**{**conf, "path": str(plain)}).batch_rule() == ("", 0, 32)  # no rule stated: a profile's may
    cb.write_text("lr_scaling: [")  # changed since submit: what the request says, the scheduler goes on
    assert JobRequest(**conf, sets=("lr_scaling=constant-batch", "global_batch=48")).batch_rule() == \
        ("constant-batch", 48, 0)
    cb = _config(tmp_path, "cb.yaml", "lr_scaling: constant-batch\nglobal_batch: 96\nbatch_size: 32\n")

    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps({"speed_model": EQ5.to_dict()}))
    Store(tmp_path / "cl", create=True).close()
    for path, want in ((cb, 3), (plain, 1)):
        r = run_inproc(capsys, "submit", str(path), "--dir", str(tmp_path / "cl"))
        assert r.returncode in (0, None), r.stderr
    store, sched = _sched(tmp_path / "cl", prof)
    (a, b) = store.jobs()
    assert a.request.train_args == () and a.request.batch_rule() == ("constant-batch", 96, 32)
    assert isinstance(rate_for(sched.config)(a), AccumulatedRate) and rate_for(sched.config)(a).micro_batches == 3
    assert sched.decide("arrival", a.id)[a.id] == 3
    assert sched._most_workers(a) == 3 and sched._most_workers(b) == 0


def test_a_config_jobs_rule_is_checked_at_submit(tmp_path, capsys):
    """A config whose rule ``train`` would refuse (with the submit's own --global-batch) is refused at
    ``submit``, in one line, exit 2, and nothing is queued; a --global-batch over a config that sets
    ``constant-batch`` itself is accepted and passed to ``train``."""
    from tests.conftest import one_line_error, run_inproc

    Store(tmp_path / "cl", create=True).close()
    odd = _config(tmp_path, "odd.yaml", "lr_scaling: constant-batch\nglobal_batch: 100\nbatch_size: 32\n")
    r = run_inproc(capsys, "submit", str(odd), "--dir", str(tmp_path / "cl"))
    one_line_error(r, "global_batch 100 is not a multiple of batch_size 32")
    plain = _config(tmp_path, "plain.yaml", "batch_size: 32\n")
    r = run_inproc(capsys, "submit", str(plain), "--global-batch", "64", "--dir", str(tmp_path / "cl"))
    one_line_error(r, "global_batch 64 needs lr_scaling constant-batch")
    cb = _config(tmp_path, "cb.yaml", "lr_scaling: constant-batch\nbatch_size: 32\n")
    r = run_inproc(capsys, "submit", str(cb), "--global-batch", "48", "--dir", str(tmp_path / "cl"))
    one_line_error(r, "global_batch 48 is not a multiple of batch_size 32")
    assert Store(tmp_path / "cl").jobs() == []
    r = run_inproc(capsys, "submit", str(cb), "--global-batch", "64", "--dir", str(tmp_path / "cl"))
    assert r.returncode in (0, None), r.stderr
    (job,) = Store(tmp_path / "cl").jobs()
    assert job.request.train_args == ("--global-batch", "64")
    assert job.request.batch_rule() == ("constant-batch", 64, 32)
