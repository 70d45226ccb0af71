"""Table 2 of arXiv 1908.08082: the resize experiment, as a design file and the table's arithmetic.

The design (a YAML file; unknown keys are errors)::

    config: configs/cpu_small.yaml   # training recipe (relative paths: to the design file's folder,
                                     # then to the project root)
    overrides: {total_steps: 240}    # config keys to change
    w_init: 1                        # workers at the start
    w_new: 2                         # workers after the resize
    resize_steps: [80, 160]          # one resized run per step (resize after that step completes)
    repeats: 1                       # runs of every row (--repeats overrides)
    vary_seed: true                  # repeat r trains with seed + r (false: every repeat the same seed)
    slots: 2                         # worker slots (CPU: more than the cores oversubscribes)
    device: auto                     # auto | cpu | cuda
    relaunch: sequential             # how a resize relaunches (elastic-ring train --relaunch):
                                     # sequential (the paper: old workers exit, then new ones start),
                                     # overlap, or prelaunch (new workers start before the stop)
    out: results/table2_cpu          # output folder (--out overrides)

``--set KEY=VALUE`` changes a design key (``--set w_new=4``) or, for any other key, a training
config key on top of ``overrides``; the file is read and checked like every config
(:mod:`elastic_ring.config.base`).

Rows: ``baseline w_init`` (no resize), ``baseline w_new`` (no resize), and ``resize at S`` for each
S (w_init -> w_new after step S). Every row runs the same ``total_steps``, so a row at more
workers also trains on more samples (the per-worker batch is fixed, as in the paper). With
``--set lr_scaling=constant-batch`` every row trains the same global batch instead (``global_batch``,
by default ``batch_size`` x the larger of w_init and w_new; the workers accumulate micro-batches).

Per run, from its events alone (:func:`run_metrics`): steps; epochs = samples consumed / train
set size, samples = sum over segments of steps * batch * workers; wall time = the ``finished``
event's ``wall_s`` (first launch to the end, evaluation included); each resize's overhead
(``resize_overhead``: stop latency, checkpoint, relaunch to first step, total lost); the final test
accuracy and loss (``evaluation``) and the last window's training loss.

Per row (:func:`table2_rows`): mean and sample standard deviation over repeats of each number;
time saved = wall(baseline w_init) - wall(row), paired by repeat, then mean and standard deviation.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Sequence

from pydantic import Field, field_validator, model_validator

from elastic_ring.config.base import Bool, ConfigModel, Int, IntTuple, Section, Str, load, parse_overrides
from elastic_ring.events.api import (Evaluation, Event, Finished, Launch, ResizeOverhead, SegmentEnd, Throughput,
                                     as_event)

PACKAGE = Path(__file__).resolve().parents[1]  # elastic_ring/: its configs/ travel with it when installed


class ResizeDesign(ConfigModel):
    """The blueprint of a Table 2 experiment (the design file's keys; validated on construction)."""

    config: Str
    w_init: Int = Field(ge=1)
    w_new: Int = Field(ge=1)
    resize_steps: IntTuple = Field(min_length=1)
    overrides: Section = {}
    repeats: Int = Field(1, ge=1)
    vary_seed: Bool = True
    slots: Int | None = None
    device: Literal["auto", "cpu", "cuda"] = "auto"
    out: Str = "results/table2"
    relaunch: Literal["prelaunch", "overlap", "sequential"] = "sequential"

    @field_validator("resize_steps")
    @classmethod
    def _increasing(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if any(s < 1 for s in v) or list(v) != sorted(set(v)):
            raise ValueError(f"must be distinct increasing steps >= 1, got {list(v)}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "ResizeDesign":
        if self.w_init == self.w_new:
            raise ValueError(f"w_init and w_new are both {self.w_init}: nothing to resize")
        if self.slots is not None and self.slots < max(self.w_init, self.w_new):
            raise ValueError(f"slots {self.slots} < max(w_init, w_new) = {max(self.w_init, self.w_new)}")
        return self

    def rows(self) -> list[dict[str, Any]]:
        """[{label, workers, schedule: [(step, to)]}] in table order."""
        def n(w: int) -> str:
            return f"{w} worker{'s' if w != 1 else ''}"

        out = [{"label": f"baseline {n(self.w_init)}", "key": f"base-w{self.w_init}",
                "workers": self.w_init, "schedule": []},
               {"label": f"baseline {n(self.w_new)}", "key": f"base-w{self.w_new}",
                "workers": self.w_new, "schedule": []}]
        for s in self.resize_steps:
            out.append({"label": f"{self.w_init} -> {self.w_new} at step {s}",
                        "key": f"resize-{s}", "workers": self.w_init, "schedule": [(s, self.w_new)]})
        return out


def resolve_path(p: str, base: Path) -> Path:
    """A path as given, else relative to ``base`` (the design's folder), else to the package
    (``configs/cpu_small.yaml`` is the packaged ``elastic_ring/configs/cpu_small.yaml``)."""
    path = Path(p)
    if path.is_absolute() or path.exists():
        return path
    for b in (base, PACKAGE):
        if (b / path).exists():
            return b / path
    return path


def load_design(path: str | Path, overrides: Sequence[str] | Mapping[str, Any] = ()) -> ResizeDesign:
    """Read and validate a design file, with ``--set`` overrides.

    An override whose key is a design key (``w_new=4``, ``resize_steps=[50,100]``) changes the
    design; any other key is a training config key and joins the design's ``overrides`` (checked
    when the training config is loaded).

    Raises:
        ConfigError: unreadable or invalid YAML, unknown or missing keys, bad values.
    """
    changes = overrides if isinstance(overrides, Mapping) else parse_overrides(overrides)
    routed = {k if k.split(".")[0] in ResizeDesign.model_fields else f"overrides.{k}": v
              for k, v in changes.items()}
    return load(ResizeDesign, path, routed)


# ---------------------------------------------------------------------------- per-run numbers
def run_metrics(events: Iterable[Event | Mapping[str, Any]], batch_size: int, train_size: int,
                global_batch: int = 0) -> dict[str, Any]:
    """The numbers of one finished run, from its events (module docstring); an event given as its
    line's dict is read as its typed record. ``global_batch``: a constant-batch run's samples per
    step at every world size (0: ``batch_size`` per worker)."""
    recs = [as_event(e) for e in events]
    launches = sorted((e for e in recs if isinstance(e, Launch)), key=lambda e: e.segment)
    ends = {e.segment: e for e in recs if isinstance(e, SegmentEnd)}
    samples, steps = 0, 0
    for ln in launches:
        end = ends.get(ln.segment)
        if end is None:
            continue
        n = int(end.step) - (int(ln.start_step) - 1)
        steps += n
        samples += n * (global_batch or batch_size * int(ln.world_size))
    fin = [e for e in recs if isinstance(e, Finished)]
    evals = [e for e in recs if isinstance(e, Evaluation)]
    thr = [e for e in recs if isinstance(e, Throughput)]
    ov = [e for e in recs if isinstance(e, ResizeOverhead)]
    return {
        "finished": bool(fin),
        "steps": steps,
        "samples": samples,
        "epochs": samples / train_size if train_size else None,
        "wall_s": float(fin[-1].wall_s) if fin else None,
        "resizes": [{"from_workers": e.from_workers, "to_workers": e.to_workers, "step": e.step,
                     "stop_latency_s": e.stop_latency_s, "checkpoint_s": e.checkpoint_s,
                     "relaunch_to_first_step_s": e.relaunch_to_first_step_s, "total_lost_s": e.total_lost_s}
                    for e in ov],
        "overhead_s": sum(float(e.total_lost_s) for e in ov) if ov else None,
        "test_accuracy": float(evals[-1].test_accuracy) if evals else None,
        "test_loss": float(evals[-1].test_loss) if evals else None,
        "train_loss": float(thr[-1].loss) if thr else None,
    }


def mean_sd(xs: Iterable[float | None]) -> dict[str, Any]:
    """{mean, sd, n} of the values that are not None (sd None below 2 values)."""
    v = [float(x) for x in xs if x is not None]
    if not v:
        return {"mean": None, "sd": None, "n": 0}
    return {"mean": statistics.fmean(v), "sd": statistics.stdev(v) if len(v) > 1 else None, "n": len(v)}


def table2_rows(design_rows: list[dict[str, Any]], runs: dict[str, list[dict[str, Any]]],
                baseline_key: str) -> list[dict[str, Any]]:
    """Aggregate per-run metrics into Table 2 rows.

    Args:
        design_rows: :meth:`ResizeDesign.rows`.
        runs: row key -> per-repeat metrics (index = repeat; None for a missing run).
        baseline_key: the key of the w_init baseline (time saved is against it).
    """
    base = runs.get(baseline_key, [])
    out = []
    for r in design_rows:
        ms = runs.get(r["key"], [])
        saved, saved_pct = [], []
        for i, m in enumerate(ms):
            b = base[i] if i < len(base) else None
            if m and b and m.get("wall_s") is not None and b.get("wall_s") is not None:
                saved.append(b["wall_s"] - m["wall_s"])
                saved_pct.append((b["wall_s"] - m["wall_s"]) / b["wall_s"])
        ok = [m for m in ms if m]
        out.append({
            "label": r["label"], "key": r["key"], "workers": r["workers"],
            "reference": r["key"] == baseline_key,
            "schedule": [list(s) for s in r["schedule"]], "repeats": len(ok),
            "steps": mean_sd(m["steps"] for m in ok),
            "epochs": mean_sd(m["epochs"] for m in ok),
            "wall_s": mean_sd(m["wall_s"] for m in ok),
            "overhead_s": mean_sd(m["overhead_s"] for m in ok) if r["schedule"] else mean_sd([]),
            "stop_latency_s": mean_sd(x["stop_latency_s"] for m in ok for x in m["resizes"]),
            "checkpoint_s": mean_sd(x["checkpoint_s"] for m in ok for x in m["resizes"]),
            "relaunch_to_first_step_s": mean_sd(x["relaunch_to_first_step_s"] for m in ok for x in m["resizes"]),
            "time_saved_s": mean_sd(saved),
            "time_saved_frac": mean_sd(saved_pct),
            "test_accuracy": mean_sd(m["test_accuracy"] for m in ok),
            "test_loss": mean_sd(m["test_loss"] for m in ok),
            "train_loss": mean_sd(m["train_loss"] for m in ok),
        })
    return out


def _fmt(s: dict[str, Any], fmt: str, scale: float = 1.0, suffix: str = "") -> str:
    if s["mean"] is None:
        return "-"
    txt = format(s["mean"] * scale, fmt)
    if s["sd"] is not None:
        txt += " ± " + format(s["sd"] * scale, fmt)
    return txt + suffix


def render_table2(rows: list[dict[str, Any]], markdown: bool = False) -> str:
    """Table 2 as plain text or Markdown; ``a ± b`` is mean ± sample sd over repeats."""
    from elastic_ring.profile.api import _render

    head = ["run", "n", "steps", "epochs", "wall s", "resize overhead s", "time saved s",
            "time saved", "test acc", "test loss", "train loss"]
    body = []
    for r in rows:
        saved = "(reference)" if r.get("reference") else None
        body.append([r["label"], str(r["repeats"]), _fmt(r["steps"], ".0f"), _fmt(r["epochs"], ".2f"),
                     _fmt(r["wall_s"], ".1f"), _fmt(r["overhead_s"], ".2f"),
                     saved or _fmt(r["time_saved_s"], ".1f"),
                     saved or _fmt(r["time_saved_frac"], ".1f", 100, "%"),
                     _fmt(r["test_accuracy"], ".2f", 100, "%"), _fmt(r["test_loss"], ".4f"),
                     _fmt(r["train_loss"], ".4f")])
    return _render(head, body, markdown)
