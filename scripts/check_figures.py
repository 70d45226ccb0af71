"""Check every marked figure in the README and docs/ against the results file it names.

A figure in Markdown names its source with an HTML comment right after it (invisible once rendered):

    the grow lost 0.85 s<!-- fig: results/bench_zygote.json#medians.zygote.lost_s -->

The figure is the number written just before the marker on the same line (or a range "A-B" or
"A to B", "N min M s", a number word up to "twelve" with at most one noun after it: "four runs").
It must equal the file's value rounded to as many decimals as the figure shows (0.71 matches
0.7149, not 0.716), unless an option says otherwise. The grammar, all on one line:

    <!-- fig: FILE[#KEYS] [re=REGEX] [agg=AGG] [x=SCALE] [r=DECIMALS] [tol=ABS|tol=PCT%]
              [bound=max|min|abs] [code=PATH,PATH] [admits=YYYY-MM-DD|admits=Nd] [note="..."] -->
    <!-- fig: none: why the figure has no file -->
    <!-- fig-block: FILE -->   (on a line before a ``` block or a table: each of its lines,
                                "..." lines excepted, must be a line of FILE)

KEYS (JSON files) is a path such as `resize.rows[harness=ours:overlap].grow_lost_median_s`:
- dotted keys; `[3]` an index; `[odd-key]` or `["odd.key"]` a key with dashes or dots (write
  `[a-b]`, not `a-b`, which subtracts);
- `[field=value]` the first list item whose field is value (`[f=a,g=b]`: both; `[f~a]`: whose f
  contains a); `[?f=a]` the list of every such item; a key after a list takes it from every
  item (`runs[?survive=True].lost_s[1]`: the second such run's); `[*]` every item, the steps
  after it applied to each;
- `|median`, `|min`, `|max`, `|mean`, `|sum`, `|len` or `|range` after a path aggregates a list;
- terms joined by `/`, `*`, `+`, `-` are computed left to right (`a/b` a ratio, `a/b-1` a change;
  a term may be a plain number); `,` gives several values (a range "A-B" needs two).
`re=` (text files) takes the regex's first match, group 1 if it has one. `agg=` (median, min,
max, mean, sum, len, range) aggregates every match of `re=` or every value KEYS gives; in a table
row write `agg=`, since a `|` in a marker would split the table's cell. A source with spaces in a
selector is written in double quotes: "FILE#a[k=x y].b".
`x=` scales the file's value (1000 for seconds written as ms, 100 for a fraction written as %,
1/60 for minutes). `r=` rounds to that many decimals instead of the figure's own; `tol=` accepts
that absolute (or relative, with %) difference. `bound=max` makes the figure an upper bound
(every value the file gives must not exceed it: "under 60 s"), `bound=min` a lower bound,
`bound=abs` a bound on the size ("within 15%": every value between -15 and 15).

Staleness: `code=` names the code the figure measures (paths or folders). If git's newest commit
touching that code is newer than the newest commit touching FILE (author dates), the figure is
stale and fails, unless `admits=` covers it: a date (code commits up to that day, UTC, are
admitted: the doc says the figure predates them) or a span `Nd` (code up to N days newer than the
file is admitted). A FILE with uncommitted changes counts as new; so does code with uncommitted
changes (as changed today, as its commit will be). Without git history the staleness is not checked.

Usage: python scripts/check_figures.py [--root DIR] [--list] [--stale] [--by-doc] [FILE.md ...]
Prints one line per problem (`doc:line: ...`) and the counts; exit status 1 on any problem.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

MARKER = re.compile(r"<!--\s*(fig|fig-block)\s*:(.*?)-->")
FENCE = re.compile(r"^\s*(```|~~~)")
_NUM = r"[-+−]?\d[\d,]*(?:\.\d+)?"
# A figure at the end of the text before a marker: "3.02", "0.71 s", "1.22×", "16.8-34.6x",
# "-9.6% to +7.2%", "11 min 17 s".
_UNIT = r"[A-Za-z%×µ/]+"
FIGURE_MINSEC = re.compile(rf"(?P<m>\d+)\s*min\s+(?P<s>\d+(?:\.\d+)?)\s*s\W*$")
FIGURE = re.compile(
    rf"(?<![\w.])(?P<a>{_NUM})(?:\s*{_UNIT})?"
    rf"(?:\s*(?:-|–|to)\s*(?P<b>{_NUM}))?\s*(?:{_UNIT})?[\s*_`|)\],;:.]*$"
)
# A rough count of figures still without a marker: a number with a unit of time, size or ratio.
UNMARKED = re.compile(
    r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s?(?:ms|s|min|h|%|x|×|MB|GB|KB|img/s|steps/s|points)(?![\w/])"
)
NUMBER_WORDS = "zero one two three four five six seven eight nine ten eleven twelve".split()
AGGREGATES = {
    "median": statistics.median,
    "min": min,
    "max": max,
    "mean": statistics.fmean,
    "sum": sum,
    "len": len,
    "range": lambda v: [min(v), max(v)],
}


class FigureError(Exception):
    """A marker that cannot be checked, or a figure that disagrees with its file."""


@dataclass
class Counts:
    checked: int = 0
    blocks: int = 0
    no_file: int = 0
    stale_admitted: int = 0
    unmarked: int = 0
    problems: list[str] = field(default_factory=list)
    listing: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- figures in the text


def parse_number(text: str) -> tuple[float, int]:
    """A written number and its decimals: '1,234.50' -> (1234.5, 2); '−3' -> (-3.0, 0)."""
    t = text.replace(",", "").replace("−", "-")
    dec = len(t.split(".", 1)[1]) if "." in t else 0
    return float(t), dec


def figure_before(text: str) -> tuple[list[float], int]:
    """The figure written at the end of `text` (what precedes a marker): its values and decimals."""
    m = FIGURE_MINSEC.search(text)
    if m:
        sec, dec = parse_number(m["s"])
        return [int(m["m"]) * 60 + sec], dec
    m = FIGURE.search(text)
    word = re.search(r"\b([A-Za-z]+)(?:\s+[A-Za-z]+)?[\s*_`|)\],;:.]*$", text)
    if not m and word and word.group(1).lower() in NUMBER_WORDS:
        return [float(NUMBER_WORDS.index(word.group(1).lower()))], 0
    if not m:
        raise FigureError(f"no figure before the marker (text ends {text[-30:]!r})")
    a, da = parse_number(m["a"])
    if m["b"] is None:
        return [a], da
    b, db = parse_number(m["b"])
    return [a, b], max(da, db)


# ---------------------------------------------------------------- values in the files


def _split_top(s: str, seps: str) -> list[tuple[str, str]]:
    """Split `s` at the characters in `seps` outside brackets and quotes: [(sep_before, part)]."""
    out, depth, quote, cur, sep = [], 0, "", "", ""
    for ch in s:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif depth == 0 and ch in seps and cur:
            out.append((sep, cur))
            cur, sep = "", ch
            continue
        cur += ch
    out.append((sep, cur))
    return out


def _steps(path: str) -> list[str]:
    """'a.b[2][k=v].c' -> ['a', 'b', '[2]', '[k=v]', 'c']."""
    steps, i = [], 0
    while i < len(path):
        if path[i] == ".":
            i += 1
        elif path[i] == "[":
            j, quote = i + 1, ""
            while j < len(path) and (quote or path[j] != "]"):
                if path[j] in "\"'":
                    quote = "" if quote == path[j] else (quote or path[j])
                j += 1
            steps.append(path[i : j + 1])
            i = j + 1
        else:
            j = i
            while j < len(path) and path[j] not in ".[":
                j += 1
            steps.append(path[i:j])
            i = j
    return steps


def _step(node, step: str, spread: bool):
    if spread:
        return [_step(n, step, False) for n in node]
    if step.startswith("["):
        inner = step[1:-1]
        if inner == "*":
            if not isinstance(node, (list, dict)):
                raise KeyError(step)
            return list(node.values()) if isinstance(node, dict) else list(node)
        if inner[:1] and inner[:1] in "\"'":
            return node[inner[1:-1]]
        if re.match(r"\??[\w-]+[=~]", inner):
            every = inner.startswith("?")
            parts = re.split(r",(?=[\w-]+[=~])", inner.lstrip("?"))
            conds = [re.match(r"([\w-]+)([=~])(.*)", c).groups() for c in parts]
            found = [
                item for item in node
                if isinstance(item, dict)
                and all(str(item.get(k)) == v if op == "=" else v in str(item.get(k)) for k, op, v in conds)
            ]
            if every:
                return found
            if found:
                return found[0]
            raise KeyError(step)
        if isinstance(node, list):
            return node[int(inner)]
        return node[inner]
    if isinstance(node, list):
        if step.isdigit():
            return node[int(step)]
        return [item[step] for item in node]  # a key of every item: runs[?survive=True].lost_s
    return node[step]


def json_value(data, term: str):
    """One term of KEYS: a number, or a path then an optional |aggregate."""
    if re.fullmatch(r"\d+(?:\.\d+)?", term.strip()):
        return float(term)
    path, _, agg = term.partition("|")
    node, spread = data, False
    for step in _steps(path.strip()):
        try:
            node = _step(node, step, spread)
        except (KeyError, IndexError, ValueError, TypeError):
            raise FigureError(f"key {path!r}: no {step!r} there") from None
        spread = spread or step == "[*]"
    if agg:
        if agg not in AGGREGATES:
            raise FigureError(f"unknown aggregate |{agg} (known: {', '.join(AGGREGATES)})")
        if not isinstance(node, list) or not node:
            raise FigureError(f"|{agg} of {path!r}: not a non-empty list")
        node = AGGREGATES[agg](node)
    return node


def _num(v, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise FigureError(f"{what} is {json.dumps(v)[:60]}, not a number")
    return float(v)


def eval_keys(data, keys: str) -> list:
    """KEYS: comma-separated expressions of terms joined by / * + - (left to right); a lone term
    that is a list (a `[*]` path, `|range`) gives each of its items."""
    values: list[float] = []
    for _, expr in _split_top(keys, ","):
        terms = _split_top(expr, "/*+-")
        first = json_value(data, terms[0][1])
        if len(terms) == 1 and isinstance(first, list):
            values.extend(first)  # numbers, or anything agg=len counts
            continue
        acc = _num(first, terms[0][1])
        for op, term in terms[1:]:
            x = _num(json_value(data, term), term)
            if op == "/":
                acc = acc / x if x else math.inf
            elif op == "*":
                acc *= x
            elif op == "+":
                acc += x
            else:
                acc -= x
        values.append(acc)
    return values


def parse_scale(text: str) -> float:
    num, _, den = text.partition("/")
    return float(num) / (float(den) if den else 1.0)


# ---------------------------------------------------------------- git history


class History:
    """The newest commit time of each path, from one `git log` over the repository: author dates,
    which a rebase or a cherry-pick keeps (the committer date would move a measurement's age)."""

    def __init__(self, root: Path):
        self.times: dict[str, int] = {}
        self.dirty: set[str] = set()
        self._newest: dict[str, int | None] = {}
        self.ok = False
        try:
            log = subprocess.run(
                ["git", "-C", str(root), "log", "--format=%x01%at", "--name-only"],
                capture_output=True, text=True, check=True, timeout=60,
            ).stdout
            status = subprocess.run(
                ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=all"],
                capture_output=True, text=True, check=True, timeout=60,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            return
        self.ok = bool(log.strip())
        t = 0
        for line in log.splitlines():
            if line.startswith("\x01"):
                t = int(line[1:])
            elif line and line not in self.times:
                self.times[line] = t
        for line in status.splitlines():
            self.dirty.add(line[3:].split(" -> ")[-1].strip('"'))

    def newest(self, path: str) -> int | None:
        """Newest commit time touching `path` (a file or a folder); None if never committed."""
        path = path.rstrip("/")
        if path not in self._newest:
            best = [t for p, t in self.times.items() if p == path or p.startswith(path + "/")]
            self._newest[path] = max(best) if best else None
        return self._newest[path]

    def is_dirty(self, path: str) -> bool:
        path = path.rstrip("/")
        return any(p == path or p.startswith(path + "/") for p in self.dirty)

    def changed_at(self, path: str, now: int) -> int | None:
        """When `path` last changed as a commit will date it: `now` where it has uncommitted
        changes (a results file re-measured, code edited: the check before a commit fails as the
        check after it will), else its newest commit's time; None if never committed nor changed."""
        return now if self.is_dirty(path) else self.newest(path)


def _day(t: int) -> str:
    return _dt.datetime.fromtimestamp(t, _dt.timezone.utc).strftime("%Y-%m-%d")


# ---------------------------------------------------------------- the checker


class Checker:
    def __init__(self, root: Path, history: History | None = None):
        self.root = root
        self.history = history
        self._files: dict[str, object] = {}

    def _git(self) -> History:
        if self.history is None:
            self.history = History(self.root)
        return self.history

    def _read(self, rel: str, as_json: bool):
        key = (rel, as_json)
        if key not in self._files:
            p = self.root / rel
            if not p.is_file():
                raise FigureError(f"cited file {rel} is missing")
            text = p.read_text(encoding="utf-8", errors="replace")
            if as_json:
                try:
                    self._files[key] = json.loads(text)
                except ValueError as e:
                    raise FigureError(f"{rel} is not JSON ({e})") from None
            else:
                self._files[key] = text
        return self._files[key]

    def file_values(self, source: str, opts: dict[str, str]) -> list[float]:
        rel, _, keys = source.partition("#")
        if "re" in opts:
            text = self._read(rel, as_json=False)
            try:
                matches = list(re.finditer(opts["re"], text, re.MULTILINE))
            except re.error as e:
                raise FigureError(f"re={opts['re']!r} is not a regex ({e})") from None
            found = [m.group(1) if m.groups() else m.group(0) for m in matches]
            if not found:
                raise FigureError(f"regex {opts['re']!r} finds nothing in {rel}")
            try:
                nums = [parse_number(g.strip())[0] for g in found]
            except ValueError:
                raise FigureError(f"regex {opts['re']!r} in {rel} gives {found[0]!r}, not a number") from None
            return self._aggregate(nums, opts) if opts.get("agg") else nums[:1]
        if not keys:
            self._read(rel, as_json=False)
            raise FigureError(f"marker names {rel} but no #KEY or re=")
        values = eval_keys(self._read(rel, as_json=True), keys)
        if opts.get("agg") == "len":
            return [float(len(values))]
        return self._aggregate([_num(v, keys) for v in values], opts)

    @staticmethod
    def _aggregate(nums: list[float], opts: dict[str, str]) -> list[float]:
        agg = opts.get("agg")
        if not agg:
            return nums
        if agg not in AGGREGATES:
            raise FigureError(f"unknown aggregate agg={agg} (known: {', '.join(AGGREGATES)})")
        got = AGGREGATES[agg](nums)
        return got if isinstance(got, list) else [got]

    def compare(
        self, fig: list[float], dec: int, vals: list[float], opts: dict[str, str], minsec: bool = False
    ) -> str | None:
        """None if the figure agrees with the file's values, else why not (minsec: written "N min M s")."""
        scale = parse_scale(opts.get("x", "1"))
        vals = [v * scale for v in vals]
        if opts.get("bound") and len(fig) == 1:
            fig = fig * len(vals)  # "under 60 s under every policy": one bound for each value
        if len(vals) != len(fig):
            return f"the figure has {len(fig)} value(s), the file gives {len(vals)}: {_fmt(vals)}"
        if "r" in opts:
            dec = int(opts["r"])
        for f, v in zip(fig, vals):
            bound = opts.get("bound")
            if bound == "abs" and abs(v) <= f:
                continue
            if bound == "max" and v <= f:
                continue
            if bound == "min" and v >= f:
                continue
            if bound in ("max", "min", "abs"):
                side = "below" if bound == "min" else "above"
                return f"the file's {_fmt([v])} is {side} the bound {'±' if bound == 'abs' else ''}{f:g}"
            tol = opts.get("tol")
            if tol:
                allowed = abs(v) * float(tol[:-1]) / 100 if tol.endswith("%") else float(tol)
            else:
                allowed = 0.5 * 10.0 ** -dec
            if abs(f - v) > allowed + 1e-9 * max(1.0, abs(v)):
                want = _written(v, dec, minsec) if not tol else _fmt([v])
                return f"figure {_written(f, dec, minsec)} but the file gives {_fmt([v])} (write {want})"
        return None

    def stale(self, source: str, opts: dict[str, str]) -> str | None:
        """None if fresh or admitted; else why the figure's file is older than its code."""
        code = [c for c in opts.get("code", "").split(",") if c]
        if not code:
            return None
        hist = self._git()
        if not hist.ok:
            return None
        rel = source.partition("#")[0]
        for c in code:
            if not (self.root / c).exists():
                raise FigureError(f"code path {c} (code=) does not exist")
        now = int(time.time())
        t_file = hist.changed_at(rel, now)  # (re-measured, not yet committed: now, as new as any code)
        if t_file is None:
            return None
        newer = [(hist.changed_at(c, now) or 0, c) for c in code]
        t_code, which = max(newer)
        if t_code <= t_file:
            return None
        admits = opts.get("admits", "")
        if admits.endswith("d") and admits[:-1].isdigit():
            if t_code - t_file <= int(admits[:-1]) * 86400:
                return "admitted"
        elif admits:
            if _day(t_code) <= admits:
                return "admitted"
        return (
            f"stale: {rel} last written {_day(t_file)}, {which} changed since ({_day(t_code)})"
            + (f"; admits={admits} does not cover it" if admits else "; re-measure, or admit it (admits=)")
        )

    # ------------------------------------------------------------ one document

    def check_doc(self, doc: Path, counts: Counts) -> None:
        rel_doc = doc.relative_to(self.root).as_posix() if doc.is_relative_to(self.root) else str(doc)
        lines = doc.read_text(encoding="utf-8").splitlines()
        in_fence, pending_block = False, None
        block_lines: list[str] = []
        table_lines: list[str] = []
        for n, line in enumerate(lines, 1):
            where = f"{rel_doc}:{n}"
            if FENCE.match(line):
                if in_fence:
                    in_fence = False
                    if pending_block is not None:
                        self._check_block(pending_block, block_lines, counts)
                        pending_block = None
                else:
                    in_fence, block_lines = True, []
                continue
            if in_fence:
                block_lines.append(line)
                continue
            if pending_block is not None and line.lstrip().startswith("|"):
                table_lines.append(line)  # a table after fig-block: its rows are the file's lines
                continue
            if table_lines:
                self._check_block(pending_block, table_lines, counts)
                pending_block, table_lines = None, []
            visible = re.sub(r"`[^`]*`", lambda m: " " * len(m.group(0)), line)
            last = 0
            for m in MARKER.finditer(visible):
                kind, body = m.group(1), line[m.start(2) : m.end(2)].strip()
                counts.unmarked += _unmarked(visible[last : m.start()], kind == "fig")
                last = m.end()
                try:
                    if "--" in body or body.endswith("-"):
                        raise FigureError("a marker holding '--' (or ending in '-') is no HTML comment to GitHub: it shows")
                    if "|" in body and line.lstrip().startswith("|"):
                        raise FigureError("a '|' in a marker splits the table's cell: write agg=NAME, not |NAME")
                    if kind == "fig-block":
                        pending_block = (where, body)
                        continue
                    self._check_marker(where, visible[: m.start()], body, counts)
                except FigureError as e:
                    counts.problems.append(f"{where}: {e}")
            counts.unmarked += _unmarked(visible[last:], False)
        if table_lines:
            self._check_block(pending_block, table_lines, counts)
        elif pending_block is not None:
            counts.problems.append(f"{pending_block[0]}: fig-block with no ``` block or table after it")

    def _check_block(self, pending: tuple[str, str], block: list[str], counts: Counts) -> None:
        where, rel = pending
        try:
            text = self._read(rel.split()[0], as_json=False)
        except (FigureError, IndexError) as e:
            counts.problems.append(f"{where}: {e or 'fig-block names no file'}")
            return
        have = {ln.rstrip() for ln in text.splitlines()}
        missing = [ln for ln in block if ln.strip() not in ("", "...") and _bare(ln) not in have]
        counts.blocks += 1
        for ln in missing[:5]:
            counts.problems.append(f"{where}: block line not in {rel}: {ln.strip()[:90]!r}")

    def _check_marker(self, where: str, before: str, body: str, counts: Counts) -> None:
        if body.startswith("none"):
            counts.no_file += 1
            counts.listing.append(f"{where}: no file: {body[4:].lstrip(':').strip()}")
            return
        if body.count('"') % 2:
            raise FigureError("marker does not parse (an unclosed quote)")
        tokens = re.findall(r'(\w+)="([^"]*)"|"([^"]*)"|(\S+)', body)
        if not tokens or tokens[0][0] or not (tokens[0][2] or tokens[0][3]):
            raise FigureError("marker names no file first")
        source, opts = tokens[0][2] or tokens[0][3], {}
        for quoted_key, quoted, _, plain in tokens[1:]:
            k, eq, v = (quoted_key, "=", quoted) if quoted_key else plain.partition("=")
            if not eq or k not in ("re", "agg", "x", "r", "tol", "bound", "code", "admits", "note"):
                raise FigureError(f"unknown marker option {plain or quoted_key!r}")
            opts[k] = v
        if opts.get("bound", "max") not in ("max", "min", "abs"):
            raise FigureError(f"bound={opts['bound']}: max, min or abs")
        text = re.sub(r"<!--.*?-->", "", before)
        fig, dec = figure_before(text)
        vals = self.file_values(source, opts)
        counts.checked += 1
        counts.listing.append(f"{where}: {'-'.join(f'{f:g}' for f in fig)} <- {source} = {_fmt(vals)}")
        why = self.compare(fig, dec, vals, opts, minsec=bool(FIGURE_MINSEC.search(text)))
        if why:
            raise FigureError(f"{why} ({source})")
        state = self.stale(source, opts)
        if state == "admitted":
            counts.stale_admitted += 1
            counts.stale.append(f"{where}: admitted stale ({source}, admits={opts.get('admits')})")
        elif state:
            raise FigureError(state)


def _bare(line: str) -> str:
    """A block's or table's line as its file has it: without markers and trailing blanks."""
    return re.sub(r"<!--.*?-->", "", line).rstrip()


def _unmarked(text: str, marked_at_end: bool) -> int:
    """Numbers with units in `text`, less the figure at its end when a marker follows it."""
    if marked_at_end:
        m = FIGURE_MINSEC.search(text) or FIGURE.search(text)
        if m:
            text = text[: m.start()]
    return len(UNMARKED.findall(re.sub(r"\]\([^)]*\)", "", text)))


def _written(v: float, dec: int, minsec: bool) -> str:
    """A value as a figure is written: 0.85, or 11 min 17 s."""
    if not minsec:
        return f"{v:.{dec}f}"
    total = round(v, dec)
    return f"{int(total // 60)} min {total - 60 * int(total // 60):.{dec}f} s"


def _fmt(vals: list[float]) -> str:
    return ", ".join(f"{v:.6g}" for v in vals)


def documents(root: Path) -> list[Path]:
    docs = [root / "README.md"] if (root / "README.md").is_file() else []
    return docs + sorted((root / "docs").rglob("*.md"))


def run(root: Path, docs: list[Path] | None = None, history: History | None = None) -> Counts:
    checker = Checker(root, history)
    counts = Counts()
    for doc in docs if docs is not None else documents(root):
        checker.check_doc(doc, counts)
    return counts


def summary(counts: Counts) -> str:
    return (
        f"figures checked: {counts.checked}; verbatim blocks checked: {counts.blocks}; "
        f"marked as having no file: {counts.no_file}; stale but admitted: {counts.stale_admitted}; "
        f"numbers with units not marked (a rough count): {counts.unmarked}; "
        f"problems: {len(counts.problems)}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("docs", nargs="*", type=Path, help="Markdown files (default: README.md, docs/**/*.md)")
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--list", action="store_true", help="print every marker with its file's value")
    ap.add_argument("--stale", action="store_true", help="print the admitted stale figures")
    ap.add_argument("--by-doc", action="store_true", help="print the counts of each document too")
    a = ap.parse_args(argv)
    root = a.root.resolve()
    docs = [d.resolve() for d in a.docs] or None
    for d in docs or []:
        if not d.is_file():
            print(f"check_figures: error: no such file: {d}", file=sys.stderr)
            return 2
    counts = run(root, docs)
    if a.by_doc:
        history = History(root)
        for doc in docs or documents(root):
            rel = doc.relative_to(root).as_posix() if doc.is_relative_to(root) else str(doc)
            print(f"{rel}: {summary(run(root, [doc], history))}")
    if a.list:
        print("\n".join(counts.listing))
    if a.stale:
        print("\n".join(counts.stale))
    for p in counts.problems:
        print(p)
    print(summary(counts))
    return 1 if counts.problems else 0


if __name__ == "__main__":
    sys.exit(main())
