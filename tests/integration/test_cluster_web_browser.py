"""The cluster page in a real headless Chromium (Debian's chromium + chromedriver, driven by
Selenium): a real cluster (`cluster up --web`), two short jobs, one named like a script tag. The
page shows the rows and the timeline's bars, escapes the name, and changes without a reload
when a job ends. A screenshot is saved (into docs/ with ELASTIC_RING_DOCS_SCREENSHOT=1). A second
test draws the resize, restart and decision marks of a hand-written store and reads their hover
texts."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import BIN, ROOT, wait_for
from tests.unit.test_cluster_web import cluster  # noqa: F401 - the hand-written store (a fixture)
from tests.unit.test_cluster_web import wait_answers

pytestmark = pytest.mark.integration

CHROMIUM, DRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
CLI = [sys.executable, "-m", "elastic_ring.cli.main"]
PACED = str(ROOT / "tests" / "integration" / "scripts" / "paced.py")
EVIL = "<script>alert(1)</script>"



def _wait(pred, timeout, what):
    return wait_for(pred, timeout, what, poll=0.3)


def _js(browser, script: str):
    """One read of the page in one script: the page redraws every second, so element handles kept
    across calls go stale."""
    return browser.execute_script(script)


@pytest.fixture
def browser(tmp_path):
    if not (os.path.exists(CHROMIUM) and os.path.exists(DRIVER)):
        pytest.skip("needs Debian's chromium and chromium-driver (scripts/setup.sh installs them as root)")
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--disable-dev-shm-usage", "--window-size=1200,900", f"--user-data-dir={tmp_path / 'chromium'}"):
        opts.add_argument(a)
    drv = webdriver.Chrome(service=Service(DRIVER), options=opts)
    try:
        yield drv
    finally:
        drv.quit()


def test_live_page_rows_bars_escaping_and_update_without_reload(tmp_path, browser):
    t_start = time.time()
    d, log = tmp_path / "cl", tmp_path / "scheduler.log"
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", PYTHONUNBUFFERED="1")
    sched = subprocess.Popen([*CLI, "cluster", "up", "--dir", str(d), "--slots", "2", "--quiet", "--poll", "0.3",
                              "--web", "127.0.0.1:0"], cwd=ROOT, env=env, stdout=open(log, "ab"),
                             stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url = _wait(lambda: (m := re.search(r"web page: (http://\S+/)", log.read_text())) and m.group(1),
                    60, "the web page's address")
        browser.get(url)
        browser.execute_script("window.__sameDocument = 'yes'")  # gone if the page ever reloads
        _wait(lambda: "slot(s)" in _js(browser, "return document.getElementById('summary').textContent"), 20,
              "the first poll")
        for name, steps in ((EVIL, "30"), ("long", "150")):
            r = subprocess.run([*CLI, "submit", PACED, "--name", name, "--steps", steps, "--max-workers", "1",
                                "--dir", str(d)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, r.stderr
        names = _wait(lambda: (n := _js(browser, "return [...document.querySelectorAll('#jobs tbody tr td.name')]"
                                                 ".map(e => e.textContent)")) and len(n) == 2 and n, 30, "two job rows")
        assert names == [EVIL, "long"]  # the tag is text, not markup: no script element came of it
        assert _js(browser, "return document.querySelectorAll('#jobs script').length") == 0
        # both jobs run, one slot each: a bar per job on the timeline
        _wait(lambda: set(_js(browser, "return [...document.querySelectorAll('#timeline rect.bar')]"
                                       ".map(e => e.dataset.job)")) == {"1", "2"}, 90, "a timeline bar for each job")
        _wait(lambda: _js(browser, "return document.querySelectorAll('#curves .curve polyline').length"), 60,
              "a curve")
        # the short job ends: its row changes state without a reload
        _wait(lambda: _js(browser, "return document.querySelectorAll(\"tr[data-job='1'][data-state='finished']\")"
                                   ".length"), 90, "job 1 finished on the page")
        assert _js(browser, "return window.__sameDocument") == "yes"
        assert "finished" in _js(browser, "return document.querySelector(\"tr[data-job='1'] td.state\").textContent")
        widths = _js(browser, "return [...document.querySelectorAll(\"#timeline rect.bar[data-job='1']\")]"
                              ".map(e => parseFloat(e.getAttribute('width')))")
        assert widths and all(w > 1 for w in widths)
        time.sleep(1.5)  # one more poll, so the screenshot has the curves of the running job
        shot = tmp_path / "cluster-web.png"
        browser.save_screenshot(str(shot))
        assert shot.stat().st_size > 10_000
        if os.environ.get("ELASTIC_RING_DOCS_SCREENSHOT") == "1":
            shutil.copy(shot, ROOT / "docs" / "cluster-web.png")
        print(f"browser test: {time.time() - t_start:.1f} s from cluster up to the screenshot")
    finally:
        os.killpg(sched.pid, signal.SIGTERM)  # drains: the long job checkpoints and stops
        try:
            sched.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(sched.pid, signal.SIGKILL)
            sched.wait(timeout=10)


def test_markers_and_hover_texts_drawn(cluster, browser):
    """Resize, restart and decision marks with their cost or cause on hover, and the scheduler's
    gap, drawn in Chromium from a cluster store written by hand (no training: seconds)."""
    from elastic_ring.cluster.web import WebServer, bind

    d, a, b = cluster
    srv = WebServer(d, bind("127.0.0.1", 0))
    srv.start()
    try:
        wait_answers(srv)  # else, under load, Chromium may load an error page that never updates
        browser.get(srv.url)
        _wait(lambda: _js(browser, "return document.querySelectorAll('#timeline path.resize').length"), 30,
              "a resize mark")

        def titles(sel: str) -> list[str]:
            return browser.execute_script(
                "return [...document.querySelectorAll(arguments[0])].map(e => e.querySelector('title').textContent)",
                sel)

        assert titles("#timeline path.resize") == [
            "resize 4 -> 2 at step 20: 3.3 s lost (stop 1.0 s, checkpoint 0.2 s, relaunch to first step 2.5 s)"]
        assert titles("#timeline text.restart") == ["restart 1 (rank 1 died), 3 step(s) redone"]
        dec = titles("#timeline path.decision")
        assert len(dec) == 2 and "decision (arrival, job 2): job 1: 2, job 2: 2" in dec[1]
        assert titles("#timeline rect.gap") and "scheduler not running" in titles("#timeline rect.gap")[0]
        assert _js(browser, "return document.getElementById('scheduler').textContent") == "scheduler not running"
        row = _js(browser, f"return document.querySelector(\"tr[data-job='{a}']\").textContent")
        assert "3.3 s" in row and EVIL in row  # resizes (time lost), the name as text
    finally:
        srv.stop()
