"""Run a Table 2 design (:mod:`.resize`): every row, every repeat, then ``table2.json`` and ``table2.md``.

Runs go to ``OUT/runs/<row>-r<repeat>/`` (each an ordinary training run with events.jsonl). The
order interleaves rows within a repeat (repeat 0: all rows, then repeat 1: all rows, ...), so a
slow drift of the machine's load spreads over the rows instead of biasing one. A run that already
finished with the same config is reused, so a longer ``--repeats`` extends an experiment.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import yaml

from elastic_ring.config.api import TrainConfig, config_to_dict
from elastic_ring.controller.api import Resize
from elastic_ring.errors import UserError
from elastic_ring.events.api import read_events
from elastic_ring.experiment.resize import ResizeDesign, render_table2, run_metrics, table2_rows
from elastic_ring.profile.profiler import run_finished, say, start_run, train_set_size
from elastic_ring.words import count


@dataclass(frozen=True)
class Table2:
    """A Table 2 experiment run: ``table2.json``'s dict and what it was run on."""

    design: ResizeDesign
    config: TrainConfig
    device: str
    out: Path
    result: dict[str, Any]

    def text(self) -> str:
        """What ``elastic-ring experiment resize`` prints: the heading, the table, the files written."""
        d, c = self.design, self.config
        return "\n".join([
            f"Table 2: {d.w_init} -> {d.w_new} workers, ResNet-{c.depth}/{c.width} on {c.dataset} "
            f"({self.device}), {c.total_steps} steps, batch {c.batch_size}/worker, relaunch {d.relaunch}; "
            f"mean ± sd over {d.repeats} repeat(s)",
            render_table2(self.result["rows"]), "",
            f"wrote {self.out / 'table2.json'} and {self.out / 'table2.md'}; plots: elastic-ring report {self.out}"])


def run_table2(design_path: str, repeats: int | None = None, out_dir: str | None = None,
               overrides: Sequence[str] = (), slots: int | None = None, device: str | None = None,
               relaunch: str | None = None, note: Callable[[str], None] = say) -> Table2:
    """Read the design (``--set`` ``overrides`` and the flags given on top), check it against the
    config, the device and the slots, then run (or reuse) every run and write the tables. ``note``
    gets the warnings (a GPU without NCCL, more workers than CPU cores).

    Raises:
        UserError: a design the config or the machine cannot run (one line).
    """
    from elastic_ring.config.api import load_config
    from elastic_ring.config.base import parse_overrides
    from elastic_ring.controller.runs import resolve_device
    from elastic_ring.data import check_dataset
    from elastic_ring.experiment.resize import load_design, resolve_path

    flags = {k: v for k, v in (("repeats", repeats), ("relaunch", relaunch)) if v is not None}
    design = load_design(design_path, parse_overrides(overrides) | flags)
    dev, ngpu, _ = resolve_device(device or design.device, note)
    cfg_path = resolve_path(design.config, Path(design_path).resolve().parent)
    cfg = load_config(cfg_path, design.overrides, device=dev)
    if cfg.lr_scaling == "constant-batch" and not cfg.global_batch:  # every row the same global batch,
        cfg = cfg.replace(global_batch=cfg.batch_size * max(design.w_init, design.w_new))  # at any size
    last = max(design.resize_steps)
    if last >= cfg.total_steps:
        raise UserError(f"resize step {last} is not before the last step ({cfg.total_steps})")
    need = max(design.w_init, design.w_new)
    n_slots = slots or design.slots or (ngpu if dev == "cuda" else max(need, os.cpu_count() or 1))
    if n_slots < need:
        raise UserError(f"{count(need, 'worker')} needed but only {n_slots} slot(s)")
    if dev == "cuda" and need > ngpu:
        raise UserError(f"the design needs {need} GPUs but {ngpu} are visible")
    check_dataset(cfg.dataset, cfg.data_dir)
    out = Path(out_dir or design.out)
    if dev == "cpu" and need > (os.cpu_count() or 1):
        note(f"elastic-ring: note: {need} workers on {os.cpu_count()} CPU cores oversubscribe them")
    result = run_design(design, cfg, out, n_slots, dev, design_path=str(design_path))
    return Table2(design, cfg, dev, out, result)


def run_design(design: ResizeDesign, cfg: TrainConfig, out_dir: Path, slots: int, device: str,
               out: Callable[[str], None] = say, show_progress: bool | None = None,
               design_path: str | None = None) -> dict[str, Any]:
    """Run (or reuse) every run of the design and write the tables; returns ``table2.json``'s dict."""
    rows = design.rows()
    n_total = len(rows) * design.repeats
    train_size = train_set_size(cfg)
    runs: dict[str, list[dict[str, Any] | None]] = {r["key"]: [] for r in rows}
    run_dirs: dict[str, list[str]] = {r["key"]: [] for r in rows}
    t0 = time.time()
    done = 0
    for rep in range(design.repeats):
        rcfg = cfg.replace(seed=cfg.seed + rep) if design.vary_seed else cfg
        for r in rows:
            done += 1
            rd = out_dir / "runs" / f"{r['key']}-r{rep}"
            tag = f"experiment [{done}/{n_total}] {r['label']} (repeat {rep + 1}/{design.repeats})"
            same = False
            if run_finished(rd):
                try:
                    same = yaml.safe_load((rd / "config.yaml").read_text()) == config_to_dict(rcfg) and \
                        [tuple(x) for x in json.loads((rd / "run.json").read_text())["schedule"]] == \
                        [tuple(s) for s in r["schedule"]] and \
                        json.loads((rd / "run.json").read_text()).get("relaunch", "prelaunch") == design.relaunch
                except (OSError, ValueError, KeyError, yaml.YAMLError):
                    same = False
            if same:
                out(f"{tag}: reusing the finished run in {rd}")
            else:
                out(f"{tag}: {rcfg.total_steps} steps; run folder {rd}")
                start_run(rd, rcfg, r["workers"], tuple(Resize(s, w) for s, w in r["schedule"]),
                          slots, device, out=out, show_progress=show_progress, relaunch=design.relaunch)
            m = run_metrics(read_events(rd / "events.jsonl"), rcfg.batch_size, train_size,
                            global_batch=rcfg.global_batch)
            m["run_dir"] = str(rd)
            m["seed"] = rcfg.seed
            runs[r["key"]].append(m)
            run_dirs[r["key"]].append(str(rd))
            acc = "n/a" if m["test_accuracy"] is None else f"{100 * m['test_accuracy']:.2f}%"
            out(f"{tag}: wall {m['wall_s']:.1f} s, test accuracy {acc} ({time.time() - t0:.0f} s so far)")
    base_key = rows[0]["key"]
    table = table2_rows(rows, runs, base_key)
    result = {
        "design": {**design.__dict__, "resize_steps": list(design.resize_steps), "path": design_path},
        "config": config_to_dict(cfg), "device": device, "slots": slots, "cpu_count": os.cpu_count(),
        "train_set_size": train_size, "rows": table, "runs": runs,
        "notes": ("wall_s: first launch to the end of the run (final evaluation included), from the "
                  "run's finished event; time saved = wall(baseline w_init) - wall(row), paired by "
                  "repeat; epochs = samples consumed / train set size; a ± b = mean ± sample sd"),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir / ".table2.json.tmp"
    tmp.write_text(json.dumps(result, indent=2))
    os.replace(tmp, out_dir / "table2.json")
    (out_dir / "table2.md").write_text(table2_markdown(result))
    return result


def table2_markdown(result: dict[str, Any]) -> str:
    d, c = result["design"], result["config"]
    head = (f"# Table 2: resize {d['w_init']} -> {d['w_new']} workers "
            f"(ResNet-{c['depth']}/{c['width']} on {c['dataset']}, {result['device']}, "
            f"{c['total_steps']} steps, batch {c['batch_size']}/worker, relaunch: "
            f"{d.get('relaunch', 'prelaunch')})\n\n")
    reps = max((r["repeats"] for r in result["rows"]), default=0)
    return (head + render_table2(result["rows"], markdown=True) + "\n\n"
            + f"{reps} repeat(s) per row; " + result["notes"] + ".\n")
