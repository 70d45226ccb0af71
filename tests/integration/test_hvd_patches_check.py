"""A Horovod whose internals changed is one line at `elastic-ring train`, before anything starts.

A ``sitecustomize`` on the path deletes ``ElasticDriver.resume`` from the installed Horovod in every
Python started (the controller, and the child that checks the patches; the check's cache is empty):
the real CLI answers with one line naming the missing internal and the installed version, exit
status 2, and no run folder."""

from __future__ import annotations

import os

import pytest

from tests.conftest import ROOT, one_line_error, run_cli

pytestmark = pytest.mark.integration


def test_a_changed_horovod_is_one_line_before_anything_starts(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import horovod.runner.elastic.driver as d\n"
                                           "del d.ElasticDriver.resume\n")
    path = os.pathsep.join([str(site), str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {"PYTHONPATH": path, "ELASTIC_RING_CACHE": str(tmp_path / "cache")}
    p = run_cli("train", "--script", str(ROOT / "examples" / "mlp_digits.py"), "--steps", "4",
                "--run-dir", str(tmp_path / "r"), env=env, timeout=120)
    one_line_error(p, "Horovod 0.28.1 has no horovod.runner.elastic.driver.ElasticDriver.resume",
                   "patch 'resume'", "--collective torch")
    assert not (tmp_path / "r").exists()
    assert not list((tmp_path / "cache").glob("horovod-patches.json"))  # a no is not remembered
