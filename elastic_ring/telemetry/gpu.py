"""What GPUs CUDA can really use, asked once by the controller before it starts any worker.

NVML (the driver's management library) lists GPUs that CUDA may still refuse: a driver older than
torch's CUDA build, MIG instances, ``CUDA_VISIBLE_DEVICES`` narrowing the set; and NVML may be
absent (a container without it) where CUDA works. So :func:`probe` asks torch
(``torch.cuda.is_available()`` / ``device_count()``, which initialise the driver without creating
a context, so no GPU memory is taken in the controller), and NVML only for names, the driver
version and each visible GPU's compute mode. torch is imported only where a GPU may exist (NVML
lists one, or the driver's device files are there): a CPU machine pays nothing.

:class:`GpuReport` is the answer, with :meth:`GpuReport.line`, the one line the CLI prints.
:func:`resolve_device` turns ``--device auto|cpu|cuda`` into a device or a one-line
:class:`~elastic_ring.errors.UserError`; :func:`check_cpu_fallback` says when ``auto`` chose the CPU
and the command only makes sense on GPUs. :func:`check_nccl` refuses a CUDA run with a Horovod built
without NCCL (every gradient would go GPU -> host -> gloo/TCP -> GPU). :func:`exclusive_fallback`
turns ``prelaunch``/``overlap`` into ``sequential`` on GPUs in exclusive-process mode, where new
workers cannot open the GPUs the old ones still hold.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from elastic_ring import env as envvars
from elastic_ring.errors import UserError

# NVML compute modes (nvml.h): 0 default, 1 exclusive thread (retired), 2 prohibited, 3 exclusive process
_EXCLUSIVE_MODES = {1: "exclusive-thread", 2: "prohibited", 3: "exclusive-process"}
NO_NCCL_ENV = envvars.ALLOW_NO_NCCL
NCCL_FIX = ("HOROVOD_GPU_OPERATIONS=NCCL bash scripts/setup.sh  (rebuilds the Horovod wheel with "
            "NCCL; scripts/setup.sh says what is missing if NCCL's header or library is not found)")


def visible_entries(env: dict[str, str] | None = None) -> list[str] | None:
    """``CUDA_VISIBLE_DEVICES`` as CUDA reads it: None when unset (all devices); else the entries up
    to the first invalid one (``-1`` or an empty entry ends the list, as in CUDA)."""
    raw = envvars.cuda_visible_devices(env)
    if raw is None:
        return None
    out: list[str] = []
    for item in raw.split(","):
        item = item.strip()
        if not item or item.startswith("-"):
            break
        out.append(item)
    return out


def nvml():
    """pynvml, initialised; None where there is no driver or no library."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # noqa: BLE001  no driver, no library, no GPU
        return None


def visible_handles(nv, env: dict[str, str] | None = None) -> list[tuple[int, int, Any]]:
    """(CUDA ordinal, NVML index, handle) of each GPU this process's ``CUDA_VISIBLE_DEVICES`` shows,
    in CUDA's order. Entries are indices or UUIDs (``GPU-...``; MIG entries have no NVML index: -1)."""
    try:
        count = nv.nvmlDeviceGetCount()
    except Exception:  # noqa: BLE001
        return []
    entries = visible_entries(env)
    if entries is None:
        entries = [str(i) for i in range(count)]
    out = []
    for ordinal, e in enumerate(entries):
        try:
            if e.isdigit():
                if int(e) >= count:
                    break  # CUDA stops at the first index that does not exist
                h = nv.nvmlDeviceGetHandleByIndex(int(e))
                idx = int(e)
            else:
                h = nv.nvmlDeviceGetHandleByUUID(e)
                try:
                    idx = int(nv.nvmlDeviceGetIndex(h))
                except Exception:  # noqa: BLE001  a MIG instance
                    idx = -1
        except Exception:  # noqa: BLE001
            break
        out.append((ordinal, idx, h))
    return out


def _driver_present() -> bool:
    return any(Path(p).exists() for p in ("/dev/nvidiactl", "/dev/nvidia0", "/proc/driver/nvidia/version"))


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


@dataclass(frozen=True)
class GpuReport:
    """What :func:`probe` found. ``usable``: devices CUDA can use in this process (what workers get
    with ``set_device(local_rank)``); ``listed``: GPUs the driver lists through NVML for this
    process's ``CUDA_VISIBLE_DEVICES`` (None: NVML absent); ``reason``: why ``usable`` is 0."""

    usable: int
    listed: int | None = None
    names: tuple[str, ...] = ()
    driver: str | None = None
    torch_version: str | None = None
    torch_cuda: str | None = None
    reason: str = ""
    modes: tuple[str, ...] = field(default=())  # compute mode of each visible GPU (NVML)

    @property
    def exclusive(self) -> bool:
        return any(m in _EXCLUSIVE_MODES.values() for m in self.modes)

    def line(self) -> str:
        if self.usable:
            names = ", ".join(f"{n}x {m}" if n > 1 else m for m, n in _counts(self.names)) or "?"
            what = (f"GPUs: {self.usable} usable by CUDA ({names}; torch {self.torch_version}, CUDA "
                    f"{self.torch_cuda}{', driver ' + self.driver if self.driver else ''})")
            if self.listed is not None and self.listed != self.usable:
                what += f"; NVML lists {self.listed}"
            if self.exclusive:
                what += f"; compute mode {', '.join(sorted(set(self.modes)))}"
            return what
        return f"GPUs: none usable by CUDA: {self.reason}"


def _counts(names: tuple[str, ...]) -> list[tuple[str, int]]:
    out: dict[str, int] = {}
    for n in names:
        out[n] = out.get(n, 0) + 1
    return list(out.items())


def probe(env: dict[str, str] | None = None, nvml_fn: Callable[[], Any] = nvml,
          torch_fn: Callable[[], Any] | None = None,
          driver_present: Callable[[], bool] = _driver_present) -> GpuReport:
    """Ask NVML (names, driver, compute modes) and torch (what CUDA can use). ``nvml_fn`` and
    ``torch_fn`` return the modules (fakes in the unit tests); torch is imported only where NVML
    lists a GPU or the driver's device files exist."""
    nv = nvml_fn()
    listed, names, modes, driver = None, [], [], None
    if nv is not None:
        handles = visible_handles(nv, env)
        listed = len(handles)
        for _, _, h in handles:
            try:
                names.append(_text(nv.nvmlDeviceGetName(h)))
            except Exception:  # noqa: BLE001
                names.append("?")
            try:
                m = int(nv.nvmlDeviceGetComputeMode(h))
                modes.append(_EXCLUSIVE_MODES.get(m, "default"))
            except Exception:  # noqa: BLE001  MIG instances and old drivers do not say
                modes.append("unknown")
        try:
            driver = _text(nv.nvmlSystemGetDriverVersion())
        except Exception:  # noqa: BLE001
            driver = None
        if listed == 0:
            return GpuReport(0, 0, driver=driver, reason=(
                "the NVIDIA driver lists no GPU" + (" in CUDA_VISIBLE_DEVICES="
                                                     f"{envvars.cuda_visible_devices(env)!r}"
                                                     if visible_entries(env) is not None else "")))
    elif not driver_present():
        return GpuReport(0, None, reason="no NVIDIA driver on this machine (no NVML, no /dev/nvidiactl)")
    try:
        torch = torch_fn() if torch_fn is not None else __import__("torch")
    except Exception as e:  # noqa: BLE001
        return GpuReport(0, listed, tuple(names), driver, reason=f"torch does not import ({e})",
                         modes=tuple(modes))
    tv, tc = str(torch.__version__), torch.version.cuda
    if tc is None:
        return GpuReport(0, listed, tuple(names), driver, tv, None, modes=tuple(modes),
                         reason=f"torch {tv} is a CPU-only build (install a CUDA build of torch)")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            ok = bool(torch.cuda.is_available())
            n = int(torch.cuda.device_count()) if ok else 0
        except Exception as e:  # noqa: BLE001
            ok, n = False, 0
            caught.append(warnings.WarningMessage(str(e), RuntimeWarning, "", 0))
    if not ok or n == 0:
        why = " ".join(str(caught[0].message).split())[:200] if caught else ""
        listed_s = f"NVML lists {listed} GPU(s) but " if listed else ""
        return GpuReport(0, listed, tuple(names), driver, tv, tc, modes=tuple(modes), reason=(
            f"{listed_s}CUDA cannot use them (torch {tv} built for CUDA {tc}"
            f"{', driver ' + driver if driver else ''}{': ' + why if why else ''})"))
    if len(names) != n:  # NVML absent, or MIG: names from torch would create no context either,
        names = [f"CUDA device {i}" for i in range(n)]  # but keep the controller free of CUDA calls
        modes = modes[:n] if len(modes) >= n else modes
    return GpuReport(n, listed, tuple(names), driver, tv, tc, modes=tuple(modes))


def resolve_device(requested: str, report_fn: Callable[[], GpuReport] | None = None
                   ) -> tuple[str, int, GpuReport | None]:
    """``--device auto|cpu|cuda`` -> (device, usable GPUs, the report; None for ``cpu``)."""
    if requested == "cpu":
        return "cpu", 0, None
    rep = (report_fn or probe)()
    if requested == "cuda" and rep.usable == 0:
        raise UserError(f"--device cuda but no NVIDIA GPU that CUDA can use: {rep.reason} (try --device cpu)")
    return ("cuda" if rep.usable else "cpu"), rep.usable, rep


def check_cpu_fallback(resize_steps: list[int], total_steps: int, rep: GpuReport) -> None:
    """``--device auto`` chose the CPU, whose config runs ``total_steps``: a resize at or past it is
    most likely a GPU command run where CUDA is unusable; say that rather than only the step limit."""
    late = [s for s in resize_steps if s >= total_steps]
    if late:
        raise UserError(f"resize at step {late[0]} is not before the last step ({total_steps}) of the CPU "
                        f"config: --device auto found no GPU that CUDA can use ({rep.reason}); pass "
                        "--device cuda on a GPU node, or --steps/--config for a CPU run")


def nccl_built(hvd_fn: Callable[[], Any] | None = None) -> bool:
    """Whether the installed Horovod has NCCL (``horovod.torch.nccl_built()``)."""
    hvd = hvd_fn() if hvd_fn is not None else __import__("horovod.torch", fromlist=["nccl_built"])
    return bool(hvd.nccl_built())


def check_nccl(device: str, hvd_fn: Callable[[], Any] | None = None,
               env: dict[str, str] | None = None, warn: Callable[[str], None] | None = None) -> bool:
    """On ``cuda``, refuse a Horovod without NCCL (UserError with the set-up command that fixes it);
    ``ELASTIC_RING_ALLOW_NO_NCCL=1`` runs anyway, with a warning. True when NCCL is there."""
    if device != "cuda":
        return False
    try:
        ok = nccl_built(hvd_fn)
    except Exception as e:  # noqa: BLE001
        raise UserError(f"horovod.torch does not import ({type(e).__name__}: {e}); run: bash scripts/setup.sh") from None
    if ok:
        return True
    msg = ("Horovod was built without NCCL: on GPUs every gradient would go GPU -> host -> gloo/TCP "
           f"-> GPU. Fix: {NCCL_FIX}")
    if envvars.allow_no_nccl(env):
        (warn or (lambda s: None))(f"WARNING: {msg}; running anyway ({NO_NCCL_ENV}=1)")
        return False
    raise UserError(f"{msg}; or set {NO_NCCL_ENV}=1 to run without it")


def exclusive_fallback(relaunch: str, device: str, rep: GpuReport | None) -> tuple[str, str | None]:
    """``prelaunch``/``overlap`` on exclusive-process GPUs -> ``sequential``, with the line saying so."""
    if device != "cuda" or rep is None or relaunch not in ("prelaunch", "overlap") or not rep.exclusive:
        return relaunch, None
    return "sequential", (f"--relaunch {relaunch} needs new workers to open GPUs the old ones still "
                          f"hold; these GPUs are in {', '.join(sorted(set(rep.modes) - {'default'}))} "
                          "compute mode, so resizes use --relaunch sequential")


def host_devices_env(table: dict[str, list[str]]) -> str:
    """``{host: [device, ...]}`` -> the value of ``ELASTIC_RING_HOST_DEVICES``: ``h1=0,1;h2=2``."""
    return ";".join(f"{h}={','.join(d)}" for h, d in table.items())


HOST_DEVICES_ENV = envvars.HOST_DEVICES


def apply_host_devices(env: dict[str, str] | None = None) -> str | None:
    """In a worker, before CUDA starts: set ``CUDA_VISIBLE_DEVICES`` from ``ELASTIC_RING_HOST_DEVICES``
    for this worker's host (``HOROVOD_HOSTNAME``, which horovodrun sets per slot). horovodrun sends
    one environment to every host, so a per-host list has to travel this way. Returns the value set."""
    env = os.environ if env is None else env
    raw, host = envvars.host_devices(env), envvars.horovod_hostname(env)
    if not raw or not host:
        return None
    for part in raw.split(";"):
        h, _, devs = part.partition("=")
        if h == host:
            env["CUDA_VISIBLE_DEVICES"] = devs
            return devs
    return None


def map_through_parent(indices: list[int], env: dict[str, str] | None = None) -> list[str]:
    """Device indices in the caller's view -> the ``CUDA_VISIBLE_DEVICES`` entries to give a child:
    mapped through the caller's own ``CUDA_VISIBLE_DEVICES`` (a scheduler started on GPUs 4-7 gives
    its slot 0 GPU 4), unchanged where that is unset. Raises UserError when an index is not there."""
    parent = visible_entries(env)
    if parent is None:
        return [str(i) for i in indices]
    out = []
    for i in indices:
        if i >= len(parent):
            raise UserError(f"GPU slot {i} is not among the {len(parent)} GPU(s) of CUDA_VISIBLE_DEVICES="
                            f"{','.join(parent)!r} this process was started with")
        out.append(parent[i])
    return out
