"""A failed segment's recovery, as the controller's one place acting on a decision carries it out
(``Controller._act``): the backend's survivors asked whether they go on from memory
(:meth:`Recovery._ask_survivors`, called by ``Controller._decide``), then the restart itself, from
the checkpoint or in the survivors' processes, counted against ``--max-restarts`` and written as a
``restart`` event (:meth:`Recovery._failed`). Why it failed and who is blamed is
:mod:`.diagnose`'s; when to give up is :mod:`.restart_rule`'s.

:class:`Recovery` is a base class of :class:`~.controller.Controller`: its methods read and write the
controller's state (``backend``, ``plan``, ``meter``, ``_failures``, ``_elastic``, ...) as they did
in controller.py, from where they moved unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from elastic_ring.controller.api import RunState
from elastic_ring.controller.display import layout_words
from elastic_ring.controller.membership import Cause, MembershipChange
from elastic_ring.controller.meter import Restarting
from elastic_ring.controller.restart_rule import append_traceback, give_up_reason
from elastic_ring.controller.segment import Segment
from elastic_ring.events.api import Restart

if TYPE_CHECKING:
    from elastic_ring.controller.backends.api import Survival


class Recovery:
    """A failure's survivors asked, and the restart that follows (mixed into
    :class:`~.controller.Controller`)."""

    def _ask_survivors(self, seg: Segment) -> Survival | None:
        """A segment failed (or its stalled ranks were ended: :meth:`.Stalls.end_alone`): the backend's
        survivors, when it keeps them (the Ray backend or ``--relaunch inplace`` with ``--survive``)
        and they agree on a step they all hold in memory; None: restart from the checkpoint."""
        if not self.resize.keeps_workers or (seg.stall is not None and not self.stalls.ended):
            return None
        self.stalls.ended = 0.0
        off = self.survival.off_refusal() if self.survival is not None else None
        s = self.backend.survivors(wait_s=0.0) if off else self.backend.survivors()  # off: the group ended
        if s is None:
            self._refused = off or self.backend.refused  # for the restart that follows
        return s

    def _failed(self, seg: Segment, change: MembershipChange, rc: int | None) -> None:
        """A segment failed. From the checkpoint at ``change.step``, at ``change.members_after``
        workers (fewer: the slots that answer); or, when its survivors agreed (``change.survivors``),
        they go on in their processes from the last step they all hold in memory, at their number,
        as after a scheduled shrink there (the next segment is an in-place resize). Either counts as
        a restart (``max_restarts``; the same error twice is not retried: raises) and is a
        ``restart`` event (``path`` "memory" for the survivors). Where the backend starts a new worker
        on a grow (``rejoins``), the plan grows back after the survivors' next step (``joiner``)."""
        s, step, world = change.survivors, change.step, change.members_after
        self.prelaunch.cancel()
        self.meter.pending = None
        a = self.diagnosis.account(seg, rc, step, s)
        why, redone = a.why, max(0, a.last - step)
        attempt, repeated = self._failures.record(a.failure)
        if s is None:
            append_traceback(seg.log, a.record)
        reason = give_up_reason(a.record, a.failure, attempt, repeated, self.max_restarts, world)
        refused, self._refused = self._refused, None
        path = "disk" if s is None else "memory"
        node = a.node
        # its host is left out for a cooldown (docs/hosts.md); in place on one host the one host is
        # never left out; in place over discovered hosts the survivors go on without the hosts that
        # lost a worker (the backend named them), on their own hosts (placed as they are)
        if self.hosts is not None and ((s is None and not self.resize.keeps_workers) or self.backend.over_hosts):
            for host in (s.lost if s is not None and s.lost else (None,)):
                ex = self.hosts.failed(seg, a.rank, self.spec.run_dir, host=host)
                node = node or (ex.host if ex is not None else None)
            if s is not None and s.hosts:
                self.hosts.keep(s.hosts)
        self.events.write(Restart(attempt=attempt, cause=why, rank=a.rank, returncode=rc, segment=seg.index,
                                  world_size=seg.world, from_step=step, failed_at_step=a.last, steps_redone=redone,
                                  new_world_size=0 if reason is not None else world, gave_up=reason is not None,
                                  node=node, path=path, memory_refused=refused, time=change.time))
        if reason is not None:
            self._fail(seg, rc, f"{why} ({reason})", rank=a.rank)
        joined = ""
        if s is not None:
            planned = self.plan.world_after(step + 1)  # the size the job was to have after the next step
            self.plan.add(step, world, "failure")
            joins = (self.backend.rejoins and planned > world
                     and step + 1 < self.spec.total_steps and self.plan.world_after(step + 1) == world)
            self._t_failure = change.time  # a joiner's grow back says how long after the failure it came
            if joins:  # a new worker takes the dead one's place after the survivors' next step
                self.plan.add(step + 1, planned, "joiner")
            self._save_plan()
            self._elastic = seg  # its survivors wait, paused, for their new ring
            joined = f" with {s.joiners} warm spare(s) in the failed worker(s)' place" if s.joiners else ""
            if joins:
                joined += (f"; {planned - world} new worker(s) join after step {step + 1}, the state by broadcast "
                           f"from a survivor")
        elif change.cause is Cause.LOST_HOST:
            self.plan.add(step, world, "restart")
            self._save_plan()
            how = f"LR unchanged: {layout_words(self.constant_batch, world)}" if self.constant_batch else \
                "LR by the run's rule"
            self.out(f"only {world} slot(s) answer: restarting at {world} worker(s) ({how})")
        self._set_state(RunState.RESTARTING, step=step, world_size=world,  # (also in memory: until they step)
                        segment=seg.index + 1, pending_world=None, resize_from=None)
        self.meter.restarting = Restarting(attempt, change.time, a.t_last, redone, step, seg.index + 1, path=path)
        if s is not None:
            self.out(f"{why}: restart {attempt}/{self.max_restarts} in memory: {world - s.joiners} survivor(s) go "
                     f"on from step {step}{joined} ({redone} step(s) to redo)")
        else:
            self.out(f"{why}: restart {attempt}/{self.max_restarts} from step {step} with {world} worker(s) "
                     f"({redone} step(s) to redo)" + (f"; not from memory: {refused}" if refused else "")
                     + (self.survival.restart_note() if self.survival is not None else ""))
