"""The CUDA path without a GPU: fakes for NVML, torch.cuda and Horovod's nccl_built.

Covers GPU detection (torch asked, NVML alone not trusted; one line saying what was found), the
``auto`` fallback's message, the NCCL refusal, the exclusive-process fallback to ``sequential``,
telemetry of the visible GPUs only, per-host ``CUDA_VISIBLE_DEVICES`` for cluster jobs, and the
CUDA RNG state of the rank's own device in checkpoints (old checkpoints with a list too).
"""

from __future__ import annotations

import types

import pytest
import torch

from elastic_ring.errors import UserError
from elastic_ring.telemetry import gpu
from elastic_ring.telemetry.probe import Telemetry


class FakeNvml:
    """pynvml with ``n`` GPUs; ``modes`` their compute modes; ``uuids`` GPU-<i>."""

    def __init__(self, n: int = 4, modes=None, driver: str = "580.1") -> None:
        self.n, self.modes, self.driver = n, modes or [0] * n, driver

    def nvmlDeviceGetCount(self):
        return self.n

    def nvmlDeviceGetHandleByIndex(self, i):
        if i >= self.n:
            raise RuntimeError("bad index")
        return ("h", i)

    def nvmlDeviceGetHandleByUUID(self, u):
        if u.startswith("GPU-") and int(u[4:]) < self.n:
            return ("h", int(u[4:]))
        raise RuntimeError("no such uuid")

    def nvmlDeviceGetIndex(self, h):
        return h[1]

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA H200"

    def nvmlDeviceGetComputeMode(self, h):
        return self.modes[h[1]]

    def nvmlSystemGetDriverVersion(self):
        return self.driver

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=10 * h[1])

    def nvmlDeviceGetMemoryInfo(self, h):
        return types.SimpleNamespace(used=2**30 * h[1], total=2**34)


def fake_torch(available: bool, count: int, cuda: str | None = "13.0", warning: str = ""):
    def is_available():
        if warning:
            import warnings
            warnings.warn(warning, UserWarning)
        return available

    cuda_mod = types.SimpleNamespace(is_available=is_available, device_count=lambda: count)
    return types.SimpleNamespace(__version__="2.14.1+cu130", version=types.SimpleNamespace(cuda=cuda),
                                 cuda=cuda_mod)


def test_visible_entries_follow_cuda_rules():
    assert gpu.visible_entries({}) is None
    assert gpu.visible_entries({"CUDA_VISIBLE_DEVICES": ""}) == []
    assert gpu.visible_entries({"CUDA_VISIBLE_DEVICES": "2,3"}) == ["2", "3"]
    assert gpu.visible_entries({"CUDA_VISIBLE_DEVICES": "2,-1,3"}) == ["2"]


def test_probe_counts_what_torch_can_use_and_says_so():
    rep = gpu.probe(env={"CUDA_VISIBLE_DEVICES": "1,3"}, nvml_fn=lambda: FakeNvml(4),
                    torch_fn=lambda: fake_torch(True, 2))
    assert (rep.usable, rep.listed) == (2, 2)
    assert rep.line() == ("GPUs: 2 usable by CUDA (2x NVIDIA H200; torch 2.14.1+cu130, CUDA 13.0, "
                          "driver 580.1)")


def test_nvml_lists_gpus_that_cuda_refuses():
    """A driver too old for torch's CUDA: NVML counts 4, CUDA none; the line says why."""
    rep = gpu.probe(env={}, nvml_fn=lambda: FakeNvml(4, driver="470.2"),
                    torch_fn=lambda: fake_torch(False, 0, warning="The NVIDIA driver on your system is too old"))
    assert rep.usable == 0 and rep.listed == 4
    assert "NVML lists 4 GPU(s) but CUDA cannot use them" in rep.line()
    assert "driver 470.2" in rep.line() and "too old" in rep.line()
    with pytest.raises(UserError, match="--device cuda but no NVIDIA GPU that CUDA can use: NVML lists 4"):
        gpu.resolve_device("cuda", lambda: rep)
    assert gpu.resolve_device("auto", lambda: rep)[:2] == ("cpu", 0)


def test_no_nvml_but_cuda_works():
    """A container without NVML: torch is asked (the driver's device files exist)."""
    rep = gpu.probe(env={}, nvml_fn=lambda: None, torch_fn=lambda: fake_torch(True, 2),
                    driver_present=lambda: True)
    assert rep.usable == 2 and rep.listed is None
    assert gpu.resolve_device("auto", lambda: rep)[:2] == ("cuda", 2)


def test_cpu_machine_does_not_import_torch():
    def boom():
        raise AssertionError("torch imported on a machine without a driver")

    rep = gpu.probe(env={}, nvml_fn=lambda: None, torch_fn=boom, driver_present=lambda: False)
    assert rep.usable == 0 and "no NVIDIA driver" in rep.reason
    rep = gpu.probe(env={"CUDA_VISIBLE_DEVICES": ""}, nvml_fn=lambda: FakeNvml(2), torch_fn=boom)
    assert rep.usable == 0 and "CUDA_VISIBLE_DEVICES=''" in rep.reason


def test_cpu_only_torch_is_named():
    rep = gpu.probe(env={}, nvml_fn=lambda: FakeNvml(1), torch_fn=lambda: fake_torch(True, 1, cuda=None))
    assert rep.usable == 0 and "CPU-only build" in rep.line()


def test_auto_on_cpu_explains_the_cpu_config(cli_inproc, tmp_path, monkeypatch):
    """The headline command on a machine without a usable GPU: the error says auto chose the CPU."""
    monkeypatch.setattr(gpu, "probe", lambda: gpu.GpuReport(0, reason="no NVIDIA driver on this machine"))
    p = cli_inproc("train", "--gpus", "1", "--resize-at", "5000", "--to", "2", "--run-dir", str(tmp_path / "r"))
    assert p.returncode == 2, p.stderr
    err = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(err) == 1, p.stderr
    assert "resize at step 5000 is not before the last step (120) of the CPU config" in err[0]
    assert "--device auto found no GPU that CUDA can use (no NVIDIA driver on this machine)" in err[0]


def test_nccl_refused_on_cuda_with_the_fix():
    no = lambda: types.SimpleNamespace(nccl_built=lambda: False)  # noqa: E731
    yes = lambda: types.SimpleNamespace(nccl_built=lambda: True)  # noqa: E731
    assert gpu.check_nccl("cpu", hvd_fn=no) is False
    assert gpu.check_nccl("cuda", hvd_fn=yes) is True
    with pytest.raises(UserError, match="built without NCCL.*HOROVOD_GPU_OPERATIONS=NCCL bash scripts/setup.sh"):
        gpu.check_nccl("cuda", hvd_fn=no, env={})
    said = []
    assert gpu.check_nccl("cuda", hvd_fn=no, env={gpu.NO_NCCL_ENV: "1"}, warn=said.append) is False
    assert said and said[0].startswith("WARNING: Horovod was built without NCCL")


def test_exclusive_process_gpus_fall_back_to_sequential():
    rep = gpu.probe(env={}, nvml_fn=lambda: FakeNvml(2, modes=[3, 3]), torch_fn=lambda: fake_torch(True, 2))
    assert rep.exclusive and "exclusive-process" in rep.line()
    for mode in ("prelaunch", "overlap"):
        new, why = gpu.exclusive_fallback(mode, "cuda", rep)
        assert new == "sequential" and f"--relaunch {mode}" in why and "exclusive-process" in why
    assert gpu.exclusive_fallback("inplace", "cuda", rep) == ("inplace", None)
    shared = gpu.probe(env={}, nvml_fn=lambda: FakeNvml(2), torch_fn=lambda: fake_torch(True, 2))
    assert gpu.exclusive_fallback("prelaunch", "cuda", shared) == ("prelaunch", None)


def test_telemetry_reports_only_visible_gpus():
    t = Telemetry(None, gpus=True, nvml_fn=lambda: FakeNvml(4), env={"CUDA_VISIBLE_DEVICES": "2,GPU-3"})
    g = t.sample()["gpus"]
    assert [(x["index"], x["nvml_index"]) for x in g] == [(0, 2), (1, 3)]
    assert g[0]["util_percent"] == 20 and g[1]["mem_used_mb"] == 3 * 1024


def test_host_devices_reach_each_worker():
    env = {gpu.HOST_DEVICES_ENV: "a=0,1;b=4", "HOROVOD_HOSTNAME": "b", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert gpu.apply_host_devices(env) == "4" and env["CUDA_VISIBLE_DEVICES"] == "4"
    env = {"HOROVOD_HOSTNAME": "b", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert gpu.apply_host_devices(env) is None and env["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_cluster_gpu_env_maps_through_the_schedulers_devices():
    from elastic_ring.cluster.runner import gpu_env

    table = [("localhost", 0), ("localhost", 1), ("localhost", 2), ("n2", 0), ("n2", 1)]
    assert gpu_env(table[:3], [1, 2], False, env={"CUDA_VISIBLE_DEVICES": "4,5,6"}) == {"CUDA_VISIBLE_DEVICES": "5,6"}
    assert gpu_env(table[:3], [0, 2], False, env={}) == {"CUDA_VISIBLE_DEVICES": "0,2"}
    e = gpu_env(table, [2, 3, 4], True, env={"CUDA_VISIBLE_DEVICES": "4,5,6"})
    assert e == {gpu.HOST_DEVICES_ENV: "localhost=6;n2=0,1", "CUDA_VISIBLE_DEVICES": "6"}
    with pytest.raises(UserError, match="GPU slot 2 is not among the 1 GPU"):
        gpu_env(table[:3], [2], False, env={"CUDA_VISIBLE_DEVICES": "7"})


class FakeCuda:
    """torch.cuda's RNG functions for one process with ``n`` visible GPUs and a current device."""

    def __init__(self, current: int = 0) -> None:
        self.current, self.set_calls = current, []

    def is_available(self):
        return True

    def is_initialized(self):
        return True

    def current_device(self):
        return self.current

    def get_rng_state(self):
        return torch.tensor([self.current, 7], dtype=torch.uint8)

    def get_rng_state_all(self):
        raise AssertionError("one state per visible GPU is what breaks on fewer GPUs")

    def set_rng_state(self, st):
        self.set_calls.append(st.tolist())

    def set_rng_state_all(self, sts):
        raise AssertionError("set_rng_state_all raises IndexError with fewer GPUs than saved")


def test_cuda_rng_is_the_ranks_own_device(monkeypatch):
    from elastic_ring.worker import state as api  # the RNG state a checkpoint holds

    fake = FakeCuda(current=0)
    for name in ("is_available", "is_initialized", "current_device", "get_rng_state",
                 "get_rng_state_all", "set_rng_state", "set_rng_state_all"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    st = api._rng_state()
    assert st["cuda"].tolist() == [0, 7]
    api._set_rng_state(st)
    assert fake.set_calls == [[0, 7]]
    # a checkpoint written by an older version with 4 GPUs visible, resumed with 2 visible
    old = dict(st, cuda=[torch.tensor([i, 1], dtype=torch.uint8) for i in range(4)])
    fake.current = 1
    api._set_rng_state(old)
    assert fake.set_calls[-1] == [1, 1]
    fake.current = 5  # more devices now than states saved: nothing to restore, and no IndexError
    api._set_rng_state(old)
    assert len(fake.set_calls) == 2


def test_warm_up_is_nothing_on_the_cpu():
    from elastic_ring.train.worker import warm_up

    assert warm_up(torch.nn.Linear(2, 2), [], 8, True, torch.device("cpu")) == 0.0


@pytest.mark.gpu
def test_batches_made_on_the_gpu_equal_the_cpus():
    from elastic_ring.data.datasets import ArrayDataset, make_batch

    g = torch.Generator().manual_seed(1)
    ds = ArrayDataset(torch.randint(0, 256, (300, 3, 32, 32), dtype=torch.uint8, generator=g),
                      torch.randint(0, 10, (300,), generator=g), (0.49, 0.48, 0.45), (0.25, 0.24, 0.26), "t")
    idx = torch.randperm(300, generator=g)[:128]
    xc, yc = make_batch(ds, idx, True, torch.Generator().manual_seed(7))
    xg, yg = make_batch(ds.to("cuda"), idx, True, torch.Generator().manual_seed(7))
    assert xg.is_cuda and torch.equal(yg.cpu(), yc)
    assert torch.allclose(xg.cpu(), xc, atol=1e-6)


@pytest.mark.gpu
def test_warm_up_leaves_the_model_and_rngs_untouched():
    from elastic_ring.data.datasets import ArrayDataset
    from elastic_ring.nn import resnet
    from elastic_ring.train.worker import warm_up

    dev = torch.device("cuda", 0)
    torch.backends.cudnn.benchmark = True
    model = resnet(8, 4, 10).to(dev)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ds = ArrayDataset(torch.zeros(16, 3, 32, 32, dtype=torch.uint8), torch.zeros(16, dtype=torch.long),
                      (0.5,) * 3, (0.25,) * 3, "t").to(dev)
    cpu_rng, cuda_rng = torch.get_rng_state(), torch.cuda.get_rng_state()
    assert warm_up(model, ds, 8, True, dev) > 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), cpu_rng) and torch.equal(torch.cuda.get_rng_state(), cuda_rng)


def test_gpu_workers_get_the_cpu_thread_cap(monkeypatch):
    from elastic_ring import protocol
    from elastic_ring.controller.backends.api import worker_env

    monkeypatch.setenv(protocol.CPU_THREADS_ENV, "3")
    for device in ("cuda", "cpu"):
        spec = types.SimpleNamespace(device=device, extra_env={})
        env = worker_env(spec, 4)
        assert env["OMP_NUM_THREADS"] == "3", device
        assert ("HOROVOD_CYCLE_TIME" in env) == (device == "cpu")


def test_in_place_reset_keeps_rank_0s_own_extras():
    """Rank 0 of an in-place reset restores from meta built of its own objects (found by the CPU
    dry run of gpu_check.sh: the LR state dict was cleared, then `LRState(**{})` failed)."""
    from elastic_ring.worker.state import _restore_in_place

    lr = {"base": 0.1, "start": 0.1}
    assert _restore_in_place(lr, lr) is lr and lr == {"base": 0.1, "start": 0.1}
    cur = {"base": 0.2}
    assert _restore_in_place(cur, {"base": 0.3}) is cur and cur == {"base": 0.3}
