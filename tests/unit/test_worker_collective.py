"""The worker library's collective interface (:mod:`elastic_ring.worker.collective`) with fakes, the
local launcher's pieces (:mod:`elastic_ring.controller.backends.local` and its launcher process,
:mod:`~elastic_ring.controller.backends.local_launcher`), and ``--collective``'s checks at the request.

The torch implementation is driven by a fake ``torch.distributed`` pair: the root rank's fake
records what it sends, the other rank's replays it, so a broadcast is checked end to end (what
rank 1 holds afterwards is rank 0's) without a process group.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import subprocess
import sys
import time
import types

import pytest
import torch

from elastic_ring.controller.backends import LaunchOptions, Relaunch, make_launch
from elastic_ring.controller.backends import local, local_launcher
from elastic_ring.controller.backends.api import SegmentLaunch
from elastic_ring.controller.membership import StateSource
from elastic_ring.controller.requests import RunRequest, check
from elastic_ring.errors import UserError
from elastic_ring.protocol import STORE_FD_ENV
from elastic_ring.seam import Action, Go
from elastic_ring.worker import collective as coll_mod
from elastic_ring.worker.checks import check_collectives_untouched
from elastic_ring.worker.collective import COLLECTIVES, HorovodCollective, TorchCollective
from elastic_ring.worker.errors import ContractError


class FakeDist:
    """One rank of a fake two-rank group: broadcasts are recorded on the root (``wire``) and replayed
    on the other rank; an allreduce adds ``other`` (the other rank's tensor)."""

    class ReduceOp:
        SUM = "sum"

    def __init__(self, rank: int, wire: list, other=None) -> None:
        self.rank, self.wire, self.other = rank, wire, other
        self.calls: list[str] = []
        self.groups: list = []  # the group of each all_reduce / broadcast_object_list

    def get_rank(self) -> int:
        return self.rank

    def get_world_size(self) -> int:
        return 2

    def all_reduce(self, t, op=None, group=None, async_op=False):
        self.calls.append(f"all_reduce:{op}:{async_op}")
        self.groups.append(group)
        t.add_(self.other)
        if async_op:
            return types.SimpleNamespace(wait=lambda: self.calls.append("wait"))
        return None

    def broadcast(self, t, src=0):
        self.calls.append("broadcast")
        if self.rank == src:
            self.wire.append(t.clone())
        else:
            t.copy_(self.wire.pop(0))

    def broadcast_object_list(self, box, src=0, group=None, device=None):
        self.calls.append("broadcast_object_list")
        self.groups.append((group, str(device)))
        if self.rank == src:
            self.wire.append(box[0])
        else:
            box[0] = self.wire.pop(0)


def _pair(other=None, control=None):
    wire: list = []
    cpu = torch.device("cpu")
    return (TorchCollective(FakeDist(0, wire, other), cpu, control),
            TorchCollective(FakeDist(1, wire, other), cpu, control))


def _net(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))


def test_torch_allreduce_sums_or_averages_and_leaves_the_input():
    c, _ = _pair(other=torch.tensor([3.0, 5.0]))
    x = torch.tensor([1.0, 1.0])
    assert torch.equal(c.allreduce(x, "sum"), torch.tensor([4.0, 6.0]))
    assert torch.equal(c.allreduce(x, "mean"), torch.tensor([2.0, 3.0]))
    assert torch.equal(x, torch.tensor([1.0, 1.0]))
    h = c.allreduce_async(x, name="stop_flag")
    assert torch.equal(c.wait(h), torch.tensor([4.0, 6.0])) and c.dist.calls[-2:] == ["all_reduce:sum:True", "wait"]


def test_host_side_values_go_on_the_control_group_where_there_is_one():
    control = object()
    c, _ = _pair(other=torch.tensor([1.0]), control=control)
    h = c.allreduce_async(torch.tensor([1.0, 0.0]), name="stop_flag")  # the stop vote
    assert torch.equal(c.wait(h), torch.tensor([2.0, 1.0]))
    c.allreduce(torch.tensor([1.0, 0.0]), "mean", name="window_loss")
    c.barrier(name="exit_barrier")
    c.broadcast_object({"step": 3})
    assert c.dist.groups == [control, control, control, (control, "cpu")]
    plain, _ = _pair(other=torch.tensor([1.0]))  # no control group: the default one
    plain.allreduce(torch.tensor([1.0, 0.0]))
    plain.broadcast_object({})
    assert plain.dist.groups == [None, (None, "cpu")]


def test_torch_broadcast_parameters_gives_every_tensor_of_the_root_in_place():
    root, other = _pair()
    a, b = _net(0), _net(1)
    a.train()(torch.randn(5, 3))  # BatchNorm's running stats and its int64 counter move on the root
    b_params = [p for p in b.parameters()]
    root.broadcast_parameters(a.state_dict(), 0)
    other.broadcast_parameters(b.state_dict(), 0)
    for k, v in a.state_dict().items():
        assert torch.equal(b.state_dict()[k], v), k
    assert all(p is q for p, q in zip(b_params, b.parameters()))  # the same tensors, written in place
    assert b.state_dict()["1.num_batches_tracked"].item() == 1
    # one broadcast per dtype (float32 and int64), not one per tensor
    assert root.dist.calls.count("broadcast") == 2


def test_torch_broadcast_optimizer_state_and_object():
    root, other = _pair()
    a, b = _net(0), _net(0)
    oa = torch.optim.SGD(a.parameters(), lr=0.3, momentum=0.9)
    ob = torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9)
    a(torch.randn(4, 3)).sum().backward()
    oa.step()
    root.broadcast_optimizer_state(oa, 0)
    other.broadcast_optimizer_state(ob, 0)
    sa, sb = oa.state_dict(), ob.state_dict()
    assert sb["param_groups"][0]["lr"] == 0.3 and sa["state"].keys() == sb["state"].keys()
    for k in sa["state"]:
        assert torch.equal(sa["state"][k]["momentum_buffer"], sb["state"][k]["momentum_buffer"])
    assert root.broadcast_object({"step": 7}) == {"step": 7}
    assert other.broadcast_object(None) == {"step": 7}
    t = torch.tensor([42])
    assert root.broadcast(t).item() == 42 and other.broadcast(torch.tensor([0])).item() == 42


class _Hvd:
    Average, Sum = "avg", "sum"

    def __init__(self) -> None:
        self.calls: list = []

    def __getattr__(self, name):
        return lambda *a, **k: self.calls.append((name, k)) or (a[0] if a else None)


def test_horovod_collective_maps_to_hvd_with_op_and_name():
    hvd = _Hvd()
    c = HorovodCollective(hvd)
    c.allreduce(torch.ones(1), "mean", name="window_loss")
    c.allreduce_async(torch.ones(1), name="stop_flag")
    c.broadcast_object({}, 0, name="resume_meta")
    c.barrier(name="exit_barrier")
    assert hvd.calls == [("allreduce", {"op": "avg", "name": "window_loss"}),
                         ("allreduce_async", {"op": "sum", "name": "stop_flag"}),
                         ("broadcast_object", {"root_rank": 0, "name": "resume_meta"}),
                         ("allreduce", {"name": "exit_barrier"})]


@pytest.mark.parametrize("collective,in_place_elastic,pg,hvd,needle", [
    ("torch", False, True, False, "process group before elastic_ring.worker.init()"),
    ("horovod", False, True, False, "in a Horovod job: run it with --collective torch"),
    ("torch", False, False, True, "hvd.init() in a --collective torch job"),
    ("torch", True, False, True, "hvd.init() in a --collective torch job"),
    ("horovod", False, False, True, "hvd.init() before elastic_ring.worker.init(): call only"),
    ("horovod", True, False, True, None),  # Horovod Elastic's entry point may have called hvd.init()
    ("horovod", False, False, False, None),
    ("torch", False, False, False, None),
])
def test_a_collective_the_script_started_first_is_refused_with_what_to_do(monkeypatch, collective,
                                                                            in_place_elastic, pg, hvd, needle):
    monkeypatch.setitem(sys.modules, "torch.distributed",
                        types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: pg))
    monkeypatch.setitem(sys.modules, "horovod.torch", types.SimpleNamespace(is_initialized=lambda: hvd))
    if needle is None:
        check_collectives_untouched(collective, in_place_elastic)
    else:
        with pytest.raises(ContractError, match=re.escape(needle)):
            check_collectives_untouched(collective, in_place_elastic)


def test_rank_0_failing_to_bind_the_launchers_port_is_a_group_formed_before_init(monkeypatch):
    """The script's own ``init_process_group()`` (env://) on rank 0 meets the port the launcher holds
    for the library: said as the early process group it is; once the library took the socket, or on
    another port, the error stays what it is."""
    from elastic_ring.worker.checks import explain_port_clash

    monkeypatch.setenv("MASTER_PORT", "50369")
    monkeypatch.setenv(STORE_FD_ENV, "5")
    clash = RuntimeError("The server socket has failed to listen on any local network address. port: 50369, "
                         "useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use")
    said = explain_port_clash(clash)
    assert isinstance(said, ContractError) and "process group before elastic_ring.worker.init()" in str(said)
    other = RuntimeError(str(clash).replace("50369", "50370"))
    assert explain_port_clash(other) is other
    monkeypatch.delenv(STORE_FD_ENV)
    assert explain_port_clash(clash) is clash


def test_a_horovod_that_cannot_say_counts_as_not_started(monkeypatch):
    def broken():
        raise ValueError("Horovod has not been initialized; use hvd.init().")

    monkeypatch.setitem(sys.modules, "torch.distributed",
                        types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: False))
    monkeypatch.setitem(sys.modules, "horovod.torch", types.SimpleNamespace(is_initialized=broken))
    for collective in COLLECTIVES:
        check_collectives_untouched(collective)


def test_the_torch_ring_takes_torchruns_variables(monkeypatch):
    from elastic_ring.worker.ring import TorchRing, ring_from_env

    monkeypatch.setenv(coll_mod.COLLECTIVE_ENV, "torch")
    for k, v in dict(RANK="1", WORLD_SIZE="3", LOCAL_RANK="1", LOCAL_WORLD_SIZE="3").items():
        monkeypatch.setenv(k, v)
    ring = ring_from_env()
    assert isinstance(ring, TorchRing) and (ring.rank, ring.size, ring.local_size) == (1, 3, 3)
    with pytest.raises(ContractError, match="not formed yet"):
        ring.coll
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    with pytest.raises(ContractError, match="LOCAL_WORLD_SIZE"):
        ring_from_env()


def test_the_torch_ring_formed_by_the_controller_adopts_its_go_and_retires_when_left_out(monkeypatch):
    from elastic_ring.worker import ring as ring_mod

    monkeypatch.setenv(coll_mod.COLLECTIVE_ENV, "torch")
    monkeypatch.setenv(ring_mod.INPLACE_ENV, ring_mod.RING_BY_CONTROLLER)
    monkeypatch.setenv(ring_mod.MEMBER_ENV, "w2")
    monkeypatch.setenv(ring_mod.STORE_ENV, "")  # restored after the go's update
    for k, v in dict(RANK="1", WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1").items():
        monkeypatch.setenv(k, v)
    ring = ring_mod.ring_from_env()
    assert isinstance(ring, ring_mod.TorchControllerRing) and ring.in_place and ring.generation == 0
    env = dict(RANK="2", WORLD_SIZE="3", LOCAL_RANK="2", LOCAL_WORLD_SIZE="3")
    env[ring_mod.STORE_ENV] = "127.0.0.1:1"
    assert ring._went(Go(12, env=env)) == 12 and (ring.rank, ring.size, ring.local_size) == (2, 3, 3)
    destroyed = []
    monkeypatch.setattr("torch.distributed.destroy_process_group", lambda: destroyed.append(1))
    with pytest.raises(ring_mod.Retired):
        ring.reform(Action.from_json({"action": "resize", "segment": 3, "members": {"w1": {}}}))
    assert destroyed == [1] and ring._coll is None


# ---------------------------------------------------------------------- the launcher and the request
def test_make_launch_gives_the_local_backend_for_torch(tmp_path):
    spec = types.SimpleNamespace(run_dir=tmp_path, script=None, script_args=("--x",), extra_env={},
                                 device="cpu", slots=2, hosts=None, hostfile=None, cwd="")
    backend, resize = make_launch(LaunchOptions(relaunch="overlap", collective="torch"), spec)
    assert isinstance(backend, local.LocalBackend) and resize == Relaunch("overlap")
    cmd = local.launcher_command(spec, SegmentLaunch(2, 3, 40, "me", go_file=tmp_path / "go"))
    assert cmd[1:5] == ["-m", "elastic_ring.controller.backends.local", "--nproc", "2"]
    assert "horovodrun" not in " ".join(cmd) and "elastic_ring.controller.hvdrun" not in cmd
    assert cmd[cmd.index("--segment") + 1] == "3" and cmd[cmd.index("--go-file") + 1] == str(tmp_path / "go")
    assert cmd[-3:] == ["--", "elastic_ring.train.worker", "--x"]
    env = local_launcher.rank_env(1, 2, 1234, base={STORE_FD_ENV: "9"}, store_fd=7)
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["MASTER_PORT"]) == ("1", "2", "1", "1234")
    assert STORE_FD_ENV not in env and local_launcher.rank_env(0, 2, 1234, base={}, store_fd=7)[STORE_FD_ENV] == "7"


def test_the_rendezvous_port_is_held_from_the_pick_to_rank_0s_store(monkeypatch):
    """The launcher's socket listens from the pick: another process cannot bind the port, a rank's
    connection waits in the backlog, and rank 0's store serves on the very socket it is handed."""
    sock = local_launcher.rendezvous_socket()
    port = sock.getsockname()[1]
    for reuse in (0, 1):
        with socket.socket() as thief:
            thief.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, reuse)
            with pytest.raises(OSError) as e:
                thief.bind((local.MASTER_ADDR, port))
            assert e.value.errno == errno.EADDRINUSE
    early = socket.create_connection((local.MASTER_ADDR, port), timeout=5)  # before anyone serves
    early.close()
    monkeypatch.setenv("MASTER_ADDR", local.MASTER_ADDR)
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setenv(STORE_FD_ENV, str(sock.detach()))
    master = coll_mod.rendezvous_store(0, 1, timeout_s=10)
    assert STORE_FD_ENV not in os.environ and master.port == port  # taken once
    master.set("who", "rank 0")
    assert coll_mod.rendezvous_store(1, 1, timeout_s=10).get("who") == b"rank 0"
    monkeypatch.delenv("MASTER_PORT")
    with pytest.raises(ContractError, match="MASTER_PORT"):
        coll_mod.rendezvous_store(1, 2)


_FD_CHECK = '''
import os, socket
from elastic_ring.protocol import STORE_FD_ENV
from elastic_ring.seam import Action, Go
port = int(os.environ["MASTER_PORT"])
if os.environ["RANK"] == "0":
    s = socket.socket(fileno=int(os.environ[STORE_FD_ENV]))
    assert s.getsockname()[1] == port
    conn, _ = s.accept()
    assert conn.recv(16) == b"rank 1"
else:
    assert STORE_FD_ENV not in os.environ
    socket.create_connection(("127.0.0.1", port)).sendall(b"rank 1")
'''


def test_the_launcher_hands_the_listening_socket_to_rank_0_only():
    p = subprocess.run([sys.executable, "-m", "elastic_ring.controller.backends.local", "--nproc", "2", "--",
                        sys.executable, "-c", _FD_CHECK], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


def test_torch_inplace_and_ray_requests_pass_the_check():
    check(RunRequest(collective="torch", relaunch="inplace"))
    check(RunRequest(collective="torch", backend="ray"))
    check(RunRequest(collective="torch", relaunch="inplace", survive=True))
    check(RunRequest(collective="torch", backend="ray", survive=True))


def test_torch_survive_is_refused_on_gpus_in_one_line():
    from elastic_ring.controller.requests import check_torch_survive

    check_torch_survive("cpu", True)
    check_torch_survive("cuda", False)
    with pytest.raises(UserError, match=r"^--survive with --collective torch keeps survivors on gloo \(--device cpu\) "
                                        r"only: NCCL after a peer's death is not handled"):
        check_torch_survive("cuda", True)


# ---------------------------------------------------------------------- in place: the controller's groups
class FakeHandle:
    _pid = 100

    def __init__(self, cmd, env) -> None:
        FakeHandle._pid += 1
        self.pid, self.cmd, self.env, self.rc, self.killed = FakeHandle._pid, cmd, env, None, False

    def poll(self):
        return self.rc

    def kill(self) -> None:
        self.killed, self.rc = True, -9 if self.rc is None else self.rc


class FakeLauncher:
    def __init__(self) -> None:
        self.started: list[FakeHandle] = []

    def start(self, cmd, env, log_path):
        h = FakeHandle(cmd, env)
        self.started.append(h)
        return h


class FakeStores:
    """A TorchRingFormer whose stores are numbers (port 5000 + n)."""

    def __init__(self) -> None:
        from elastic_ring.controller.backends.torch_ring import TorchRingFormer

        self.n = 0

        def serve(host):
            self.n += 1
            return f"store{self.n}", 5000 + self.n

        self.former = TorchRingFormer(lambda: "127.0.0.1", serve)


def test_torch_envs_rank_members_in_order_with_local_ranks_per_node():
    from elastic_ring.controller.backends.torch_ring import torch_envs
    from elastic_ring.worker.ring import MEMBER_ENV, STORE_ENV

    ms = [types.SimpleNamespace(name=f"w{i}", info={"node_id": n}, rank=-1) for i, n in enumerate("aba")]
    envs = torch_envs(ms, "10.0.0.1:7000")
    assert [m.rank for m in ms] == [0, 1, 2]
    assert [(e["RANK"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["GROUP_RANK"]) for e in envs.values()] == [
        ("0", "0", "2", "0"), ("1", "0", "1", "1"), ("2", "1", "2", "0")]
    assert all(e["WORLD_SIZE"] == "3" and e[STORE_ENV] == "10.0.0.1:7000" for e in envs.values())
    assert envs["w1"][MEMBER_ENV] == "w1" and envs["w1"]["MASTER_PORT"] == "7000"


def _local_ring(tmp_path):
    from elastic_ring.controller.backends.local import LocalRingBackend

    spec = types.SimpleNamespace(run_dir=tmp_path, script=None, script_args=(), extra_env={}, device="cpu",
                                 hosts=None, hostfile=None,
                                 slots=2, cwd="")
    launcher, stores = FakeLauncher(), FakeStores()
    return LocalRingBackend(spec, launcher=launcher, rings=stores.former), launcher


def test_make_launch_gives_the_local_ring_for_torch_inplace(tmp_path):
    from elastic_ring.controller.backends import InPlace

    spec = types.SimpleNamespace(run_dir=tmp_path, script=None, script_args=(), extra_env={}, device="cpu", slots=2,
                                 hosts=None, hostfile=None, cwd="")
    backend, resize = make_launch(LaunchOptions(relaunch="inplace", collective="torch"), spec)
    assert isinstance(backend, local.LocalRingBackend) and isinstance(resize, InPlace)


def test_local_ring_grows_ahead_and_shrinks_now_keeping_rank_0(tmp_path):
    """Start at 1 with a warm spare for the free slot; a grow reported ahead takes the spare and
    writes the action with every member's environment over a new store and the spare's go (its
    rank and store); rank 0 takes it; the shrink formed at the pause leaves the joiner out, which
    then exits RETIRED without failing the group, and a new spare is started for the freed slot."""
    from elastic_ring import protocol
    from elastic_ring.seam import action_file, take_ahead_action
    from elastic_ring.worker.ring import STORE_ENV

    ring, launcher = _local_ring(tmp_path)
    started = ring.start(SegmentLaunch(1, 0, 6, "me"), tmp_path / "logs" / "segment-000-w1.log")
    group = started.handle
    r0, joiner = launcher.started
    assert "--ring-by-controller" in started.cmd and r0.env["RANK"] == "0" and r0.env[STORE_ENV].endswith(":5001")
    assert joiner.cmd[joiner.cmd.index("--segment") + 1] == "-1" and STORE_ENV not in joiner.env  # a spare
    assert group.pid == r0.pid and group.poll() is None

    ring.report_ahead(SegmentLaunch(2, 1, 12, "me"))
    assert len(launcher.started) == 2  # the spare joins: no new process
    act = protocol.read_json(action_file(tmp_path, 0))
    assert act["at_step"] == 6 and act["to"] == 2 and set(act["members"]) == {"w1", "w2"}
    assert act["members"]["w1"]["RANK"] == "0" and act["members"]["w2"]["RANK"] == "1"
    assert act["members"]["w1"][STORE_ENV].endswith(":5002")
    go = act["go_files"][joiner.cmd[joiner.cmd.index("--go-file") + 1]]
    assert go["stop_at"] == 12 and go["env"] == act["members"]["w2"]
    assert take_ahead_action(tmp_path, 0)  # rank 0 takes it at the pause
    ring.resize_in_place(0, SegmentLaunch(2, 1, 12, "me"), 0.0, StateSource.PEER)
    assert ring._ahead is None and not action_file(tmp_path, 0).exists()
    assert [m.rank for m in group.members] == [0, 1] and group.pid == r0.pid

    ring.resize_in_place(1, SegmentLaunch(1, 2, 18, "me"), 0.0, StateSource.MEMORY)  # a shrink, formed at the pause
    act = protocol.read_json(action_file(tmp_path, 1))
    assert set(act["members"]) == {"w1"} and act["members"]["w1"]["WORLD_SIZE"] == "1"
    assert len(launcher.started) == 3 and launcher.started[2].env["RANK"] == "1"  # a spare for the freed slot
    joiner.rc = protocol.RETIRED
    assert group.poll() is None and [m.name for m in group.members] == ["w1"]
    r0.rc = 0
    assert group.poll() == 0
    logs = (tmp_path / "logs" / "segment-002-w1.log").read_text()
    assert f"rank 0: w1 pid {r0.pid}" in logs and "leaving: w2" in logs


def test_local_ring_withdraws_ahead_and_a_failure_ends_the_others(tmp_path):
    from elastic_ring.seam import action_file

    ring, launcher = _local_ring(tmp_path)
    group = ring.start(SegmentLaunch(1, 0, 6, "me"), tmp_path / "seg.log").handle
    r0, spare = launcher.started
    ring.report_ahead(SegmentLaunch(2, 1, 12, "me"))
    assert ring.retract_ahead(0) and not spare.killed and not action_file(tmp_path, 0).exists()
    assert group.poll() is None and ring.spares[0].handle is spare  # withdrawn: a spare again
    spare.rc = 1  # the spare died meanwhile: the resize formed now starts a new process
    ring.resize_in_place(0, SegmentLaunch(2, 1, 12, "me"), 0.0, StateSource.PEER)
    r1 = launcher.started[2]
    assert "--go-file" not in r1.cmd and r1.env["RANK"] == "1" and group.poll() is None
    r1.rc = 1
    assert group.poll() == 1 and r0.killed and ring.first_failed_rank(None) == 1
    assert "rank 1 exited with status 1" in (tmp_path / "logs" / "segment-001-w2.log").read_text()


def test_a_joiner_started_ahead_that_fails_fails_the_group(tmp_path):
    ring, launcher = _local_ring(tmp_path)
    group = ring.start(SegmentLaunch(1, 0, 6, "me"), tmp_path / "seg.log").handle
    ring.report_ahead(SegmentLaunch(2, 1, 12, "me"))
    r0, joiner = launcher.started  # the spare, taken for the group ahead
    joiner.rc = 0  # it ended before its go: it cannot have joined
    assert group.poll() == 1 and r0.killed and ring.first_failed_rank(None) == 1


def test_the_launcher_ends_the_others_at_the_first_failure(tmp_path, capsys):
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    bad = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    assert local_launcher.supervise([slow, bad], poll_s=0.01) == 3
    assert slow.poll() is not None  # killed
    err = capsys.readouterr().err
    log = tmp_path / "log"
    log.write_text(f"noise\n{err}")
    assert local.first_failed_rank(log) == 1
    ok = [subprocess.Popen([sys.executable, "-c", "pass"]) for _ in range(2)]
    assert local_launcher.supervise(ok, poll_s=0.01) == 0


def test_script_collective_reads_the_scripts_own_init(tmp_path):
    cases = {"import horovod.torch as hvd\nhvd.init()\n": "horovod",
             "import torch.distributed as dist\ndist.init_process_group('gloo')\n": "torch",
             "# hvd.init() is not called here\nimport elastic_ring.worker as e\ne.init()\n": None}
    for i, (text, want) in enumerate(cases.items()):
        f = tmp_path / f"s{i}.py"
        f.write_text(text)
        assert local.script_collective(f) == want, text


@pytest.mark.parametrize("kw,needle", [
    (dict(collective="mpi"), "--collective must be one of horovod, torch"),
    (dict(collective="torch", relaunch="overlap", survive=True),
     "--survive goes with --backend ray or --relaunch inplace"),
    (dict(collective="torch", relaunch="inplace", hosts="a:1,b:1"), "--relaunch inplace runs on one host"),
])
def test_request_checks_the_collective(kw, needle):
    with pytest.raises(UserError, match=needle.replace("(", r"\(")):
        check(RunRequest(**kw))


def test_request_refuses_a_script_of_the_other_collective(tmp_path):
    hvd_script, pg_script = tmp_path / "h.py", tmp_path / "t.py"
    hvd_script.write_text("import horovod.torch as hvd\nhvd.init()\n")
    # a library script that forms the group itself (without the import: torchrun's form, which runs)
    pg_script.write_text("import elastic_ring.worker\nimport torch.distributed as dist\ndist.init_process_group()\n")
    with pytest.raises(UserError, match="calls hvd.init"):
        check(RunRequest(script=str(hvd_script), collective="torch"))
    with pytest.raises(UserError, match="init_process_group.*, and add --collective torch"):
        check(RunRequest(script=str(pg_script)))
    with pytest.raises(UserError, match=r"init_process_group\(\) itself: replace the call with "
                                        r"elastic_ring.worker.init\(\), which forms the process group$"):
        check(RunRequest(script=str(pg_script), collective="torch"))
    check(RunRequest(script=str(hvd_script)))


def _one_line(p, needle):
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in p.stderr and needle in lines[0], p.stderr


def test_bad_collective_input_is_one_line_exit_2(cli_inproc, tmp_path):
    hvd_script = tmp_path / "h.py"
    hvd_script.write_text("import horovod.torch as hvd\nhvd.init()\n")
    pg_script = tmp_path / "t.py"  # (without the library's import: torchrun's form, which runs)
    pg_script.write_text("import elastic_ring.worker\nimport torch.distributed as dist\n"
                         "dist.init_process_group('gloo')\n")
    _one_line(cli_inproc("train", "--collective", "torch", "--script", str(hvd_script), "--steps", "4",
                         "--run-dir", str(tmp_path / "a")), "calls hvd.init()")
    _one_line(cli_inproc("train", "--script", str(pg_script), "--steps", "4", "--run-dir", str(tmp_path / "b")),
              "add --collective torch")
    _one_line(cli_inproc("train", "--collective", "torch", "--relaunch", "inplace", "--hosts", "a:1,b:1",
                         "--run-dir", str(tmp_path / "c")), "--relaunch inplace runs on one host")
    assert not any((tmp_path / d).exists() for d in "abc")  # refused before a run folder was made


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU machine has NCCL to give")
def test_nccl_on_a_cpu_machine_is_one_line_exit_2(cli_inproc, tmp_path):
    _one_line(cli_inproc("train", "--collective", "torch", "--device", "cuda", "--run-dir", str(tmp_path / "r")),
              "--collective torch asks for NCCL with --device cuda but no NVIDIA GPU")


def test_the_torch_ring_warms_the_import_ddp_makes_even_for_a_script_that_never_compiles(monkeypatch):
    from elastic_ring.worker.ring import TorchRing

    for k, v in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(k, v)
    ring = TorchRing()
    ring.warms_compile = False  # init(warm_compile=False): the built-in trainer's SGD
    assert ring.warms_compile is True


def test_torchrun_names_from_horovodrun_ranks():
    """A --collective torch worker launched by horovodrun (--hosts) reads torchrun's names; nothing
    changes for a worker that has torchrun's already or runs on Horovod."""
    from elastic_ring.worker.collective import torchrun_env_from_horovodrun

    env = {"ELASTIC_RING_COLLECTIVE": "torch", "HOROVOD_RANK": "3", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "1",
           "HOROVOD_LOCAL_SIZE": "2", "HOROVOD_CROSS_RANK": "1"}
    assert torchrun_env_from_horovodrun(env)
    assert [env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")] == \
        ["3", "4", "1", "2", "1"]
    mine = {"ELASTIC_RING_COLLECTIVE": "torch", "HOROVOD_RANK": "3", "RANK": "0"}
    assert not torchrun_env_from_horovodrun(mine) and mine["RANK"] == "0"
    hvd = {"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2"}
    assert not torchrun_env_from_horovodrun(hvd) and "RANK" not in hvd


def test_store_address_of_the_hosts():
    from elastic_ring.controller.backends.torch_hosts import store_address

    assert store_address(["localhost", "127.0.0.1"]) == "127.0.0.1"
    assert store_address(["localhost", "192.0.2.77"]) not in ("127.0.0.1", "")  # the route's own address


def test_make_launch_on_several_hosts_for_torch_launches_by_horovodrun_over_a_store_of_its_own(tmp_path):
    """--collective torch --hosts: horovodrun launches (its -H), each segment's workers are told a
    new store this controller serves (ELASTIC_RING_STORE and torchrun's MASTER_ADDR/PORT); the
    newest two stores are kept (a segment's outlives it by one, for --relaunch overlap)."""
    from elastic_ring.controller.backends.torch_hosts import TorchHostsBackend
    from elastic_ring.worker.ring import STORE_ENV

    spec = types.SimpleNamespace(run_dir=tmp_path, script=None, script_args=(), extra_env={}, device="cpu", slots=2,
                                 hosts="localhost:1,127.0.0.1:1", hostfile=None, network_interface=None)
    started = []

    class Launcher:
        def start(self, cmd, env, log_path):
            started.append((cmd, env))
            return object()

    ports = iter(range(5000, 5010))
    backend, resize = make_launch(LaunchOptions(relaunch="overlap", collective="torch"), spec, launcher=Launcher())
    assert isinstance(backend, TorchHostsBackend) and resize == Relaunch("overlap")
    backend.serve = lambda host: (f"store@{host}", next(ports))
    for seg in range(3):
        backend.start(SegmentLaunch(2, seg, 10 * (seg + 1), "me"), tmp_path / f"{seg}.log")
    cmd, env = started[0]
    assert "-H" in cmd and cmd[cmd.index("-H") + 1] == "localhost:1,127.0.0.1:1" and "--gloo" in cmd
    assert (env[STORE_ENV], env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1:5000", "127.0.0.1", "5000")
    assert [e[STORE_ENV] for _, e in started] == ["127.0.0.1:5000", "127.0.0.1:5001", "127.0.0.1:5002"]
    assert backend.stores == ["store@127.0.0.1", "store@127.0.0.1"] and len(started) == 3


def test_horovodrun_gets_only_the_slots_of_the_segment(tmp_path):
    """horovodrun's Gloo launch fills every slot of -H whatever -np says: a segment's -H holds its
    first ``world`` slots, from --hosts, --hostfile or a restart's override."""
    from elastic_ring.controller.backends.horovodrun import first_slots, horovodrun_command

    assert first_slots([("a", 2), ("b", 2)], 3) == "a:2,b:1"
    assert first_slots([("a", 2), ("b", 2)], 1) == "a:1"
    assert first_slots([("a", 1), ("b", 1)], 2) == "a:1,b:1"
    hf = tmp_path / "hostfile"
    hf.write_text("# two hosts\nh1 slots=2\nh2 slots=2\n")
    spec = types.SimpleNamespace(run_dir=tmp_path, script=None, script_args=(), hosts=None, hostfile=str(hf))
    cmd = horovodrun_command(spec, 3, 0, 10)
    assert cmd[cmd.index("-H") + 1] == "h1:2,h2:1" and "--hostfile" not in cmd
    cmd = horovodrun_command(types.SimpleNamespace(**{**vars(spec), "hostfile": None, "hosts": "x:4"}), 2, 0, 10,
                             hosts="y:1,z:1")
    assert cmd[cmd.index("-H") + 1] == "y:1,z:1"
    cmd = horovodrun_command(types.SimpleNamespace(**{**vars(spec), "hostfile": None}), 2, 0, 10)
    assert cmd[cmd.index("-H") + 1] == "localhost:2"


# ---------------------------------------------------------------------- in place: survivors (--survive)
def _surviving_ring(tmp_path, world=2):
    from elastic_ring.controller.backends.local import LocalRingBackend

    spec = types.SimpleNamespace(run_dir=tmp_path, script=None, script_args=(), extra_env={}, device="cpu",
                                 slots=world)
    launcher, stores = FakeLauncher(), FakeStores()
    ring = LocalRingBackend(spec, launcher=launcher, rings=stores.former, survive=True)
    group = ring.start(SegmentLaunch(world, 0, 20, "me"), tmp_path / "logs" / "segment-000-w2.log").handle
    spares = launcher.started[world:]  # --survive keeps one warm spare beside a full ring
    assert len(spares) == 1 and "--go-file" in spares[0].cmd
    return ring, group, launcher.started[:world]


def _holds(tmp_path, member, held, segment=0):
    from elastic_ring import protocol
    from elastic_ring.seam import survivor_file

    protocol.write_json_atomic(survivor_file(tmp_path, member), {"member": member, "held": held, "pid": 1,
                                                                 "time": time.time(), "segment": segment})


def _error(tmp_path, rank, exc):
    from elastic_ring import protocol

    protocol.write_error_record(tmp_path, exc, rank, segment=0)


GLOO_RESET = ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error [127.0.0.1]:6038: Connection "
              "reset by peer. This is typically caused by a remote worker hanging or bugs in the application. "
              "Check the logs of the remote worker before reporting an error. GLHF!")
GLOO_CLOSED = ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] Connection closed by peer "
               "[127.0.0.1]:1729. This is typically caused by a remote worker crashing. Check the logs of the "
               "remote worker before reporting an error. GLHF!")
GLOO_TIMEOUT = ("[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 300000ms "
                "for recv operation to complete")


@pytest.mark.parametrize("message", [GLOO_RESET, GLOO_CLOSED, GLOO_TIMEOUT])
@pytest.mark.parametrize("kind", ["RuntimeError", "DistBackendError"])
def test_torch_gloo_errors_of_a_lost_peer_are_a_peer_loss(kind, message):
    """What torch 2.14's gloo raised in the survivor when its peer was killed (DDP's backward hook,
    the stop vote's allreduce on the control group, a broadcast) or stopped answering; older torch
    raises the same text as a ``DistBackendError``."""
    from elastic_ring import protocol
    from elastic_ring.worker import survive

    assert protocol.is_peer_loss(kind, f"{kind}: {message}")
    exc = type(kind, (RuntimeError,), {})(message)
    assert survive._peer_loss(exc)
    own = f"{kind}: [/pytorch/third_party/gloo/gloo/allreduce.cc:42] Invalid argument: tensor sizes differ"
    assert not protocol.is_peer_loss(kind, own)


def test_local_ring_with_survive_keeps_the_survivors_and_blames_the_dead_rank(tmp_path):
    """rank 1 is killed (no record of its own); rank 0's collective broke (a peer-loss record, as
    a survivor that could not go on writes) and it says it holds steps 6 and 7: a shrink from
    step 7, rank 1 blamed, rank 0 never; the resize that follows rolls rank 0 back alone."""
    from elastic_ring import protocol
    from elastic_ring.seam import action_file
    from elastic_ring.seam import survivor_file
    from elastic_ring.worker.survive import SURVIVE_ENV

    ring, group, (r0, r1) = _surviving_ring(tmp_path)
    assert r0.env[SURVIVE_ENV] == "1" and r1.env[SURVIVE_ENV] == "1"
    r1.rc = -9
    assert group.poll() == 137 and not r0.killed  # failed, the survivor left running
    _error(tmp_path, 0, RuntimeError(GLOO_CLOSED))
    _holds(tmp_path, "w1", [6, 7])
    s = ring.survivors(wait_s=2.0)
    assert s is not None and (s.step, s.world, s.joiners) == (7, 1, 0), s
    assert (s.failure.rank, s.failure.type) == (1, "Killed"), s.failure
    assert group.poll() is None and [m.name for m in group.members] == ["w1"] and not r0.killed
    assert not survivor_file(tmp_path, "w1").exists()
    ring.resize_in_place(0, SegmentLaunch(1, 1, 20, "me"), time.time(), StateSource.MEMORY)
    act = protocol.read_json(action_file(tmp_path, 0))
    assert act["rollback_to"] == 7 and act["to"] == 1 and act["members"]["w1"]["RANK"] == "0"
    assert "rank 1 (w2) gone; rank 0 (w1) go on from step 7" in (tmp_path / "logs" / "segment-000-w2.log").read_text()


def test_local_ring_survivors_of_a_lost_rank_0_are_renumbered_and_its_own_error_is_named(tmp_path):
    from elastic_ring import protocol
    from elastic_ring.seam import action_file

    ring, group, (r0, r1, r2) = _surviving_ring(tmp_path, world=3)
    _error(tmp_path, 0, ValueError("boom"))  # rank 0's own error; the others only lost it
    _error(tmp_path, 2, RuntimeError(GLOO_RESET))
    r0.rc = 1
    assert group.poll() == 1
    _holds(tmp_path, "w2", [5, 6])
    _holds(tmp_path, "w3", [6, 7])  # a step ahead: the reduction reached it
    s = ring.survivors(wait_s=2.0)
    assert s is not None and (s.step, s.world) == (6, 2) and (s.failure.rank, s.failure.type) == (0, "ValueError")
    ring.resize_in_place(0, SegmentLaunch(2, 1, 20, "me"), time.time(), StateSource.PEER)
    act = protocol.read_json(action_file(tmp_path, 0))
    assert act["rollback_to"] == 6 and [act["members"][n]["RANK"] for n in ("w2", "w3")] == ["0", "1"]


@pytest.mark.parametrize("case", ["off", "silent", "no common step", "other segment", "all alive"])
def test_local_ring_restarts_from_the_checkpoint_when_the_survivors_cannot_go_on(tmp_path, case):
    ring, group, (r0, r1, r2) = _surviving_ring(tmp_path, world=3)
    ring.survive = case != "off"
    r2.rc = -9
    if case == "all alive":
        r2.rc = None
        group.rc = 1
    assert group.poll() in (1, 137)
    if case != "silent":  # rank 1 says nothing: alive and silent
        _holds(tmp_path, "w1", [6, 7], segment=1 if case == "other segment" else 0)
        _holds(tmp_path, "w2", [4, 5] if case == "no common step" else [6, 7])
    if case == "all alive":
        _holds(tmp_path, "w3", [6, 7])
    assert ring.survivors(wait_s=0.3) is None
    if case != "off":
        assert r0.killed and r1.killed  # ended: the controller restarts from the checkpoint


def test_local_ring_without_survive_still_ends_the_others_and_a_stall_ends_only_its_rank(tmp_path):
    """The stalled rank's own process (its pid record names its member) is killed with its launcher's
    stand-in: a stopped worker forked by the zygote would outlive the stand-in."""
    from elastic_ring import protocol

    ring, group, (r0, r1) = _surviving_ring(tmp_path)
    stopped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for rank, name, p in ((1, "w2", stopped), (0, "w1", other)):
            protocol.write_json_atomic(protocol.pid_dir(tmp_path) / f"seg000-rank{rank}.json",
                                       {"rank": rank, "pid": p.pid, "member": name, "owner": "me", "segment": 0})
        assert ring.end_ranks([1]) and r1.killed and not r0.killed
        assert stopped.wait(timeout=10) == -9 and other.poll() is None
    finally:
        for p in (stopped, other):
            if p.poll() is None:
                p.kill()
            p.wait()
    assert not ring.end_ranks([5])
    ring.survive = False
    assert not ring.end_ranks([0])
    plain, launcher = _local_ring(tmp_path / "plain")
    g = plain.start(SegmentLaunch(2, 0, 20, "me"), tmp_path / "plain.log").handle
    a, b = launcher.started
    b.rc = -9
    assert g.poll() == 137 and a.killed and plain.survivors() is None


def test_horovod_votes_reuse_one_tensor_only_once_the_vote_before_was_waited_for():
    """Horovod's votes go in place into one kept tensor (no tensor made per vote); a vote launched
    while the one before was never waited for (its reduction may still write into it) gets a new
    one, as does a vote of another length."""
    from elastic_ring.worker.collective import HorovodCollective

    class Hvd:
        Sum = "sum"

        def __init__(self):
            self.launched = []

        def allreduce_async_(self, t, op=None, name=None):
            self.launched.append((t, t.tolist(), op, name))
            return len(self.launched)  # (Horovod's handles: ints)

        def synchronize(self, handle):
            return self.launched[handle - 1][0]

    hvd = Hvd()
    coll = HorovodCollective(hvd)
    h1 = coll.vote_async([1.0, 0.0, 9.0], name="stop_flag")
    assert coll.wait(h1).tolist() == [1.0, 0.0, 9.0]
    h2 = coll.vote_async([0.0, 1.0, 4.0], name="stop_flag")
    assert hvd.launched[1][0] is hvd.launched[0][0]  # the same tensor, the new values in it
    assert hvd.launched[1][1:] == ([0.0, 1.0, 4.0], "sum", "stop_flag")
    h3 = coll.vote_async([0.0, 0.0, 2.0], name="stop_flag")  # h2 never waited for
    assert hvd.launched[2][0] is not hvd.launched[1][0] and hvd.launched[1][0].tolist() == [0.0, 1.0, 4.0]
    assert coll.wait(h3).tolist() == [0.0, 0.0, 2.0]
    coll.vote_async([1.0, 1.0, 1.0, 1.0])
    assert hvd.launched[3][0] is not hvd.launched[2][0] and hvd.launched[3][1] == [1.0] * 4


def test_a_horovod_votes_sums_are_read_through_its_buffer_and_another_tensors_listed():
    """``wait_values``: the vote's tensor summed in place (here: the other rank's values added, as
    Horovod's allreduce writes them) is read back as floats through the votes' buffer; a tensor
    that is not the votes' (a collective of another kind) is listed."""
    import torch

    from elastic_ring.worker.collective import HorovodCollective

    class Hvd:
        Sum = "sum"

        def __init__(self):
            self.out = {}

        def allreduce_async_(self, t, op=None, name=None):
            t.add_(torch.tensor([0.0, 1.0, 3.0, 0.25]))  # the other rank's values
            self.out[len(self.out) + 1] = t
            return len(self.out)

        def synchronize(self, handle):
            return self.out[handle]

    hvd = Hvd()
    coll = HorovodCollective(hvd)
    values = coll.wait_values(coll.vote_async([1.0, 0.0, 9.0, 0.5], name="stop_flag"))
    assert values == (1.0, 1.0, 12.0, 0.75) and all(type(v) is float for v in values)
    values = coll.wait_values(coll.vote_async([0.0, 0.0, 2.0, 1.0], name="stop_flag"))  # (the same tensor, reused)
    assert values == (0.0, 1.0, 5.0, 1.25)
    hvd.out[99] = torch.tensor([2.0, 4.0])
    assert coll.wait_values(99) == [2.0, 4.0]


def test_the_launcher_names_a_killed_worker_before_the_peer_that_exited_on_its_loss():
    """``local_launcher.first_failed``: a worker killed by a signal before one that exited non-zero,
    each the lowest rank; None while none failed."""
    from elastic_ring.controller.backends.local_launcher import first_failed

    assert first_failed([None, 0, None]) is None and first_failed([0, 0]) is None
    assert first_failed([1, -9]) == (1, -9)  # rank 0 exited 1 on its lost peer; rank 1 was killed
    assert first_failed([1, None, 2]) == (0, 1) and first_failed([-15, -9]) == (0, -15)
    assert first_failed([None, 1]) == (1, 1)


def test_an_in_place_group_names_a_killed_worker_before_the_peer_that_exited_on_its_loss(tmp_path):
    """``LocalGroup.poll`` (``--relaunch inplace``, ``--collective torch``) picks its failure as the
    launcher does: both exited by the same poll, the killed rank 1 is named, not rank 0."""
    from elastic_ring.controller.backends.local import LocalGroup, LocalMember

    class Handle:
        def __init__(self, rc, pid):
            self.rc, self.pid, self.killed = rc, pid, False

        def poll(self):
            return self.rc

        def kill(self):
            self.killed = True

    log = tmp_path / "seg.log"
    members = [LocalMember("w1", Handle(1, 11), rank=0), LocalMember("w2", Handle(-9, 12), rank=1),
               LocalMember("w3", Handle(None, 13), rank=2)]
    group = LocalGroup(members, log)
    assert group.poll() == 137 and group.failed_rank == 1
    assert "rank 1 exited with status -9" in log.read_text() and members[2].handle.killed
    group = LocalGroup([LocalMember("w1", Handle(None, 21), rank=0), LocalMember("w2", Handle(2, 22), rank=1)], log)
    assert group.poll() == 2 and group.failed_rank == 1  # no signal: the first that failed, as before
