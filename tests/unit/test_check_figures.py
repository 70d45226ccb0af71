"""scripts/check_figures.py: every marked figure of the README and docs/ agrees with its results file
(the repository's own docs), and the checker's rules on small fake docs: rounding, ranges, aggregates,
a missing file or key, a figure with no file, a verbatim block, a stale figure and its admission."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, load_module


@pytest.fixture(scope="module")
def cf():
    return load_module(ROOT / "scripts" / "check_figures.py")


def test_every_marked_figure_in_the_repository_agrees_with_its_file(cf):
    t0 = time.monotonic()
    counts = cf.run(ROOT)
    assert counts.problems == [], "\n".join(counts.problems)
    assert counts.checked >= 200, cf.summary(counts)  # the README's and the reports' figures are marked
    assert counts.no_file >= 1 and counts.blocks >= 4, cf.summary(counts)
    assert time.monotonic() - t0 < 10


def _repo(tmp_path: Path, doc: str, files: dict[str, object]) -> Path:
    for rel, content in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content if isinstance(content, str) else json.dumps(content))
    (tmp_path / "docs").mkdir(exist_ok=True)
    (tmp_path / "docs" / "a.md").write_text(doc)
    return tmp_path


RES = {"results/b.json": {"rows": [{"mode": "overlap", "lost_s": [0.71, 0.9, 0.85]}, {"mode": "seq", "lost_s": [3.0]}],
                          "median": {"lost_s": 0.8493, "bare_s": 2.198}, "n": 676.9}}


def _check(cf, tmp_path, doc, files=RES, history=None):
    root = _repo(tmp_path, doc, files)
    return cf.run(root, history=history or cf.History(tmp_path / "no-git-here"))


def test_a_correct_rounding_passes_and_a_wrong_figure_fails_naming_the_line(cf, tmp_path):
    doc = (
        "# t\n\nThe grow lost 0.85 s<!-- fig: results/b.json#median.lost_s -->, and 0.8<!-- fig: results/b.json#median.lost_s -->.\n"
        "It lost **0.84 s**<!-- fig: results/b.json#median.lost_s --> here.\n"
    )
    c = _check(cf, tmp_path, doc)
    assert c.checked == 3
    assert len(c.problems) == 1 and c.problems[0].startswith("docs/a.md:4: figure 0.84 but the file gives 0.8493")
    assert "(write 0.85)" in c.problems[0]


def test_a_missing_key_or_file_fails(cf, tmp_path):
    doc = (
        "a 0.85 s<!-- fig: results/b.json#median.lost -->\n"
        "b 0.85 s<!-- fig: results/nope.json#median.lost_s -->\n"
        "c 0.85 s<!-- fig: results/b.json#rows[mode=sequential].lost_s|median -->\n"
    )
    c = _check(cf, tmp_path, doc)
    assert [p.split(":")[1] for p in c.problems] == ["1", "2", "3"]
    assert "no 'lost' there" in c.problems[0]
    assert "results/nope.json is missing" in c.problems[1]
    assert "[mode=sequential]" in c.problems[2]


def test_a_figure_with_no_file_is_counted_not_checked(cf, tmp_path):
    c = _check(cf, tmp_path, "took 25 min here<!-- fig: none: timed by hand once -->\nand 3 s<!-- fig: none -->\n")
    assert (c.no_file, c.checked, c.problems) == (2, 0, [])


def test_aggregates_ranges_selectors_scales_and_composite_times(cf, tmp_path):
    doc = (
        "median 0.85 s<!-- fig: results/b.json#rows[mode=overlap].lost_s|median -->\n"
        "rounds 0.71-0.90 s<!-- fig: results/b.json#rows[mode=overlap].lost_s|range -->\n"
        "3 rounds<!-- fig: results/b.json#rows[0].lost_s|len -->\n"
        "849 ms<!-- fig: results/b.json#median.lost_s x=1000 -->\n"
        "0.39x<!-- fig: results/b.json#median.lost_s/median.bare_s -->\n"
        "61% lower<!-- fig: results/b.json#median.lost_s/median.bare_s-1 x=-100 -->\n"
        "11 min 17 s<!-- fig: results/b.json#n -->\n"
        "three rounds<!-- fig: results/b.json#rows[0].lost_s agg=len -->\n"
        "under 5 s<!-- fig: results/b.json#rows[*].lost_s[0] bound=max -->\n"
        "within 4<!-- fig: results/b.json#rows[*].lost_s[0] bound=abs -->\n"
    )
    c = _check(cf, tmp_path, doc)
    assert c.problems == [] and c.checked == 7 + 3
    wrong = "11 min 16 s<!-- fig: results/b.json#n -->\nunder 2 s<!-- fig: results/b.json#rows[*].lost_s[0] bound=max -->\n"
    wrong += "within 0.8<!-- fig: results/b.json#rows[*].lost_s[0] bound=abs -->\n"
    c = _check(cf, tmp_path, wrong)
    assert len(c.problems) == 3
    assert "figure 11 min 16 s but the file gives 676.9 (write 11 min 17 s)" in c.problems[0]
    assert "is above the bound 2" in c.problems[1]
    assert "the file's 3 is above the bound ±0.8" in c.problems[2]


def test_a_regex_in_a_text_file_a_tolerance_and_a_verbatim_block(cf, tmp_path):
    files = {"results/out.txt": "# wall 25.3 s load 1.43\nstate: finished  wall: 13.1 s\nlost 0.71\n"}
    doc = (
        "took 25 s<!-- fig: results/out.txt re=\"wall ([\\d.]+) s load\" tol=0.5 -->\n\n"
        "<!-- fig-block: results/out.txt -->\n```\nstate: finished  wall: 13.1 s\n...\nlost 0.71\n```\n\n"
        "<!-- fig-block: results/out.txt -->\n```\nlost 0.72\n```\n"
        "<!-- fig-block: results/t.md -->\n| a | b |\n|---|---|\n| x | 0.5 |\n\n"
        "<!-- fig-block: results/t.md -->\n\n| a | b |\n| y | 0.6 |\nafter\n"
    )
    files["results/t.md"] = "# t\n\n| a | b |\n|---|---|\n| x | 0.5 |\n| y | 0.7 |\n"
    c = _check(cf, tmp_path, doc, files)
    assert c.checked == 1 and c.blocks == 4
    assert len(c.problems) == 2 and "block line not in results/out.txt: 'lost 0.72'" in c.problems[0]
    assert c.problems[1].startswith("docs/a.md:19: block line not in results/t.md: '| y | 0.6 |'")


def test_a_filter_keeps_every_matching_item_and_a_bad_regex_is_one_problem_line(cf, tmp_path):
    files = {"results/r.json": {"runs": [{"ok": True, "s": 0.2}, {"ok": False, "s": 2.0}, {"ok": True, "s": 0.3}]}}
    doc = (
        "second kept run 0.3 s<!-- fig: results/r.json#runs[?ok=True].s[1] -->\n"
        "kept runs 0.2-0.3 s<!-- fig: results/r.json#runs[?ok=True].s agg=range -->\n"
        "first failed 2.0 s<!-- fig: results/r.json#runs[ok=False].s -->\n"
        "bad 1 s<!-- fig: results/r.json re=\"([\" -->\n"
    )
    c = _check(cf, tmp_path, doc, files)
    assert c.checked == 3 and len(c.problems) == 1 and c.problems[0].startswith("docs/a.md:4: re='([' is not a regex")


def test_a_pipe_in_a_table_rows_marker_is_refused_agg_is_not(cf, tmp_path):
    doc = (
        "| a | b |\n|---|---|\n| x | 0.85<!-- fig: results/b.json#rows[0].lost_s|median --> |\n"
        "| y | 0.85<!-- fig: results/b.json#rows[0].lost_s agg=median --> |\n"
    )
    c = _check(cf, tmp_path, doc)
    assert c.checked == 1 and len(c.problems) == 1 and c.problems[0].startswith("docs/a.md:3: a '|' in a marker")


def test_markers_inside_code_are_examples_not_markers(cf, tmp_path):
    doc = "write `0.9 s<!-- fig: results/b.json#nope -->` beside it\n```\n1 s<!-- fig: results/x.json#k -->\n```\n"
    c = _check(cf, tmp_path, doc)
    assert (c.checked, c.problems) == (0, [])


def test_a_marker_that_does_not_parse_or_stands_after_no_figure_fails(cf, tmp_path):
    doc = (
        "a 1 s<!-- fig: results/b.json#n colour=red -->\nthe file says<!-- fig: results/b.json#n -->\n"
        "677 s<!-- fig: results/b.json#n note=\"--sic\" -->\n"
    )
    c = _check(cf, tmp_path, doc)
    assert len(c.problems) == 3
    assert "unknown marker option 'colour=red'" in c.problems[0] and "no figure before the marker" in c.problems[1]
    assert c.problems[2].startswith("docs/a.md:3: a marker holding '--'")


class _FakeHistory:
    ok = True

    def __init__(self, times):
        self.times = times

    def newest(self, path):
        return self.times.get(path)

    def is_dirty(self, path):
        return False

    def changed_at(self, path, now):
        return self.newest(path)  # (nothing uncommitted)


def test_a_figure_older_than_the_code_it_measures_fails_unless_admitted(cf, tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "launch.py").write_text("")
    day = 86400
    t0 = 1796000000  # 2026-11-30
    hist = _FakeHistory({"results/b.json": t0, "pkg/launch.py": t0 + 2 * day})
    doc = (
        "a 0.85 s<!-- fig: results/b.json#median.lost_s code=pkg/launch.py -->\n"
        "b 0.85 s<!-- fig: results/b.json#median.lost_s code=pkg/launch.py admits=2026-12-03 -->\n"
        "c 0.85 s<!-- fig: results/b.json#median.lost_s code=pkg/launch.py admits=2026-12-01 -->\n"
        "d 0.85 s<!-- fig: results/b.json#median.lost_s code=pkg/launch.py admits=3d -->\n"
        "e 0.85 s<!-- fig: results/b.json#median.lost_s code=pkg/gone.py -->\n"
    )
    c = _check(cf, tmp_path, doc, history=hist)
    lines = [p.split(":")[1] for p in c.problems]
    assert lines == ["1", "3", "5"], c.problems
    assert "stale: results/b.json last written 2026-11-30, pkg/launch.py changed since (2026-12-02)" in c.problems[0]
    assert "admits=2026-12-01 does not cover it" in c.problems[1]
    assert "code path pkg/gone.py" in c.problems[2]
    assert c.stale_admitted == 2
    # re-measured: the file is as new as the code, no admission needed
    hist.times["results/b.json"] = t0 + 3 * day
    assert _check(cf, tmp_path, doc.split("e 0.85")[0], history=hist).problems == []


def test_the_command_prints_the_counts_and_exits_1_on_a_problem(cf, tmp_path):
    root = _repo(tmp_path, "a 0.9 s<!-- fig: results/b.json#median.lost_s -->\nb 7 s, 3 min\n", RES)
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "check_figures.py"), "--root", str(root)],
        capture_output=True, text=True, timeout=60,
    )
    assert out.returncode == 1
    assert out.stdout.splitlines()[0].startswith("docs/a.md:1: figure 0.9 but the file gives 0.8493")
    assert "figures checked: 1;" in out.stdout and "not marked (a rough count): 2;" in out.stdout


def test_staleness_read_from_a_real_git_history_by_author_date(cf, tmp_path):
    root = _repo(tmp_path, "a 0.85 s<!-- fig: results/b.json#median.lost_s code=pkg admits=2026-12-02 -->\n", RES)
    (root / "pkg").mkdir()
    (root / "pkg" / "launch.py").write_text("x = 1\n")

    def commit(paths, date):
        env = {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": "2030-01-01T00:00:00Z", "HOME": str(tmp_path),
               "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
               "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"}
        subprocess.run(["git", "add", *paths], cwd=root, check=True, env=env)
        subprocess.run(["git", "commit", "-qm", "c"], cwd=root, check=True, env=env)

    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    commit(["results", "docs"], "2026-11-30T12:00:00Z")
    commit(["pkg"], "2026-12-02T12:00:00Z")  # the code changed after the measurement: admitted
    assert cf.run(root).problems == [] and cf.run(root).stale_admitted == 1
    (root / "pkg" / "launch.py").write_text("x = 2\n")  # changed, not yet committed: changed today
    problems = cf.run(root).problems
    today = time.strftime("%Y-%m-%d", time.gmtime())
    assert len(problems) == 1 and f"pkg changed since ({today}); admits=2026-12-02" in problems[0], problems
    commit(["pkg"], "2026-12-03T12:00:00Z")  # and again, after the admitted day
    problems = cf.run(root).problems
    assert len(problems) == 1 and "pkg changed since (2026-12-03); admits=2026-12-02 does not cover it" in problems[0]
    (root / "results" / "b.json").write_text(json.dumps({"median": {"lost_s": 0.851}}))  # re-measured, not committed
    assert cf.run(root).problems == []
    commit(["results"], "2026-12-04T12:00:00Z")
    counts = cf.run(root)
    assert counts.problems == [] and counts.stale_admitted == 0
