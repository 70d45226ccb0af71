"""The cluster page's Hosts table in a real headless Chromium (test_cluster_web_browser's driver), from
a hand-written store whose running job's controller wrote its hosts: each host's row, its state
and until when, the names as text; hidden again once no running job has hosts."""

from __future__ import annotations

import pytest

from elastic_ring import protocol
from tests.integration.test_cluster_web_browser import _js, _wait, browser  # noqa: F401 - the fixture
from tests.unit.test_cluster_web import EVIL, cluster, wait_answers  # noqa: F401 - the fixture

pytestmark = pytest.mark.integration

STATE = {"discovered": [["a", 2], ["b", 1], ["c", 4]],
         "usable": [["a", 2]], "in_use": [["a", 1]], "excluded": [{"host": "b", "until": 1234.5, "failures": 2}],
         "draining": [], "target": 1, "need": 1}


def test_the_hosts_table_shows_each_host_of_a_running_job(cluster, browser):  # noqa: F811 - the fixtures
    from elastic_ring.cluster.web import WebServer, bind

    d, a, b = cluster
    ctl = d / "jobs" / str(a) / protocol.CONTROLLER_FILE
    protocol.write_json_atomic(ctl, {"state": "running", "host_state": STATE})
    srv = WebServer(d, bind("127.0.0.1", 0))
    srv.start()
    try:
        wait_answers(srv)
        browser.get(srv.url)
        _wait(lambda: _js(browser, "return document.querySelectorAll('#hosts tbody tr').length") == 3, 30,
              "three host rows")
        assert _js(browser, "return document.getElementById('hosts-section').hidden") is False
        rows = _js(browser, "return [...document.querySelectorAll('#hosts tbody tr')].map(r => "
                            "[...r.children].map(c => c.textContent))")
        assert [r[1:4] for r in rows] == [["a", "1 of 2", "in use"], ["b", "1", "excluded"],
                                          ["c", "4", "discovered, idle"]]
        assert all(r[0] == f"#{a} {EVIL}" for r in rows)  # the job's name as text
        assert rows[0][4] == "-" and rows[1][4] != "-"  # until when: the excluded host's end of cooldown
        assert _js(browser, "return document.querySelectorAll('#hosts script').length") == 0
        protocol.write_json_atomic(ctl, {"state": "running"})  # no host discovery (any more): hidden
        _wait(lambda: _js(browser, "return document.getElementById('hosts-section').hidden"), 30, "the table hidden")
    finally:
        srv.stop()
