"""scripts/code_shape.py's membership counts (issue 44): on a small package written here, each count
comes out as the tree was built (a backend that is a Protocol, never instantiated or missing a
method is left out; a flag outside a test is not a test; a name bound to Horovod only in another
function is not Horovod's), and ``--commit`` reads a revision from git, not the files on disk."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT, load_module

TREE = {
    "__init__.py": "",
    "controller/__init__.py": "",
    "controller/backends/__init__.py": """
        from elastic_ring.controller.backends.a import ABackend, BBackend, Helper
        from elastic_ring.controller.backends.b import CBackend

        def make(kind):
            if kind == "a":
                return ABackend()
            if kind == "c":
                return CBackend()
            Helper()
            return BBackend()
    """,
    "controller/backends/api.py": """
        from typing import Protocol

        class Backend(Protocol):
            name: str
            def start(self, launch): ...
            def close(self): ...
            def _private(self): ...
    """,
    "controller/backends/a.py": """
        from ...worker.survive import agreement
        from elastic_ring.worker import survive

        class ABackend:
            def start(self, launch):
                return 1
            def close(self):
                pass
            def survivors(self):
                records = []
                step, why = agreement(records)
                return step

        class BBackend(ABackend):
            pass

        class Helper:  # instantiated, but only starts
            def start(self, launch):
                pass

        class NeverMade:  # has both, but no one makes one
            def start(self, launch):
                pass
            def close(self):
                pass
    """,
    "controller/backends/b.py": """
        from abc import ABC, abstractmethod
        from elastic_ring.worker import survive

        class Base(ABC):
            @abstractmethod
            def start(self, launch): ...
            def close(self):
                pass

        class CBackend(Base):
            def start(self, launch):
                pass
            def survivors(self):
                x = [1]
                return survive.agreement(x)
    """,
    "controller/controller.py": """
        from elastic_ring.worker.inplace import action

        class Controller:
            def run(self, seg):
                self._interrupts = 0
                self._interrupts += 1
                target = seg.live_target
                if self._interrupts and not seg.deferred_stop:
                    pass
                while seg.live_target is not None:
                    pass
                go = self.ready or self._interrupts
                if not self.resize.withdraw_ahead(seg.index):
                    pass
                ask = getattr(self.backend, "survivors", None)
                end = getattr(self.backend, "end_ranks", None)
                n = getattr(seg, "segment", None)
                heal = hasattr(self.backend, "heal")
                return [s for s in seg.all if s.deferred_stop]
    """,
    "controller/hvdrun.py": """
        import os

        def patch():
            from horovod.runner.elastic import driver
            from horovod.runner.elastic.driver import ElasticDriver as cls
            driver.FREQUENCY = 1
            d = driver.ElasticDriver
            d.resume = None
            cls._exit, cls._start = None, None
            setattr(driver, "other", 2)
            os.environ_thing = 3

        def unrelated(driver):
            driver.x = 1
    """,
    "worker/__init__.py": "",
    "worker/inplace.py": "def action():\n    return {}\n",
    "worker/survive.py": """
        def agreement(records, silent=0):
            return (max(records) if records else None), None

        def agreed_step(records):
            \"\"\"A wrapper: not an agreement of its own.\"\"\"
            return agreement(records)[0]
    """,
    "worker/ring.py": """
        class Ring:
            pass

        class R1(Ring):
            pass

        class Retired(BaseException):
            pass
    """,
    "worker/more_rings.py": """
        from elastic_ring.worker import ring

        class R2(ring.R1):
            pass
    """,
    "worker/progress.py": """
        class Progress:
            def heartbeat(self, step, phase):
                pass
            def after(self, step):
                self.heartbeat(step, "step")
    """,
    "worker/boundary.py": """
        class StepBoundary:
            def after_step(self, progress, step):
                progress.heartbeat(step, "step")
    """,
    "worker/loop.py": """
        def steps(progress):
            for step in range(3):
                progress.heartbeat(step, "step")
                yield step
    """,
    "worker/hooked.py": """
        from elastic_ring.worker.boundary import StepBoundary

        def hook(job, step):
            StepBoundary().after_step(job.progress, step)
    """,
    "worker/elastic_adapter.py": """
        def commit(job):
            job.boundary.after_step(job.progress, job.step)
    """,
    "worker/builder.py": """
        from elastic_ring.worker.boundary import StepBoundary

        class Maker:  # builds the boundary (as Job does): not a loop form
            def __init__(self):
                self.boundary = StepBoundary(self)
    """,
    "worker/timer.py": """
        def install(m, job):  # wraps the boundary's methods: not a loop form
            m.wrap(job.boundary, "after_step")
    """,
    "controller/hvd_table.py": """
        import importlib

        _DRIVER = "horovod.runner.elastic.driver:ElasticDriver"
        MESSAGE = "horovod.torch:init"  # a string, not a call's argument

        PATCHES = (
            Patch("resume", "horovod.runner.elastic.driver:ElasticDriver.resume", ("horovod.runner.x:Y.read",)),
            Patch("exit", f"{_DRIVER}._handle_worker_exit"),
            Patch("other", target="horovod.torch:init"),
        )

        def apply(p):
            owner = importlib.import_module(p.module)
            setattr(owner, p.attr, None)
            print("horovod.torch is not a patch target:", p)
    """,
    "worker/evaluate.py": """
        def evaluate(progress, step):
            progress.heartbeat(step, "eval")
    """,
    "worker/api.py": """
        class Job:
            elastic = True
            rank = property(lambda self: 0)
            size = property(lambda self: 1)
            _hidden = property(lambda self: 2)

            def __init__(self):
                self.ring = None

            @property
            def step(self):
                return 0

            def steps(self):
                pass

            def pause(self):
                pass

            def _sync(self):
                pass
    """,
}


@pytest.fixture(scope="module")
def cs():
    return load_module(ROOT / "scripts" / "code_shape.py")


def _write(root: Path, tree: dict[str, str]) -> Path:
    pkg = root / "elastic_ring"
    for rel, text in tree.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(textwrap.dedent(text).lstrip("\n"))
    return pkg


def test_each_count_is_what_the_tree_was_built_with(cs, tmp_path):
    counts, where = cs.membership_counts(_write(tmp_path, TREE))
    assert where["backend_classes"] == ["elastic_ring.controller.backends.a.ABackend",
                                        "elastic_ring.controller.backends.a.BBackend",
                                        "elastic_ring.controller.backends.b.CBackend"]
    assert where["ring_classes"] == ["elastic_ring.worker.more_rings.R2", "elastic_ring.worker.ring.R1",
                                     "elastic_ring.worker.ring.Ring"]
    assert [w.split(" ")[1] for w in where["survivor_agreements"]] == ["survivors", "survivors"]
    assert {w.split(":")[0] for w in where["survivor_agreements"]} == {"elastic_ring.controller.backends.a",
                                                                       "elastic_ring.controller.backends.b"}
    # _interrupts: the if and the `or`; live_target: the while; deferred_stop: the if's not and the
    # comprehension's if; withdraw_ahead: the if; none of the assignments
    assert (counts["flag_tests._interrupts"], counts["flag_tests.live_target"], counts["flag_tests.deferred_stop"],
            counts["flag_tests.withdraw_ahead"], counts["flag_tests"]) == (2, 1, 2, 1, 6)
    assert counts["controller_conditions"] == 4  # two ifs, a while, a comprehension's if
    assert (counts["getattr_probes"], counts["backend_probes"]) == (3, 3)
    # progress (defines heartbeat) and boundary (the boundary itself) are not loop forms, nor is an
    # eval heartbeat, nor a module that only builds or wraps the boundary
    assert sorted(where["loop_forms"]) == ["elastic_ring.worker.elastic_adapter", "elastic_ring.worker.hooked",
                                           "elastic_ring.worker.loop"]
    assert sorted(where["loop_forms_sharing_boundary"]) == ["elastic_ring.worker.elastic_adapter",
                                                            "elastic_ring.worker.hooked"]
    assert where["job_public_names"] == ["pause", "rank", "size", "step", "steps"]
    assert where["controller_modules_importing_worker_seam"] == ["elastic_ring.controller.backends.a",
                                                                 "elastic_ring.controller.backends.b",
                                                                 "elastic_ring.controller.controller"]
    assert counts["controller_imports_of_worker_seam"] == 4
    # the assignments in hvdrun, then the table's targets (not the names a patch reads, not a message)
    assert sorted(w.split(" ")[1] for w in where["horovod_patches"]) == sorted([
        "driver.FREQUENCY", "d.resume", "cls._exit", "cls._start", "setattr(driver,",
        "horovod.runner.elastic.driver:ElasticDriver.resume",
        "horovod.runner.elastic.driver:ElasticDriver._handle_worker_exit", "horovod.torch:init"])
    assert (counts["horovod_patches.controller"], counts["horovod_patches.worker"],
            counts["horovod_patch_modules"]) == (8, 0, 2)
    ctl = textwrap.dedent(TREE["controller/controller.py"]).lstrip("\n")
    assert counts["controller_lines"] == len(ctl.splitlines())


def test_no_backend_interface_and_no_ring_give_zero(cs, tmp_path):
    tree = {k: v for k, v in TREE.items() if k not in ("controller/backends/api.py", "worker/ring.py",
                                                         "worker/more_rings.py")}
    counts, _ = cs.membership_counts(_write(tmp_path, tree))
    assert counts["backend_classes"] == 0 and counts["ring_classes"] == 0
    assert counts["survivor_agreements"] == 2


def test_a_commit_is_read_from_git_and_the_working_tree_from_disk(cs, tmp_path):
    repo = tmp_path / "repo"
    _write(repo, TREE)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "before"], check=True)
    # after the commit: one survivors' agreement less, one loop form more on the boundary
    (repo / "elastic_ring/controller/backends/b.py").write_text("class CBackend:\n    pass\n")
    (repo / "elastic_ring/worker/loop.py").write_text(
        "from elastic_ring.worker import boundary\n\ndef steps(job):\n    job.boundary.begin()\n")
    out = tmp_path / "out" / "shape.json"
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "code_shape.py"), "--repo", str(repo),
                        "--commit", "HEAD", "--commit", "worktree", "--out", str(out), "--table"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    before, after = json.loads(out.read_text())["commits"]
    assert len(before["sha"]) == 40 and before["commit"] == before["sha"][:7] and before["date"][:2] == "20"
    assert "working tree, changed" in after["commit"]
    assert before["counts"]["survivor_agreements"] == 2 and after["counts"]["survivor_agreements"] == 1
    assert before["counts"]["loop_forms_sharing_boundary"] == 2
    assert after["counts"]["loop_forms_sharing_boundary"] == 3
    assert "| survivor_agreements | 2 | 1 |" in r.stdout.splitlines()
    # a file that does not parse: one line naming it, status 2
    (repo / "elastic_ring/worker/loop.py").write_text("def steps(:\n")
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "code_shape.py"), "--repo", str(repo),
                        "--commit", "worktree"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert r.stderr.startswith("code_shape: elastic_ring/worker/loop.py does not parse here")


def test_a_revision_that_is_not_a_commit_is_one_line_and_status_2(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "code_shape.py"), "--commit", "no-such-rev-44"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == f"code_shape: --commit no-such-rev-44: not a commit of the checkout {ROOT}"
