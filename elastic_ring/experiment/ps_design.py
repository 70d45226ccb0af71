"""The Table I experiment's design (:mod:`elastic_ring.experiment.ps_sync`): the design file as
written (:class:`DesignSpec`, validated like every config), expanded by :func:`load_design` into a
:class:`Design` of :class:`Cell` s, one :class:`~elastic_ring.ps.api.PSConfig` per (heterogeneity,
paradigm), with each run's folder.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from pydantic import Field, field_validator, model_validator

from elastic_ring.config.base import ConfigModel, Float, FloatTuple, Int, IntTuple, Section, Str, build, load
from elastic_ring.errors import ConfigError
from elastic_ring.ps.api import PSConfig


def _named(kind: str, entries: list[dict[str, Any]], required: tuple[str, ...]) -> list[dict[str, Any]]:
    if not entries:
        raise ValueError("must be a non-empty list")
    for i, e in enumerate(entries):
        if any(k not in e for k in required):
            raise ValueError(f"{kind} {i + 1} needs {' and '.join(required)}")
    if len({slug(str(e["name"])) for e in entries}) != len(entries):
        raise ValueError("names must be distinct")
    return entries


class DesignSpec(ConfigModel):
    """The design file as written (module docstring); :func:`load_design` expands it into a
    :class:`Design`. ``base``, each ``heterogeneity`` and each ``paradigms`` entry hold
    :class:`PSConfig` keys (besides ``name``), merged in that order into every cell's config."""

    out: Str = "results/ps_table1"
    seeds: IntTuple = (0,)
    targets: FloatTuple
    references: tuple[Str, ...] = ()
    parallel: Int = Field(1, ge=1)
    bootstrap: Int = Field(5000, ge=100)
    margin: Float = Field(1.25, gt=1)
    base: Section = {}
    heterogeneity: list[dict[str, Any]] = [{"name": "base"}]
    paradigms: list[dict[str, Any]]
    engine: Literal["mpi", "inprocess"] = "mpi"

    @field_validator("seeds")
    @classmethod
    def _distinct(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v or len(set(v)) != len(v):
            raise ValueError(f"need at least one seed, each once, got {list(v)}")
        return v

    @field_validator("targets")
    @classmethod
    def _fractions(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if not v or any(not 0 < t <= 1 for t in v):
            raise ValueError(f"need accuracies in (0, 1], got {list(v)}")
        return v

    @field_validator("heterogeneity")
    @classmethod
    def _hets(cls, v: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return _named("entry", v, ("name",))

    @field_validator("paradigms")
    @classmethod
    def _paradigms(cls, v: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return _named("entry", v, ("name", "sync"))

    @model_validator(mode="after")
    def _references(self) -> "DesignSpec":
        missing = sorted(set(self.references) - {str(p["name"]) for p in self.paradigms})
        if missing:
            raise ValueError(f"reference(s) {', '.join(missing)} not among the paradigms")
        return self


@dataclass(frozen=True)
class Cell:
    """One (heterogeneity, paradigm) of the design; per seed: ``cfg.replace(seed=...)``."""

    het: str
    paradigm: str
    cfg: PSConfig


@dataclass(frozen=True)
class Design:
    """A :class:`DesignSpec` expanded: every cell's :class:`PSConfig` built, seeds and paradigms
    narrowed by the command line."""

    out: Path
    seeds: tuple[int, ...]
    targets: tuple[float, ...]
    paradigms: tuple[str, ...]
    hets: tuple[str, ...]
    cells: dict[tuple[str, str], Cell]
    references: tuple[str, ...]
    parallel: int
    bootstrap: int
    margin: float
    source: str
    engine: str = "mpi"

    def cell(self, het: str, paradigm: str) -> Cell:
        return self.cells[(het, paradigm)]

    def run_dir(self, het: str, paradigm: str, seed: int) -> Path:
        return self.out / "runs" / slug(het) / f"{slug(paradigm)}-seed{seed}"


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower()


def load_design(path: str | Path, overrides: Sequence[str] | Mapping[str, Any] = (),
                seeds: int | None = None, only: tuple[str, ...] = ()) -> Design:
    """Read and validate a design, then build every cell's config.

    Args:
        overrides: ``--set`` of design keys (``parallel=3``, ``seeds=[0,1]``, ``out=...``) or of
            the shared ps settings (``base.time_budget_s=10``).
        seeds: keep only the first N seeds. only: keep only these paradigm names.

    Raises:
        ConfigError: the design or a cell's config is invalid (one line naming the cell).
    """
    spec = load(DesignSpec, path, overrides)
    source = f"{path} + overrides" if overrides else str(path)
    seed_list = spec.seeds
    if seeds is not None:
        if seeds < 1:
            raise ConfigError(f"--seeds must be >= 1, got {seeds}")
        seed_list = seed_list[:seeds]
    cells = {}
    for h in spec.heterogeneity:
        for p in spec.paradigms:
            values = spec.base | {k: v for k, v in h.items() if k != "name"} | {k: v for k, v in p.items() if k != "name"}
            src = f"{source} heterogeneity {h['name']!r} paradigm {p['name']!r}"
            cfg = build(PSConfig, values, src)
            if spec.engine == "inprocess" and cfg.clock != "virtual":
                raise ConfigError(f"{src}: engine inprocess needs clock: virtual")
            cells[(str(h["name"]), str(p["name"]))] = Cell(str(h["name"]), str(p["name"]), cfg)
    names = tuple(str(p["name"]) for p in spec.paradigms)
    if only:
        missing = sorted(set(only) - set(names))
        if missing:
            raise ConfigError(f"--only: no paradigm named {', '.join(missing)} (have: {', '.join(names)})")
        names = tuple(n for n in names if n in only)
    return Design(Path(spec.out), seed_list, spec.targets, names, tuple(str(h["name"]) for h in spec.heterogeneity),
                  cells, spec.references, spec.parallel, spec.bootstrap, spec.margin, str(path), spec.engine)
