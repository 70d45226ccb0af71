"""Whether a run keeps survivors after a failure: ``--survive`` forces it, ``--no-survive`` forbids it,
and by default it is on where the launcher can keep survivors (``--backend ray``, ``--relaunch
inplace``) and the per-step state copy it needs is cheap.

:func:`initial` is the choice at the start, from the options alone (:class:`Choice`; mode ``auto``:
measure first). Under ``auto`` the workers time their copy against their step in the first steps
(:class:`elastic_ring.worker.survive.CostMeter`) and each writes its ratio; :class:`SurviveWatch`
(the controller's, polled with the segment) waits until every rank of the running segment has
said, decides for all with :func:`decide` (the dearest rank's ratio against
:data:`~elastic_ring.seam.MAX_COST`), writes its word where the workers read it, says it
in one line, a ``survive_choice`` event and the run's ``controller.json`` (``status``). After an
"off", a failure is a restart from the checkpoint, as under ``--no-survive``.

On a launcher that cannot keep survivors nothing is said at the start (the choice is recorded as an
event); the restart that follows a failure says why it was from the checkpoint.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

from elastic_ring import protocol
from elastic_ring.events.api import SurviveChoice
from elastic_ring.seam import MAX_COST, choice_file, cost_file

ON, OFF, AUTO = "on", "off", "auto"
CHECK_EVERY_S = 0.5  # how often the controller looks for the workers' reports while they measure


@dataclass(frozen=True)
class Choice:
    """``mode`` (:data:`ON`, :data:`OFF`, :data:`AUTO`: measure first), ``why`` (the line's
    reason), ``forced`` (an option chose it), ``ratio`` (measured), ``can`` (the launcher can
    keep survivors)."""

    mode: str
    why: str
    forced: bool = False
    ratio: float | None = None
    can: bool = True

    @property
    def launches_survivors(self) -> bool:
        """Whether the workers are launched keeping survivors (on, or measuring)."""
        return self.mode != OFF

    @property
    def worker_env(self) -> str:
        """The workers' ``ELASTIC_RING_SURVIVE`` value (``auto``: they time their copy first)."""
        return "auto" if self.mode == AUTO else "1"

    def line(self) -> str:
        if self.mode == AUTO:
            return f"survive: measuring ({self.why})"
        return f"survive: {self.mode} ({self.why})"

    def event(self) -> SurviveChoice:
        return SurviveChoice(on=None if self.mode == AUTO else self.mode == ON, why=self.why, ratio=self.ratio,
                             forced=self.forced)


def why_not(backend: str, relaunch: str, collective: str, device: str, torchrun: bool) -> str | None:
    """Why the launcher keeps no survivors after a failure, or None when it can."""
    if torchrun:
        return "a script of torchrun's contract: every worker is stopped and started again at a failure"
    if backend != "ray" and relaunch != "inplace":
        return f"--relaunch {relaunch} keeps no survivors; --relaunch inplace and --backend ray do"
    if collective == "torch" and device == "cuda":
        return "--collective torch on GPUs: NCCL after a peer's death is not handled"
    return None


def initial(forced: bool | None, backend: str, relaunch: str, collective: str, device: str,
            torchrun: bool = False, hvd_elastic: bool = False) -> Choice:
    """The choice at the start: ``forced`` (``--survive`` True, ``--no-survive`` False; its
    conflicts were refused by the request's check), else off where the launcher cannot keep
    survivors, on for a Horovod Elastic script (its commits are its copy: none per step), else
    measure (:data:`AUTO`)."""
    cannot = why_not(backend, relaunch, collective, device, torchrun)
    if forced is False:
        return Choice(OFF, "--no-survive", forced=True, can=cannot is None)
    if forced:
        return Choice(ON, "--survive", forced=True)
    if cannot is not None:
        return Choice(OFF, cannot, can=False)
    if hvd_elastic:
        return Choice(ON, "a Horovod Elastic script's commits are its copy: none per step")
    return Choice(AUTO, f"the state copy against the step in the first steps: on at <= {_pct(MAX_COST)} of a step")


def decide(ratios: Iterable[float]) -> Choice:
    """The default's word from the ranks' measured copy/step ratios: on where the dearest is at
    most :data:`MAX_COST`."""
    worst = max(ratios)
    if worst <= MAX_COST:
        return Choice(ON, f"state copy {_pct(worst)} of a step, <= {_pct(MAX_COST)}", ratio=worst)
    return Choice(OFF, f"state copy {_pct(worst)} of a step > {_pct(MAX_COST)}; --survive forces it", ratio=worst)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%" if x < 0.995 else f"{100 * x:.0f}%"


def recorded(events: Iterable[Any]) -> tuple[dict[str, Any] | None, str | None]:
    """The run's newest choice among ``events`` (``survive_choice``) as ``status --json`` gives it
    (``{on, why, ratio, forced}``; ``on`` None: still measuring), and the line ``status`` prints
    (None where the launcher cannot keep survivors and nothing forced it: no news there)."""
    last = None
    for e in events:
        if isinstance(e, SurviveChoice):
            last = e
    if last is None:
        return None, None
    rec = {"on": last.on, "why": last.why, "ratio": last.ratio, "forced": last.forced}
    if last.on is None:
        return rec, f"survive: measuring ({last.why})"
    cannot = last.on is False and not last.forced and last.ratio is None
    return rec, None if cannot else f"survive: {'on' if last.on else 'off'} ({last.why})"


class SurviveWatch:
    """The run's choice, held by the controller (see the module docstring): ``start`` records the
    initial one (and clears an earlier controller's word and reports: a resume measures again),
    ``check`` decides once the running segment's ranks have all reported, ``off_refusal`` says why
    a failure's survivors are not asked, ``launching`` readies the backend for a fresh launch."""

    def __init__(self, choice: Choice, run_dir: Path, events: Any, out: Callable[[str], None],
                 show: Callable[[str], None], check_every_s: float = CHECK_EVERY_S) -> None:
        self.choice, self.run_dir, self.events, self.out, self.show = choice, Path(run_dir), events, out, show
        self.check_every_s = check_every_s
        self.said_cannot = False
        self._next_check = 0.0

    @property
    def measuring(self) -> bool:
        return self.choice.mode == AUTO

    def start(self) -> None:
        choice_file(self.run_dir).unlink(missing_ok=True)
        for f in self._reports():
            f.unlink(missing_ok=True)
        self.events.write(self.choice.event())
        self.show(self.choice.line())
        if self.choice.forced or (self.choice.mode == ON and self.choice.can):
            self.out(self.choice.line())

    def _reports(self) -> list[Path]:
        return sorted(protocol.control_dir(self.run_dir).glob(cost_file(self.run_dir, "*").name))

    def check(self, world: int) -> Choice | None:
        """Under :data:`AUTO`: once at least ``world`` ranks (the running segment's) have reported,
        the word for all (written, said, recorded); else None."""
        if not self.measuring or time.monotonic() < self._next_check:
            return None
        self._next_check = time.monotonic() + self.check_every_s
        ratios = [float(r["ratio"]) for r in (protocol.read_json(f) for f in self._reports())
                  if isinstance(r, dict) and isinstance(r.get("ratio"), (int, float))]
        if len(ratios) < max(1, world):
            return None
        self.choice = decide(ratios)
        protocol.write_json_atomic(choice_file(self.run_dir), {"on": self.choice.mode == ON,
                                                               "ratio": self.choice.ratio, "why": self.choice.why})
        self.events.write(self.choice.event())
        self.show(self.choice.line())
        self.out(self.choice.line())
        return self.choice

    def off_refusal(self) -> str | None:
        """Why a failure's survivors are not asked now (the default measured the copy dear), else None."""
        return self.choice.line() if self.choice.mode == OFF and not self.choice.forced and self.choice.can else None

    def restart_note(self) -> str:
        """Said once with the first restart from the checkpoint where the launcher keeps no survivors."""
        if self.choice.can or self.said_cannot:
            return ""
        self.said_cannot = True
        return f"; {self.choice.line()}"

    def launching(self, backend: Any) -> None:
        """A fresh launch: after the default's "off", its workers are launched keeping no survivors."""
        if self.choice.mode == OFF and not self.choice.forced and getattr(backend, "survive", False):
            backend.survive = False
