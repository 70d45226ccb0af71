"""Typed events, one JSON line each, shared by train, profile, ps, reports and the simulator."""

from elastic_ring.events.api import (
    Event, EventLog, UnknownEvent, as_event, read_events, register,
    Launch, FirstStep, Throughput, ResizeRequested, CheckpointWritten, WorkersExited, Relaunched,
    FirstStepAfterResize, ResizeOverhead, Evaluation, Finished, ErrorEvent, SegmentEnd, Restart, Stalled,
    Recovered,
)

__all__ = [
    "Event", "EventLog", "UnknownEvent", "as_event", "read_events", "register",
    "Launch", "FirstStep", "Throughput", "ResizeRequested", "CheckpointWritten", "WorkersExited",
    "Relaunched", "FirstStepAfterResize", "ResizeOverhead", "Evaluation", "Finished", "ErrorEvent",
    "SegmentEnd", "Restart", "Stalled", "Recovered",
]
