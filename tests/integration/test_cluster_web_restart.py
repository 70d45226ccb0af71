"""`elastic-ring cluster web` reads a cluster folder from its own process: its page and /metrics go
on answering while the scheduler is killed with SIGKILL and started again, and show the gap."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request

import pytest

from tests.conftest import ROOT, wait_for

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "elastic_ring.cli.main"]



def _wait(pred, timeout, what):
    return wait_for(pred, timeout, what, poll=0.2)


def _get(url: str) -> str:
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=10) as r:  # no proxy
        assert r.status == 200
        return r.read().decode()


def _up(d, log) -> subprocess.Popen:
    return subprocess.Popen([*CLI, "cluster", "up", "--dir", str(d), "--slots", "1", "--quiet", "--poll", "0.3"],
                            cwd=ROOT, stdout=open(log, "ab"), stderr=subprocess.STDOUT, start_new_session=True)


def test_page_and_metrics_survive_a_scheduler_kill9_and_show_the_gap(tmp_path):
    from prometheus_client.parser import text_string_to_metric_families

    d, log, wlog = tmp_path / "cl", tmp_path / "up.log", tmp_path / "web.log"
    procs = [_up(d, log)]
    try:
        _wait(lambda: (d / "cluster.db").exists() and "elastic-ring cluster:" in log.read_text(), 60, "cluster up")
        web = subprocess.Popen([*CLI, "cluster", "web", "--dir", str(d), "--bind", "127.0.0.1:0"], cwd=ROOT,
                               stdout=open(wlog, "ab"), stderr=subprocess.STDOUT, start_new_session=True,
                               env=dict(os.environ, PYTHONUNBUFFERED="1"))
        procs.append(web)
        url = _wait(lambda: (m := re.search(r"web page: (http://\S+/)", wlog.read_text())) and m.group(1),
                    60, "the web page's address")

        def up() -> float:
            fam = {f.name: f for f in text_string_to_metric_families(_get(url + "metrics"))}
            return fam["elastic_ring_scheduler_up"].samples[0].value

        _wait(lambda: _get(url).startswith("<!doctype html>") and up() == 1, 30, "scheduler up on /metrics")
        os.kill(procs[0].pid, signal.SIGKILL)
        procs[0].wait(timeout=30)
        _wait(lambda: up() == 0, 30, "scheduler down on /metrics")
        gaps = json.loads(_get(url + "api/state"))["scheduler"]["gaps"]
        assert len(gaps) == 1 and gaps[0]["to"] is None
        assert "<!doctype html>" in _get(url)
        procs[0] = _up(d, log)
        _wait(lambda: up() == 1, 60, "scheduler up again on /metrics")
        gaps = json.loads(_get(url + "api/state"))["scheduler"]["gaps"]
        assert len(gaps) == 1 and gaps[0]["to"] is not None and gaps[0]["to"] > gaps[0]["from"]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
