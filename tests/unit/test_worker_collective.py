"""The worker library's collective interface (:mod:`elastic_ring.worker.collective`) with fakes, the
local launcher's pieces (:mod:`elastic_ring.controller.backends.local`), and ``--collective``'s
checks at the request.

The torch implementation is driven by a fake ``torch.distributed`` pair: the root rank's fake
records what it sends, the other rank's replays it, so a broadcast is checked end to end (what
rank 1 holds afterwards is rank 0's) without a process group.
"""

from __future__ import annotations

import subprocess
import sys
import types

import pytest
import torch

from elastic_ring.controller.backends import LaunchOptions, Relaunch, make_launch
from elastic_ring.controller.backends import local
from elastic_ring.controller.backends.api import SegmentLaunch
from elastic_ring.controller.requests import RunRequest, check
from elastic_ring.errors import UserError
from elastic_ring.worker import collective as coll_mod
from elastic_ring.worker.collective import HorovodCollective, TorchCollective
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


def test_a_process_group_or_horovod_of_the_script_is_refused(monkeypatch):
    fake = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True)
    monkeypatch.setitem(sys.modules, "torch.distributed", fake)
    with pytest.raises(ContractError, match="process group before elastic_ring.worker.init"):
        coll_mod.check_no_process_group("torch")
    with pytest.raises(ContractError, match="with --collective torch"):
        coll_mod.check_no_process_group("horovod")
    fake.is_initialized = lambda: False
    monkeypatch.setitem(sys.modules, "horovod.torch", types.SimpleNamespace(is_initialized=lambda: True))
    with pytest.raises(ContractError, match="hvd.init"):
        coll_mod.check_no_process_group("torch")
    coll_mod.check_no_process_group("horovod")  # Horovod's own check is elsewhere (checks.py)


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


# ---------------------------------------------------------------------- the launcher and the request
def test_make_launch_gives_the_local_backend_for_torch(tmp_path):
    spec = types.SimpleNamespace(run_dir=tmp_path, script=None, script_args=("--x",), extra_env={},
                                 device="cpu", slots=2)
    backend, resize = make_launch(LaunchOptions(relaunch="overlap", collective="torch"), spec)
    assert isinstance(backend, local.LocalBackend) and resize == Relaunch("overlap")
    cmd = local.launcher_command(spec, SegmentLaunch(2, 3, 40, "me", go_file=tmp_path / "go"))
    assert cmd[1:5] == ["-m", "elastic_ring.controller.backends.local", "--nproc", "2"]
    assert "horovodrun" not in " ".join(cmd) and "elastic_ring.controller.hvdrun" not in cmd
    assert cmd[cmd.index("--segment") + 1] == "3" and cmd[cmd.index("--go-file") + 1] == str(tmp_path / "go")
    assert cmd[-3:] == ["--", "elastic_ring.train.worker", "--x"]
    env = local.rank_env(1, 2, 1234, base={})
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["MASTER_PORT"]) == ("1", "2", "1", "1234")


def test_the_launcher_ends_the_others_at_the_first_failure(tmp_path, capsys):
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    bad = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    assert local.supervise([slow, bad], poll_s=0.01) == 3
    assert slow.poll() is not None  # killed
    err = capsys.readouterr().err
    log = tmp_path / "log"
    log.write_text(f"noise\n{err}")
    assert local.first_failed_rank(log) == 1
    ok = [subprocess.Popen([sys.executable, "-c", "pass"]) for _ in range(2)]
    assert local.supervise(ok, poll_s=0.01) == 0


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
    (dict(collective="torch", backend="ray"), "drop --backend ray"),
    (dict(collective="torch", hosts="a:1,b:1"), "runs on one host"),
    (dict(collective="torch", relaunch="inplace"), "--relaunch inplace is Horovod Elastic's"),
])
def test_request_checks_the_collective(kw, needle):
    with pytest.raises(UserError, match=needle.replace("(", r"\(")):
        check(RunRequest(**kw))


def test_request_refuses_a_script_of_the_other_collective(tmp_path):
    hvd_script, pg_script = tmp_path / "h.py", tmp_path / "t.py"
    hvd_script.write_text("import horovod.torch as hvd\nhvd.init()\n")
    pg_script.write_text("import torch.distributed as dist\ndist.init_process_group()\n")
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
    pg_script = tmp_path / "t.py"
    pg_script.write_text("import torch.distributed as dist\ndist.init_process_group('gloo')\n")
    _one_line(cli_inproc("train", "--collective", "torch", "--script", str(hvd_script), "--steps", "4",
                         "--run-dir", str(tmp_path / "a")), "calls hvd.init()")
    _one_line(cli_inproc("train", "--script", str(pg_script), "--steps", "4", "--run-dir", str(tmp_path / "b")),
              "add --collective torch")
    _one_line(cli_inproc("train", "--collective", "torch", "--relaunch", "inplace", "--run-dir",
                         str(tmp_path / "c")), "--relaunch inplace is Horovod Elastic's")
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
