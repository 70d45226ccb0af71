"""What a user's script says about itself, read before anything starts: its text, parsed with
``ast`` (nothing of it runs, nothing is imported). `elastic-ring train --script` checks it before
a run folder is made (:func:`check_script`, one line and exit status 2 for what cannot run) and
takes the collective from it where the script makes it plain (:func:`inferred_collective`).

:func:`read_script` returns a :class:`ScriptShape`:

- whether it compiles (a ``SyntaxError``: ``file:line``);
- the collective it uses: Horovod where it imports ``horovod`` and nothing of ``torch.distributed``;
  torch where it uses ``torch.distributed`` or ``DistributedDataParallel`` and does not import
  ``horovod``; neither (or both) is not plain, and the run keeps its default (or the flag);
- its loop: ``job.steps()`` (whose length is ``--steps``) or ``job.epochs()``, called on the job
  ``elastic_ring.worker.init()`` returned; a Horovod Elastic script (``hvd.elastic``) has its own;
- its form (:attr:`ScriptShape.form`): ``"torchrun"`` for a script that follows only torchrun's
  contract (it imports ``torch.distributed``, calls ``init_process_group`` itself, and imports
  neither ``elastic_ring`` nor ``horovod``): it runs unchanged, as torchrun runs it
  (:mod:`elastic_ring.worker.torchrun`); ``"hvd_elastic"``; ``"library"`` otherwise.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from elastic_ring.errors import UserError

_WORKER = "elastic_ring.worker"
_DDP = "DistributedDataParallel"
_PG_INIT = "init_process_group"


@dataclass(frozen=True)
class ScriptShape:
    """What :func:`read_script` found (each ``*_line``: the first line that shows it, 0: none)."""

    horovod_line: int = 0  # an import of horovod
    torch_line: int = 0  # torch.distributed or DistributedDataParallel, imported or named
    torch_what: str = ""  # which of the two (for the message)
    steps_line: int = 0  # job.steps()
    epochs_line: int = 0  # job.epochs()
    hvd_elastic: bool = False  # hvd.elastic: Horovod Elastic's own loop
    pg_init_line: int = 0  # a call of init_process_group (torch.distributed's own group)
    elastic_ring_line: int = 0  # an import of elastic_ring (anything of it)

    @property
    def collective(self) -> str | None:
        """``"horovod"`` or ``"torch"`` where the script makes it plain, else None."""
        if self.horovod_line and not self.torch_line:
            return "horovod"
        if self.torch_line and not self.horovod_line:
            return "torch"
        return None

    @property
    def form(self) -> str:
        """``"torchrun"`` (torchrun's contract only: see the module docstring), ``"hvd_elastic"``
        (Horovod Elastic's API) or ``"library"`` (the worker library, or plain Horovod)."""
        if self.torch_line and self.pg_init_line and not self.horovod_line and not self.elastic_ring_line:
            return "torchrun"
        return "hvd_elastic" if self.hvd_elastic else "library"

    @property
    def needs_steps(self) -> bool:
        """A flat ``job.steps()`` loop: its length is ``--steps`` (an epoch loop's is its own)."""
        return bool(self.steps_line) and not self.epochs_line and not self.hvd_elastic


def _dotted(node: ast.AST) -> str:
    """``a.b.c`` of a Name/Attribute chain ("" for anything else)."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return ""
    parts.append(node.id)
    return ".".join(reversed(parts))


def read_script(path: str | Path) -> ScriptShape:
    """Read ``path`` (see the module docstring).

    Raises:
        UserError: it cannot be read, or does not compile (one line naming ``file:line``).
    """
    try:
        source = Path(path).read_bytes()
    except OSError as e:
        raise UserError(f"script {path} cannot be read: {e.strerror}") from None
    try:
        tree = ast.parse(source, filename=str(path))
        compile(tree, str(path), "exec")  # what the parser lets through (a misplaced return, ...)
    except SyntaxError as e:
        raise UserError(f"script {e.filename or path}:{e.lineno} does not compile: {e.msg}") from None
    except ValueError as e:  # a NUL byte
        raise UserError(f"script {path} does not compile: {e}") from None
    return _shape(tree)


def _shape(tree: ast.AST) -> ScriptShape:
    nodes = sorted((n for n in ast.walk(tree) if hasattr(n, "lineno")), key=lambda n: (n.lineno, n.col_offset))
    horovod = torch = steps = epochs = pg_init = ours = 0
    torch_what, hvd_elastic = "", False
    modules: set[str] = set()  # names bound to elastic_ring.worker
    inits: set[str] = {f"{_WORKER}.init"}  # names of its init()
    hvd_names: set[str] = set()  # names bound to a horovod module

    def saw_torch(line: int, what: str) -> None:
        nonlocal torch, torch_what
        if not torch:
            torch, torch_what = line, what

    for n in nodes:
        if isinstance(n, ast.Import):
            for a in n.names:
                if a.name.split(".")[0] == "horovod":
                    horovod = horovod or n.lineno
                    hvd_names.add(a.asname or a.name.split(".")[0])
                if a.name.startswith("torch.distributed"):
                    saw_torch(n.lineno, "torch.distributed")
                if a.name == _WORKER:
                    modules.add(a.asname or _WORKER)
                if a.name.split(".")[0] == "elastic_ring":
                    ours = ours or n.lineno
        elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
            names = {a.name: a.asname or a.name for a in n.names}
            if n.module.split(".")[0] == "horovod":
                horovod = horovod or n.lineno
                hvd_names.update(names.values())
            if n.module.startswith("torch.distributed") or (n.module == "torch" and "distributed" in names):
                saw_torch(n.lineno, "torch.distributed")
            if _DDP in names:
                saw_torch(n.lineno, _DDP)
            if n.module.split(".")[0] == "elastic_ring":
                ours = ours or n.lineno
            if n.module == "elastic_ring" and "worker" in names:
                modules.add(names["worker"])
            if n.module == _WORKER and "init" in names:
                inits.add(names["init"])
        elif isinstance(n, ast.Attribute):
            d = _dotted(n)
            if d.startswith("torch.distributed.") or n.attr == _DDP:
                saw_torch(n.lineno, _DDP if n.attr == _DDP else "torch.distributed")
            if n.attr == "elastic" and _dotted(n.value).split(".")[0] in hvd_names:
                hvd_elastic = True
        elif isinstance(n, ast.Call) and not pg_init:
            f = n.func
            if (isinstance(f, ast.Attribute) and f.attr == _PG_INIT) or (isinstance(f, ast.Name) and f.id == _PG_INIT):
                pg_init = n.lineno
    inits |= {f"{m}.init" for m in modules}
    jobs = set()  # the names the job is bound to: job = elastic.init(...)
    for n in nodes:
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and _dotted(n.value.func) in inits:
            jobs.update(t.id for t in n.targets if isinstance(t, ast.Name))
    for n in nodes:
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and _dotted(n.func.value) in jobs:
            if n.func.attr == "steps":
                steps = steps or n.lineno
            elif n.func.attr == "epochs":
                epochs = epochs or n.lineno
    return ScriptShape(horovod, torch, torch_what, steps, epochs, hvd_elastic, pg_init, ours)


def check_script(script: str, shape: ScriptShape, collective: str | None, steps: int | None) -> None:
    """What cannot run, before anything starts: a ``job.steps()`` loop without ``--steps``, and a
    ``--collective`` that the script's own contradicts (``collective``: the flag, None if not given).

    Raises:
        UserError: one line naming the script's line and the fix.
    """
    if shape.needs_steps and steps is None:
        raise UserError(f"{script}:{shape.steps_line} loops over job.steps(), whose length is the run's: "
                        f"give --steps N")
    uses = shape.collective
    if uses == "horovod" and collective == "torch":
        raise UserError(f"--collective torch, but {script} uses Horovod (it imports horovod at line "
                        f"{shape.horovod_line}): drop --collective torch, or move the script to "
                        f"torch.distributed")
    if uses == "torch" and collective == "horovod":
        raise UserError(f"--collective horovod, but {script} uses {shape.torch_what} (line "
                        f"{shape.torch_line}) and not Horovod: use --collective torch (or drop the flag)")


def inferred_collective(script: str, shape: ScriptShape) -> tuple[str, str] | None:
    """(collective, the line saying why) where the script makes its collective plain and it is
    not the default (Horovod); None otherwise."""
    if shape.collective != "torch":
        return None
    return "torch", (f"elastic-ring: {script} uses {shape.torch_what} (line {shape.torch_line}) and not "
                     f"Horovod: --collective torch")
