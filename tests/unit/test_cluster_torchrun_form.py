"""A script of torchrun's contract submitted to the cluster (docs/torchrun.md): `submit` reads its
form from its source as `train` does, takes it without --steps (its length is its own), refuses in
one line the options and clusters that do not apply, and the runner starts it without --steps; the
scheduler explores no such job and gives it the median of the others' remaining work."""

from __future__ import annotations

import pytest

from elastic_ring.cluster.api import ClusterConfig, ClusterError, JobRequest, JobRow, JobState
from elastic_ring.cluster.client import submit
from elastic_ring.cluster.runner import ProcessRunner
from elastic_ring.cluster.store import Store
from tests.conftest import ROOT
from tests.unit.test_cluster_scheduler import _setup

TORCHRUN = ROOT / "tests" / "integration" / "scripts" / "torchrun_contract.py"
LIBRARY = ROOT / "tests" / "integration" / "scripts" / "paced.py"


def _store(tmp_path, **cfg):
    st = Store(tmp_path / "cl", create=True)
    st.set_meta("config", ClusterConfig(**{"hosts": (("localhost", 2),), "policy": "eight", **cfg}).to_dict())
    st.close()
    return tmp_path / "cl"


def test_a_torchrun_script_is_queued_without_steps_and_started_without_them(tmp_path):
    d = _store(tmp_path)
    job = submit(d, str(TORCHRUN), max_workers=2, script_args=("--out", "o"))
    st = Store(d)
    req = st.job(job.job_id).request
    assert req.form == "torchrun" and req.steps is None
    lib = st.job(submit(d, str(LIBRARY), steps=7).job_id).request
    assert lib.form == "library" and lib.steps == 7
    cfg = st.config()
    runner = ProcessRunner(d, cfg)
    cmd, _ = runner.command(st.job(job.job_id), [0, 1], 2, resume=False)
    i = cmd.index("--script")
    assert cmd[i + 1] == str(TORCHRUN) and "--steps" not in cmd and cmd[-2:] == ["--out", "o"]
    cmd, _ = runner.command(st.job(2), [0], 1, resume=False)
    assert cmd[cmd.index("--steps") + 1] == "7"
    st.close()


@pytest.mark.parametrize("kw, what", [
    ({"steps": 10}, "--steps does not apply"),
    ({"checkpoint_every": 5}, "--checkpoint-every does not apply"),
    ({"target_loss": 0.5}, "--target-loss does not apply"),
])
def test_options_that_do_not_apply_to_a_torchrun_script_are_one_line(tmp_path, kw, what):
    d = _store(tmp_path)
    with pytest.raises(ClusterError) as e:
        submit(d, str(TORCHRUN), **kw)
    msg = str(e.value)
    assert msg.startswith(what) and "torchrun_contract.py follows torchrun's contract" in msg and "\n" not in msg
    assert Store(d).jobs() == []  # nothing queued


def test_a_torchrun_script_on_a_cluster_over_several_hosts_is_refused(tmp_path):
    d = _store(tmp_path, hosts=(("localhost", 1), ("127.0.0.1", 1)))
    with pytest.raises(ClusterError, match="a cluster over several hosts does not apply: .* scheduler's host"):
        submit(d, str(TORCHRUN))


def test_a_library_script_still_needs_steps_and_a_bad_form_is_refused():
    with pytest.raises(ClusterError, match="needs --steps"):
        JobRequest(name="a", kind="script", path="/x/a.py")
    with pytest.raises(ClusterError, match="form must be"):
        JobRequest(name="a", kind="script", path="/x/a.py", steps=3, form="nope")
    with pytest.raises(ClusterError, match="only a script"):
        JobRequest(name="a", kind="config", path="/x/a.yaml", form="torchrun")
    with pytest.raises(ClusterError, match="--steps does not apply"):
        JobRequest(name="a", kind="script", path="/x/a.py", steps=3, form="torchrun")


def test_the_scheduler_explores_no_torchrun_job_and_gives_it_the_median_remaining(tmp_path):
    store, cfg, runner, sched = _setup(tmp_path, slots=4, policy="srtf")
    a = store.submit(JobRequest(name="a", kind="script", path="a.py", steps=100))
    b = store.submit(JobRequest(name="b", kind="script", path="b.py", steps=300))
    t = store.submit(JobRequest(name="t", kind="script", path="t.py", form="torchrun"))
    seen = {}
    real = sched.policy.allocate

    def spy(views, slots, current):
        seen.update({v.id: v.remaining for v in views})
        return real(views, slots, current)

    sched.policy.allocate = spy
    sched.decide("test", None)
    assert seen[t] == pytest.approx((seen[a] + seen[b]) / 2)  # the median of two known ones
    assert seen[a] < seen[t] < seen[b]
    assert sched._xs(store.job(t)) is None
