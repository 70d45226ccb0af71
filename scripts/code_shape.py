"""Measure the shape of the package: import graph between modules, import cycles, longest classes
and functions; and the membership path's counts of issue 44 (``--commit``/``--out``/``--table``).

Reads the source as text (ast); runs nothing of the package. Usage:
    python scripts/code_shape.py [--root elastic_ring] [--json results/code_shape/today.json]
    python scripts/code_shape.py --commit da56294 --commit worktree --out results/code_shape.json --table

The second form measures, for each ``--commit`` (a git revision, read with ``git archive``, or
``worktree``: the files as they are now), the counts a maintainer of the membership path meets
(:data:`RULES` says how each is counted) and writes ``{commit, date, counts, where}`` per commit;
``--table`` prints them side by side as a Markdown table. Without ``--commit`` it measures the
working tree.
"""
from __future__ import annotations

import argparse
import ast
import io
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path


def module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def resolve(mod: str, is_pkg: bool, node: ast.ImportFrom) -> list[str]:
    if node.level:
        base = mod.split(".")
        if not is_pkg:
            base = base[:-1]
        base = base[: len(base) - (node.level - 1)]
        stem = ".".join(base + ([node.module] if node.module else []))
    else:
        stem = node.module or ""
    return [stem] + [f"{stem}.{a.name}" for a in node.names]


def scan(root: Path) -> dict:
    mods: dict[str, Path] = {}
    for p in sorted(root.rglob("*.py")):
        mods[module_name(p, root)] = p
    edges: dict[str, set[str]] = {m: set() for m in mods}
    classes, funcs, files = [], [], {}
    for m, p in mods.items():
        text = p.read_text()
        files[str(p)] = len(text.splitlines())
        tree = ast.parse(text)
        is_pkg = p.name == "__init__.py"
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                stem, *names = resolve(m, is_pkg, node)
                # `from pkg import mod` depends on pkg.mod; `from mod import name` on mod
                subs = [n for n in names if n in mods]
                targets = subs + ([stem] if len(subs) < len(names) else [])
            for t in targets:
                # the longest prefix that is a module of ours
                parts = t.split(".")
                for k in range(len(parts), 0, -1):
                    cand = ".".join(parts[:k])
                    if cand in mods and cand != m:
                        edges[m].add(cand)
                        break
            if isinstance(node, ast.ClassDef):
                classes.append((node.end_lineno - node.lineno + 1, f"{p}:{node.lineno} {node.name}",
                                [ast.unparse(b) for b in node.bases]))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                funcs.append((node.end_lineno - node.lineno + 1, f"{p}:{node.lineno} {node.name}"))
    # strongly connected components (Tarjan), ignoring edges into a package's own __init__ re-exports
    index, low, stack, on, sccs, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    for v in edges:
        if v not in index:
            strong(v)
    classes.sort(reverse=True)
    funcs.sort(reverse=True)
    plain = {"str", "int", "Enum", "enum.Enum", "IntEnum", "Exception", "RuntimeError", "ValueError", "Protocol"}
    mixins = [c for c in classes if len([b for b in c[2] if b not in plain]) > 1]
    return {
        "modules": len(mods),
        "import_edges": sum(len(v) for v in edges.values()),
        "import_cycles": sccs,
        "longest_classes": [{"lines": n, "where": w, "bases": b} for n, w, b in classes[:8]],
        "longest_functions": [{"lines": n, "where": w} for n, w in funcs[:8]],
        "classes_with_several_bases": [{"lines": n, "where": w, "bases": b} for n, w, b in mixins],
        "longest_files": sorted(({"lines": n, "file": f} for f, n in files.items()), key=lambda r: -r["lines"])[:10],
        "edges": {k: sorted(v) for k, v in sorted(edges.items())},
    }

# ---------------------------------------------------------------------------- the membership path

RULES = {
    "backend_classes": "classes under controller/backends that the controller can be given as its backend: "
                       "not a Protocol or ABC, instantiated somewhere in the package (a call of the class's "
                       "name), and having, themselves or through their bases in the package, every public "
                       "method of the backend interface (the class Backend, or WorkerGroup, under "
                       "controller/backends)",
    "ring_classes": "the class Ring of worker/ring.py and every class under worker/ that subclasses it, "
                    "directly or not",
    "survivor_agreements": "functions or methods that call agreement(...) (the survivors' decision of "
                           "worker/survive.py or wherever it moved), leaving out one-statement wrappers",
    "flag_tests": "in controller/controller.py and the modules of the Controller class's bases defined in "
                  "the package (controller/asks.py, controller/recovery.py: the class's own code), the uses of _interrupts, live_target, deferred_stop "
                  "(attributes) and withdraw_ahead inside a test: an if/while/conditional expression's "
                  "condition, an assert, a comprehension's if, a boolean operator's operand or a not",
    "controller_conditions": "every condition in controller/controller.py and its bases' modules, whatever it tests: if, while, "
                             "conditional expressions and comprehension ifs (flags renamed by a refactor "
                             "leave flag_tests, not this)",
    "getattr_probes": "calls of getattr( in controller/controller.py and its bases' modules",
    "backend_probes": "calls of getattr( or hasattr( on self.backend in controller/controller.py and its "
                      "bases' modules",
    "loop_forms": "modules under worker/ that do the work between two steps: they send the step "
                  "heartbeat themselves (.heartbeat(..., 'step')) or call the shared boundary; the module "
                  "that defines heartbeat() and the boundary's own module (boundary.py, or the one "
                  "defining StepBoundary) are not loop forms",
    "loop_forms_sharing_boundary": "loop forms that call one shared boundary object: a method called on "
                                   "a name or attribute `boundary` (boundary.m(...), job.boundary.m(...)) or "
                                   "on StepBoundary(...), in a module that imports a module named boundary or "
                                   "the name StepBoundary, or reaches it as an attribute .boundary (a module "
                                   "that only builds or wraps the boundary, as Job does, is not a loop form)",
    "job_public_names": "methods and properties (def, @property, or name = property(...)) of class Job "
                        "in worker/api.py whose name does not start with _",
    "controller_modules_importing_worker_seam": "modules under controller/ that import "
                                                "elastic_ring.worker.inplace or elastic_ring.worker.survive",
    "controller_imports_of_worker_seam": "those import statements, counted one by one",
    "horovod_patches": "assignments onto Horovod's objects anywhere in the package: X.attr = ... or "
                       "setattr(X, ...) where X is, or is reached from, a name bound by an import of "
                       "horovod (directly or through a local alias); and the targets of a table of patches "
                       "applied by a generic setattr: a call's positional or target= argument that is a "
                       "string 'horovod.module:Attr.name' (module-level string constants resolved in "
                       "f-strings; strings inside tuples or lists, such as the names a patch reads, are not "
                       "targets)",
    "horovod_patches.controller": "those under controller/ (the launcher's patches)",
    "horovod_patches.worker": "those under worker/ (the Horovod Elastic API served to a script)",
    "horovod_patch_modules": "the modules holding those assignments",
    "controller_lines": "lines of controller/controller.py",
}

FLAGS = ("_interrupts", "live_target", "deferred_stop", "withdraw_ahead")
SEAM_MODULES = ("elastic_ring.worker.inplace", "elastic_ring.worker.survive")
BACKEND_INTERFACES = ("Backend", "WorkerGroup")


def _modules(root: Path) -> dict[str, tuple[Path, ast.Module]]:
    """Every module of the package under ``root``: dotted name -> (path, parsed tree)."""
    out = {}
    for p in sorted(root.rglob("*.py")):
        try:
            out[module_name(p, root)] = (p, ast.parse(p.read_text(), filename=str(p)))
        except SyntaxError as e:
            raise ValueError(f"{p.relative_to(root.parent)} does not parse here ({e.msg}, line {e.lineno})") from None
    return out


def _classes(mods: dict, prefix: str) -> dict[str, list[tuple[str, ast.ClassDef]]]:
    """Top-level and nested classes of the modules under ``prefix``: name -> [(module, node)]."""
    out: dict[str, list] = {}
    for m, (_, tree) in mods.items():
        if m == prefix or m.startswith(prefix + "."):
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    out.setdefault(node.name, []).append((m, node))
    return out


def _base_names(node: ast.ClassDef) -> list[str]:
    return [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases]


def _public_methods(node: ast.ClassDef) -> set[str]:
    return {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and not n.name.startswith("_")}


def _is_abstract(node: ast.ClassDef) -> bool:
    if {"Protocol", "ABC"} & set(_base_names(node)) or any(
            isinstance(k.value, ast.Attribute) and k.value.attr == "ABCMeta" or getattr(k.value, "id", "") == "ABCMeta"
            for k in node.keywords):
        return True
    return any(isinstance(d, (ast.Name, ast.Attribute)) and (getattr(d, "id", None) or getattr(d, "attr", None))
               == "abstractmethod" for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
               for d in n.decorator_list)


def _called_names(mods: dict) -> set[str]:
    names = set()
    for _, tree in mods.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = node.func
                names.add(f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", ""))
    return names


def backend_classes(mods: dict, pkg: str) -> list[str]:
    """See ``RULES["backend_classes"]``."""
    where = f"{pkg}.controller.backends"
    classes = _classes(mods, where)
    every = _classes(mods, pkg)
    iface = next((classes[n][0][1] for n in BACKEND_INTERFACES if n in classes), None)
    if iface is None:
        return []
    needed = _public_methods(iface)
    called = _called_names(mods)

    def methods(node: ast.ClassDef, seen: frozenset = frozenset()) -> set[str]:
        got = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for b in _base_names(node):
            if b in every and b not in seen:
                got |= methods(every[b][0][1], seen | {b})
        return got

    out = []
    for name, defs in sorted(classes.items()):
        for m, node in defs:
            if node is iface or _is_abstract(node) or name not in called:
                continue
            if needed <= methods(node):
                out.append(f"{m}.{name}")
    return out


def ring_classes(mods: dict, pkg: str) -> list[str]:
    """See ``RULES["ring_classes"]``."""
    classes = _classes(mods, f"{pkg}.worker")
    if not any(m == f"{pkg}.worker.ring" for m, _ in classes.get("Ring", [])):
        return []
    family, grew = {"Ring"}, True
    while grew:
        grew = False
        for name, defs in classes.items():
            if name not in family and any(set(_base_names(n)) & family for _, n in defs):
                family.add(name)
                grew = True
    return sorted(f"{m}.{name}" for name in family for m, _ in classes[name])


def _functions(tree: ast.AST):
    """(function node, its own nodes): every function's body, nested functions' bodies left out."""
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            own, todo = [], list(fn.body)
            while todo:
                n = todo.pop()
                own.append(n)
                if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                    todo.extend(ast.iter_child_nodes(n))
            yield fn, own


def _call_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        f = node.func
        return f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
    return None


def survivor_agreements(mods: dict) -> list[str]:
    """See ``RULES["survivor_agreements"]``."""
    out = []
    for m, (_, tree) in mods.items():
        for fn, own in _functions(tree):
            if fn.name == "agreement" or not any(_call_name(n) == "agreement" for n in own):
                continue
            body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
            if len(body) == 1 and isinstance(body[0], ast.Return):
                continue  # a wrapper such as agreed_step
            out.append(f"{m}:{fn.lineno} {fn.name}")
    return out


def _flag_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute) and node.attr in FLAGS:
        return node.attr
    if isinstance(node, ast.Name) and node.id == "withdraw_ahead":
        return node.id
    return None


def flag_tests(tree: ast.Module) -> dict[str, int]:
    """See ``RULES["flag_tests"]``: uses of each flag inside a test, each counted once."""
    tests: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.If, ast.While, ast.IfExp, ast.Assert)):
            tests.append(node.test)
        elif isinstance(node, ast.comprehension):
            tests.extend(node.ifs)
        elif isinstance(node, ast.BoolOp):
            tests.extend(node.values)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            tests.append(node.operand)
    seen: set[int] = set()
    counts = {f: 0 for f in FLAGS}
    for t in tests:
        for n in ast.walk(t):
            f = _flag_name(n)
            if f and id(n) not in seen:
                seen.add(id(n))
                counts[f] += 1
    return counts


def conditions(tree: ast.Module) -> int:
    """See ``RULES["controller_conditions"]``."""
    return sum(isinstance(n, (ast.If, ast.While, ast.IfExp)) + (len(n.ifs) if isinstance(n, ast.comprehension) else 0)
               for n in ast.walk(tree))


def probes(tree: ast.Module) -> tuple[int, int]:
    """(calls of getattr, calls of getattr/hasattr on self.backend)."""
    every = backend = 0
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "hasattr"):
            every += n.func.id == "getattr"
            backend += bool(n.args) and ast.unparse(n.args[0]) == "self.backend"
    return every, backend


def _imported(mod: str, path: Path, tree: ast.Module) -> list[tuple[str, list[str]]]:
    """Every import statement of ``mod``: (module imported from, names), relative imports resolved."""
    out = []
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            stem, *names = resolve(mod, is_pkg, node)
            out.append((stem, [a.name for a in node.names]))
    return out


def loop_forms(mods: dict, pkg: str) -> tuple[list[str], list[str]]:
    """See ``RULES["loop_forms"]``: (the loop forms, those of them using the shared boundary)."""
    forms, sharing = [], []
    for m, (path, tree) in mods.items():
        if not m.startswith(f"{pkg}.worker.") or m.rsplit(".", 1)[1] == "boundary":
            continue
        defs = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        if "heartbeat" in defs or "StepBoundary" in defs:
            continue
        beats = any(_call_name(n) == "heartbeat" and len(n.args) > 1 and isinstance(n.args[1], ast.Constant)
                    and n.args[1].value == "step" for n in ast.walk(tree))
        reaches = any(stem.rsplit(".", 1)[-1] == "boundary" or "boundary" in names or "StepBoundary" in names
                      for stem, names in _imported(m, path, tree)) or any(
            isinstance(n, ast.Attribute) and n.attr == "boundary" for n in ast.walk(tree))
        uses = reaches and any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                               and _is_boundary(n.func.value) for n in ast.walk(tree))
        if beats or uses:
            forms.append(m)
        if uses:
            sharing.append(m)
    return forms, sharing


def _is_boundary(node: ast.AST) -> bool:
    """``boundary``, ``x.boundary`` or ``StepBoundary(...)``: the shared boundary object."""
    if isinstance(node, ast.Name):
        return node.id == "boundary"
    if isinstance(node, ast.Attribute):
        return node.attr == "boundary"
    return isinstance(node, ast.Call) and getattr(node.func, "id", None) == "StepBoundary"


def job_public_names(mods: dict, pkg: str) -> list[str]:
    """See ``RULES["job_public_names"]``."""
    api = mods.get(f"{pkg}.worker.api")
    job = next((n for n in api[1].body if isinstance(n, ast.ClassDef) and n.name == "Job"), None) if api else None
    if job is None:
        return []
    names = []
    for n in job.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.append(n.name)
        elif isinstance(n, ast.Assign) and _call_name(n.value) == "property":
            names.extend(t.id for t in n.targets if isinstance(t, ast.Name))
    return sorted({x for x in names if not x.startswith("_")})


def seam_imports(mods: dict, pkg: str) -> list[str]:
    """See ``RULES["controller_imports_of_worker_seam"]``: one ``module:line`` per import statement."""
    out = []
    for m, (path, tree) in mods.items():
        if not (m == f"{pkg}.controller" or m.startswith(f"{pkg}.controller.")):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                stem, *names = resolve(m, path.name == "__init__.py", node)
                targets = [stem, *names]
            else:
                continue
            if any(t == s or t.startswith(s + ".") for t in targets for s in SEAM_MODULES):
                out.append(f"{m}:{node.lineno}")
    return sorted(out, key=lambda w: (w.split(":")[0], int(w.split(":")[1])))


def _root(node: ast.AST) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def horovod_patches(mods: dict) -> list[str]:
    """See ``RULES["horovod_patches"]``: one ``module:line target`` per assignment."""
    out: list[str] = []

    def visit(m: str, body: list[ast.stmt], bound: set[str]) -> None:
        bound = set(bound)
        for st in body:
            for n in _own_nodes(st):
                if isinstance(n, ast.Import):
                    for a in n.names:
                        if a.name == "horovod" or a.name.startswith("horovod."):
                            bound.add(a.asname or a.name.split(".")[0])
                elif isinstance(n, ast.ImportFrom) and not n.level and n.module and (
                        n.module == "horovod" or n.module.startswith("horovod.")):
                    bound.update(a.asname or a.name for a in n.names)
                elif isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                    targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                    for t in targets:
                        for x in (t.elts if isinstance(t, ast.Tuple) else [t]):
                            if isinstance(x, ast.Attribute) and _root(x) in bound:
                                out.append(f"{m}:{n.lineno} {ast.unparse(x)}")
                            elif isinstance(x, ast.Name) and n.value is not None and _root(n.value) in bound:
                                bound.add(x.id)  # an alias of a Horovod object
                elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "setattr"
                      and n.args and _root(n.args[0]) in bound):
                    out.append(f"{m}:{n.lineno} setattr({ast.unparse(n.args[0])}, ...)")
            for n in _own_nodes(st):
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    visit(m, n.body, bound)

    for m, (_, tree) in mods.items():
        visit(m, tree.body, set())
        consts = {t.id: st.value.value for st in tree.body if isinstance(st, ast.Assign)
                  and isinstance(st.value, ast.Constant) and isinstance(st.value.value, str)
                  for t in st.targets if isinstance(t, ast.Name)}
        for n in ast.walk(tree):
            if isinstance(n, ast.Call):
                for a in [*n.args, *(k.value for k in n.keywords if k.arg == "target")]:
                    text = _string(a, consts)
                    if text is not None and PATCH_TARGET.match(text):
                        out.append(f"{m}:{n.lineno} {text}")
    return sorted(out, key=lambda w: (w.split(":")[0], int(w.split(":")[1].split(" ")[0])))


PATCH_TARGET = re.compile(r"^horovod(\.\w+)*:\w+(\.\w+)*$")


def _string(node: ast.AST, consts: dict[str, str]) -> str | None:
    """A string constant, or an f-string made of constants and module-level string constants."""
    if isinstance(node, ast.Constant):
        return node.value if isinstance(node.value, str) else None
    if isinstance(node, ast.JoinedStr):
        parts = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                parts.append(str(v.value))
            elif isinstance(v, ast.FormattedValue) and isinstance(v.value, ast.Name) and v.value.id in consts \
                    and v.format_spec is None and v.conversion == -1:
                parts.append(consts[v.value.id])
            else:
                return None
        return "".join(parts)
    return None


def _own_nodes(st: ast.AST):
    """The nodes of one statement, in source order, not entering nested functions or classes
    (yielded themselves, their bodies visited on their own)."""
    yield st
    if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
        return
    for c in ast.iter_child_nodes(st):
        yield from _own_nodes(c)


def controller_trees(mods: dict, pkg: str) -> list[ast.Module]:
    """controller/controller.py's tree and those of the modules under controller/ that define the
    ``Controller`` class's bases (the class's code moved into mixins is still its code)."""
    ctl = mods.get(f"{pkg}.controller.controller")
    if not ctl:
        return []
    bases = {b for node in ast.walk(ctl[1]) if isinstance(node, ast.ClassDef) and node.name == "Controller"
             for b in _base_names(node)}
    trees = [ctl[1]]
    for name, (_, tree) in sorted(mods.items()):
        if name.startswith(f"{pkg}.controller.") and name != f"{pkg}.controller.controller" and any(
                isinstance(n, ast.ClassDef) and n.name in bases for n in tree.body):
            trees.append(tree)
    return trees


def membership_counts(root: Path) -> tuple[dict[str, int], dict[str, list[str]]]:
    """The counts of :data:`RULES` for the package folder ``root``, and what each count counted."""
    pkg = root.name
    mods = _modules(root)
    ctl = mods.get(f"{pkg}.controller.controller")
    trees = controller_trees(mods, pkg)
    flags = {f: sum(flag_tests(t)[f] for t in trees) for f in FLAGS}
    probed = [probes(t) for t in trees]
    get, backend = sum(p[0] for p in probed), sum(p[1] for p in probed)
    forms, sharing = loop_forms(mods, pkg)
    seam = seam_imports(mods, pkg)
    patches = horovod_patches(mods)
    where = {
        "backend_classes": backend_classes(mods, pkg),
        "ring_classes": ring_classes(mods, pkg),
        "survivor_agreements": survivor_agreements(mods),
        "loop_forms": forms,
        "loop_forms_sharing_boundary": sharing,
        "job_public_names": job_public_names(mods, pkg),
        "controller_modules_importing_worker_seam": sorted({s.split(":")[0] for s in seam}),
        "controller_imports_of_worker_seam": seam,
        "horovod_patches": patches,
        "horovod_patch_modules": sorted({s.split(":")[0] for s in patches}),
    }
    counts = {k: len(v) for k, v in where.items()}
    counts.update({"flag_tests": sum(flags.values()), **{f"flag_tests.{f}": n for f, n in flags.items()},
                   "controller_conditions": sum(conditions(t) for t in trees),
                   "getattr_probes": get, "backend_probes": backend,
                   **{f"horovod_patches.{side}": sum(w.startswith(f"{pkg}.{side}.") for w in patches)
                      for side in ("controller", "worker")},
                   "controller_lines": len(ctl[0].read_text().splitlines()) if ctl else 0})
    order = ["backend_classes", "ring_classes", "survivor_agreements", "flag_tests",
             *[f"flag_tests.{f}" for f in FLAGS], "controller_conditions", "getattr_probes", "backend_probes",
             "loop_forms",
             "loop_forms_sharing_boundary", "job_public_names", "controller_modules_importing_worker_seam",
             "controller_imports_of_worker_seam", "horovod_patches", "horovod_patches.controller",
             "horovod_patches.worker", "horovod_patch_modules", "controller_lines"]
    return {k: counts[k] for k in order}, where


WORKTREE = "worktree"


def measure_commit(repo: Path, rev: str, package: str = "elastic_ring") -> dict:
    """The membership counts of ``rev`` (read from git, nothing checked out) or of the working tree."""
    if rev == WORKTREE:
        head = _git(repo, "rev-parse", "HEAD")
        dirty = bool(_git(repo, "status", "--porcelain", "--", package))
        counts, where = membership_counts(repo / package)
        return {"commit": f"{head[:7]} (working tree{', changed' if dirty else ''})", "sha": head,
                "date": _git(repo, "show", "-s", "--format=%cI", "HEAD"), "counts": counts, "where": where}
    try:
        sha = _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except ValueError:
        raise ValueError(f"--commit {rev}: not a commit of the checkout {repo}") from None
    with tempfile.TemporaryDirectory(prefix="code-shape-") as tmp:
        r = subprocess.run(["git", "-C", str(repo), "archive", sha, package], capture_output=True)
        if r.returncode:
            raise ValueError(f"--commit {rev}: no {package}/ in it")
        tar = r.stdout
        with tarfile.open(fileobj=io.BytesIO(tar)) as t:
            if hasattr(tarfile, "data_filter"):
                t.extractall(tmp, filter="data")
            else:  # Python before 3.12: git's own archive of this repository
                t.extractall(tmp)
        counts, where = membership_counts(Path(tmp) / package)
    return {"commit": sha[:7], "sha": sha, "date": _git(repo, "show", "-s", "--format=%cI", sha),
            "counts": counts, "where": where}


def _git(repo: Path, *args: str) -> str:
    r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    if r.returncode:
        why = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit status {r.returncode}"
        raise ValueError(f"git {' '.join(args)}: {why}")
    return r.stdout.strip()


def table(measured: list[dict]) -> str:
    """The counts of every measured commit side by side (Markdown)."""
    head = "| count | " + " | ".join(f"{m['commit']} ({m['date'][:10]})" for m in measured) + " |"
    rows = [head, "|---|" + "---|" * len(measured)]
    for k in measured[0]["counts"]:
        rows.append(f"| {k} | " + " | ".join(str(m["counts"].get(k, "")) for m in measured) + " |")
    return "\n".join(rows)



def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="elastic_ring", help="the package folder (default: elastic_ring)")
    ap.add_argument("--json", help="write the full result here")
    ap.add_argument("--label", default="", help="a label stored with the result (e.g. a commit)")
    ap.add_argument("--commit", action="append", default=[], metavar="REV",
                    help="measure the membership counts of this git revision (repeatable; 'worktree': "
                         "the files as they are now)")
    ap.add_argument("--out", help="write the membership counts of every --commit here (JSON)")
    ap.add_argument("--table", action="store_true", help="print the membership counts as a Markdown table")
    ap.add_argument("--repo", default=str(Path(__file__).resolve().parents[1]),
                    help="the git checkout the revisions are read from (default: this script's)")
    args = ap.parse_args(argv)
    if args.commit or args.out or args.table:
        return membership_main(args)
    root = Path(args.root)
    if not (root / "__init__.py").is_file():
        print(f"code_shape: {root} is not a package folder", file=sys.stderr)
        return 2
    res = scan(root)
    res["label"] = args.label
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    print(f"{res['modules']} modules, {res['import_edges']} import edges, {len(res['import_cycles'])} import cycles")
    for c in res["import_cycles"]:
        print("  cycle:", " <-> ".join(c))
    print("longest classes:")
    for c in res["longest_classes"][:5]:
        print(f"  {c['lines']:5d}  {c['where']}")
    print("longest functions:")
    for f in res["longest_functions"][:5]:
        print(f"  {f['lines']:5d}  {f['where']}")
    print(f"classes with several bases: {len(res['classes_with_several_bases'])}")
    for c in res["classes_with_several_bases"]:
        print(f"  {c['lines']:5d}  {c['where']}  ({', '.join(c['bases'])})")
    return 0



def membership_main(args: argparse.Namespace) -> int:
    repo = Path(args.repo)
    try:
        measured = [measure_commit(repo, rev) for rev in (args.commit or [WORKTREE])]
    except (ValueError, OSError) as e:
        print(f"code_shape: {e}", file=sys.stderr)
        return 2
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"rules": RULES, "commits": measured}, indent=1) + "\n")
    if args.table:
        print(table(measured))
    else:
        for m in measured:
            print(m["commit"], m["date"], " ".join(f"{k}={v}" for k, v in m["counts"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
