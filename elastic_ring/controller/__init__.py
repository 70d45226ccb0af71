"""The `elastic-ring train` controller: launch, watch, resize by checkpoint-and-relaunch, restart
after failures, measure. Import :class:`~elastic_ring.controller.controller.Controller` from its
module (this package's ``__init__`` stays light, so `status` and `resize` start fast)."""

from elastic_ring.controller.api import Plan, Resize, RunSpec, RunState, parse_hosts, parse_schedule

__all__ = ["Plan", "RunSpec", "RunState", "Resize", "parse_schedule", "parse_hosts"]
