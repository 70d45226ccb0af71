"""Measure the shape of the package: import graph between modules, import cycles, longest classes and functions.

Reads the source as text (ast); runs nothing of the package. Usage:
    python scripts/code_shape.py [--root elastic_ring] [--json results/code_shape.json]
"""
from __future__ import annotations

import argparse
import ast
import json
import sys
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="elastic_ring", help="the package folder (default: elastic_ring)")
    ap.add_argument("--json", help="write the full result here")
    ap.add_argument("--label", default="", help="a label stored with the result (e.g. a commit)")
    args = ap.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
