"""A sampler of the workers' resource use, and ``gpu_count()``.

``gpu_count()`` is the number of GPUs CUDA can use here (:func:`elastic_ring.telemetry.gpu.probe`:
torch asked, not NVML alone; 0 where there is no NVIDIA driver). ``Telemetry`` samples, at each
throughput event, utilisation and memory of the GPUs this process's ``CUDA_VISIBLE_DEVICES`` shows
(``index`` is the CUDA ordinal the workers use, ``nvml_index`` the driver's; other jobs' GPUs are
not reported), and the CPU use and resident memory of the worker processes (the launcher's
descendants) everywhere.
"""

from __future__ import annotations

from typing import Any

import psutil


from elastic_ring.telemetry.gpu import nvml as _nvml, probe, visible_handles


def gpu_count() -> int:
    return probe().usable


class Telemetry:
    """Samples the process tree under ``root_pid`` and the GPUs, at most once every ``every_s``
    seconds (:func:`elastic_ring.env.telemetry_every_s`, 1 s by default; 0: at every call): a call
    sooner gets a copy of the last sample. A sample walks every process of the machine (psutil's
    children of a process read each one's parent): at a throughput event every 20 steps of 5 ms
    that took the controller from 2.5% to 4.7% of a core beside the training
    (docs/reports/worker.md, "The tool's CPU beside the training")."""

    def __init__(self, root_pid: int | None = None, gpus: bool = False, nvml_fn=_nvml,
                 env: dict[str, str] | None = None, every_s: float | None = None, clock=None) -> None:
        import time

        from elastic_ring import env as _env

        self.root_pid = root_pid
        self._nv = nvml_fn() if gpus else None
        self._handles = visible_handles(self._nv, env) if self._nv is not None else []
        self._cpu_last: dict[int, tuple[float, float]] = {}
        self.every_s = _env.telemetry_every_s(env) if every_s is None else every_s
        self._clock = clock or time.monotonic
        self._last: tuple[float, dict[str, Any]] | None = None  # (when, the last sample)

    def _procs(self) -> list[psutil.Process]:
        if self.root_pid is None:
            return []
        try:
            root = psutil.Process(self.root_pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    def sample(self) -> dict[str, Any]:
        now = self._clock()
        if self._last is not None and now - self._last[0] < self.every_s:
            return dict(self._last[1])
        out = self._sample(now)
        self._last = (now, out)
        return dict(out)

    def _sample(self, now: float) -> dict[str, Any]:
        out: dict[str, Any] = {}
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
            for ordinal, idx, h in self._handles:
                try:
                    u = self._nv.nvmlDeviceGetUtilizationRates(h)
                    m = self._nv.nvmlDeviceGetMemoryInfo(h)
                except Exception:  # noqa: BLE001
                    continue
                gpus.append({"index": ordinal, "nvml_index": idx, "util_percent": u.gpu,
                             "mem_used_mb": round(m.used / 2**20), "mem_total_mb": round(m.total / 2**20)})
            out["gpus"] = gpus
        return out
