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
    rules: [linear, constant-batch]  # optional: every row under each batch rule (--rules overrides)
    accuracy_margin: 0.005           # with rules: time each row to the reference's final accuracy - this

``--set KEY=VALUE`` changes a design key (``--set w_new=4``) or, for any other key, a training
config key on top of ``overrides``; the file is read and checked like every config
(:mod:`elastic_ring.config.base`).

Rows: ``baseline w_init`` (no resize), ``baseline w_new`` (no resize), and ``resize at S`` for each
S (w_init -> w_new after step S). Every row runs the same ``total_steps``, so a row at more
workers also trains on more samples (the per-worker batch is fixed, as in the paper). With
``--set lr_scaling=constant-batch`` every row trains the same global batch instead (``global_batch``,
by default ``batch_size`` x the larger of w_init and w_new; the workers accumulate micro-batches).

Rules compared (``rules``, ``--rules linear,constant-batch``): the design's rows under each batch
rule, in one experiment. ``linear`` (Eq. 7): the rows above, keys as without ``rules``;
``constant-batch``: the no-resize run at w_init and each resized run, every one with the global
batch ``batch_size`` x max(w_init, w_new) (keys ``constant-batch-...``); ``sqrt`` and ``none``: the
rows of ``linear`` under that rule. Each row then also gets, per repeat, its final test accuracy's
spread (min-max) and the time to reach an accuracy (:func:`time_to_accuracy`): the elapsed time
from the first launch to the first evaluation at or above the target, the target being the
reference row's (the first rule's no-resize run at w_init) mean final accuracy less
``accuracy_margin`` (so every row is timed to the same accuracy).

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

from elastic_ring.config.base import Bool, ConfigModel, Float, Int, IntTuple, Section, Str, load, parse_overrides
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
    rules: tuple[Literal["linear", "sqrt", "none", "constant-batch"], ...] = ()
    accuracy_margin: Float = Field(0.005, ge=0, le=1)

    @field_validator("rules", mode="before")
    @classmethod
    def _rules_list(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = [x.strip() for x in v.split(",") if x.strip()]
        return () if v is None else v

    @field_validator("rules")
    @classmethod
    def _distinct(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(v)) != len(v):
            raise ValueError(f"must be distinct rules, got {list(v)}")
        return v

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

        out = []
        for rule in self.rules or (None,):
            pre, tail = ("", "") if rule in (None, "linear") else (f"{rule}-", f", {rule}")
            if rule == "linear" and len(self.rules) > 1:
                tail = ", Eq. 7"
            bases = [self.w_init] if rule == "constant-batch" else [self.w_init, self.w_new]
            for w in bases:
                out.append({"label": f"baseline {n(w)}{tail}", "key": f"{pre}base-w{w}", "workers": w,
                            "schedule": [], "rule": rule})
            for s in self.resize_steps:
                out.append({"label": f"{self.w_init} -> {self.w_new} at step {s}{tail}", "key": f"{pre}resize-{s}",
                            "workers": self.w_init, "schedule": [(s, self.w_new)], "rule": rule})
        return out


def rule_config(cfg: Any, rule: str | None, design: ResizeDesign) -> Any:
    """The training config of a row under ``rule`` (None: ``cfg`` as it is): ``constant-batch``
    with the config's global batch, else ``batch_size`` x max(w_init, w_new); the other rules with
    no global batch."""
    if rule is None:
        return cfg
    if rule == "constant-batch":
        return cfg.replace(lr_scaling=rule, global_batch=cfg.global_batch or
                           cfg.batch_size * max(design.w_init, design.w_new))
    return cfg.replace(lr_scaling=rule, global_batch=0)


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
    t0 = float(launches[0].time) if launches and launches[0].time is not None else None
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
        # (seconds since the first launch, step, test accuracy) of every evaluation, in order
        "accuracy_curve": [[float(e.time) - t0, int(e.step), float(e.test_accuracy)] for e in evals
                           if e.time is not None] if t0 is not None else [],
    }


def time_to_accuracy(metrics: Mapping[str, Any], target: float) -> float | None:
    """Seconds from the run's first launch to its first evaluation at or above ``target`` (None:
    never reached, or no evaluations)."""
    for t, _, acc in metrics.get("accuracy_curve") or ():
        if acc >= target:
            return float(t)
    return None


def min_max(xs: Iterable[float | None]) -> dict[str, Any]:
    """{min, max, n} of the values that are not None."""
    v = [float(x) for x in xs if x is not None]
    return {"min": min(v) if v else None, "max": max(v) if v else None, "n": len(v)}


def mean_sd(xs: Iterable[float | None]) -> dict[str, Any]:
    """{mean, sd, n} of the values that are not None (sd None below 2 values)."""
    v = [float(x) for x in xs if x is not None]
    if not v:
        return {"mean": None, "sd": None, "n": 0}
    return {"mean": statistics.fmean(v), "sd": statistics.stdev(v) if len(v) > 1 else None, "n": len(v)}


def table2_rows(design_rows: list[dict[str, Any]], runs: dict[str, list[dict[str, Any]]],
                baseline_key: str, accuracy_margin: float | None = None) -> list[dict[str, Any]]:
    """Aggregate per-run metrics into Table 2 rows.

    Args:
        design_rows: :meth:`ResizeDesign.rows`.
        runs: row key -> per-repeat metrics (index = repeat; None for a missing run).
        baseline_key: the key of the w_init baseline (time saved is against it).
        accuracy_margin: given (rules compared), each row also gets ``test_accuracy_range`` and
            ``time_to_accuracy_s`` (mean ± sd and min-max over repeats) to the target: the
            baseline's mean final accuracy less this margin (``accuracy_target``).
    """
    base = runs.get(baseline_key, [])
    target = None
    if accuracy_margin is not None:
        ref = mean_sd(m["test_accuracy"] for m in base if m)["mean"]
        target = None if ref is None else ref - accuracy_margin
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
        if accuracy_margin is not None:
            reach = [time_to_accuracy(m, target) if target is not None else None for m in ok]
            out[-1].update({
                "rule": r.get("rule"), "accuracy_target": target,
                "test_accuracy_range": min_max(m["test_accuracy"] for m in ok),
                "time_to_accuracy_s": {**mean_sd(reach), **{k: v for k, v in min_max(reach).items() if k != "n"},
                                       "reached": sum(x is not None for x in reach)},
                "wall_s_range": min_max(m["wall_s"] for m in ok)})
    return out


def render_rules(rows: list[dict[str, Any]], markdown: bool = False) -> str:
    """The rules' comparison: final test accuracy and the time to the common target accuracy, each
    as mean ± sd [min-max] over repeats (rows of :func:`table2_rows` with ``accuracy_margin``)."""
    from elastic_ring.profile.api import _render

    def rng(d: dict[str, Any], fmt: str, scale: float = 1.0) -> str:
        if d.get("min") is None:
            return ""
        return f" [{format(d['min'] * scale, fmt)}-{format(d['max'] * scale, fmt)}]"

    head = ["run", "rule", "n", "final test acc", "time to target s", "reached", "wall s"]
    body = []
    for r in rows:
        t = r["time_to_accuracy_s"]
        body.append([r["label"], r.get("rule") or "-", str(r["repeats"]),
                     _fmt(r["test_accuracy"], ".2f", 100, "%") + rng(r["test_accuracy_range"], ".2f", 100),
                     _fmt(t, ".1f") + rng(t, ".1f"), f"{t['reached']}/{r['repeats']}",
                     _fmt(r["wall_s"], ".1f") + rng(r["wall_s_range"], ".1f")])
    return _render(head, body, markdown)


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
