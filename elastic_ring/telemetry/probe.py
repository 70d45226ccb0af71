"""GPU discovery (pynvml) and a sampler of the workers' resource use.

``gpu_count()`` is how ``--device auto`` and the slot count find GPUs: it asks NVML (the driver),
honours ``CUDA_VISIBLE_DEVICES``, and returns 0 where there is no NVIDIA driver. ``Telemetry``
samples, at each throughput event, per-GPU utilisation and memory where GPUs exist, and the CPU use
and resident memory of the worker processes (the launcher's descendants) everywhere.
"""

from __future__ import annotations

import os
from typing import Any

import psutil


def _nvml():
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # no driver, no library, no GPU
        return None


def gpu_count() -> int:
    nv = _nvml()
    if nv is None:
        return 0
    try:
        n = nv.nvmlDeviceGetCount()
    except Exception:
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v for v in visible.split(",") if v.strip() and v.strip() != "-1"]
        n = min(n, len(ids))
    return n


class Telemetry:
    """Samples the process tree under ``root_pid`` and the GPUs."""

    def __init__(self, root_pid: int | None = None, gpus: bool = False) -> None:
        self.root_pid = root_pid
        self._nv = _nvml() if gpus else None
        self._cpu_last: dict[int, tuple[float, float]] = {}

    def _procs(self) -> list[psutil.Process]:
        if self.root_pid is None:
            return []
        try:
            root = psutil.Process(self.root_pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    def sample(self) -> dict[str, Any]:
        import time

        out: dict[str, Any] = {}
        now = time.monotonic()
        cpu_pct, rss, n = 0.0, 0, 0
        for p in self._procs():
            try:
                t = p.cpu_times()
                busy = t.user + t.system
                rss += p.memory_info().rss
            except psutil.Error:
                continue
            n += 1
            prev = self._cpu_last.get(p.pid)
            if prev is not None and now > prev[0]:
                cpu_pct += 100.0 * (busy - prev[1]) / (now - prev[0])
            self._cpu_last[p.pid] = (now, busy)
        out["processes"] = n
        out["cpu_percent"] = round(cpu_pct, 1)
        out["rss_mb"] = round(rss / 2**20, 1)
        if self._nv is not None:
            gpus = []
            try:
                for i in range(self._nv.nvmlDeviceGetCount()):
                    h = self._nv.nvmlDeviceGetHandleByIndex(i)
                    u = self._nv.nvmlDeviceGetUtilizationRates(h)
                    m = self._nv.nvmlDeviceGetMemoryInfo(h)
                    gpus.append({"index": i, "util_percent": u.gpu, "mem_used_mb": round(m.used / 2**20),
                                 "mem_total_mb": round(m.total / 2**20)})
            except Exception:
                pass
            out["gpus"] = gpus
        return out
