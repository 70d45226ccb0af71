"""The one configuration layer: a frozen pydantic model, one loader and one error format.

Every configuration of the project is a :class:`ConfigModel`: :class:`~elastic_ring.config.api.TrainConfig`
(``train``, ``profile``, ``experiment resize``'s runs), :class:`~elastic_ring.ps.api.PSConfig`
(``ps``), :class:`~elastic_ring.experiment.resize.ResizeDesign` (``experiment resize``) and
:class:`~elastic_ring.experiment.ps_design.DesignSpec` (``ps experiment``). A model declares its keys,
types, defaults and ranges; the layer does the rest the same way for all of them:

- :func:`load` reads a YAML mapping, applies ``--set key=value`` overrides (values read as YAML
  scalars; ``a.b=v`` sets key ``b`` of the mapping ``a``) and validates; :func:`build` validates a
  mapping already in memory. Both raise :class:`~elastic_ring.errors.ConfigError`.
- An unknown key, a value of the wrong type or out of range is ONE line naming the source and the
  key (:func:`config_error`)::

      configs/x.yaml + overrides: unknown key 'foo' (known: augment, batch_size, ...)
      configs/x.yaml + overrides: batch_size: must be >= 1, got 0
      configs/x.yaml + overrides: augment: wrong type, expected a boolean, got 'maybe'

- Scalars are read alike everywhere (:data:`Int`, :data:`Float`, :data:`Bool`, :data:`Str`): an
  integer refuses 2.5 and booleans, a boolean takes true/false/yes/no/on/off/1/0 as text, and a
  tuple takes a YAML list, one number, or text such as ``"0.5,0.75"``.
- An instance is frozen; :meth:`ConfigModel.replace` re-validates, :meth:`ConfigModel.to_dict` is
  JSON-able (tuples as lists), as run folders store it.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Mapping, Sequence, TypeVar

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError
from pydantic_core import PydanticCustomError

from elastic_ring.errors import ConfigError

M = TypeVar("M", bound="ConfigModel")

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _wrong(kind: str) -> PydanticCustomError:
    return PydanticCustomError(f"{kind}_type", "wrong type")


def _int(v: Any) -> Any:
    if isinstance(v, bool):
        raise _wrong("int")
    return v


def _float(v: Any) -> Any:
    if isinstance(v, bool):
        raise _wrong("float")
    return v


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in _TRUE + _FALSE:
        return v.strip().lower() in _TRUE
    raise _wrong("bool")


def _str(v: Any) -> Any:
    return str(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v


def _items(v: Any) -> Any:
    """A YAML list as is; ``"0.5,0.75"`` or ``"[0.5, 0.75]"`` split on commas; one number as one item."""
    if isinstance(v, str):
        return [x.strip() for x in v.replace("[", "").replace("]", "").split(",") if x.strip()]
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return [v]
    return v


Int = Annotated[int, BeforeValidator(_int)]
Float = Annotated[float, BeforeValidator(_float)]
Bool = Annotated[bool, BeforeValidator(_bool)]
Str = Annotated[str, BeforeValidator(_str)]
FloatTuple = Annotated[tuple[Float, ...], BeforeValidator(_items)]
IntTuple = Annotated[tuple[Int, ...], BeforeValidator(_items)]
# a mapping of keys to values; a YAML key left empty (``overrides:``) is the empty mapping
Section = Annotated[dict[str, Any], BeforeValidator(lambda v: {} if v is None else v)]


class ConfigModel(BaseModel):
    """Base of every configuration: unknown keys are refused and an instance is frozen.

    User input goes through :func:`load` or :func:`build` (a one-line :class:`ConfigError`);
    constructing one directly in code (``PSConfig(workers=2)``) raises pydantic's
    ``ValidationError`` on a bad value.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    def replace(self: M, **changes: Any) -> M:
        """A copy with ``changes`` applied, validated again (a bad change is a ConfigError)."""
        return build(type(self), self.model_dump() | changes, source="overrides")

    def to_dict(self) -> dict[str, Any]:
        """The values as plain JSON-able data (tuples as lists), as run folders store them."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.model_dump().items()}


def build(cls: type[M], values: Mapping[str, Any], source: str) -> M:
    """Validate ``values`` as a ``cls``.

    Raises:
        ConfigError: one line, ``SOURCE: ...`` (see :func:`config_error`).
    """
    try:
        return cls.model_validate(dict(values))
    except ValidationError as e:
        raise config_error(e, source, cls) from None


def load(cls: type[M], path: str | Path | None = None,
         overrides: Sequence[str] | Mapping[str, Any] = ()) -> M:
    """THE loader: the YAML file at ``path`` (none: no file), then ``overrides``, validated.

    Args:
        cls: the model to build.
        path: a YAML mapping of the model's keys.
        overrides: ``--set`` strings ``key=value`` (see :func:`parse_overrides`) or a mapping of
            values already typed (the CLI's dedicated flags; a None value is skipped). A dotted key
            ``a.b`` sets key ``b`` of the mapping under ``a``.

    Raises:
        ConfigError: unreadable file, invalid YAML, a bad ``--set``, unknown key, wrong type or
            invalid value; the message names the source, e.g. ``configs/x.yaml + overrides``.
    """
    values = read_yaml(path) if path is not None else {}
    if isinstance(overrides, Mapping):
        changes = {k: v for k, v in overrides.items() if v is not None}
    else:
        changes = parse_overrides(overrides)
    for key, value in changes.items():
        *parents, leaf = key.split(".")
        node = values
        for i, part in enumerate(parents):
            if node.get(part) is None:
                node[part] = {}
            node = node[part]
            if not isinstance(node, dict):
                raise ConfigError(f"--set {key}: {'.'.join(parents[:i + 1])} is not a mapping")
        node[leaf] = value
    source = str(path) if path is not None else "defaults"
    if changes:
        source = f"{path} + overrides" if path is not None else "overrides"
    return build(cls, values, source)


def config_file(path: str | Path) -> Path:
    """``path`` as given; a relative ``configs/NAME`` that does not exist from here is the file the
    package carries (``elastic_ring/configs/NAME``), so that the commands of the docs run from any
    folder once the package is installed (in a checkout, ``configs/`` links to the same files)."""
    p = Path(path)
    if not p.is_absolute() and p.parts[:1] == ("configs",) and not p.exists():
        packaged = Path(str(resources.files("elastic_ring"))) / p
        if packaged.is_file():
            return packaged
    return p


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping (:func:`config_file` finds it), raising :class:`ConfigError` with one line
    on any problem."""
    p = config_file(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read config {p}: {e.strerror or e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        raise ConfigError(f"config {p} is not valid YAML{line}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config {p} must be a mapping of keys to values")
    return data


def parse_overrides(pairs: Sequence[str]) -> dict[str, Any]:
    """Parse ``key=value`` strings; values are read as YAML scalars (``[1, 2]`` as a list)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set expects key=value, got {pair!r}")
        try:
            out[key.strip()] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            out[key.strip()] = raw
    return out


# ------------------------------------------------------------------------------- the one format
_EXPECTED = {"int": "an integer", "float": "a number", "bool": "a boolean", "string": "a string",
             "list": "a list", "tuple": "a list", "dict": "a mapping"}
_BOUNDS = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}


def _where(loc: Sequence[Any]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return f"{out}: " if out else ""


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _describe(err: Mapping[str, Any]) -> str:
    kind, ctx, got = err["type"], err.get("ctx") or {}, _shown(err.get("input"))
    head = kind.split("_")[0]
    if head in _EXPECTED and kind.endswith(("_type", "_parsing", "_from_float")):
        return f"wrong type, expected {_EXPECTED[head]}, got {got}"
    if kind in _BOUNDS:
        bound = next(iter(ctx.values()))
        return f"must be {_BOUNDS[kind]} {bound:g}, got {got}"
    if kind == "literal_error":
        return f"must be one of {ctx['expected']}, got {got}"
    if kind == "too_short":
        return f"needs at least {ctx['min_length']} item(s), got {got}"
    if kind == "finite_number":
        return f"must be a finite number, got {got}"
    if kind == "value_error":
        return str(ctx["error"])
    return f"{err['msg']}, got {got}"


def config_error(err: ValidationError, source: str, cls: type[BaseModel] | None = None) -> ConfigError:
    """THE error format: a pydantic error as one line ``SOURCE: [KEY: ]PROBLEM[; ...]``.

    Unknown keys come first (``unknown key 'foo' (known: a, b)``), then one ``key: problem`` per
    other error in field order; a rule between several keys has no ``key:`` prefix.
    """
    unknown: dict[tuple, list[str]] = {}
    problems = []
    for e in err.errors(include_url=False):
        loc = tuple(e["loc"])
        if e["type"] == "extra_forbidden":
            unknown.setdefault(loc[:-1], []).append(repr(str(loc[-1])))
        elif e["type"] == "missing":
            problems.append(f"{_where(loc[:-1])}missing required key {str(loc[-1])!r}")
        else:
            problems.append(_where(loc) + _describe(e))
    heads = []
    for parent, keys in unknown.items():
        known = sorted(cls.model_fields) if cls is not None and not parent else []
        heads.append(f"{_where(parent)}unknown key{'s' if len(keys) > 1 else ''} {', '.join(keys)}"
                     + (f" (known: {', '.join(known)})" if known else ""))
    text = "; ".join(heads + problems)
    return ConfigError(" ".join(f"{source}: {text}".split("\n")))
