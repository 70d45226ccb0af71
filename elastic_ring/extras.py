"""Which optional part of the install (a pip extra) each command and module needs.

``pip install elastic-ring`` is the base: the launcher, the controller, the worker library and the
torch collective. The rest are extras of ``pyproject.toml``: ``[horovod]``, ``[ray]``,
``[cluster]``, ``[sim]``, ``[ps]``, ``[report]`` (``[all]``: every one). A command whose extra is
missing stops before it starts with one line naming the extra (:class:`MissingExtra`, exit 2):
the CLI asks :func:`require` before it imports a command (:data:`COMMAND_NEEDS`), and turns a
``ModuleNotFoundError`` of a module listed in :data:`EXTRA_OF` met later (an option's lazy import,
e.g. ``train --backend ray``) into the same line (:func:`from_import_error`).
"""

from __future__ import annotations

import importlib.util

from elastic_ring.errors import UserError

# top-level module -> the extra that installs it
EXTRA_OF: dict[str, str] = {
    "horovod": "horovod",
    "ray": "ray",
    "starlette": "cluster",
    "uvicorn": "cluster",
    "prometheus_client": "cluster",
    "numba": "sim",
    "scipy": "sim",
    "mpi4py": "ps",
    "matplotlib": "report",
    "tensorboard": "report",
}

# command -> (its extra, the modules of it that the command cannot start without)
COMMAND_NEEDS: dict[str, tuple[str, tuple[str, ...]]] = {
    # the scheduler (its policies' compiled kernels, its fits) and its page
    "cluster": ("cluster", ("starlette", "uvicorn", "prometheus_client", "numba", "scipy")),
    "simulate": ("sim", ("numba", "scipy")),
    "ps": ("ps", ("mpi4py",)),
    "report": ("report", ("matplotlib",)),
    "experiment": ("report", ("matplotlib",)),  # its tables come with plots
}


class MissingExtra(UserError):
    """A command needs an extra that is not installed: one line naming it, exit status 2."""


def installed(module: str) -> bool:
    """Whether ``module`` can be imported here (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def message(what: str, module: str, extra: str | None = None) -> str:
    """The line for ``what`` (e.g. ``"elastic-ring cluster"``) missing ``module``, which comes with
    ``extra`` (default: the module's own, :data:`EXTRA_OF`)."""
    top = module.partition(".")[0]
    extra = extra or EXTRA_OF[top]
    return f"{what} needs the [{extra}] extra ({top} is not installed): pip install 'elastic-ring[{extra}]'"


def require(what: str, *modules: str, extra: str | None = None) -> None:
    """Raises :class:`MissingExtra` for the first of ``modules`` that is not installed."""
    for m in modules:
        if not installed(m):
            raise MissingExtra(message(what, m, extra))


def require_for_command(name: str) -> None:
    """Before ``elastic-ring NAME`` is imported: what :data:`COMMAND_NEEDS` lists for it."""
    if name in COMMAND_NEEDS:
        extra, modules = COMMAND_NEEDS[name]
        require(f"elastic-ring {name}", *modules, extra=extra)


def from_import_error(what: str, e: ImportError) -> MissingExtra | None:
    """The one-line error for ``e`` when the module it misses comes with an extra, else None."""
    name = getattr(e, "name", None) or ""
    if not isinstance(e, ModuleNotFoundError) or name.partition(".")[0] not in EXTRA_OF:
        return None
    return MissingExtra(message(what, name))
