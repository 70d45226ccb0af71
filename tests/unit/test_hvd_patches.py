"""The Horovod internals elastic-ring patches (elastic_ring.hvd_patches), against the installed Horovod,
without processes: every patch is applied to the real module or class (once, whatever the number
of calls), a missing or changed target is one line naming it and the installed version, the start
check remembers a yes per install, and what each worker-side patch does on a small case (the
launcher's patches are shown doing their part in test_hvdrun.py and test_survive.py)."""

from __future__ import annotations

import importlib
import queue

import pytest

from elastic_ring import hvd_patches
from elastic_ring.controller import hvdrun
from elastic_ring.errors import UserError
from elastic_ring.hvd_patches import MARK, ORIGINAL, PATCHES, HorovodChanged, Patch, apply, check, patches
from elastic_ring.protocol import read_json

pytest.importorskip("horovod.torch")


def _owner(p: Patch):
    module, qual = p.target.split(":")
    *path, name = qual.split(".")
    owner = importlib.import_module(module)
    for part in path:
        owner = getattr(owner, part)
    return owner, name


@pytest.fixture
def restored(monkeypatch):
    """Every target Horovod's own during the test, put back as it was after it (and the originals' table)."""
    for p in PATCHES:
        owner, name = _owner(p)
        current = getattr(owner, name)  # Horovod's own during the test (another test's worker may have patched it)
        monkeypatch.setattr(owner, name, getattr(current, ORIGINAL, current))
    monkeypatch.setattr(hvd_patches, "_ORIGINALS", dict(hvd_patches._ORIGINALS))
    return monkeypatch


def test_the_patches_were_written_for_the_installed_horovod_and_it_has_every_target():
    import horovod

    assert horovod.__version__ in hvd_patches.WRITTEN_FOR
    check()  # every patch, every name it uses
    assert {p.group for p in PATCHES} == set(hvd_patches.GROUPS)
    assert len({p.name for p in PATCHES}) == len({p.target for p in PATCHES}) == len(PATCHES)
    assert all(p.why and "\n" not in p.why for p in PATCHES)


@pytest.mark.parametrize("name", [p.name for p in PATCHES])
def test_each_patch_is_applied_to_the_real_horovod_once(restored, name):
    (p,) = patches(name)
    owner, attr = _owner(p)
    before = getattr(owner, attr)
    apply(name)
    new = getattr(owner, attr)
    assert new is not before and getattr(new, MARK) and getattr(new, ORIGINAL) is before
    assert hvd_patches.original(name) is before
    apply(name)  # idempotent: not wrapped twice
    assert getattr(owner, attr) is new and hvd_patches.original(name) is before
    check(patches(name))  # a patched Horovod still checks (its own function behind ours)


def test_groups_select_their_patches_and_hvdrun_installs_them_by_its_environment():
    assert [p.name for p in patches("survive")] == ["resume", "blacklist", "warm_joiner"]
    assert {p.group for p in patches("launcher", "worker")} == {"launcher", "worker"}
    assert [p.name for p in patches("slot_hosts", "commit")] == ["slot_hosts", "commit"]
    with pytest.raises(ValueError, match="no-such"):
        patches("no-such")
    assert hvdrun.launcher_groups({}) == ["launcher"]
    assert hvdrun.launcher_groups({"ELASTIC_RING_SURVIVE": "1", "ELASTIC_RING_SLOT_HOSTS": "1"}) == \
        ["launcher", "survive", "slot-hosts"]


def _one_line(e: pytest.ExceptionInfo, *needles: str) -> str:
    msg = str(e.value)
    assert isinstance(e.value, UserError) and e.value.exit_code == 2
    assert "\n" not in msg and "Horovod 0.28.1" in msg and "scripts/setup.sh" in msg, msg
    for n in needles:
        assert n in msg, msg
    return msg


@pytest.mark.parametrize("name", [p.name for p in PATCHES])
def test_a_missing_target_is_one_line_naming_it_and_the_version(restored, name):
    (p,) = patches(name)
    owner, attr = _owner(p)
    restored.delattr(owner, attr)
    with pytest.raises(HorovodChanged) as e:
        check(patches(name))
    _one_line(e, f"has no {p.module}.{p.attr}", f"'{name}'")
    with pytest.raises(HorovodChanged):
        apply(p.group)  # nothing of the group is installed
    assert all(not getattr(getattr(*_owner(q)), MARK, False) for q in patches(p.group) if q is not p)


def test_a_changed_signature_or_a_missing_name_it_uses_is_one_line(restored):
    from horovod.runner.elastic import driver

    restored.setattr(driver.ElasticDriver, "_handle_worker_exit", lambda self, slot_info, exit_code: None)
    with pytest.raises(HorovodChanged) as e:
        check(patches("worker_exit"))
    _one_line(e, "changed horovod.runner.elastic.driver.ElasticDriver._handle_worker_exit: it takes "
              "(self, slot_info, exit_code) where the patch calls it with (self, slot_info, exit_code, timestamp)")
    restored.setattr(driver.ElasticDriver, "resume", lambda self, extra: None)  # a new required parameter
    with pytest.raises(HorovodChanged, match=r"ElasticDriver.resume: it takes \(self, extra\) where"):
        check(patches("resume"))
    restored.setattr(driver.ElasticDriver, "resume", 3)
    with pytest.raises(HorovodChanged, match="resume: it is a int, not a function"):
        check(patches("resume"))
    restored.delattr(driver, "DISCOVER_HOSTS_FREQUENCY_SECS")
    with pytest.raises(HorovodChanged) as e:
        check(patches("discovery"))
    _one_line(e, "has no horovod.runner.elastic.driver.DISCOVER_HOSTS_FREQUENCY_SECS", "'discovery'")


def test_another_version_is_checked_by_shape(restored):
    """A version the patches were not written for passes where its classes' code still sets the
    instance attributes the patches read (the installed code does), and fails where it does not."""
    import horovod

    missing = Patch("probe", "launcher", "horovod.runner.elastic.driver:ElasticDriver.resume", "a probe",
                    lambda f: f, ("self",), ("horovod.runner.elastic.driver:ElasticDriver._no_such_attribute",))
    check([missing])  # 0.28.1: the instance attributes are known, not looked for
    restored.setattr(horovod, "__version__", "0.29.0")
    check()  # every instance attribute found in the classes' code (a dataclass field, self.x = ..., a, self.x = ...)
    with pytest.raises(HorovodChanged) as e:
        check([missing])
    msg = str(e.value)
    assert "Horovod 0.29.0 has no horovod.runner.elastic.driver.ElasticDriver._no_such_attribute" in msg
    assert "written for Horovod 0.28.1" in msg and "\n" not in msg


def test_the_start_check_remembers_a_yes_per_install_and_relays_a_no(tmp_path):
    cache = tmp_path / "horovod-patches.json"
    asked = []

    def yes(groups):
        asked.append(groups)
        return 0, ""

    hvd_patches.check_installed("launcher", "worker", cache=cache, run_check=yes)
    hvd_patches.check_installed("worker", "launcher", cache=cache, run_check=yes)  # remembered
    assert asked == [("launcher", "worker")]
    hvd_patches.check_installed("launcher", cache=cache, run_check=yes)  # other groups: asked
    assert len(asked) == 2
    line = "--collective horovod: Horovod 0.28.1 has no horovod.torch.init, which ..."
    with pytest.raises(HorovodChanged) as e:
        hvd_patches.check_installed("survive", cache=tmp_path / "other.json", run_check=lambda g: (2, line))
    assert str(e.value) == line
    with pytest.raises(HorovodChanged, match=r"failed \(status 1\): ImportError: boom"):
        hvd_patches.check_installed("survive", cache=tmp_path / "other.json",
                                    run_check=lambda g: (1, "ImportError: boom"))
    assert not (tmp_path / "other.json").exists()  # a no is not remembered


def test_the_start_check_of_the_real_install_in_a_child(tmp_path):
    cache = tmp_path / "c.json"
    hvd_patches.check_installed("launcher", "survive", "slot-hosts", cache=cache)  # (a child Python: 0.3 s)
    assert list(read_json(cache).values()) == [True]
    assert hvd_patches.main(["launcher"]) == 0


def test_the_controller_checks_the_worker_patches_only_for_a_horovod_elastic_script(tmp_path):
    from tests.conftest import ROOT

    seen = []
    hvdrun.check_horovod_patches(str(ROOT / "examples" / "hvd_elastic_mlp.py"), check=lambda *g: seen.append(g))
    hvdrun.check_horovod_patches(str(ROOT / "examples" / "mlp_digits.py"), check=lambda *g: seen.append(g))
    hvdrun.check_horovod_patches(None, check=lambda *g: seen.append(g))
    assert seen == [("launcher", "survive", "slot-hosts", "worker"), ("launcher", "survive", "slot-hosts"),
                    ("launcher", "survive", "slot-hosts")]


# ---- what the worker's patches do (elastic_ring.worker.hvd_elastic), on small cases ----

class _Window:
    samples = 0


class _Session:
    """Stands for hvd_elastic.Session: the state it serves, its commit points, its window."""

    def __init__(self, state=None):
        self.state, self.points, self.counting = state, 0, True
        self.job = type("Job", (), {"progress": type("P", (), {"window": _Window()})()})()

    def commit_point(self):
        self.points += 1


def _state(**kw):
    from horovod.common.elastic import ObjectState

    return ObjectState(bcast_object=lambda x: x, get_rank=lambda: 0, **kw)


def test_check_host_updates_never_interrupts(restored):
    from horovod.common.elastic import HostsUpdatedInterrupt, HostUpdateResult

    s = _state(epoch=0)
    s.on_hosts_updated(5.0, HostUpdateResult.added)
    with pytest.raises(HostsUpdatedInterrupt):  # Horovod's own: a host change interrupts
        s.check_host_updates()
    apply("check_host_updates")
    s._host_messages = queue.Queue()
    s.on_hosts_updated(9.0, HostUpdateResult.added)
    assert s.check_host_updates() is None  # taken at the next commit instead


def test_commit_saves_as_horovod_does_and_is_the_sessions_stop_point(restored):
    from horovod.common.elastic import HostUpdateResult

    from elastic_ring.worker import hvd_elastic

    apply("commit", "check_host_updates")
    s = _state(epoch=1)
    s.epoch = 5
    s.on_hosts_updated(9.0, HostUpdateResult.added)  # (Horovod's commit would raise here)
    session = _Session(s)
    restored.setattr(hvd_elastic, "_SESSION", session)
    s.commit()
    s.epoch = 6
    s.restore()
    assert s.epoch == 5 and session.points == 1  # saved, and one stop point
    _state(epoch=0).commit()  # another state than the session's: saved, no stop point
    assert session.points == 1


def test_record_batch_counts_horovods_and_this_ranks_samples(restored):
    from horovod.torch.elastic.sampler import ElasticSampler

    from elastic_ring.worker import hvd_elastic

    apply("record_batch")
    sampler = ElasticSampler.__new__(ElasticSampler)  # (its constructor asks an initialised Horovod)
    sampler.processed_num, sampler.num_replicas = 0, 2
    session = _Session()
    restored.setattr(hvd_elastic, "_SESSION", session)
    sampler.record_batch(0, 16)
    assert sampler.processed_num == 32 and session.job.progress.window.samples == 16
    session.counting = False
    sampler.record_batch(1, 16)
    assert sampler.processed_num == 64 and session.job.progress.window.samples == 16


def test_init_reaches_horovods_only_when_it_is_not_initialised(restored):
    import horovod.torch as hvd

    from elastic_ring.worker import session as worker_session

    calls, up = [], {"v": False}
    restored.setattr(hvd, "init", lambda *a, **k: calls.append((a, k)))  # stands for Horovod's own
    restored.setattr(hvd, "is_initialized", lambda: up["v"])
    restored.setattr(worker_session, "current", lambda: object())  # the worker library is running
    apply("init")
    hvd.init(comm=None)
    assert calls == [((), {"comm": None})]
    up["v"] = True
    hvd.init()  # initialised already: a no-op
    assert len(calls) == 1


def test_elastic_run_is_elastic_rings(restored):
    import horovod.torch as hvd

    from elastic_ring.worker import hvd_elastic

    apply("elastic_run")

    def train(state):
        """the script's function"""

    wrapped = hvd.elastic.run(train)
    assert hvd.elastic.run is hvd_elastic.run and wrapped.__wrapped__ is train and wrapped.__doc__ == train.__doc__


class _Collective:
    """A collective done after ``polls`` polls; the clock moves only when the test says."""

    def __init__(self, polls: int):
        self.left, self.polls, self.slept, self.cleared, self.loads = polls, 0, [], [], 0
        self.now = 100.0

    def poll(self, handle):
        self.polls += 1
        self.left -= 1
        return self.left < 0

    def load(self):
        self.loads += 1
        return (self.machine_load, 0.0, 0.0)

    def sleep(self, s):
        self.slept.append(s)

    def clock(self):
        return self.now

    def real(self, handle):
        self.cleared.append(handle)
        return "released"


def test_on_a_crowded_machine_a_wait_sleeps_between_polls_then_horovod_releases_the_handle():
    c = _Collective(polls=7)
    c.machine_load = 3.1  # 2 cores: above 1.5 per core
    wait = hvd_patches._wait_polling(c.real, poll=c.poll, load=c.load, cores=2, sleep=c.sleep, clock=c.clock)
    assert wait(41) == "released" and c.cleared == [41]
    assert c.slept == [50e-6, 100e-6, 200e-6, 400e-6, 500e-6, 500e-6]  # doubling up to 0.5 ms
    assert c.polls == 8


class _Ticking(_Collective):
    """A collective whose sleeps move the clock; ``lost`` answers as the test says, each ask counted."""

    def __init__(self, polls: int, lost_after: int | None):
        super().__init__(polls)
        self.machine_load, self.asked, self.lost_after = 3.1, [], lost_after

    def sleep(self, s):
        super().sleep(s)
        self.now += s

    def lost(self):
        self.asked.append(self.now)
        return self.lost_after is not None and len(self.asked) > self.lost_after


def test_a_collective_horovods_loop_never_finished_ends_its_wait_with_an_error_once_the_loop_is_down():
    """Horovod 0.28's background loop, shut down by a peer's loss, finishes every queued collective
    before its process set reads finalized; one queued after that is never finished. The polled wait
    asks whether the loop is down every LOST_CHECK_S of waiting, and then raises instead of waiting
    forever; Horovod's own wait (which would never return) is not called."""
    c = _Ticking(polls=10**9, lost_after=1)  # never done; the loop reads down at the second ask
    wait = hvd_patches._wait_polling(c.real, poll=c.poll, load=c.load, cores=2, sleep=c.sleep, clock=c.clock,
                                     lost=c.lost)
    with pytest.raises(hvd_patches.HorovodCollectiveLost, match="never end"):
        wait(7)
    assert c.cleared == [] and len(c.asked) == 2
    assert c.asked[0] - 100.0 >= hvd_patches.LOST_CHECK_S and c.asked[1] - c.asked[0] >= hvd_patches.LOST_CHECK_S
    assert c.asked[1] - 100.0 < 2 * hvd_patches.LOST_CHECK_S + 0.01  # asked on time, not long after
    # a rank that only waits long for its peers (the loop up) keeps waiting until the collective is done
    c = _Ticking(polls=3000, lost_after=None)  # about 1.5 s of 0.5 ms sleeps
    wait = hvd_patches._wait_polling(c.real, poll=c.poll, load=c.load, cores=2, sleep=c.sleep, clock=c.clock,
                                     lost=c.lost)
    assert wait(8) == "released" and c.cleared == [8] and len(c.asked) == 2


def test_a_lost_collective_counts_as_a_peers_loss_but_is_never_survived_in_its_process():
    from elastic_ring import protocol
    from elastic_ring.worker import survive

    exc = hvd_patches.HorovodCollectiveLost("Horovod's background loop shut down (a peer lost) with collective 3 ...")
    assert protocol.is_peer_loss(type(exc).__name__, str(exc))  # the rank is a victim, not blamed
    assert not survive._peer_loss(exc)  # no survivor's record: its queue holds the lost collective
    assert survive._peer_loss(RuntimeError("Connection closed by peer [127.0.0.1]:5000"))


def test_on_a_machine_with_free_cores_horovods_own_wait_runs_and_the_load_is_read_once_a_second():
    c = _Collective(polls=5)
    c.machine_load = 2.9  # 2 cores: not above 1.5 per core
    wait = hvd_patches._wait_polling(c.real, poll=c.poll, load=c.load, cores=2, sleep=c.sleep, clock=c.clock)
    assert wait(1) == "released" and c.slept == [] and c.polls == 0  # straight to Horovod's wait
    c.machine_load = 8.0  # the machine fills up: seen at the next read, a second after the last
    c.now += 0.5
    wait(2)
    assert c.loads == 1 and c.slept == []
    c.now += 0.5
    c.left = 3
    wait(3)
    assert c.loads == 2 and c.slept == [50e-6, 100e-6] and c.cleared == [1, 2, 3]


def test_a_cpu_worker_waits_asleep_unless_told_to_spin_and_a_gpu_worker_keeps_horovods_wait(restored):
    from horovod.torch import mpi_lib_v2

    restored.setenv("ELASTIC_RING_HOROVOD_WAIT", "spin")
    assert hvd_patches.wait_asleep("cpu") is False
    restored.delenv("ELASTIC_RING_HOROVOD_WAIT")
    assert hvd_patches.wait_asleep("cuda") is False
    assert not getattr(mpi_lib_v2.horovod_torch_wait_and_clear, MARK, False)
    assert hvd_patches.wait_asleep("cpu") is True
    assert getattr(mpi_lib_v2.horovod_torch_wait_and_clear, MARK)
    installed = mpi_lib_v2.horovod_torch_wait_and_clear
    restored.setattr(hvd_patches, "check", lambda *a: pytest.fail("checked again once installed"))
    assert hvd_patches.wait_asleep("cpu") is True  # idempotent: a ring re-formed finds it installed, unchecked
    assert mpi_lib_v2.horovod_torch_wait_and_clear is installed


def test_a_horovod_without_the_wait_internals_keeps_its_own_wait(restored):
    from horovod.torch import mpi_lib_v2

    restored.delattr(mpi_lib_v2, "horovod_torch_poll")
    before = mpi_lib_v2.horovod_torch_wait_and_clear
    assert hvd_patches.wait_asleep("cpu") is False
    assert mpi_lib_v2.horovod_torch_wait_and_clear is before


def _stat_ppid(text: str) -> int:
    return int(text.rsplit(")", 1)[1].split()[1])  # /proc/PID/stat's 4th field, after the name


def test_a_commands_middleman_is_forked_from_a_server_and_relays_output_and_status_as_horovods(restored):
    """Horovod spawns a middleman per command (a new interpreter); patched, the middleman is a fork
    of a server process this process started once: its parent is that server, whose parent is this
    process. The command's output and exit status come back as before, the middleman's own
    process session included (Horovod's code runs in it)."""
    import io
    import os

    from horovod.runner.common.util import safe_shell_exec

    apply("middleman")
    for _ in range(2):  # the second command forks from the same server
        out, err = io.StringIO(), io.StringIO()
        # the shell's parent is the middleman: its /proc stat names the middleman's parent
        rc = safe_shell_exec.execute("cat /proc/$PPID/stat; echo to-stderr >&2; exit 3", env=dict(os.environ),
                                     stdout=out, stderr=err)
        assert rc == 3 and err.getvalue() == "to-stderr\n", (rc, err.getvalue())
        server = _stat_ppid(out.getvalue())
        assert server != os.getpid()  # not spawned by this process: forked by the server
        with open(f"/proc/{server}/stat") as f:
            assert _stat_ppid(f.read()) == os.getpid()  # the server is this process's child
        with open(f"/proc/{server}/cmdline", "rb") as f:
            assert b"multiprocessing.forkserver" in f.read()
