"""The `elastic-ring train` controller: launch, watch, resize by checkpoint-and-relaunch, measure."""

from elastic_ring.controller.api import RunSpec, RunState, Resize, parse_schedule, parse_hosts
from elastic_ring.controller.controller import Controller

__all__ = ["RunSpec", "RunState", "Resize", "parse_schedule", "parse_hosts", "Controller"]
