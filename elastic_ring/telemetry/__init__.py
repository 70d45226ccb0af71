"""Hardware discovery and telemetry: NVIDIA GPUs through pynvml, processes through psutil."""

from elastic_ring.telemetry.probe import gpu_count, Telemetry

__all__ = ["gpu_count", "Telemetry"]
